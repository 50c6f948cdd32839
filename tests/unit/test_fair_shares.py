"""Fair shares between tenants (sandboxd.admission) over an injected clock: no sleeps, no timing.

A tenant alone is never refused or paced; while another tenant is active, one over its call
rate is refused with TENANT_RATE_LIMITED and the exact wait in RetryInfo, and its output is
paced by the debt its channels ran up together; the other tenant is admitted throughout.
"""

from __future__ import annotations

import pytest
from google.rpc import error_details_pb2, status_pb2
from sandboxd import errors, tenancy
from sandboxd.admission import (
    AdmissionSection,
    FairShares,
    RateLimited,
    Shares,
    TokenBucket,
    shares_of,
)
from sandboxd.admission.shares import MAX_HOLD_S
from sandboxd.api.errors import to_status
from sandboxd.config import Config
from sandboxd.reasons import Reason


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


SHARES = Shares(
    calls_per_s=10, call_burst=5, output_bytes_per_s=1000, output_burst_bytes=500, window_s=1
)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def shares(clock: Clock) -> FairShares:
    return FairShares(SHARES, clock)


def _refusal(shares: FairShares, tenant: str) -> errors.ResourceExhausted:
    with pytest.raises(errors.ResourceExhausted) as refused:
        shares.admit_call(tenant)
    return refused.value


# ----- the bucket ----------------------------------------------------------------------------


def test_a_bucket_starts_full_refills_at_its_rate_and_never_past_its_burst() -> None:
    bucket = TokenBucket(rate=10, burst=3, now=0)
    assert [bucket.try_take(0) for _ in range(4)] == [True, True, True, False]
    assert bucket.wait_for(0) == pytest.approx(0.1)
    assert bucket.try_take(0.1)
    assert bucket.tokens(100) == 3  # a long idle does not bank more than the burst


def test_a_bucket_in_debt_says_how_long_repaying_takes_and_forgives_nothing() -> None:
    bucket = TokenBucket(rate=100, burst=50, now=0)
    assert bucket.spend(0, 40) == 0
    assert bucket.spend(0, 60) == pytest.approx(0.5)  # 50 over: half a second at 100/s
    assert bucket.spend(0, 100) == pytest.approx(1.5)  # two spenders' debts add up
    assert bucket.tokens(1.5) == pytest.approx(0)


def test_a_bucket_needs_a_rate_and_a_burst() -> None:
    with pytest.raises(ValueError):
        TokenBucket(rate=0, burst=1, now=0)


# ----- calls ---------------------------------------------------------------------------------


def test_a_tenant_alone_is_never_refused(shares: FairShares) -> None:
    for _ in range(10_000):
        shares.admit_call("flood")
    assert shares.refused["flood"] == 0


def test_while_another_tenant_is_active_the_flood_is_refused_and_the_other_admitted(
    shares: FairShares, clock: Clock
) -> None:
    shares.admit_call("calm")
    for _ in range(SHARES.call_burst):
        shares.admit_call("flood")
    refusal = _refusal(shares, "flood")
    assert refusal.reason == Reason.TENANT_RATE_LIMITED
    assert isinstance(refusal, RateLimited)
    assert refusal.hold_s == pytest.approx(0.1)  # held one token interval (10/s) ...
    assert refusal.metadata["retry_after"] == "0.001s"  # ... so little is left to wait
    assert refusal.metadata["tenant"] == "flood"
    for _ in range(3):
        shares.admit_call("calm")  # the bystander's own calls go through
    clock.now += 0.1
    shares.admit_call("flood")  # the next token
    _refusal(shares, "flood")
    assert shares.refused["flood"] == 2 and shares.refused["calm"] == 0


def test_refusals_in_a_row_are_held_longer_up_to_a_bound_and_a_pass_resets_them(
    shares: FairShares, clock: Clock
) -> None:
    """A client that retries at once is paced by the held answers; one that waits as told is
    held no longer than its wait."""
    shares.admit_call("calm")
    for _ in range(SHARES.call_burst):
        shares.admit_call("flood")
    holds = []
    for _ in range(15):
        refusal = _refusal(shares, "flood")
        assert isinstance(refusal, RateLimited)
        holds.append(refusal.hold_s)
        refusal.release()  # answered before the client retries
    assert holds[:3] == pytest.approx([0.1, 0.2, 0.3])
    assert max(holds) == MAX_HOLD_S
    clock.now += 0.1
    shares.admit_call("flood")  # a token: the run of refusals ends
    refusal = _refusal(shares, "flood")
    assert isinstance(refusal, RateLimited) and refusal.hold_s == pytest.approx(0.1)


def test_the_share_binds_only_while_the_other_tenant_is_active(
    shares: FairShares, clock: Clock
) -> None:
    shares.admit_call("calm")
    for _ in range(SHARES.call_burst):
        shares.admit_call("flood")
    _refusal(shares, "flood")
    clock.now += SHARES.window_s + 0.01  # calm said nothing for the window: flood is alone
    for _ in range(100):
        shares.admit_call("flood")


def test_refused_calls_keep_the_flood_active_for_the_bystander(
    shares: FairShares, clock: Clock
) -> None:
    """A refusal is load too: the bystander stays under contention (its own share applies),
    and the flood's bucket is not handed a fresh burst by being refused."""
    shares.admit_call("calm")
    for _ in range(SHARES.call_burst):
        shares.admit_call("flood")
    for _ in range(50):
        clock.now += 0.001
        with pytest.raises(errors.ResourceExhausted):
            shares.admit_call("flood")
    assert shares.contended("calm")


def test_idle_tenants_are_forgotten_with_their_buckets(shares: FairShares, clock: Clock) -> None:
    for i in range(500):
        shares.admit_call(f"t{i}")
    assert shares.tenants_seen == 500
    clock.now += SHARES.window_s + 1
    shares.admit_call("last")
    assert shares.tenants_seen == 1


def test_a_refusal_sends_retry_info_with_the_wait(shares: FairShares) -> None:
    shares.admit_call("calm")
    for _ in range(SHARES.call_burst):
        shares.admit_call("flood")
    status = to_status(_refusal(shares, "flood"))
    (raw,) = [v for k, v in status.trailing_metadata if k == "grpc-status-details-bin"]
    details = status_pb2.Status.FromString(raw)
    assert details.code == 8  # RESOURCE_EXHAUSTED
    info, retry = error_details_pb2.ErrorInfo(), error_details_pb2.RetryInfo()
    assert [d.Is(info.DESCRIPTOR) for d in details.details] == [True, False]
    assert details.details[0].Unpack(info) and details.details[1].Unpack(retry)
    assert info.reason == "TENANT_RATE_LIMITED"
    assert retry.retry_delay.ToNanoseconds() == 1_000_000  # after the hold: 1 ms is left


# ----- output --------------------------------------------------------------------------------


def test_output_is_not_paced_for_a_tenant_alone(shares: FairShares) -> None:
    assert all(shares.output_delay("flood", 10_000) == 0 for _ in range(100))


def test_output_over_the_share_pauses_the_readers_by_the_debt_they_ran_up_together(
    shares: FairShares, clock: Clock
) -> None:
    shares.admit_call("calm")
    pace_a, pace_b = shares.pacer("flood"), shares.pacer("flood")  # two sessions, one tenant
    assert pace_a(500) == 0  # the burst
    assert pace_a(500) == pytest.approx(0.5)
    assert pace_b(500) == pytest.approx(1.0)  # the second channel's bytes add to the debt
    clock.now += 1.0
    assert pace_a(0) == 0  # repaid at 1000 bytes/s
    assert shares.output_delay("calm", 400) == 0  # the bystander's output is within its share


# ----- settings ------------------------------------------------------------------------------


def test_the_shares_are_on_by_default_and_can_be_turned_off() -> None:
    section = Config().admission
    assert section.enabled and section.calls_per_s > 0 and section.output_bytes_per_s > 0
    made = shares_of(section)
    assert made is not None and made.shares.calls_per_s == section.calls_per_s
    assert shares_of(AdmissionSection(enabled=False)) is None


def test_a_channels_tenant_is_the_prefix_of_its_session_id_only_when_ids_are_partitioned() -> None:
    assert tenancy.tenant_of_session("alpha.s-1", partitioned=True) == "alpha"
    assert tenancy.tenant_of_session("alpha.s-1", partitioned=False) == tenancy.DEFAULT_TENANT
    assert tenancy.tenant_of_session("no-dot", partitioned=True) == tenancy.DEFAULT_TENANT
    assert tenancy.tenant_of_session("Bad Prefix.x", partitioned=True) == tenancy.DEFAULT_TENANT


def _storm(shares: FairShares, clock: Clock, loops: int, seconds: float) -> tuple[int, int]:
    """`loops` clients of one tenant that retry the moment an answer comes (a pass, or a
    refusal once its hold ends), beside a calm tenant, on the virtual clock: (passes,
    refusals) answered."""
    import heapq
    from collections.abc import Callable

    shares.admit_call("calm")
    ready = [(clock.now, i) for i in range(loops)]
    heapq.heapify(ready)
    held: dict[int, Callable[[], None]] = {}  # a loop's refusal, held until its answer
    passes = refusals = 0
    end = clock.now + seconds
    while ready and ready[0][0] < end:
        clock.now, i = heapq.heappop(ready)
        if i in held:
            held.pop(i)()  # its hold ended: answered
        if i == 0:
            shares.admit_call("calm")  # the calm tenant stays active throughout
        try:
            shares.admit_call("flood")
        except RateLimited as refusal:
            refusals += 1
            held[i] = getattr(refusal, "release", lambda: None)
            heapq.heappush(ready, (clock.now + refusal.hold_s, i))
            continue
        passes += 1
        heapq.heappush(ready, (clock.now + 0.001, i))
    return passes, refusals


def test_concurrent_retrying_clients_are_answered_at_about_the_share_not_per_client() -> None:
    """Many clients of one tenant retrying at once: while its refusals are held, each new one is
    held behind them, so the server answers about `calls_per_s` refusals a second however many
    clients there are (a pass of a token between refusals does not shorten the holds)."""
    clock = Clock()
    shares = FairShares(Shares(calls_per_s=50, call_burst=50, window_s=5), clock)
    passes, refusals = _storm(shares, clock, loops=32, seconds=20)
    assert passes <= 50 + 50 * 20 + 1  # the burst, then the rate
    assert refusals <= 3 * 50 * 20, f"{refusals} refusals in 20 s: the holds did not add up"
