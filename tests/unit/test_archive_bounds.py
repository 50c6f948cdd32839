"""Unit tests of what one import may cost the server (sandboxd.archive.policy): memory and
CPU of the member checks whatever the names, and the tarfile CVE-2024-6232 start-up check."""

from __future__ import annotations

import tarfile
import time
import tracemalloc

import pytest
from sandboxd.archive.policy import (
    DEFAULT_MAX_MEMBERS,
    ArchiveLimits,
    MemberChecker,
    ensure_safe_tarfile,
    normalize_member_name,
    stream_allowance,
    tarfile_has_pax_regex_bug,
)
from sandboxd.errors import InvalidArgument

LIMITS = ArchiveLimits(DEFAULT_MAX_MEMBERS, 1 << 20, 1 << 30)
DEEP = "/".join(["a"] * 2040)  # a name of 4 KiB, 2 040 levels deep


def _dir(name: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE
    return info


def _file(name: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size = 1
    return info


def _peak_bytes(checker: MemberChecker, infos: object) -> tuple[int, InvalidArgument | None]:
    tracemalloc.start()
    refused = None
    try:
        for info in infos:  # type: ignore[attr-defined]
            checker.check(info)
    except InvalidArgument as exc:
        refused = exc
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    return peak, refused


def test_distinct_deep_names_are_bounded_in_memory() -> None:
    # Kept as strings, every proper prefix of 400 such names took 1.3 GiB.
    infos = (_dir(f"{i:04d}/{DEEP}") for i in range(DEFAULT_MAX_MEMBERS))
    peak, refused = _peak_bytes(MemberChecker(LIMITS), infos)
    assert peak < 64 << 20, f"{peak >> 20} MiB"
    assert refused is not None and refused.reason == "ARCHIVE_TOO_MANY_MEMBERS"


def test_the_full_member_cap_of_wide_names_is_bounded_in_memory() -> None:
    # A quarter of the cap, held to a quarter of the bound: memory grows with members only.
    count = DEFAULT_MAX_MEMBERS // 4
    infos = (_file(f"d{i % 1000:03d}/{'f' * 200}{i}") for i in range(count))
    peak, refused = _peak_bytes(MemberChecker(LIMITS), infos)
    assert refused is None
    assert peak < 16 << 20, f"{peak >> 20} MiB"


def test_deep_shared_names_cost_time_linear_in_the_name() -> None:
    checker = MemberChecker(LIMITS)
    checker.check(_dir(DEEP))
    started = time.process_time()
    for i in range(400):
        checker.check(_file(f"{DEEP}/f{i}"))
    assert time.process_time() - started < 2.0


def test_a_planted_symlink_is_still_found_deep_down() -> None:
    checker = MemberChecker(LIMITS)
    link = tarfile.TarInfo("a/a/l")
    link.type = tarfile.SYMTYPE
    link.linkname = "."
    checker.check(link)
    with pytest.raises(InvalidArgument) as exc:
        checker.check(_file("a/a/l/" + DEEP[:1000]))
    assert exc.value.reason == "ARCHIVE_THROUGH_SYMLINK"
    assert "'a/a/l'" in str(exc.value)


def test_existing_symlinks_given_as_hashes_are_honoured() -> None:
    from sandboxd.archive.policy import prefix_hashes

    checker = MemberChecker(LIMITS, existing_hashes={prefix_hashes("x/link")[-1]})
    with pytest.raises(InvalidArgument) as exc:
        checker.check(_file("x/link/f"))
    assert exc.value.reason == "ARCHIVE_THROUGH_SYMLINK"


@pytest.mark.parametrize(
    ("version", "buggy"),
    [
        ((3, 10, 14), True),
        ((3, 11, 7), True),
        ((3, 11, 10), False),
        ((3, 12, 5), True),
        ((3, 12, 6), False),
        ((3, 13, 0), False),
    ],
)
def test_interpreters_with_the_pax_regex_bug(version: tuple[int, int, int], buggy: bool) -> None:
    assert tarfile_has_pax_regex_bug(version) is buggy


def test_imports_are_refused_on_a_buggy_interpreter_without_the_caps() -> None:
    ensure_safe_tarfile(version=(3, 11, 7))  # the caps in force: fine
    with pytest.raises(RuntimeError, match="CVE-2024-6232"):
        ensure_safe_tarfile(max_extended_bytes=4 << 20, version=(3, 11, 7))
    with pytest.raises(RuntimeError, match="CVE-2024-6232"):
        ensure_safe_tarfile(max_digit_run=100_000, version=(3, 12, 1))
    ensure_safe_tarfile(max_extended_bytes=4 << 20, version=(3, 12, 6))  # fixed there


def test_stream_allowance_covers_what_tar_writes_for_a_full_workspace() -> None:
    import io

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for i in range(50):
            info = tarfile.TarInfo(f"dir/{'n' * 90}{i}")
            info.size = 1000
            tar.addfile(info, io.BytesIO(b"z" * 1000))
    assert len(buf.getvalue()) <= stream_allowance(50 * 1000, 50)


@pytest.mark.parametrize(
    ("name", "ok"),
    [
        ("d/" + "n" * 255, True),
        ("d/" + "n" * 256 + "/x", False),  # a name the kernel refuses: tar failed INTERNAL
        ("é" * 127 + "n", True),  # 255 bytes in two-byte characters
        ("é" * 128, False),
        ("/".join(["p" * 200] * 20) + "/" + "q" * 75, True),  # 4095 bytes
        ("/".join(["p" * 200] * 20) + "/" + "q" * 76, False),  # PATH_MAX with its NUL
    ],
)
def test_member_names_the_kernel_would_refuse_are_refused_by_name(name: str, ok: bool) -> None:
    if ok:
        assert normalize_member_name(name) == name
        return
    with pytest.raises(InvalidArgument) as exc:
        normalize_member_name(name)
    assert exc.value.reason == "ARCHIVE_MEMBER_INVALID"


def test_a_refused_check_forgets_what_it_remembered() -> None:
    """A refusal's traceback holds the checker in reference cycles until the cyclic collector
    runs: measured on a real server, six refused imports of deep names in a row had kept
    120 MiB alive (188 MiB against 95 with the release). The checker's memory goes with the
    refusal itself, whoever still holds the checker."""
    import asyncio
    import io

    from sandboxd.archive.check import check_and_forward
    from sandboxd.archive.pipe import INBOX_BYTES, Inbox, Source

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for i in range(120):
            tar.addfile(_dir(f"{i:03d}/{DEEP}"))
    checker = MemberChecker(LIMITS)

    async def refused() -> None:
        inbox = Inbox(asyncio.get_running_loop(), INBOX_BYTES)
        await inbox.put(buf.getvalue())
        inbox.end()
        with pytest.raises(InvalidArgument) as info:
            await asyncio.to_thread(check_and_forward, Source(inbox), None, checker)
        assert info.value.reason == "ARCHIVE_TOO_MANY_MEMBERS"

    asyncio.run(refused())
    assert checker.members > 0
    assert not checker._parents and not checker._seen and not checker._dirs
