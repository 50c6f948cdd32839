"""What the server tells the agent's guard (agent/memory.py; helper/agent_guard.c; SECURITY.md,
"Memory of the agent"): under gVisor only, the container's memory limit, the Sentry's share and
the session's pids in every HELLO; the agent's budget leaves the Sentry's share out; a refusal
of the guard reaches the caller as SANDBOX_LIMIT_REACHED."""

from __future__ import annotations

import asyncio

import agent_wire as w
from agent_peer import ScriptedAgent
from sandboxd.agent import memory
from sandboxd.agent.channel import Channel
from sandboxd.agent.streams import open_refused
from sandboxd.errors import ResourceExhausted
from sandboxd.reasons import Reason

MiB = 1024 * 1024
GVISOR = {
    "Memory": 256 * MiB,
    "Runtime": "runsc",
    "Tmpfs": {"/workspace": f"rw,size={64 * MiB}"},
    "Ulimits": [{"Name": "core", "Soft": 0, "Hard": 0}, {"Name": "nproc", "Soft": 64, "Hard": 64}],
}


def test_the_guard_is_gvisors_only_with_the_containers_limits() -> None:
    assert memory.guard_of_container(GVISOR) == {
        "memory": 256 * MiB,
        "sentry": memory.SENTRY_BASE_BYTES,
        "task": memory.SENTRY_TASK_BYTES,
        "pids": 64,
    }
    assert memory.guard_of_container({**GVISOR, "Runtime": "runc"}) == {}
    assert memory.guard_of_container({"Runtime": "runsc"}) == {}  # no limit to keep


def test_the_gvisor_budget_leaves_the_sentrys_share_to_it() -> None:
    """A sandbox of 128 MiB with its 64 MiB workspace and 64 pids: a quarter (32 MiB) of rings,
    the workspace full and the Sentry's 28 MiB for 32 tasks came to 150 MiB on the host, and the
    sandbox ended; the budget now leaves the Sentry's share at the session's pids out."""
    small = memory.agent_ring_budget(128 * MiB, 64 * MiB, gvisor=True, pids=64)
    assert small == memory.AGENT_MIN_BUDGET
    assert memory.agent_ring_budget(128 * MiB, 64 * MiB, gvisor=True) == 32 * MiB - 12 * MiB
    assert memory.agent_ring_budget(256 * MiB, 64 * MiB, gvisor=True, pids=64) == 64 * MiB
    assert memory.agent_ring_budget(128 * MiB, 64 * MiB, pids=64) == 32 * MiB  # runc: as before
    assert memory.budget_of_container({**GVISOR, "Memory": 128 * MiB}) == small


async def test_hello_carries_the_guard() -> None:
    agent = ScriptedAgent()
    guard = memory.guard_of_container(GVISOR)
    channel = Channel(agent.transport, name="test", resend_s=0.05, guard=guard)
    starting = asyncio.create_task(channel.start())
    hello = (await agent.recv_type(w.HELLO)).json()
    assert hello["guard"] == guard
    agent.send_json(w.HELLO_OK, 0, {"version": 1, "nonce": hello["nonce"], "pid": 1})
    await asyncio.wait_for(starting, 2)
    await channel.close()


def test_a_refusal_of_the_guard_names_the_sandboxs_limit() -> None:
    err = open_refused("exec", "LIMIT", "the sandbox's process limit is reached: 64 of 64")
    assert isinstance(err, ResourceExhausted)
    assert err.reason == Reason.SANDBOX_LIMIT_REACHED
    assert "process limit is reached" in str(err)
