"""The member rules for the server's own snapshot (trusted) and for a caller's archive."""

from __future__ import annotations

import tarfile

import pytest
from sandboxd.archive import ArchiveLimits, MemberChecker
from sandboxd.errors import InvalidArgument, ResourceExhausted


def _limits(trusted: bool) -> ArchiveLimits:
    """As transfer.py sets them: a trusted restore's file cap is the workspace cap."""
    file_cap = 1000 if trusted else 10
    return ArchiveLimits(
        max_members=100, max_file_bytes=file_cap, max_total_bytes=1000, trusted=trusted
    )


def _info(
    name: str, kind: bytes = tarfile.REGTYPE, *, size: int = 0, link: str = ""
) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.size, info.linkname, info.mode = kind, size, link, 0o644
    return info


@pytest.mark.parametrize(
    "info",
    [
        _info("p", tarfile.FIFOTYPE),
        _info("l", tarfile.SYMTYPE, link="/nowhere"),
        _info("up", tarfile.SYMTYPE, link="../../etc/passwd"),
        _info("big", size=500),  # over the file cap, within the workspace
        _info("bad\udcffname"),  # a non-UTF-8 name as tarfile decodes it
    ],
)
def test_what_the_sandbox_makes_passes_trusted_only(info: tarfile.TarInfo) -> None:
    assert MemberChecker(_limits(True)).check(info) is not None
    if "\udcff" in info.name:
        assert MemberChecker(_limits(False)).check(info) is not None  # and never INTERNAL
        return
    with pytest.raises((InvalidArgument, ResourceExhausted)):
        MemberChecker(_limits(False)).check(info)


@pytest.mark.parametrize(
    "members",
    [
        [_info("../x")],
        [_info("/abs")],
        [_info("l", tarfile.SYMTYPE, link="/etc"), _info("l/passwd")],  # through a symlink
        # A second name of a symlink is a symlink too: nothing goes through it.
        [
            _info("l", tarfile.SYMTYPE, link="/etc"),
            _info("h", tarfile.LNKTYPE, link="l"),
            _info("h/passwd"),
        ],
        [_info("h", tarfile.LNKTYPE, link="../outside")],
        [_info("huge", size=2000)],
        [_info("c", tarfile.CHRTYPE)],
    ],
)
def test_trusted_still_never_leaves_the_destination(members: list[tarfile.TarInfo]) -> None:
    checker = MemberChecker(_limits(True))
    with pytest.raises((InvalidArgument, ResourceExhausted)):
        for m in members:
            checker.check(m)


def test_closed_directories_are_unpacked_open_and_remembered() -> None:
    checker = MemberChecker(_limits(False))
    for name, mode in (("ro", 0o555), ("ok", 0o755), ("ro/none", 0o000)):
        info = _info(name, tarfile.DIRTYPE)
        info.mode = mode
        out = checker.check(info)
        assert out is not None and out.mode & 0o700 == 0o700
    assert checker.deferred_modes == [("ro", 0o555), ("ro/none", 0o000)]


def test_a_symlink_with_two_names_passes_trusted_only() -> None:
    """`ln -s a l && ln l h` in the sandbox: its snapshot carries h as a hardlink to the symlink
    l. tar -x makes it with link(2), which never follows l; a caller's archive may not."""
    members = [_info("l", tarfile.SYMTYPE, link="a"), _info("h", tarfile.LNKTYPE, link="l")]
    trusted = MemberChecker(_limits(True))
    out = [trusted.check(m) for m in members]
    assert out[1] is not None and out[1].islnk() and out[1].linkname == "l"
    untrusted = MemberChecker(_limits(False))
    untrusted.check(members[0])
    with pytest.raises(InvalidArgument, match="a hardlink to a symlink"):
        untrusted.check(members[1])
