"""A build context on its way to the engine: spooled to disk while counted, never held whole.

The caller's tar arrives in chunks; each is counted against the cap before it is written, so a
context over the cap costs at most one chunk past it. The engine is then sent a tar the server
writes: the checked Dockerfile first, under a name of the server's (so the caller's own files, a
`Dockerfile` among them, are built from but never the instructions), then the caller's members
as tarfile read and checked them, re-encoded: two tar readers may cut one stream into different
members, so the caller's bytes are never the engine's framing.

The engine unpacks the context onto its own disk before the first step, so what it unpacks
must be no more than what was counted: the context is an uncompressed tar (the engine would
inflate a compressed one) of regular files, directories and links only. A sparse member is
refused: it declares holes the engine writes out as zeros, a few bytes of context for any
size of disk. The engine does not ask what the caller meant either: it picks the decompressor
from the context's first bytes (Moby's `DetectCompression`), so a tar whose first header starts
with a compression magic (its first member's name, say), which `tarfile` reads as plain, is
read by the engine as a compressed stream of another tar, never checked here: a few MiB of
such a context inflated to GiB on the engine's disk. Those prefixes are refused.
"""

from __future__ import annotations

import asyncio
import io
import posixpath
import tarfile
from collections.abc import AsyncIterator
from pathlib import Path

from sandboxd.errors import InvalidArgument, ResourceExhausted
from sandboxd.reasons import Reason


async def spool(chunks: AsyncIterator[bytes], dest: Path, cap: int) -> int:
    """Write the chunks to `dest` (off the loop); ResourceExhausted once they pass `cap`."""
    total = 0
    f = await asyncio.to_thread(dest.open, "wb")
    try:
        async for chunk in chunks:
            total += len(chunk)
            if total > cap:
                raise ResourceExhausted(
                    f"the build context is larger than this server's limit of {cap} bytes "
                    "(setting template_max_context_bytes)",
                    reason=Reason.TEMPLATE_CONTEXT_TOO_LARGE,
                    metadata={"limit_bytes": str(cap)},
                )
            await asyncio.to_thread(f.write, chunk)
    finally:
        await asyncio.to_thread(f.close)
    return total


# Moby's DetectCompression: bzip2, gzip, xz, zstd; and a zstd skippable frame, 0x184D2A5?
# little-endian, checked apart below.
_MAGICS = (b"BZh", b"\x1f\x8b\x08", b"\xfd7zXZ\x00", b"\x28\xb5\x2f\xfd")


def _check_not_compressed(tar_path: Path) -> None:
    with tar_path.open("rb") as f:
        head = f.read(8)
    skippable = len(head) >= 8 and head[1:4] == b"\x2a\x4d\x18" and head[0] & 0xF0 == 0x50
    if skippable or head.startswith(_MAGICS):
        raise InvalidArgument(
            "the build context starts with the bytes of a compressed stream (gzip, bzip2, xz, "
            "zstd), which the engine would decompress: send an uncompressed tar whose first "
            "member's name does not start with them",
            reason=Reason.TEMPLATE_SPEC_INVALID,
        )


_KINDS = (tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.DIRTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE)


def _check_member(m: tarfile.TarInfo) -> None:
    sparse = m.issparse() or any(k.startswith("GNU.sparse") for k in m.pax_headers)
    if sparse or m.type not in _KINDS:
        what = "a sparse file" if sparse else "not a file, directory or link"
        raise InvalidArgument(
            f"build context member {m.name[:200]!r} is {what}: the engine would unpack "
            "more than the context holds",
            reason=Reason.TEMPLATE_SPEC_INVALID,
            metadata={"member": m.name[:200]},
        )


def _plain(m: tarfile.TarInfo) -> tarfile.TarInfo:
    """A member's fields as the server writes them: no pax record of the caller's (xattrs,
    sparse maps, a global header's values) reaches the engine."""
    out = tarfile.TarInfo(m.name)
    out.type, out.mode, out.mtime = m.type, m.mode & 0o7777, int(m.mtime)
    out.uid, out.gid, out.uname, out.gname = m.uid, m.gid, m.uname, m.gname
    out.linkname = m.linkname
    out.size = m.size if m.isreg() else 0
    return out


def add_dockerfile(tar_path: Path, member: str, text: str) -> None:
    """Check the spooled tar's members and write the context the engine unpacks: the
    Dockerfile first, then the members as tarfile read them, each encoded by the server.
    The caller's bytes are never handed on as they came: a tar that tarfile and the engine's
    Go reader cut into different members (a global pax header's `size`, which Python applies
    to a later member and Go to none, hid a member of any kind from the checks) reaches the
    engine only as the members checked here."""
    data = text.encode()
    info = tarfile.TarInfo(member)
    info.size = len(data)
    info.mode = 0o644
    _check_not_compressed(tar_path)
    out_path = tar_path.with_name(tar_path.name + ".checked")
    try:
        with tarfile.open(out_path, "w", format=tarfile.PAX_FORMAT, errors="strict") as out:
            out.addfile(info, io.BytesIO(data))
            if tar_path.stat().st_size > 0:
                with tarfile.open(tar_path, "r:") as tar:
                    for m in tar:
                        _check_member(m)
                        if posixpath.normpath("/" + m.name) == "/" + member:
                            raise tarfile.TarError(f"a member is named {member}")
                        out.addfile(_plain(m), tar.extractfile(m) if m.isreg() else None)
        out_path.replace(tar_path)
    except (tarfile.TarError, UnicodeError) as e:
        raise InvalidArgument(
            f"the build context is not an uncompressed tar of UTF-8 names ({e})",
            reason=Reason.TEMPLATE_SPEC_INVALID,
        ) from e
    finally:
        out_path.unlink(missing_ok=True)
