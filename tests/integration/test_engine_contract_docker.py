"""The engine contract against the Docker adapter on the real engine: the same scenarios the
fake passes in tests/unit/test_engine_contract_fake.py, so the fake stays honest."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mountcheck
import pytest
from conftest import HELPER
from engine_contract import SCENARIOS, SESSION_SCENARIOS, new_owner
from sandboxd.agent.router import ChannelSettings
from sandboxd.archive import ArchiveIO
from sandboxd.commands.sandbox import SandboxSide, sandbox_side
from sandboxd.engine import DockerEngine
from sandboxd.files import Files
from session_stack import session_stack


def watched(owner: str) -> str:
    """Its containers are checked for bind mounts like those of a server (tests/mountcheck.py)."""
    mountcheck.watch_owner(owner)
    return owner


@dataclass(frozen=True)
class Docker:
    engine: DockerEngine
    side: SandboxSide  # the server's sandbox side over it: the lifecycle and the commands


@pytest.fixture(params=["agent", "docker-exec"])
async def docker(request: pytest.FixtureRequest) -> AsyncIterator[Docker]:
    """Both ways commands run: over each sandbox's agent channel, and `docker exec`."""
    agent = request.param == "agent"
    async with DockerEngine(helper_path=HELPER, keeper_user="65533:65533", agent=agent) as engine:
        side = sandbox_side(engine, engine, ChannelSettings() if agent else None)
        try:
            yield Docker(engine, side)
        finally:
            await side.close()


async def _remove_all(docker: Docker, owner: str) -> None:
    for left in await docker.side.engine.list_sandboxes(owner):
        await docker.side.engine.remove_sandbox(left.sandbox_id)


@pytest.mark.parametrize("name", sorted(SCENARIOS))
async def test_docker_engine_keeps_the_contract(docker: Docker, name: str) -> None:
    owner = watched(new_owner())
    try:
        await SCENARIOS[name](docker.side.engine, docker.side.commands, owner)
    finally:
        await _remove_all(docker, owner)


@pytest.mark.parametrize("name", sorted(SESSION_SCENARIOS))
async def test_sessions_over_the_docker_engine(docker: Docker, name: str, tmp_path: Path) -> None:
    owner = watched(new_owner())

    side = docker.side

    def archive(engine: Any) -> ArchiveIO:
        return ArchiveIO(engine, Files(side.commands))

    try:
        async with session_stack(
            tmp_path, engine=side.engine, commands=side.commands, archive=archive, owner=owner
        ) as st:
            await SESSION_SCENARIOS[name](st)
    finally:
        await _remove_all(docker, owner)
