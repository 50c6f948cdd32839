"""The engine contract against the in-memory fake (its real-engine twin is in integration/)."""

from __future__ import annotations

from pathlib import Path

import pytest
from engine_contract import SCENARIOS, SESSION_SCENARIOS, new_owner
from fakes import FakeCommands, FakeEngine
from session_stack import session_stack


@pytest.mark.parametrize("name", sorted(SCENARIOS))
async def test_fake_engine_keeps_the_contract(name: str) -> None:
    engine = FakeEngine()
    await SCENARIOS[name](engine, FakeCommands(engine), new_owner())


@pytest.mark.parametrize("name", sorted(SESSION_SCENARIOS))
async def test_sessions_over_the_fake_engine(name: str, tmp_path: Path) -> None:
    async with session_stack(tmp_path, owner=new_owner()) as st:
        await SESSION_SCENARIOS[name](st)
