"""sandboxctl's network commands: a session's egress policy and its egress log."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from sandboxd_client.cli_output import emit, table, when

if TYPE_CHECKING:  # imported when a command runs: the parser needs none of them
    from sandboxd_client.client import SandboxClient
    from sandboxd_client.models import NetworkPolicy


def policy_from(args: argparse.Namespace) -> NetworkPolicy | None:
    """`--domain`/`--port` (repeatable) make an ALLOWLIST policy; none leaves the default."""
    from sandboxd_client.models import NetworkPolicy

    domains, ports = tuple(args.domain or ()), tuple(args.port or ())
    if not domains and not ports and not args.allow_private_networks:
        return None
    return NetworkPolicy("ALLOWLIST", domains, ports, args.allow_private_networks)


def add_policy_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--domain", action="append", metavar="NAME", help="allow a domain (repeat)")
    p.add_argument("--port", action="append", type=int, metavar="PORT", help="allow a port")
    p.add_argument("--allow-private-networks", action="store_true")


async def cmd_network(client: SandboxClient, args: argparse.Namespace) -> int:
    from sandboxd_client.models import NetworkPolicy

    policy = policy_from(args) or NetworkPolicy()
    session = await client.session(args.session).update_network_policy(policy)
    network = session.info.network
    emit(args, network, lambda: " ".join((network.mode, *network.allowed_domains)))
    return 0


async def cmd_egress(client: SandboxClient, args: argparse.Namespace) -> int:
    events = [e async for e in client.session(args.session).egress_events()]

    def text() -> str:
        rows = [("SEQ", "TIME", "VERDICT", "METHOD", "HOST", "PORT", "REASON", "UP", "DOWN")]
        for e in events:
            rows.append(
                (
                    str(e.seq),
                    when(e.time),
                    e.verdict,
                    e.method,
                    e.host,
                    str(e.port),
                    e.reason,
                    str(e.bytes_up),
                    str(e.bytes_down),
                )
            )
        return table(rows)

    emit(args, events, text)
    return 0
