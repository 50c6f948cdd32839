"""sandboxctl image: pull (with a progress bar) and ls (admin)."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from sandboxd_client.cli_output import emit, table, when

if TYPE_CHECKING:  # imported when a command runs: the parser needs none of them
    from sandboxd_client.client import SandboxClient


async def cmd_image_pull(client: SandboxClient, args: argparse.Namespace) -> int:
    from sandboxd_client.cli_progress import Progress  # for a pull alone
    from sandboxd_client.images import PullDone

    show = sys.stderr.isatty() if args.progress is None else args.progress
    bar = Progress(args.image, None, sys.stderr, show)
    digest = ""
    async for event in client.pull_image(args.image):
        if isinstance(event, PullDone):
            digest = event.image_digest
            continue
        bar.total = event.total_bytes or None
        bar.add(event.current_bytes - bar.done)
    bar.finish()
    emit(args, {"image": args.image, "image_digest": digest}, digest)
    return 0


async def cmd_image_ls(client: SandboxClient, args: argparse.Namespace) -> int:
    found = [i async for i in client.list_images()]
    rows: list[tuple[Any, ...]] = [("IMAGE", "DIGEST", "SIZE", "LAST USED")]
    rows += [(i.name, i.digest, str(i.size_bytes), when(i.last_used_at)) for i in found]
    emit(args, found, lambda: table(rows))
    return 0


def add_image_commands(sub: Any) -> None:
    image = sub.add_parser("image", help="registry images: pull, ls (admin)")
    isub = image.add_subparsers(dest="image_command", required=True)
    p = isub.add_parser("pull", help="pull an image the server allows, with a progress bar")
    p.set_defaults(func=cmd_image_pull)
    p.add_argument("image")
    p.add_argument("--progress", action="store_true", default=None, help="always show progress")
    p.add_argument("--no-progress", action="store_false", dest="progress")
    p = isub.add_parser("ls", help="images you may use, with digest, size and last use")
    p.set_defaults(func=cmd_image_ls)
