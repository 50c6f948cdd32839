"""Isolation tiers on the engine fake: the default, asking for gvisor with and without a runsc
runtime, the operator's allowed set, ALLOWLIST under gvisor, persistence and the profile's
Runtime. No Docker."""

from __future__ import annotations

from pathlib import Path

import pytest
from fakes import FakeCommands, FakeEngine
from sandboxd.engine.docker_profile import conforms, container_config
from sandboxd.engine.protocol import SandboxRequest
from sandboxd.errors import AlreadyExists, ConfigError, FailedPrecondition
from sandboxd.isolation import (
    Isolation,
    IsolationTiers,
    check_isolation,
    parse_tier,
    parse_tiers,
)
from sandboxd.reasons import Reason
from sandboxd.sessions import CreateSessionInput
from session_stack import session_stack

BOTH = {Isolation.RUNC, Isolation.GVISOR}


async def _tiers(engine: FakeEngine, default: Isolation = Isolation.RUNC, allowed=BOTH):  # type: ignore[no-untyped-def]
    tiers = IsolationTiers(default, allowed)
    await tiers.refresh(engine)
    return tiers


async def test_default_is_runc_and_echoed(tmp_path: Path) -> None:
    engine = FakeEngine()
    async with session_stack(tmp_path, engine=engine, tiers=await _tiers(engine)) as st:
        s = await st.sessions.create(CreateSessionInput(session_id="a"))
        assert s.spec.isolation is Isolation.RUNC
        assert st.engine.sandboxes[s.container_id].request.spec.isolation is Isolation.RUNC


async def test_gvisor_when_the_engine_has_it(tmp_path: Path) -> None:
    engine = FakeEngine()
    engine.tiers.add(Isolation.GVISOR)
    async with session_stack(tmp_path, engine=engine, tiers=await _tiers(engine)) as st:
        g = await st.sessions.create(CreateSessionInput(session_id="g", isolation=Isolation.GVISOR))
        r = await st.sessions.create(CreateSessionInput(session_id="r", isolation=Isolation.RUNC))
        assert st.engine.sandboxes[g.container_id].request.spec.isolation is Isolation.GVISOR
        # The tier is part of what the session is: fingerprint and the stored record.
        assert g.fingerprint != r.fingerprint
        assert (await st.sessions.get("g")).spec.isolation is Isolation.GVISOR
        # A retried create of the same id with another tier is a different session.
        with pytest.raises(AlreadyExists) as other:
            await st.sessions.create(CreateSessionInput(session_id="g", isolation=Isolation.RUNC))
        assert other.value.reason == Reason.SESSION_ALREADY_EXISTS


async def test_gvisor_without_runsc_is_refused_never_downgraded(tmp_path: Path) -> None:
    engine = FakeEngine()  # runc only
    tiers = await _tiers(engine)
    assert tiers.available() == [Isolation.RUNC]
    async with session_stack(tmp_path, engine=engine, tiers=tiers) as st:
        with pytest.raises(FailedPrecondition) as refused:
            await st.sessions.create(CreateSessionInput(session_id="g", isolation=Isolation.GVISOR))
        assert refused.value.reason == Reason.ISOLATION_UNAVAILABLE
        assert "create_sandbox" not in st.engine.calls
        assert st.engine.sandboxes == {} and await st.store.get("g") is None
        # The operator registers runsc; the next refresh (the engine came back) offers it.
        engine.tiers.add(Isolation.GVISOR)
        await tiers.refresh(engine)
        assert tiers.available() == [Isolation.RUNC, Isolation.GVISOR]
        g = await st.sessions.create(CreateSessionInput(session_id="g", isolation=Isolation.GVISOR))
        assert g.spec.isolation is Isolation.GVISOR


async def test_operator_makes_gvisor_the_only_tier(tmp_path: Path) -> None:
    engine = FakeEngine()
    engine.tiers.add(Isolation.GVISOR)
    tiers = await _tiers(engine, Isolation.GVISOR, {Isolation.GVISOR})
    assert tiers.available() == [Isolation.GVISOR]
    async with session_stack(tmp_path, engine=engine, tiers=tiers) as st:
        s = await st.sessions.create(CreateSessionInput(session_id="d"))
        assert s.spec.isolation is Isolation.GVISOR
        with pytest.raises(FailedPrecondition) as refused:
            await st.sessions.create(CreateSessionInput(session_id="r", isolation=Isolation.RUNC))
        assert refused.value.reason == Reason.ISOLATION_NOT_ALLOWED


def test_allowlist_networking_is_allowed_under_every_tier() -> None:
    # No sandbox has a network interface: egress goes over the agent's channel, gVisor too.
    tiers = IsolationTiers(Isolation.RUNC, BOTH)
    tiers._engine = frozenset(BOTH)
    assert check_isolation(Isolation.GVISOR, tiers) is Isolation.GVISOR
    assert check_isolation(Isolation.RUNC, tiers) is Isolation.RUNC
    assert check_isolation(None, None) is Isolation.RUNC
    with pytest.raises(FailedPrecondition):
        check_isolation(Isolation.GVISOR, None)


def test_settings_are_checked() -> None:
    assert parse_tiers(" runc , GVISOR ") == BOTH
    assert parse_tier("gvisor") is Isolation.GVISOR
    for bad in ("", " , ", "kvm", "runc,firecracker"):
        with pytest.raises(ConfigError):
            parse_tiers(bad)
    with pytest.raises(ConfigError, match="not in isolation_allowed"):
        IsolationTiers(Isolation.GVISOR, {Isolation.RUNC})


def test_the_profile_names_the_runtime_and_checks_it(tmp_path: Path) -> None:
    from sandboxd.config import Config
    from sandboxd.pool import default_spec

    spec = default_spec(Config(data_dir=tmp_path))
    request = SandboxRequest(spec=spec, owner_id="o", name="n")
    runsc = container_config(
        request, helper_volume="sandboxd-helper-test", keeper_user="1:1", runtime="runsc"
    )
    runc = container_config(
        request, helper_volume="sandboxd-helper-test", keeper_user="1:1", runtime="runc"
    )
    assert runsc["HostConfig"]["Runtime"] == "runsc"
    # A sandbox moved to another runtime no longer conforms (tampering check).
    assert conforms(runsc, {"Config": runsc, "HostConfig": runsc["HostConfig"]})
    assert not conforms(runsc, {"Config": runsc, "HostConfig": runc["HostConfig"]})


def test_under_gvisor_pids_is_the_sandbox_users_nproc(tmp_path: Path) -> None:
    import dataclasses

    from sandboxd.config import Config
    from sandboxd.pool import default_spec

    spec = dataclasses.replace(default_spec(Config(data_dir=tmp_path)), isolation=Isolation.GVISOR)
    request = SandboxRequest(spec=spec, owner_id="o", name="n")
    host = container_config(
        request, helper_volume="sandboxd-helper-test", keeper_user="1:1", runtime="runsc"
    )
    pids = spec.limits.pids
    assert {"Name": "nproc", "Soft": pids, "Hard": pids} in host["HostConfig"]["Ulimits"]
    # The host cgroup keeps a cap, sized for the Sentry's own threads (64 crashed it).
    assert host["HostConfig"]["PidsLimit"] > 1000


def test_a_tenant_can_be_held_to_gvisor_in_the_tokens_file(tmp_path: Path) -> None:
    import asyncio

    from sandboxd import tenancy

    digest = "a" * 64
    path = tmp_path / "tokens"
    path.write_text(f"ci {digest} isolation=gvisor\nops {'b' * 64} isolation=runc,gvisor\n")
    table = tenancy.load_tokens(path)
    assert table.grants_of("ci").isolation == "gvisor"
    tiers = IsolationTiers(Isolation.RUNC, BOTH)
    tiers._engine = frozenset(BOTH)

    async def as_tenant(tenant: str, asked: Isolation | None) -> Isolation:
        async def call() -> Isolation:
            tenancy.use_tenant(tenant, table.grants_of(tenant))
            return check_isolation(asked, tiers)

        return await asyncio.create_task(call())

    async def main() -> None:
        assert await as_tenant("ci", None) is Isolation.GVISOR  # the tenant's default
        with pytest.raises(FailedPrecondition) as refused:
            await as_tenant("ci", Isolation.RUNC)
        assert refused.value.reason == Reason.ISOLATION_NOT_ALLOWED
        assert await as_tenant("ops", None) is Isolation.RUNC
        assert await as_tenant("ops", Isolation.GVISOR) is Isolation.GVISOR

    asyncio.run(main())
    path.write_text(f"ci {digest} isolation=kvm\n")
    with pytest.raises(ConfigError, match="isolation"):
        tenancy.load_tokens(path)


async def test_the_contract_scenario_with_a_gvisor_fake() -> None:
    from engine_contract import isolation, new_owner

    engine = FakeEngine()
    engine.tiers.add(Isolation.GVISOR)
    await isolation(engine, FakeCommands(engine), new_owner())
    assert "start_sandbox" in engine.calls
