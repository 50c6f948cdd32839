"""Hostile input, archives (SECURITY.md "Files and archives"): ImportArchive refuses every bad
member before anything lands, whatever header format smuggles it in.

The member-by-member cases of integration/test_archive.py run here again beside a bystander (the
`guard`), plus the smuggling variants: PAX and GNU long-name records that override a harmless
ustar name, and archives aimed at a destination outside the workspace.
"""

from __future__ import annotations

import io
import tarfile

import grpc
import pytest
from conftest import Stubs, expect_error, run
from test_archive import BAD_ARCHIVES, dir_, import_tar, make_tar, member, tree

pytestmark = pytest.mark.usefixtures("guard")
IA = grpc.StatusCode.INVALID_ARGUMENT


def _tmp_listing(stubs: Stubs, sid: str) -> bytes:
    return run(stubs, sid, "ls", "-a", "/tmp").stdout


@pytest.mark.parametrize("case", sorted(BAD_ARCHIVES))
def test_bad_archive_changes_nothing_anywhere(stubs: Stubs, victim: str, case: str) -> None:
    data, code, reason = BAD_ARCHIVES[case]
    before, tmp_before = tree(stubs, victim), _tmp_listing(stubs, victim)
    expect_error(lambda: import_tar(stubs, victim, data, chunk=1000), code, reason)
    assert tree(stubs, victim) == before
    assert _tmp_listing(stubs, victim) == tmp_before


def _pax(name: str, overrides: dict[str, str], **attrs: object) -> bytes:
    info = tarfile.TarInfo(name)
    info.pax_headers = overrides
    for key, value in attrs.items():
        setattr(info, key, value)
    data = b"pwned" if info.isreg() else None
    if data is not None:
        info.size = len(data)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def _gnu_long(name: str) -> bytes:
    info = tarfile.TarInfo(name)
    info.size = 5
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        tar.addfile(info, io.BytesIO(b"pwned"))
    return buf.getvalue()


SMUGGLED = {
    "pax-path-traversal": (_pax("benign", {"path": "../../evil"}), "ARCHIVE_PATH_TRAVERSAL"),
    "pax-path-absolute": (_pax("benign", {"path": "/etc/evil"}), "ARCHIVE_ABSOLUTE_PATH"),
    "pax-linkpath-absolute": (
        _pax("l", {"linkpath": "/etc"}, type=tarfile.SYMTYPE, linkname="inside"),
        "ARCHIVE_LINK_OUTSIDE",
    ),
    "gnu-longname-traversal": (
        _gnu_long("a/" * 60 + "../" * 70 + "evil"),
        "ARCHIVE_PATH_TRAVERSAL",
    ),
    "long-pax-name-traversal": (
        make_tar(member("d/" * 80 + "../" * 90 + "evil", b"x")),
        "ARCHIVE_PATH_TRAVERSAL",
    ),
}


@pytest.mark.parametrize("case", sorted(SMUGGLED))
def test_smuggled_names_are_refused(stubs: Stubs, victim: str, case: str) -> None:
    data, reason = SMUGGLED[case]
    before = tree(stubs, victim)
    expect_error(lambda: import_tar(stubs, victim, data), IA, reason)
    assert tree(stubs, victim) == before


@pytest.mark.parametrize("path", ["../", "/etc", "/workspace/../tmp", "a/../../b"])
def test_destination_outside_the_workspace_is_refused(stubs: Stubs, victim: str, path: str) -> None:
    expect_error(
        lambda: import_tar(stubs, victim, make_tar(dir_("x")), path=path),
        IA,
        "PATH_OUTSIDE_WORKSPACE",
    )
