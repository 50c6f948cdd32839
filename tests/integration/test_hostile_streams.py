"""Hostile input, streams and buffers: what one
tenant sends or makes the server hold is bounded in memory, CPU, disk and reply size, beside a
bystander whose session keeps answering (the `guard`).

- 12.1: an archive of deep, distinct member names grows the server by less than 64 MiB.
- 12.2: a PAX record of 200 KB of digits is refused at once, and Health answers throughout.
- 12.4: the export of a 10 GiB sparse file in a 1 MiB workspace stops with RESOURCE_EXHAUSTED
  near the workspace cap; CreateSnapshot of it leaves no snapshot behind.
- 12.5: the session's environment (PATH) never reaches the server's internal tar runs.
- 12.7c: background processes' output buffers stay within a per-session budget; a listing
  larger than a reply is refused with a clear reason before it is buffered.
- 12.10: every byte an import writes counts against the cap (headers, long names), not only
  file data.
- 12.11: a Run whose output would not fit one reply still returns its exit status, truncated.
"""

from __future__ import annotations

import io
import os
import secrets
import tarfile
import threading
import time
from pathlib import Path

import grpc
import pytest
from conftest import (
    ServerProcess,
    SessionFactory,
    Stubs,
    error_info,
    expect_error,
    make_stubs,
    remove_owned_containers,
    rss_bytes,
    run,
    start_server,
)
from google.protobuf import duration_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from sandboxd.v1 import common_pb2, filesystem_pb2, process_pb2, session_pb2, snapshot_pb2
from test_archive import dir_, import_tar, make_tar, member, snap_stub, tree

pytestmark = pytest.mark.usefixtures("guard")
IA = grpc.StatusCode.INVALID_ARGUMENT
RE = grpc.StatusCode.RESOURCE_EXHAUSTED
NF = grpc.StatusCode.NOT_FOUND
MiB = 1024 * 1024


def _cpu_s(pid: int) -> float:
    """User plus system CPU time of the process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class _PeakRss:
    """Samples the server's resident memory while a call runs."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.base = rss_bytes(pid)
        self.peak = self.base
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, rss_bytes(self.pid))

    def __enter__(self) -> _PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_bytes(self.pid))


class _HealthProbe:
    """Asks Health every 50 ms; records the slowest answer (a frozen server answers late)."""

    def __init__(self, stubs: Stubs) -> None:
        self._health = health_pb2_grpc.HealthStub(stubs.channel)
        self.slowest = 0.0
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._probe, daemon=True)

    def _probe(self) -> None:
        while not self._stop.wait(0.05):
            started = time.monotonic()
            try:
                self._health.Check(health_pb2.HealthCheckRequest(service=""), timeout=2)
            except grpc.RpcError as exc:
                self.failures.append(str(exc.code()))  # type: ignore[attr-defined]
            self.slowest = max(self.slowest, time.monotonic() - started)

    def __enter__(self) -> _HealthProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _tar(*infos: tuple[tarfile.TarInfo, bytes | None]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in infos:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def _dir(name: str) -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE
    info.mode = 0o755
    return info, None


# ----- 12.1 memory of one import ------------------------------------------------------------


def test_deep_distinct_names_keep_the_server_small(
    server: ServerProcess, stubs: Stubs, victim: str
) -> None:
    # 200 directories, each 2 000 levels deep and distinct from the first level: kept as
    # strings, every proper prefix of every name took gigabytes.
    deep = "/".join(["a"] * 2040)
    data = _tar(*(_dir(f"{i:03d}/{deep}") for i in range(200)))
    assert len(data) < 3 * MiB
    before = tree(stubs, victim)
    cpu = _cpu_s(server.proc.pid)
    refused: grpc.RpcError | None = None
    with _PeakRss(server.proc.pid) as rss:
        try:
            import_tar(stubs, victim, data)
        except grpc.RpcError as exc:
            refused = exc
    cpu = _cpu_s(server.proc.pid) - cpu  # the server's own, not tar's in the container
    assert rss.peak - rss.base < 64 * MiB, f"the server grew by {(rss.peak - rss.base) >> 20} MiB"
    assert cpu < 3, f"the import took {cpu:.1f} s of the server's CPU"
    assert refused is not None, "an archive naming 400 000 folders was taken"
    assert refused.code() == IA, refused.details()  # type: ignore[attr-defined]
    assert error_info(refused).reason == "ARCHIVE_TOO_MANY_MEMBERS"
    assert tree(stubs, victim) == before


# ----- 12.2 PAX records parsed in quadratic time --------------------------------------------


def _pax_record_tar(payload: bytes) -> bytes:
    header = tarfile.TarInfo("././@PaxHeader")
    header.type = tarfile.XHDTYPE
    header.size = len(payload)
    pad = b"\0" * (-len(payload) % tarfile.BLOCKSIZE)
    rest = make_tar(member("after.txt", b"x"))
    return header.tobuf(tarfile.USTAR_FORMAT) + payload + pad + rest


@pytest.mark.serial  # a wall-clock bound of a few seconds: run alone
@pytest.mark.parametrize("size", [200_000, 12_000])
def test_digit_pax_record_is_refused_at_once(stubs: Stubs, victim: str, size: int) -> None:
    data = _pax_record_tar(b"9" * size)
    before = tree(stubs, victim)
    with _HealthProbe(stubs) as health:
        started = time.monotonic()
        expect_error(lambda: import_tar(stubs, victim, data), IA, "ARCHIVE_INVALID")
        elapsed = time.monotonic() - started
    assert elapsed < 1.0, f"the refusal took {elapsed:.2f} s"
    assert not health.failures and health.slowest < 1.0, (health.slowest, health.failures)
    assert tree(stubs, victim) == before


# ----- 12.4 a sparse file streams gigabytes out of a small workspace ------------------------


def test_sparse_file_export_stops_near_the_workspace_cap(
    stubs: Stubs, new_session: SessionFactory
) -> None:
    s = new_session(limits=common_pb2.ResourceLimits(workspace_bytes=MiB))
    assert run(stubs, s.session_id, "truncate", "-s", "10G", "big").exit_code == 0
    received = 0
    with pytest.raises(grpc.RpcError) as excinfo:
        replies = snap_stub(stubs).ExportArchive(
            snapshot_pb2.ExportArchiveRequest(session_id=s.session_id), timeout=120
        )
        for reply in replies:
            received += len(reply.chunk.data)
            assert received < 400 * MiB, "the export kept streaming past any workspace cap"
    assert excinfo.value.code() == RE, excinfo.value.details()  # type: ignore[attr-defined]
    assert error_info(excinfo.value).reason == "ARCHIVE_TOO_LARGE"
    # A snapshot goes through the same export: refused, and nothing of it is kept.
    expect_error(
        lambda: snap_stub(stubs).CreateSnapshot(
            snapshot_pb2.CreateSnapshotRequest(session_id=s.session_id), timeout=120
        ),
        RE,
        "ARCHIVE_TOO_LARGE",
    )
    listed = snap_stub(stubs).ListSnapshots(
        snapshot_pb2.ListSnapshotsRequest(session_id=s.session_id)
    )
    assert not listed.snapshots


# ----- 12.10 the import spool counts every byte ---------------------------------------------


@pytest.mark.parametrize("replace", [True, False])
def test_long_names_count_against_the_workspace_cap(
    stubs: Stubs, new_session: SessionFactory, replace: bool
) -> None:
    # 2 000 empty folders with 3.8 KiB names: about 10 MiB of headers and no file data.
    s = new_session(limits=common_pb2.ResourceLimits(workspace_bytes=MiB, file_bytes=MiB))
    long = "/".join(["x" * 250] * 15)
    data = _tar(*(_dir(f"{i:04d}/{long}") for i in range(2000)))
    assert len(data) > 8 * MiB
    before = tree(stubs, s.session_id)
    expect_error(
        lambda: import_tar(stubs, s.session_id, data, replace=replace), RE, "WORKSPACE_FULL"
    )
    assert tree(stubs, s.session_id) == before


def test_an_archive_within_the_cap_still_round_trips(
    stubs: Stubs, new_session: SessionFactory
) -> None:
    s = new_session(limits=common_pb2.ResourceLimits(workspace_bytes=MiB, file_bytes=MiB))
    files = [member(f"d/f{i:03d}", b"y" * 2000) for i in range(100)]
    import_tar(stubs, s.session_id, make_tar(dir_("d"), *files), replace=True)
    replies = snap_stub(stubs).ExportArchive(
        snapshot_pb2.ExportArchiveRequest(session_id=s.session_id)
    )
    exported = b"".join(r.chunk.data for r in replies)
    t = new_session(limits=common_pb2.ResourceLimits(workspace_bytes=MiB, file_bytes=MiB))
    import_tar(stubs, t.session_id, exported, replace=True)
    assert tree(stubs, t.session_id) == tree(stubs, s.session_id)


# ----- 12.5 internal runs never see the session's environment -------------------------------


def test_session_environment_does_not_reach_the_servers_tar(
    stubs: Stubs, new_session: SessionFactory
) -> None:
    # GNU tar (the python image) reads options from TAR_OPTIONS: with the session's env in
    # the server's own tar runs, a caller steers what an export or import does (/workspace is
    # noexec, so a PATH pointing there finds nothing to run; the options are enough).
    env = {"TAR_OPTIONS": "--exclude=secret.txt --exclude=in.txt", "LD_PRELOAD": "/nope.so"}
    try:
        s = new_session(image="sandboxd-runtime:python", env=env)
    except grpc.RpcError as exc:  # refused at the door: then it can reach nothing either
        assert exc.code() == IA, exc.details()  # type: ignore[attr-defined]
        return
    stubs.files.WriteFile(
        filesystem_pb2.WriteFileRequest(
            session_id=s.session_id, path="secret.txt", content=b"kept", mode=0o644
        )
    )
    exported = b"".join(
        r.chunk.data
        for r in snap_stub(stubs).ExportArchive(
            snapshot_pb2.ExportArchiveRequest(session_id=s.session_id)
        )
    )
    with tarfile.open(fileobj=io.BytesIO(exported)) as tar:
        assert "./secret.txt" in tar.getnames()
    import_tar(stubs, s.session_id, make_tar(member("in.txt", b"in")), path="dst")
    got = stubs.files.ReadFile(
        filesystem_pb2.ReadFileRequest(session_id=s.session_id, path="dst/in.txt")
    )
    assert got.content == b"in"


# ----- 12.11 replies over the message limit --------------------------------------------------


def test_run_with_more_output_than_a_reply_holds_returns_its_status(
    stubs: Stubs, new_session: SessionFactory
) -> None:
    s = new_session(limits=common_pb2.ResourceLimits(output_bytes=16 * MiB))
    script = "head -c 16777216 /dev/zero; head -c 16777216 /dev/zero >&2; exit 3"
    got = run(stubs, s.session_id, "sh", "-c", script, max_output_bytes=16 * MiB)
    assert got.exit_code == 3
    assert got.truncated
    assert 0 < len(got.stdout) + len(got.stderr) <= 17 * MiB


# ----- 12.7c / 12.11 listings and background buffers ----------------------------------------


def test_listing_larger_than_a_reply_is_refused_with_a_reason(
    stubs: Stubs, new_session: SessionFactory
) -> None:
    s = new_session()
    chain = "/".join(["d" * 250] * 15)
    script = (
        f'mkdir -p "{chain}" && awk -v d="{chain}" '
        '\'BEGIN { for (i = 0; i < 5000; i++) { f = sprintf("%s/%0200d", d, i); '
        'printf "" > f; close(f) } }\''
    )
    made = run(stubs, s.session_id, "sh", "-c", script, timeout=duration_pb2.Duration(seconds=120))
    assert made.exit_code == 0, made.stderr
    expect_error(
        lambda: stubs.files.ListDir(
            filesystem_pb2.ListDirRequest(session_id=s.session_id, depth=32), timeout=60
        ),
        RE,
        "LISTING_TOO_LARGE",
    )
    top = stubs.files.ListDir(filesystem_pb2.ListDirRequest(session_id=s.session_id, depth=1))
    assert [e.name for e in top.entries] == ["d" * 250]


def test_background_output_buffers_have_a_session_budget(
    stubs: Stubs, new_session: SessionFactory, tmp_path: Path
) -> None:
    # With the agent (the default) the rings are the agent's, in the sandbox's memory: the
    # server's budget does not apply.
    s = new_session(limits=common_pb2.ResourceLimits(output_bytes=16 * MiB))
    for _ in range(8):
        stubs.processes.StartProcess(
            process_pb2.StartProcessRequest(
                session_id=s.session_id, argv=["sleep", "30"], max_output_bytes=16 * MiB
            )
        )
    # Without it (`agent = false`) they are the server's: process_output_buffer_bytes.
    owner = "testsd" + secrets.token_hex(3)
    srv = start_server(tmp_path, owner, "--agent", "false")
    try:
        own = make_stubs(srv.address)
        _server_budget(own)
        own.channel.close()
    finally:
        srv.stop()
        remove_owned_containers(owner)


def _server_budget(stubs: Stubs) -> None:
    s = stubs.sessions.CreateSession(
        session_pb2.CreateSessionRequest(
            shell=common_pb2.ShellPolicy(allow_all=True),
            limits=common_pb2.ResourceLimits(output_bytes=16 * MiB),
        )
    ).session
    started = 0
    with pytest.raises(grpc.RpcError) as excinfo:
        for i in range(8):  # 8 x 2 x 16 MiB of rings would be 256 MiB for one session
            stubs.processes.StartProcess(
                process_pb2.StartProcessRequest(
                    session_id=s.session_id,
                    argv=["sleep", "30"],
                    process_id=f"p{i}",
                    max_output_bytes=16 * MiB,
                )
            )
            started += 1
    assert excinfo.value.code() == RE, excinfo.value.details()  # type: ignore[attr-defined]
    assert error_info(excinfo.value).reason == "OUTPUT_BUFFER_BUDGET"
    assert 1 <= started <= 4
    for i in range(started):
        stubs.processes.SignalProcess(
            process_pb2.SignalProcessRequest(
                session_id=s.session_id, process_id=f"p{i}", signal="SIGKILL"
            )
        )
    # Once they have ended, their exit records make room again.
    time.sleep(1)
    stubs.processes.StartProcess(
        process_pb2.StartProcessRequest(
            session_id=s.session_id, argv=["true"], max_output_bytes=16 * MiB
        )
    )
