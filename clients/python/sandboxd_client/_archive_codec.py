"""How an archive travels: the compression an export or import asks the server for, and the
zstd codec that turns the wire's frames back into the plain tar the caller sees.

The server compresses and decompresses inside the sandbox and relays the frames, so a
compressed archive costs the server fewer bytes; an older server, or a client without the
`zstandard` package, moves the plain tar as before.
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING, Any

from sandboxd_client._lazy import lazy

if TYPE_CHECKING:
    from sandboxd_client._gen.sandboxd.v1 import snapshot_pb2
    from sandboxd_client.client import SandboxClient
else:
    snapshot_pb2 = lazy("sandboxd_client._gen.sandboxd.v1.snapshot_pb2")

FEATURE = "archive_zstd"  # GetServerInfo's word for it
LEVEL = 1  # the client's own compression of an import: fast, as the sandbox's is
MODES = ("auto", "zstd", "none")


def have_zstandard() -> bool:
    return importlib.util.find_spec("zstandard") is not None


async def archive_compression(
    client: SandboxClient, mode: str, deadline: float | None
) -> snapshot_pb2.ArchiveCompression.ValueType:
    """The ArchiveCompression value to ask for: zstd under "auto" only when the server says
    it has it and zstandard is installed; "zstd" always; "none" never."""
    if mode not in MODES:
        raise ValueError(f"compression must be one of {', '.join(MODES)}, not {mode!r}")
    if mode == "none" or (mode == "auto" and not have_zstandard()):
        return snapshot_pb2.ARCHIVE_COMPRESSION_UNSPECIFIED
    if mode == "auto":
        try:
            info = await client._checked(deadline)
        except Exception:  # the call itself reports what is wrong with the server
            return snapshot_pb2.ARCHIVE_COMPRESSION_UNSPECIFIED
        if FEATURE not in info.features:
            return snapshot_pb2.ARCHIVE_COMPRESSION_UNSPECIFIED
    return snapshot_pb2.ARCHIVE_COMPRESSION_ZSTD


class TarCodec:
    """zstd both ways: frames from the server decoded (across frames), the caller's tar
    encoded for an import."""

    def __init__(self) -> None:
        import zstandard

        self._zstd: Any = zstandard

    def decoder(self) -> Any:
        return self._zstd.ZstdDecompressor().decompressobj(read_across_frames=True)

    def encoder(self) -> Any:
        return self._zstd.ZstdCompressor(level=LEVEL, write_checksum=True).compressobj()


def tar_codec() -> TarCodec:
    return TarCodec()
