"""The engine contract against the in-memory fake (its real-engine twin is in integration/)."""

from __future__ import annotations

import pytest
from engine_contract import SCENARIOS, new_owner
from fakes import FakeEngine


@pytest.mark.parametrize("name", sorted(SCENARIOS))
async def test_fake_engine_keeps_the_contract(name: str) -> None:
    await SCENARIOS[name](FakeEngine(), new_owner())
