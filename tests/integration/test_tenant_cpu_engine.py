"""Each tenant's sandboxes share one CPU weight, read back from the host kernel: a tenant with
three sessions gives each a quarter of the weight the other tenant's one session has (the
`cpu.shares` or `cpu.weight` of each container's own cgroup), and the last one left of them
weighs a whole tenant again. A gVisor sandbox is made with its share (runsc cannot change it
later). The weight lives in each container's own cgroup only: no cgroup of the server's on
the host to leave behind. No timing is asserted."""

from __future__ import annotations

import contextlib
from pathlib import Path

import grpc
import pytest
from conftest import ServerProcess, Stubs, gvisor_registered, run
from containers import inspect_container, session_container
from sandboxd.v1 import common_pb2, session_pb2
from two_tenants import two_tenant_fixtures

ALL = common_pb2.ShellPolicy(allow_all=True)
CGROUP_ROOT = Path("/sys/fs/cgroup")
CAP_MILLIS = 400  # the server's admission_demoted_cpu_millis (one sandbox: all of it)


server, stubs = two_tenant_fixtures("tcpu", "--admission-demoted-cpu-millis", str(CAP_MILLIS))


def _cpu_group(container: str) -> tuple[Path, int]:
    """The container's cpu cgroup on this host, read from its main process, and the cgroup
    version: the v1 cpu hierarchy's, or v2's one hierarchy."""
    pid = inspect_container(container)["State"]["Pid"]
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "cpu" in controllers.split(","):
            return CGROUP_ROOT / controllers / path.lstrip("/"), 1
        if controllers == "":
            return CGROUP_ROOT / path.lstrip("/"), 2
    raise AssertionError(f"no cpu cgroup for pid {pid}")


def kernel_weight(container: str) -> int:
    """The container's CPU weight as the kernel has it, in cpu.shares units (cgroup v1
    `cpu.shares`, or v2 `cpu.weight` converted back)."""
    group, version = _cpu_group(container)
    if version == 1:
        return int((group / "cpu.shares").read_text())
    weight = int((group / "cpu.weight").read_text())  # 1 + (shares - 2) * 9999 / 262142
    return 2 + (weight - 1) * 262142 // 9999


def kernel_cpu_millis(container: str) -> int:
    """The container's CPU limit as the kernel has it (its CFS quota over its period), in
    millicpus: cgroup v1 `cpu.cfs_quota_us` / `cpu.cfs_period_us`, or v2 `cpu.max`."""
    group, version = _cpu_group(container)
    if version == 1:
        quota = int((group / "cpu.cfs_quota_us").read_text())
        return quota * 1000 // int((group / "cpu.cfs_period_us").read_text())
    quota_s, period_s = (group / "cpu.max").read_text().split()
    return int(quota_s) * 1000 // int(period_s)


def cpu_limits(server: ServerProcess, session_id: str) -> tuple[int, int]:
    """(the engine's NanoCpus in millicpus, the kernel's) of the session's container."""
    c = session_container(session_id, server.owner_id, running=True)
    return int(inspect_container(c)["HostConfig"]["NanoCpus"]) // 10**6, kernel_cpu_millis(c)


def weights(server: ServerProcess, *session_ids: str) -> list[tuple[int, int]]:
    """(the engine's CpuShares, the kernel's) of each session's container."""
    found = []
    for sid in session_ids:
        c = session_container(sid, server.owner_id, running=True)
        found.append((int(inspect_container(c)["HostConfig"]["CpuShares"]), kernel_weight(c)))
    return found


def _delete(stubs: Stubs, session_id: str) -> None:
    with contextlib.suppress(grpc.RpcError):  # deleted already
        stubs.sessions.DeleteSession(session_pb2.DeleteSessionRequest(session_id=session_id))


def _create(stubs: Stubs, tenant: str, **fields: object) -> str:
    req = session_pb2.CreateSessionRequest(shell=ALL, **fields)  # type: ignore[arg-type]
    return stubs.sessions.CreateSession(req).session.session_id


def test_a_tenants_sandboxes_share_one_weight_at_the_kernel(
    server: ServerProcess, stubs: dict[str, Stubs]
) -> None:
    flood, calm = stubs["flood"], stubs["calm"]
    csid = _create(calm, "calm")
    fsids = [_create(flood, "flood") for _ in range(3)]
    try:
        assert weights(server, csid) == [(1024, 1024)]
        # Three of one tenant: a quarter each (a power-of-two split), under the other's one.
        assert weights(server, *fsids) == [(256, 256)] * 3
        # Nor can a sandbox raise its own: its cgroup files are read-only inside (either layout).
        files = "/sys/fs/cgroup/cpu*/cpu.shares /sys/fs/cgroup/cpu.weight"
        write = f"for f in {files}; do echo 1024 > $f; done"
        tried = run(flood, fsids[0], "sh", "-c", write)
        assert tried.exit_code != 0 and b"Read-only" in tried.stderr, tried
        assert weights(server, fsids[0]) == [(256, 256)]
        for sid in fsids[1:]:
            flood.sessions.DeleteSession(session_pb2.DeleteSessionRequest(session_id=sid))
        assert weights(server, fsids[0]) == [(1024, 1024)]
        assert weights(server, csid) == [(1024, 1024)]
    finally:
        for s, sid in ((calm, csid), *((flood, f) for f in fsids)):
            _delete(s, sid)


@pytest.mark.skipif(not gvisor_registered(), reason="runsc is not registered with the engine")
def test_a_gvisor_sandbox_is_made_with_its_tenants_share(
    server: ServerProcess, stubs: dict[str, Stubs]
) -> None:
    flood = stubs["flood"]
    runc = _create(flood, "flood")
    gvisor = _create(flood, "flood", isolation=common_pb2.ISOLATION_GVISOR)
    try:
        assert weights(server, runc, gvisor) == [(512, 512), (512, 512)]
    finally:
        for sid in (runc, gvisor):
            _delete(flood, sid)


def test_a_tenant_writing_without_pause_weighs_the_least_while_another_is_active(
    server: ServerProcess, stubs: dict[str, Stubs]
) -> None:
    """Background `yes` of one tenant while the other makes calls: its sandbox is demoted to
    the least weight at the kernel and held to the demoted tenant's CPU cap (its CFS quota,
    admission_demoted_cpu_millis), the other's keeps its own, and the demoted one still answers
    (a lower limit is no tampering); once its writer is gone and it has been calm for 5 s, its
    weight and its own limit come back. Polled, no timing asserted beyond bounds."""
    import time  # noqa: PLC0415

    from sandboxd.v1 import process_pb2  # noqa: PLC0415

    flood, calm = stubs["flood"], stubs["calm"]
    csid = _create(calm, "calm")
    fsid = _create(flood, "flood")

    def until(want: list[tuple[int, int]], sid: str, within_s: float) -> None:
        deadline = time.monotonic() + within_s
        while weights(server, sid) != want:
            assert time.monotonic() < deadline, (weights(server, sid), want)
            # The other tenant stays active (its calls keep the shares contended).
            calm.sessions.GetSession(session_pb2.GetSessionRequest(session_id=csid))
            time.sleep(0.2)

    try:
        assert weights(server, fsid) == [(1024, 1024)]
        own = cpu_limits(server, fsid)
        assert own[0] == own[1] > CAP_MILLIS, own
        started = flood.processes.StartProcess(
            process_pb2.StartProcessRequest(session_id=fsid, argv=["yes", "flood"])
        )
        until([(2, 2)], fsid, 30)
        assert weights(server, csid) == [(1024, 1024)]
        deadline = time.monotonic() + 10  # the weight and the cap are one update
        while cpu_limits(server, fsid) != (CAP_MILLIS, CAP_MILLIS):
            assert time.monotonic() < deadline, cpu_limits(server, fsid)
            time.sleep(0.1)
        assert cpu_limits(server, csid) == own
        assert run(flood, fsid, "true").exit_code == 0  # still its sandbox, not a tampered one
        flood.processes.SignalProcess(
            process_pb2.SignalProcessRequest(
                session_id=fsid, process_id=started.process.process_id, signal="SIGKILL"
            )
        )
        until([(1024, 1024)], fsid, 30)
        assert cpu_limits(server, fsid) == own
    finally:
        for s, sid in ((calm, csid), (flood, fsid)):
            _delete(s, sid)


@pytest.mark.skipif(not gvisor_registered(), reason="runsc is not registered with the engine")
def test_a_gvisor_tenant_writing_without_pause_is_demoted_at_its_host_cgroup(
    server: ServerProcess, stubs: dict[str, Stubs]
) -> None:
    """runsc has no update: beside this local engine the server writes the gVisor sandbox's
    host cgroup. Its `yes` while the other tenant makes calls: the kernel's weight 2 and the
    demoted cap, read back from the host; the sandbox still answers; then its own again."""
    import time  # noqa: PLC0415

    from sandboxd.v1 import process_pb2  # noqa: PLC0415

    flood, calm = stubs["flood"], stubs["calm"]
    csid = _create(calm, "calm")
    fsid = _create(flood, "flood", isolation=common_pb2.ISOLATION_GVISOR)
    container = session_container(fsid, server.owner_id, running=True)

    def kernel() -> tuple[int, int]:
        return kernel_weight(container), kernel_cpu_millis(container)

    def until(want: tuple[int, int], within_s: float) -> None:
        deadline = time.monotonic() + within_s
        while kernel() != want:
            assert time.monotonic() < deadline, (kernel(), want)
            calm.sessions.GetSession(session_pb2.GetSessionRequest(session_id=csid))
            time.sleep(0.2)

    try:
        own = kernel()
        assert own[0] == 1024 and own[1] > CAP_MILLIS, own
        started = flood.processes.StartProcess(
            process_pb2.StartProcessRequest(session_id=fsid, argv=["yes", "flood"])
        )
        until((2, CAP_MILLIS), 30)
        assert run(flood, fsid, "true").exit_code == 0
        flood.processes.SignalProcess(
            process_pb2.SignalProcessRequest(
                session_id=fsid, process_id=started.process.process_id, signal="SIGKILL"
            )
        )
        until(own, 30)
    finally:
        for s, sid in ((calm, csid), (flood, fsid)):
            _delete(s, sid)
