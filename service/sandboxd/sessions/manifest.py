"""A session's declared workspace (manifest) written into its fresh sandbox.

`write_manifest` is the one exec-and-drain loop of sessions: it runs `tar -x` in the sandbox
with the manifest's tar on stdin. Kept as one small function so it can switch to the shared
helper client without touching the lifecycle.
"""

from __future__ import annotations

import asyncio
import io
import tarfile

from sandboxd.engine.protocol import Engine
from sandboxd.errors import FailedPrecondition, ResourceExhausted
from sandboxd.models import Session, WorkspaceManifest

_MAX_ERROR_BYTES = 4096


def build_manifest_tar(manifest: WorkspaceManifest) -> bytes:
    """A tar of the declared directories and files; paths were validated already."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        dirs: set[str] = set()
        wanted = list(manifest.directories) + [
            str(p) for f in manifest.files for p in _parents(f.path)
        ]
        for d in wanted:
            for p in [*_parents(d), d]:
                if p not in dirs and p != ".":
                    dirs.add(p)
                    info = tarfile.TarInfo(p)
                    info.type = tarfile.DIRTYPE
                    info.mode = 0o755
                    tar.addfile(info)
        for f in manifest.files:
            info = tarfile.TarInfo(f.path)
            info.size = len(f.content)
            info.mode = f.mode
            tar.addfile(info, io.BytesIO(f.content))
    return buf.getvalue()


def _parents(path: str) -> list[str]:
    parts = path.split("/")[:-1]
    return ["/".join(parts[: i + 1]) for i in range(len(parts))]


async def write_manifest(engine: Engine, session: Session) -> None:
    """Unpack the manifest into /workspace as the sandbox user; WORKSPACE_FULL when it does
    not fit, MANIFEST_WRITE_FAILED for any other refusal."""
    archive = await asyncio.to_thread(build_manifest_tar, session.spec.manifest)
    async with engine.exec(
        session.container_id,
        ["tar", "-x", "-f", "-", "-C", "/workspace"],
        user=session.spec.user,
        stdin=True,
    ) as stream:
        await stream.write(archive)
        stream.close_stdin()
        errors = bytearray()
        while (chunk := await stream.read()) is not None:
            errors += chunk[1][: _MAX_ERROR_BYTES - len(errors)]
        code = await stream.wait_exit_code()
    if code != 0:
        text = errors.decode(errors="replace").strip()
        if "space" in text.lower():
            raise ResourceExhausted(
                "the workspace manifest does not fit in the workspace", reason="WORKSPACE_FULL"
            )
        raise FailedPrecondition(
            f"could not write the workspace manifest (tar exited {code}: {text})",
            reason="MANIFEST_WRITE_FAILED",
        )
