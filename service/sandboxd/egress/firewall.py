"""The host filter of a session network: from its bridge, only the proxy port is reachable.

A container on an Internal network can still reach every port the host listens on through the
gateway address. One chain per bridge in the filter table's INPUT path accepts TCP to the
proxy's address and port and drops everything else (IPv6 entirely, so link-local addresses of
the bridge lead nowhere either). Commands run through asyncio subprocesses with `-w`.
"""

from __future__ import annotations

import asyncio
import logging

log = logging.getLogger(__name__)

TOOLS = ("iptables", "ip6tables")
_TIMEOUT_S = 20.0


class FirewallError(Exception):
    pass


def chain_name(bridge: str) -> str:
    return f"SBX-{bridge}"


async def _run(*argv: str) -> tuple[int, str]:
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
    except OSError as exc:
        return 127, str(exc)
    try:
        async with asyncio.timeout(_TIMEOUT_S):
            out, _ = await proc.communicate()
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return 124, "timed out"
    return proc.returncode or 0, out.decode(errors="replace").strip()[:500]


async def available() -> tuple[bool, str]:
    """Whether both tools can read the filter table here (root, modules, binaries)."""
    for tool in TOOLS:
        code, out = await _run(tool, "-w", "-t", "filter", "-S", "INPUT")
        if code != 0:
            return False, f"{tool}: {out or f'exit {code}'}"
    return True, ""


async def _must(*argv: str) -> None:
    code, out = await _run(*argv)
    if code != 0:
        raise FirewallError(f"{' '.join(argv)}: {out or f'exit {code}'}")


async def install(bridge: str, gateway: str, port: int) -> None:
    """Create (or refresh) the chain of `bridge` and hook it first into INPUT; idempotent."""
    chain = chain_name(bridge)
    for tool in TOOLS:
        await _run(tool, "-w", "-N", chain)  # exists already: fine, flushed next
        await _must(tool, "-w", "-F", chain)
        if tool == "iptables":
            await _must(
                tool, "-w", "-A", chain, "-p", "tcp", "-d", gateway, "--dport", str(port),
                "-j", "ACCEPT",
            )  # fmt: skip
        await _must(tool, "-w", "-A", chain, "-j", "DROP")
        code, _ = await _run(tool, "-w", "-C", "INPUT", "-i", bridge, "-j", chain)
        if code != 0:
            await _must(tool, "-w", "-I", "INPUT", "1", "-i", bridge, "-j", chain)


async def remove(bridge: str) -> None:
    """Unhook and delete the chain of `bridge`; missing pieces are not errors."""
    chain = chain_name(bridge)
    for tool in TOOLS:
        for _ in range(16):  # every copy of the hook, should one have been doubled
            code, _out = await _run(tool, "-w", "-D", "INPUT", "-i", bridge, "-j", chain)
            if code != 0:
                break
        await _run(tool, "-w", "-F", chain)
        await _run(tool, "-w", "-X", chain)
