"""A gVisor sandbox's CPU and memory ceiling are written into its own host cgroup
(engine/host_cgroup.py), found from its main process; a pid that names another cgroup (ended and
reused by a host process, or a forged path) is refused and nothing is written, in both cgroup
layouts."""

from __future__ import annotations

from pathlib import Path

import pytest
from sandboxd.agent.memory import GVISOR_HEADROOM_MAX, GVISOR_HEADROOM_MIN, gvisor_host_memory
from sandboxd.engine.host_cgroup import cpu_cgroup, raise_memory, write_cpu, write_memory_ceiling
from sandboxd.errors import FailedPrecondition

CID = "ab" * 32
MiB = 1024 * 1024


def _host(tmp: Path, cgroup_lines: str, group: str, files: dict[str, str]) -> tuple[Path, Path]:
    root, proc = tmp / "cgroup", tmp / "proc"
    (proc / "42").mkdir(parents=True)
    (proc / "42" / "cgroup").write_text(cgroup_lines)
    (root / group).mkdir(parents=True)
    for name, text in files.items():
        (root / group / name).write_text(text)
    return root, proc


def test_v1_weight_and_quota(tmp_path: Path) -> None:
    lines = f"9:name=systemd:/docker/{CID}\n1:cpu:/docker/{CID}\n0::/\n"
    files = {"cpu.shares": "1024", "cpu.cfs_period_us": "100000", "cpu.cfs_quota_us": "-1"}
    root, proc = _host(tmp_path, lines, f"cpu/docker/{CID}", files)
    write_cpu(CID, 42, 2, 125, root=root, proc=proc)
    group = root / "cpu" / "docker" / CID
    assert (group / "cpu.shares").read_text() == "2"
    assert (group / "cpu.cfs_quota_us").read_text() == "12500"
    write_cpu(CID, 42, 1024, root=root, proc=proc)  # the weight alone: the quota stays
    assert (group / "cpu.shares").read_text() == "1024"
    assert (group / "cpu.cfs_quota_us").read_text() == "12500"


def test_v2_weight_and_max(tmp_path: Path) -> None:
    group = f"system.slice/docker-{CID}.scope"
    root, proc = _host(
        tmp_path, f"0::/{group}\n", group, {"cpu.weight": "100", "cpu.max": "200000 100000"}
    )
    write_cpu(CID, 42, 2, 500, root=root, proc=proc)
    assert (root / group / "cpu.weight").read_text() == "1"
    assert (root / group / "cpu.max").read_text() == "50000 100000"
    write_cpu(CID, 42, 1024, root=root, proc=proc)
    assert (root / group / "cpu.weight").read_text() == "39"  # Docker's own conversion


@pytest.mark.parametrize(
    "lines",
    [
        "1:cpu:/\n",  # the pid now belongs to a host process in the root cgroup
        f"1:cpu:/docker/{'cd' * 32}\n",  # another container's
        f"1:cpu:/docker/{CID}/../../\n",  # a path that climbs out
    ],
)
def test_a_cgroup_not_the_containers_own_is_refused(tmp_path: Path, lines: str) -> None:
    root, proc = _host(tmp_path, lines, "cpu", {"cpu.shares": "1024"})
    with pytest.raises(FailedPrecondition):
        write_cpu(CID, 42, 2, 100, root=root, proc=proc)
    assert (root / "cpu" / "cpu.shares").read_text() == "1024"


def test_no_process_or_a_short_id_is_refused(tmp_path: Path) -> None:
    with pytest.raises(FailedPrecondition):
        cpu_cgroup(CID, 7, root=tmp_path, proc=tmp_path)
    with pytest.raises(FailedPrecondition):
        cpu_cgroup(CID[:12], 42, root=tmp_path, proc=tmp_path)
    with pytest.raises(FailedPrecondition):
        cpu_cgroup(CID, 0, root=tmp_path, proc=tmp_path)


def test_v1_memory_ceiling_raises_swap_first_and_never_lowers(tmp_path: Path) -> None:
    """The headroom of a gVisor sandbox (agent/memory.py, `gvisor_host_memory`): v1 needs the
    limit with swap raised before the limit itself; a ceiling already above stays."""
    lines = f"5:memory:/docker/{CID}\n1:cpu:/docker/{CID}\n"
    files = {"memory.limit_in_bytes": "134217728", "memory.memsw.limit_in_bytes": "134217728"}
    root, proc = _host(tmp_path, lines, f"memory/docker/{CID}", files)
    raise_memory(CID, 42, {"Memory": 128 * MiB}, root=root, proc=proc)
    group = root / "memory" / "docker" / CID
    assert (group / "memory.limit_in_bytes").read_text() == str(192 * MiB)
    assert (group / "memory.memsw.limit_in_bytes").read_text() == str(192 * MiB)
    write_memory_ceiling(CID, 42, 150 * MiB, root=root, proc=proc)  # lower: nothing
    assert (group / "memory.limit_in_bytes").read_text() == str(192 * MiB)


def test_v2_memory_ceiling(tmp_path: Path) -> None:
    group = f"system.slice/docker-{CID}.scope"
    root, proc = _host(tmp_path, f"0::/{group}\n", group, {"memory.max": "268435456"})
    raise_memory(CID, 42, {"Memory": 256 * MiB}, root=root, proc=proc)
    assert (root / group / "memory.max").read_text() == str(320 * MiB)


def test_a_memory_ceiling_elsewhere_than_the_containers_own_is_not_written(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A pid that names another cgroup: nothing written, the start goes on (logged)."""
    root, proc = _host(tmp_path, "5:memory:/\n", "memory", {"memory.limit_in_bytes": "1024"})
    with pytest.raises(FailedPrecondition):
        write_memory_ceiling(CID, 42, 2048, root=root, proc=proc)
    raise_memory(CID, 42, {"Memory": 128 * MiB}, root=root, proc=proc)
    assert (root / "memory" / "memory.limit_in_bytes").read_text() == "1024"
    assert "memory headroom" in caplog.text


def test_the_headroom_is_a_quarter_within_its_bounds() -> None:
    assert gvisor_host_memory(0) == 0
    assert gvisor_host_memory(128 * MiB) == 128 * MiB + GVISOR_HEADROOM_MIN
    assert gvisor_host_memory(512 * MiB) == 640 * MiB
    assert gvisor_host_memory(4096 * MiB) == 4096 * MiB + GVISOR_HEADROOM_MAX
