"""A session's declared workspace (manifest) written into its fresh sandbox.

`write_manifest` runs `tar -x` in the sandbox through the shared helper client, with the
manifest's tar on stdin.
"""

from __future__ import annotations

import asyncio
import io
import tarfile

from sandboxd.commands import SandboxCommands
from sandboxd.errors import FailedPrecondition, ResourceExhausted
from sandboxd.helper_client import HelperClient, tool_argv
from sandboxd.models import Session, WorkspaceManifest
from sandboxd.reasons import Reason

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


async def write_manifest(commands: SandboxCommands, session: Session) -> None:
    """Unpack the manifest into /workspace as the sandbox user; WORKSPACE_FULL when it does
    not fit, MANIFEST_WRITE_FAILED for any other refusal."""
    archive = await asyncio.to_thread(build_manifest_tar, session.spec.manifest)
    # Through the one helper client: tar under `sbx run` with a clean environment, so nothing
    # the session's env says (TAR_OPTIONS, PATH, loader variables) reaches it.
    result = await HelperClient(commands).run(
        session, tool_argv(".", ["tar", "-x", "-f", "-"]), stdin=archive
    )
    if result.exit_code != 0:
        text = result.stderr_text.strip()[:_MAX_ERROR_BYTES]
        if "space" in text.lower():
            raise ResourceExhausted(
                "the workspace manifest does not fit in the workspace", reason=Reason.WORKSPACE_FULL
            )
        raise FailedPrecondition(
            f"could not write the workspace manifest (tar exited {result.exit_code}: {text})",
            reason=Reason.MANIFEST_WRITE_FAILED,
        )
