"""sandboxctl audit (the audit log, filtered, oldest first) and sandboxctl watch (session
events, or with a PATH a workspace folder's changes, live); JSON Lines with -o json."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from typing import TYPE_CHECKING, Any

from sandboxd_client.cli_output import pairs, table, wants_json, when

if TYPE_CHECKING:  # imported when a command runs: the parser needs none of them
    from sandboxd_client.client import SandboxClient


def _time(text: str | None) -> dt.datetime | None:
    """ISO 8601 (`2026-01-02T03:04:05Z`), or an age back from now (`90s`, `15m`, `2h`, `7d`)."""
    if not text:
        return None
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    if text[-1:] in units and text[:-1].replace(".", "", 1).isdigit():
        return dt.datetime.now(dt.UTC) - dt.timedelta(seconds=float(text[:-1]) * units[text[-1]])
    try:
        value = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise SystemExit(f"sandboxctl: {text!r} is neither ISO 8601 nor an age like 15m") from None
    return value if value.tzinfo else value.replace(tzinfo=dt.UTC)


def _summary(attributes: Any) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(attributes.items()) if k != "method")


def add_audit_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--session", default="", help="only this session's events")
    p.add_argument("--kind", action="append", default=[], help="only this kind (repeat)")
    p.add_argument("--since", help="ISO 8601 time or age (15m, 2h, 7d)")
    p.add_argument("--until", help="ISO 8601 time or age")
    p.add_argument("--tenant", default="", help="another tenant's events (admin)")
    p.add_argument("--limit", type=int, default=0, help="at most this many events")


async def cmd_audit(client: SandboxClient, args: argparse.Namespace) -> int:
    from sandboxd_client.models import as_dict

    rows = [("TIME", "TENANT", "SESSION", "KIND", "DETAILS")]
    n = 0
    async for event in client.list_audit_events(
        session_id=args.session,
        kinds=args.kind,
        start_time=_time(args.since),
        end_time=_time(args.until),
        tenant=args.tenant,
    ):
        if wants_json(args):
            print(json.dumps(as_dict(event), sort_keys=True), flush=True)
        else:
            rows.append(
                (
                    when(event.time),
                    event.tenant,
                    event.session_id or "-",
                    event.kind,
                    _summary(event.attributes),
                )
            )
        n += 1
        if args.limit and n >= args.limit:
            break
    if not wants_json(args):
        print(table(rows))
    return 0


def add_watch_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("session", nargs="?", help="one session (else every session of yours)")
    p.add_argument(
        "path", nargs="?", help="a directory of the session's workspace: its changes instead"
    )
    p.add_argument("--recursive", action="store_true", help="with PATH: every folder beneath")
    p.add_argument("--label", action="append", metavar="KEY=VALUE", help="filter (repeat)")
    p.add_argument("--after", type=int, default=0, metavar="SEQUENCE", help="replay after this")
    p.add_argument("--count", type=int, default=0, help="stop after this many events")


async def cmd_watch(client: SandboxClient, args: argparse.Namespace) -> int:
    """Session events as they happen; each line starts with the sequence to resume after.
    With a PATH (or --recursive): the changes beneath that workspace folder instead."""
    from sandboxd_client.models import as_dict

    if args.session and (args.path is not None or args.recursive):
        return await cmd_watch_dir(client, args)
    if args.session:
        events = client.watch_session(args.session, after_sequence=args.after)
    else:
        events = client.watch_sessions(pairs(args.label, "--label"), after_sequence=args.after)
    n = 0
    async for e in events:
        if wants_json(args):
            print(json.dumps(as_dict(e), sort_keys=True), flush=True)
        else:
            details = " ".join(f"{k}={v}" for k, v in sorted(e.attributes.items()))
            print(
                f"{e.sequence} {when(e.time)} {e.session_id} {e.kind} {e.state} "
                f"{e.message} {details}".rstrip(),
                flush=True,
            )
        n += 1
        if args.count and n >= args.count:
            break
    return 0


async def cmd_watch_dir(client: SandboxClient, args: argparse.Namespace) -> int:
    """One line per change: sequence, kind, path (old -> new for a rename), type."""
    from sandboxd_client.models import as_dict

    session = client.session(args.session)
    n = 0
    async with session.watching(args.path or "", recursive=args.recursive) as events:
        # On stderr, so that stdout stays one line per event: changes from now on are shown.
        print(f"watching {args.path or '/workspace'}", file=sys.stderr, flush=True)
        async for e in events:
            if wants_json(args):
                print(json.dumps(as_dict(e), sort_keys=True), flush=True)
            else:
                where = f"{e.old_path} -> {e.path}" if e.old_path else e.path
                print(f"{e.sequence} {e.kind} {where} {e.type}".rstrip(), flush=True)
            n += 1
            if args.count and n >= args.count:
                break
    return 0
