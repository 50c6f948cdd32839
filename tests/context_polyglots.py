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
