"""The audit log's domain without a server: the store's filters and paging, the writer's
acknowledge-after-commit promise and batching, retention by age and size, the JSON Lines export,
the tenant scope of a listing, the egress sink, and trace context in log lines."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sandboxd import errors
from sandboxd.api.audit_interceptor import trace_id_of
from sandboxd.audit import AuditEvent, AuditLog, AuditQuery, AuditStore, AuditWriter
from sandboxd.audit.egress import egress_sink
from sandboxd.egress.audit import AuditLog as EgressAuditLog
from sandboxd.events import EventHub
from sandboxd.logging_setup import CURRENT_TRACE, JsonFormatter, TraceFilter
from sandboxd.reasons import Reason


def _event(tenant: str = "alpha", session: str = "s1", kind: str = "command", **attrs: object):
    return AuditEvent.of(kind, time=time.time(), tenant=tenant, session_id=session, **attrs)


async def test_writer_acknowledges_after_commit_with_ids(tmp_path: Path) -> None:
    async with AuditStore(tmp_path / "audit.db") as store:
        writer = AuditWriter(store)
        writer.start()
        written = await asyncio.gather(*(writer.record(_event(n=i)) for i in range(50)))
        assert sorted(e.id for e in written) == list(range(1, 51))
        # Acknowledged means committed: a second connection sees every event.
        async with AuditStore(tmp_path / "audit.db") as other:
            seen = await other.list(AuditQuery(tenant="alpha", limit=100))
        assert {e.attributes["n"] for e in seen} == {str(i) for i in range(50)}
        await writer.close()


async def test_a_failed_commit_fails_the_waiting_calls(tmp_path: Path) -> None:
    store = AuditStore(tmp_path / "audit.db")
    async with store:
        writer = AuditWriter(store)
        writer.start()
        await store.db.execute("DROP TABLE audit_events")
        with pytest.raises(errors.Unavailable):
            await writer.record(_event())
        await writer.close()


async def test_disabled_writer_records_nothing_and_lists_nothing() -> None:
    writer = AuditWriter(None)
    assert not writer.enabled
    event = _event()
    assert await writer.record(event) is event
    writer.record_nowait(event)
    assert await AuditLog(None).list(caller="alpha", caller_is_admin=False) == ([], "")


async def test_listing_filters_pages_and_tenant_scope(tmp_path: Path) -> None:
    async with AuditStore(tmp_path / "audit.db") as store:
        t0 = time.time()
        events = [
            AuditEvent.of("command", time=t0 + i, tenant="alpha", session_id=f"s{i % 2}", n=i)
            for i in range(7)
        ] + [AuditEvent.of("refused", time=t0, tenant="beta", reason="X")]
        await store.append(events)
        log = AuditLog(store)

        page, token = await log.list(caller="alpha", caller_is_admin=False, page_size=3)
        assert [e.attributes["n"] for e in page] == ["0", "1", "2"] and token
        page2, token2 = await log.list(
            caller="alpha", caller_is_admin=False, page_size=3, page_token=token
        )
        assert [e.attributes["n"] for e in page2] == ["3", "4", "5"]
        last, end = await log.list(
            caller="alpha", caller_is_admin=False, page_size=3, page_token=token2
        )
        assert [e.attributes["n"] for e in last] == ["6"] and end == ""

        s1, _ = await log.list(caller="alpha", caller_is_admin=False, session_id="s1")
        assert [e.attributes["n"] for e in s1] == ["1", "3", "5"]
        window, _ = await log.list(
            caller="alpha", caller_is_admin=False, start_time=t0 + 2, end_time=t0 + 4
        )
        assert [e.attributes["n"] for e in window] == ["2", "3"]
        none, _ = await log.list(caller="alpha", caller_is_admin=False, kinds=["refused"])
        assert none == []

        with pytest.raises(errors.PermissionDenied) as denied:
            await log.list(caller="alpha", caller_is_admin=False, tenant="beta")
        assert denied.value.reason == Reason.AUDIT_TENANT_NOT_ALLOWED
        theirs, _ = await log.list(caller="root", caller_is_admin=True, tenant="beta")
        assert [e.kind for e in theirs] == ["refused"]

        with pytest.raises(errors.InvalidArgument) as bad_kind:
            await log.list(caller="alpha", caller_is_admin=False, kinds=["nope"])
        assert bad_kind.value.reason == Reason.INVALID_AUDIT_KIND
        with pytest.raises(errors.InvalidArgument) as bad_range:
            await log.list(caller="alpha", caller_is_admin=False, start_time=5, end_time=4)
        assert bad_range.value.reason == Reason.INVALID_TIME_RANGE
        for forged in ("bm9wZQ==", "!!", "MTIzNDU2Nzg5MDEyMzQ1Njc4OTAxMjM0"):
            with pytest.raises(errors.InvalidArgument) as bad_token:
                await log.list(caller="alpha", caller_is_admin=False, page_token=forged)
            assert bad_token.value.reason == Reason.INVALID_PAGE_TOKEN


async def test_retention_prunes_by_age_then_by_size(tmp_path: Path) -> None:
    async with AuditStore(tmp_path / "audit.db") as store:
        now = time.time()
        old = [AuditEvent.of("command", time=now - 7200, tenant="a", n=i) for i in range(5)]
        new = [AuditEvent.of("command", time=now, tenant="a", blob="x" * 500) for _ in range(10)]
        await store.append(old + new)
        writer = AuditWriter(store, max_age_s=3600, max_bytes=10**9)
        assert await writer.prune() == 5
        left = await store.list(AuditQuery(tenant="a", limit=100))
        assert len(left) == 10 and all("blob" in e.attributes for e in left)

        small = AuditWriter(store, max_age_s=3600, max_bytes=2000)
        assert await small.prune() > 0
        kept = await store.list(AuditQuery(tenant="a", limit=100))
        assert 0 < len(kept) < 10
        assert [e.id for e in kept] == [e.id for e in left][-len(kept) :]  # newest stay


async def test_export_appends_one_json_object_per_line(tmp_path: Path) -> None:
    export = tmp_path / "out" / "audit.jsonl"
    async with AuditStore(tmp_path / "audit.db") as store:
        writer = AuditWriter(store, export_path=export)
        writer.start()
        await writer.record(_event(argv=["echo", "hi"]))
        await asyncio.gather(*(writer.record(_event(n=i)) for i in range(20)))
        await writer.close()
        writer2 = AuditWriter(store, export_path=export)  # a restart appends, never truncates
        writer2.start()
        await writer2.record(_event(kind="lifecycle"))
        await writer2.close()
    docs = [json.loads(line) for line in export.read_text().splitlines()]
    assert len(docs) == 22
    assert json.loads(docs[0]["attributes"]["argv"]) == ["echo", "hi"]
    assert [int(d["id"]) for d in docs] == list(range(1, 23))


async def test_export_lines_survive_short_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write(2) may take fewer bytes than given: the rest must follow, or the next batch
    lands after half a line."""
    real_write = os.write

    def short_write(fd: int, data: bytes | memoryview) -> int:
        return real_write(fd, bytes(data[:7]))

    monkeypatch.setattr("sandboxd.audit.writer.os.write", short_write)
    export = tmp_path / "audit.jsonl"
    async with AuditStore(tmp_path / "audit.db") as store:
        writer = AuditWriter(store, export_path=export)
        writer.start()
        await asyncio.gather(*(writer.record(_event(n=i)) for i in range(5)))
        await writer.record(_event(n=5))
        await writer.close()
    assert [json.loads(line)["attributes"]["n"] for line in export.read_text().splitlines()] == [
        str(i) for i in range(6)
    ]


async def test_egress_decisions_reach_the_writer_without_blocking(tmp_path: Path) -> None:
    async with AuditStore(tmp_path / "audit.db") as store:
        writer = AuditWriter(store)
        writer.start()
        hub = EventHub(first_sequence=1)
        log = EgressAuditLog("alpha.s1", on_event=egress_sink(writer, hub), tenant="alpha")
        log.record(method="CONNECT", host="example.com", port=443, allowed=True)
        log.record(method="GET", host="evil.test", port=80, allowed=False, reason="NOT_ALLOWED")
        log.record(method="CONNECT", host="example.com", port=443, allowed=True, ended="closed")
        await writer.close()
        events = await store.list(AuditQuery(tenant="alpha", limit=10))
    assert [(e.kind, e.attributes["host"], e.attributes["verdict"]) for e in events] == [
        ("egress", "example.com", "allowed"),
        ("egress", "evil.test", "refused"),
    ]
    assert events[1].attributes["rule"] == "NOT_ALLOWED"
    assert events[0].session_id == "alpha.s1"
    # Only the refusal goes to the session's event feed.
    watch = hub.watch("alpha", 0, lambda e: True)
    (refused,) = [await asyncio.wait_for(anext(watch), 2)]
    assert refused.kind == "EGRESS_REFUSED" and refused.attributes["host"] == "evil.test"
    await watch.aclose()


def test_attributes_are_clipped_and_none_dropped() -> None:
    e = AuditEvent.of("command", time=0, tenant="t", argv=["x" * 10_000], signal=None)
    assert "signal" not in e.attributes
    assert len(e.attributes["argv"]) < 4200 and e.attributes["argv"].endswith("...(cut)")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "4bf92f3577b34da6a3ce929d0e0e4736",
        ),
        (
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "4bf92f3577b34da6a3ce929d0e0e4736",
        ),
        ("00-00000000000000000000000000000000-00f067aa0ba902b7-01", ""),
        ("00-4bf92f3577b34da6-00f067aa0ba902b7-01", ""),
        ("garbage", ""),
        ("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\nx", ""),
    ],
)
def test_traceparent_parsing(value: str, expected: str) -> None:
    assert trace_id_of([("traceparent", value)]) == expected
    assert trace_id_of([("other", value)]) == ""
    assert trace_id_of(None) == ""


def test_log_lines_of_a_traced_call_carry_its_trace_id() -> None:
    record = logging.makeLogRecord({"msg": "hello", "levelname": "INFO", "name": "x"})
    token = CURRENT_TRACE.set("abc123")
    try:
        assert TraceFilter().filter(record)
    finally:
        CURRENT_TRACE.reset(token)
    assert json.loads(JsonFormatter().format(record))["trace_id"] == "abc123"
    untraced = logging.makeLogRecord({"msg": "hello", "levelname": "INFO", "name": "x"})
    TraceFilter().filter(untraced)
    assert "trace_id" not in json.loads(JsonFormatter().format(untraced))


@pytest.mark.parametrize(
    "created",
    [
        1_764_806_400.0,  # a second's start
        1_764_806_400.0004999,
        1_764_806_400.9994999,
        1_764_806_400.9999996,  # rounds into the next second
        1_764_806_459.1239996,  # rounds across a millisecond
        1_798_761_599.999,  # the last millisecond of a year
        1_796_389_647.4307985,  # an ordinary moment
    ],
)
def test_json_time_is_the_records_utc_time_to_the_millisecond(created: float) -> None:
    """The time's text is made once per second, not by a datetime per line: it must be the
    one `datetime` writes, at every edge of its rounding (one formatter, lines in order)."""
    formatter = JsonFormatter()
    for at in (created - 1.0005, created, created + 0.0004, created):
        record = logging.makeLogRecord({"msg": "m", "levelname": "INFO", "name": "x"})
        record.created = at
        expected = datetime.fromtimestamp(at, tz=UTC).isoformat(timespec="milliseconds")
        assert json.loads(formatter.format(record))["time"] == expected


def test_per_tenant_metrics_have_no_session_label_and_bounded_tenants() -> None:
    from sandboxd import domain_events as de
    from sandboxd import metrics as metrics_module
    from sandboxd.metrics import Metrics

    m = Metrics()
    m.observe(
        de.CommandExited(
            "alpha", "s1", "p1", ("ls",), "/workspace", "run", 0, "", False, 0.5,
            stdout_bytes=10, stderr_bytes=2,
        )
    )  # fmt: skip
    m.observe(de.EgressDecided("alpha", "s1", 0.0, "egress", "GET", "x.test", 443, False, ""))
    m.observe(de.CallRefused("beta", "", "PERMISSION_DENIED", "X"))
    m.observe(de.CommandStarted("beta", "s1", "p2", ("ls",), "exec"))  # no record: not counted
    text = m.render().decode()
    assert 'sandboxd_tenant_output_bytes_total{tenant="alpha"} 12.0' in text
    assert 'sandboxd_tenant_egress_total{tenant="alpha",verdict="refused"} 1.0' in text
    assert 'sandboxd_tenant_events_total{kind="refused",tenant="beta"} 1.0' in text
    assert "session" not in "".join(
        line for line in text.splitlines() if line.startswith("sandboxd_tenant_")
    )
    for i in range(metrics_module.MAX_TENANTS + 5):
        m.observe(de.TemplateDeleted(f"t{i}", "web"))  # a lifecycle record
    text = m.render().decode()
    assert 'sandboxd_tenant_events_total{kind="lifecycle",tenant="other"}' in text
    tenants = {
        line.split('tenant="')[1].split('"')[0]
        for line in text.splitlines()
        if line.startswith("sandboxd_tenant_events_total{")
    }
    assert len(tenants) <= metrics_module.MAX_TENANTS + 1


async def test_secret_injections_are_audited_by_name_never_value(tmp_path: Path) -> None:
    async with AuditStore(tmp_path / "audit.db") as store:
        writer = AuditWriter(store)
        writer.start()
        log = EgressAuditLog("alpha.s1", on_event=egress_sink(writer), tenant="alpha")
        log.record(
            method="GET",
            host="api.test",
            port=443,
            allowed=True,
            kind="secret_injected",
            secret="API_TOKEN",
        )
        await writer.close()
        (event,) = await store.list(AuditQuery(tenant="alpha", limit=10))
    assert event.kind == "secret_injected" and event.attributes["secret"] == "API_TOKEN"
