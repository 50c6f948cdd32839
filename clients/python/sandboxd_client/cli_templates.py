"""sandboxctl template: build (streams the build log), ls, rm."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from sandboxd_client.cli_output import emit, table, when

if TYPE_CHECKING:  # imported when a command runs: the parser needs none of them
    from sandboxd_client.client import SandboxClient
    from sandboxd_client.templates import Template


def _tar_dir(directory: Path) -> IO[bytes]:
    """The directory as an uncompressed tar in a temporary file (spilled to disk when large)."""
    import tarfile  # for template builds alone: every other command starts without it
    import tempfile

    spool = tempfile.SpooledTemporaryFile(max_size=8 * 1024 * 1024)  # noqa: SIM115
    with tarfile.open(fileobj=spool, mode="w") as tar:
        for path in sorted(directory.rglob("*")):
            tar.add(path, arcname=str(path.relative_to(directory)), recursive=False)
    spool.seek(0)
    return spool


async def _chunks(f: IO[bytes]) -> AsyncIterator[bytes]:
    from sandboxd_client.templates import CONTEXT_CHUNK

    while chunk := await asyncio.to_thread(f.read, CONTEXT_CHUNK):
        yield chunk


async def cmd_template_build(client: SandboxClient, args: argparse.Namespace) -> int:
    directory = Path(args.dir)
    dockerfile = Path(args.file) if args.file else directory / "Dockerfile"
    text = dockerfile.read_text()
    context = await asyncio.to_thread(_tar_dir, directory)
    from sandboxd_client.templates import Template

    done: Template | None = None
    try:
        async for event in client.build_template(args.name, text, _chunks(context)):
            if isinstance(event, Template):
                done = event
            else:
                print(event.line, file=sys.stderr)
    finally:
        context.close()
    assert done is not None
    emit(args, done, f"{done.name} {done.state} {done.size_bytes} bytes")
    return 0


async def cmd_template_ls(client: SandboxClient, args: argparse.Namespace) -> int:
    found = [t async for t in client.list_templates()]
    rows: list[tuple[Any, ...]] = [("NAME", "STATE", "BUILTIN", "SIZE", "CREATED", "MESSAGE")]
    rows += [
        (
            t.name,
            t.state,
            "yes" if t.builtin else "",
            str(t.size_bytes),
            when(t.created_at),
            t.message[:60],
        )
        for t in found
    ]
    emit(args, found, lambda: table(rows))
    return 0


async def cmd_template_rm(client: SandboxClient, args: argparse.Namespace) -> int:
    for name in args.names:
        await client.delete_template(name)
    emit(args, {"deleted": args.names}, "")
    return 0


def add_template_commands(sub: Any) -> None:
    template = sub.add_parser("template", help="templates: build from a Dockerfile, ls, rm")
    tsub = template.add_subparsers(dest="template_command", required=True)
    p = tsub.add_parser("build", help="build a template from DIR (its Dockerfile, or -f)")
    p.set_defaults(func=cmd_template_build)
    p.add_argument("name")
    p.add_argument("dir")
    p.add_argument("-f", "--file", help="the Dockerfile (default: DIR/Dockerfile)")
    p = tsub.add_parser("ls", help="the built-in templates and yours")
    p.set_defaults(func=cmd_template_ls)
    p = tsub.add_parser("rm", help="delete templates (refused while a live session uses one)")
    p.set_defaults(func=cmd_template_rm)
    p.add_argument("names", nargs="+")
