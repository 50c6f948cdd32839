"""The engine contract against the Docker adapter on the real engine: the same scenarios the
fake passes in tests/unit/test_engine_contract.py, so the fake stays honest."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from conftest import HELPER
from engine_contract import SCENARIOS, new_owner
from sandboxd.engine import DockerEngine


@pytest.fixture
async def docker() -> AsyncIterator[DockerEngine]:
    async with DockerEngine(helper_path=HELPER, keeper_user="65533:65533") as engine:
        yield engine


@pytest.mark.parametrize("name", sorted(SCENARIOS))
async def test_docker_engine_keeps_the_contract(docker: DockerEngine, name: str) -> None:
    owner = new_owner()
    try:
        await SCENARIOS[name](docker, owner)
    finally:
        for left in await docker.list_sandboxes(owner):
            await docker.remove_sandbox(left.sandbox_id)
