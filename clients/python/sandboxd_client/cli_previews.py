"""sandboxctl's preview commands: publish, unpublish and list a session's ports."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from sandboxd_client.cli_output import emit, table, when

if TYPE_CHECKING:  # imported when a command runs: the parser needs none of them
    from sandboxd_client.client import SandboxClient


async def cmd_publish(client: SandboxClient, args: argparse.Namespace) -> int:
    p = await client.publish_port(args.session, args.port, ttl=args.ttl, public=args.public)

    def text() -> str:
        lines = [f"url       {p.url or '-'}", f"path_url  {p.path_url}"]
        if p.token:
            lines += [f"token     {p.token}", f"expires   {when(p.expires_at)}"]
            lines.append(f"open      {p.path_url}?sandboxd_token={p.token}")
        return "\n".join(lines)

    emit(args, p, text)
    return 0


async def cmd_unpublish(client: SandboxClient, args: argparse.Namespace) -> int:
    await client.unpublish_port(args.session, args.port)
    return 0


async def cmd_ports(client: SandboxClient, args: argparse.Namespace) -> int:
    previews = [p async for p in client.list_ports(args.session)]

    def text() -> str:
        rows = [("PORT", "PUBLIC", "EXPIRES", "PATH_URL")]
        rows += [
            (str(p.port), "yes" if p.public else "no", when(p.expires_at), p.path_url)
            for p in previews
        ]
        return table(rows)

    emit(args, previews, text)
    return 0


def add_preview_commands(sub: Any) -> None:
    p = sub.add_parser("publish", help="publish a session's port: its preview URLs and token")
    p.set_defaults(func=cmd_publish)
    p.add_argument("session")
    p.add_argument("port", type=int)
    p.add_argument("--ttl", type=float, metavar="SECONDS", help="token lifetime (default 1 h)")
    p.add_argument("--public", action="store_true", help="no token (needs the operator's grant)")
    p = sub.add_parser("unpublish", help="close a port's preview and revoke its tokens")
    p.set_defaults(func=cmd_unpublish)
    p.add_argument("session")
    p.add_argument("port", type=int)
    p = sub.add_parser("ports", help="a session's published ports")
    p.set_defaults(func=cmd_ports)
    p.add_argument("session")
