"""sandboxctl starts in the time its command needs: what each start-up imports.

Start-up is dominated by imports (grpc's C core, the generated stubs, protobuf), so the check is
on the import set, not a clock: `--version`, `--help` and `completion` load neither grpc nor any
generated stub, and `import sandboxd_client` alone loads neither either (its names are imported
on first use). Each check runs in a fresh interpreter: this test process has imported everything.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest
from sandboxd_client._gen.sandboxd.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    process_pb2,
    process_pb2_grpc,
)

HEAVY = ("grpc", "google.protobuf", "google.rpc", "grpc_status", "sandboxd_client._gen")


def _modules_after(code: str) -> set[str]:
    """The modules a fresh interpreter holds after `code` (which may end by SystemExit)."""
    script = (
        "import json, sys\n"
        "try:\n" + "".join(f"    {line}\n" for line in code.splitlines()) + "except SystemExit:\n"
        "    pass\n"
        "sys.__stderr__.write(json.dumps(sorted(sys.modules)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, timeout=60, check=True
    )
    return set(json.loads(done.stderr.decode().splitlines()[-1]))


def _heavy(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if any(m == h or m.startswith(h + ".") for h in HEAVY))


@pytest.mark.parametrize(
    "argv",
    [["--version"], ["--help"], ["exec", "--help"], ["completion", "bash"]],
    ids=lambda a: " ".join(a),
)
def test_commands_that_call_no_server_import_neither_grpc_nor_stubs(argv: list[str]) -> None:
    modules = _modules_after(f"from sandboxd_client.cli import main\nmain({argv!r})")
    assert "sandboxd_client.cli" in modules
    assert _heavy(modules) == []


def test_importing_the_package_imports_its_names_on_first_use() -> None:
    assert _heavy(_modules_after("import sandboxd_client")) == []
    used = _modules_after("import sandboxd_client\nsandboxd_client.SandboxClient")
    assert "grpc" in used and "sandboxd_client.client" in used


def test_every_public_name_of_the_package_resolves() -> None:
    import sandboxd_client

    for name in sandboxd_client.__all__:
        assert getattr(sandboxd_client, name) is not None, name
    with pytest.raises(AttributeError):
        _ = sandboxd_client.NoSuchName  # type: ignore[attr-defined]


# What `sandboxctl exec` has no use for: the other services' generated modules, the status
# details' decoders (read only when a call fails), the result classes, tar and the progress bar.
NOT_FOR_EXEC = (
    "sandboxd_client._gen.sandboxd.v1.session_pb2",
    "sandboxd_client._gen.sandboxd.v1.session_pb2_grpc",
    "sandboxd_client._gen.sandboxd.v1.filesystem_pb2",
    "sandboxd_client._gen.sandboxd.v1.filesystem_pb2_grpc",
    "sandboxd_client._gen.sandboxd.v1.snapshot_pb2",
    "sandboxd_client._gen.sandboxd.v1.snapshot_pb2_grpc",
    "sandboxd_client._gen.sandboxd.v1.template_pb2",
    "sandboxd_client._gen.sandboxd.v1.template_pb2_grpc",
    "sandboxd_client._gen.sandboxd.v1.volumes_pb2",
    "sandboxd_client._gen.sandboxd.v1.volumes_pb2_grpc",
    "sandboxd_client._gen.sandboxd.v1.audit_pb2",
    "sandboxd_client._gen.sandboxd.v1.audit_pb2_grpc",
    "sandboxd_client._gen.sandboxd.v1.previews_pb2",
    "sandboxd_client._gen.sandboxd.v1.events_pb2",
    "sandboxd_client._gen.sandboxd.v1.watch_pb2",
    "google.rpc",
    "grpc_status",
    "sandboxd_client.models",
    "sandboxd_client.tar_stream",
    "sandboxd_client.cli_progress",
    "tarfile",
)


class _Fake(admin_pb2_grpc.AdminServiceServicer, process_pb2_grpc.ProcessServiceServicer):
    """GetServerInfo and an Exec that prints a line and exits 3: all `sandboxctl exec` calls."""

    def GetServerInfo(
        self, request: admin_pb2.GetServerInfoRequest, context: grpc.ServicerContext
    ) -> admin_pb2.GetServerInfoResponse:
        return admin_pb2.GetServerInfoResponse(version="fake", api_version="v1")

    def Exec(
        self, request: process_pb2.ExecRequest, context: grpc.ServicerContext
    ) -> Iterator[process_pb2.ExecResponse]:
        yield process_pb2.ExecResponse(started=process_pb2.ProcessStarted(process_id="p-1"))
        out = process_pb2.ProcessOutput(data=" ".join(request.argv).encode() + b"\n")
        yield process_pb2.ExecResponse(output=out)
        yield process_pb2.ExecResponse(exited=process_pb2.ProcessExited(exit_code=3))


@pytest.fixture
def fake_server() -> Iterator[str]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    admin_pb2_grpc.add_AdminServiceServicer_to_server(_Fake(), server)
    process_pb2_grpc.add_ProcessServiceServicer_to_server(_Fake(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}"
    server.stop(grace=None)


def test_exec_imports_only_the_process_service(fake_server: str) -> None:
    """A whole `sandboxctl exec` (the version check, the streamed command, its exit code)
    loads grpc and the process service's stubs, and none of what exec does not use."""
    argv = ["--addr", fake_server, "exec", "s-1", "--", "echo", "hi"]
    script = (
        "import json, sys\n"
        "from sandboxd_client.cli import main\n"
        f"code = main({argv!r})\n"
        "sys.__stderr__.write(json.dumps([code, sorted(sys.modules)]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, timeout=60, check=True
    )
    code, names = json.loads(done.stderr.decode().splitlines()[-1])
    assert (code, done.stdout) == (3, b"echo hi\n")
    modules = set(names)
    assert {"grpc", "sandboxd_client._gen.sandboxd.v1.process_pb2_grpc"} <= modules
    loaded = sorted(
        m for m in modules if any(m == n or m.startswith(n + ".") for n in NOT_FOR_EXEC)
    )
    assert loaded == []


@pytest.mark.parametrize(
    "argv",
    [
        ["exec", "s-1", "--", "sh", "-c", "echo hi"],
        ["--addr", "h:1", "--token=t", "-o", "json", "exec", "-i", "--env", "A=1", "s", "--", "x"],
        ["--call-timeout", "5", "--ca", "ca.pem", "run", "--rm", "--allow", "sh", "--", "sh"],
        ["--add", "h:2", "ls", "--label", "a=b"],
        ["create", "--allow-all", "--memory", "512Mi", "--lease", "3600"],
        ["snapshot", "create", "s-1", "--label", "k=v"],
        ["volume", "ls"],
        ["template", "build", "py", "dir"],
        ["image", "pull", "busybox"],
        ["cp", "./src", "s-1:"],
        ["network", "s-1", "--domain", "example.org"],
        ["watch", "s-1"],
        ["audit"],
        ["shell", "--new", "--template", "python"],
    ],
    ids=lambda a: " ".join(a),
)
def test_a_command_parses_as_with_every_parser_built(argv: list[str]) -> None:
    """`parse` builds the parser of the command it runs alone (the others cost most of a
    start-up): it reads every command line as the whole parser does."""
    from sandboxd_client import cli

    split = argv.index("--") if "--" in argv else len(argv)
    expected = vars(cli.build_parser().parse_args(argv[:split]))
    assert vars(cli.parse(argv)) == expected | {"argv": argv[split + 1 :]}


@pytest.mark.parametrize(
    "argv", [["exec"], ["nosuch", "x"], ["exec", "s", "--bogus"], ["--output", "yaml", "ls"]]
)
def test_a_mistake_is_reported_by_the_whole_parser(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    from sandboxd_client import cli

    with pytest.raises(SystemExit) as whole:
        cli.build_parser().parse_args(argv)
    wanted = capsys.readouterr().err
    with pytest.raises(SystemExit) as got:
        cli.parse(argv)
    assert (got.value.code, capsys.readouterr().err) == (whole.value.code, wanted)
    assert got.value.code == cli.EXIT_ERROR


@pytest.mark.parametrize("argv", [["--version"], ["--addr", "h:1", "--version"], ["-h"]])
def test_version_and_help_answer_as_the_whole_parser_does(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    from sandboxd_client import cli

    with pytest.raises(SystemExit) as whole:
        cli.build_parser().parse_args(argv)
    wanted = capsys.readouterr()
    with pytest.raises(SystemExit) as got:
        cli.parse(argv)
    assert (got.value.code, capsys.readouterr()) == (whole.value.code, wanted)
    assert got.value.code == 0
