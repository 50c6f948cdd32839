"""The Go client (clients/go) against this suite's live server: `go vet`, its tests (typed
errors, retries and the first-use check against in-process fake servers, the surface against
the protos' services, the conformance scenario), and a program outside the repository that
requires the module and builds from Debian's Go sources without a module proxy.

`make test` installs the Debian packages first (`clients/go/ensure-go.sh`); the committed stubs
must be what `clients/go/gen.sh` generates from proto/, and sandboxd/reasons.go what
tools/genreasons makes of errors.proto.
"""

from __future__ import annotations

import filecmp
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import REPO, ServerProcess
from polyglot import CONFORMANCE, TOKEN, conformance_steps, passed_steps, service_rpcs, token_server

GO_DIR = REPO / "clients" / "go"
MODULE = "github.com/sandboxd/sandboxd/clients/go"
__all__ = ["token_server"]


def go(
    *args: str, cwd: Path = GO_DIR, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """A go command in clients/go (env.sh: module mode, vendor/ from Debian, GOPROXY=off)."""
    return subprocess.run(
        [str(GO_DIR / "env.sh"), "go", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **(env or {})},
    )


@pytest.fixture(scope="module", autouse=True)
def _toolchain() -> None:
    missing = [
        t for t in ("go", "protoc", "protoc-gen-go", "protoc-gen-go-grpc") if not shutil.which(t)
    ]
    assert not missing, f"{missing} missing: run `make go-deps` (Debian packages)"


def test_committed_go_stubs_match_the_protos(tmp_path: Path) -> None:
    subprocess.run([str(GO_DIR / "gen.sh"), str(tmp_path)], check=True, timeout=120)
    committed = GO_DIR / "sandboxdv1"
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == sorted(p.name for p in committed.iterdir()), "run clients/go/gen.sh"
    _, mismatch, errors = filecmp.cmpfiles(tmp_path, committed, names, shallow=False)
    assert not mismatch and not errors, f"stale Go stubs {mismatch + errors}: run clients/go/gen.sh"


def test_committed_reasons_match_errors_proto(tmp_path: Path) -> None:
    out = tmp_path / "reasons.go"
    errors_proto = REPO / "proto" / "sandboxd" / "v1" / "errors.proto"
    made = go("run", "./tools/genreasons", str(errors_proto), str(out))
    assert made.returncode == 0, made.stderr
    committed = (GO_DIR / "sandboxd" / "reasons.go").read_text()
    assert out.read_text() == committed, "stale reasons.go: run `go generate ./sandboxd`"


def test_go_vet_and_gofmt() -> None:
    vet = go("vet", "./...")
    assert vet.returncode == 0, vet.stderr
    fmt = subprocess.run(
        ["gofmt", "-l", "sandboxd", "examples", "tools", "sandboxdv1"],
        cwd=GO_DIR,
        capture_output=True,
        text=True,
        check=True,
    )
    assert fmt.stdout == "", f"gofmt wants to change: {fmt.stdout}"


def test_go_client(server: ServerProcess) -> None:
    """Live tests, the offline ones, the surface against the protos and the conformance run."""
    env = {
        "SANDBOXD_ADDR": server.address,
        "SANDBOXD_CONFORMANCE": str(CONFORMANCE),
        "SANDBOXD_RPCS": json.dumps(service_rpcs()),
    }
    result = go("test", "-count=1", "-v", "./sandboxd/", env=env)
    assert result.returncode == 0, f"go test failed:\n{result.stdout}\n{result.stderr}"
    for name in (
        "TestSessionExecAndFiles",
        "TestErrorsAreTyped",
        "TestSurface",
        "TestOtherMajorVersionIsRefused",
        "TestNotSandboxdIsRefused",
        "TestClosedPortIsUnavailableWithinTheDeadline",
        "TestIdempotentCallsRetryNonIdempotentNever",
        "TestConformance",
        "TestWatchDir",
        "TestRunAnswersWithTheClientsOwnReplyLimit",
        "TestRefusedImportIsItsOwnErrorEveryTime",
        "TestSandboxRunsFilesAndRefusals",
        "TestSandboxShellIsATerminal",
    ):
        assert f"--- PASS: {name} " in result.stdout, name
    assert passed_steps(result.stdout) == conformance_steps(), result.stdout


def test_go_example_streams_exec(server: ServerProcess) -> None:
    result = go("run", "./examples/exec", env={"SANDBOXD_ADDR": server.address})
    assert result.returncode == 0, result.stderr
    assert result.stdout == "line 1\nline 2\nline 3\n"


def _build_outside(project: Path, example: str) -> Path:
    """A module outside the repository requiring the client (vendored from Debian's sources),
    whose main package is examples/<example>; the built program."""
    assert REPO not in project.parents
    shutil.copy(GO_DIR / "examples" / example / "main.go", project / "main.go")
    env = {
        **os.environ,
        "GO111MODULE": "on",
        "GOPROXY": "off",
        "GOFLAGS": "",
        "GOPATH": str(project / ".gopath"),  # an empty module cache: nothing comes from it
    }

    def run(*cmd: str, cwd: Path = project) -> None:
        done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, f"{cmd}: {done.stdout}\n{done.stderr}"

    run("go", "mod", "init", "example.com/consumer")
    run("go", "mod", "edit", f"-require={MODULE}@v0.0.0", f"-replace={MODULE}={GO_DIR}")
    debvendor = str(GO_DIR / "tools" / "debvendor" / "main.go")
    env["GO111MODULE"] = "off"
    run("go", "run", debvendor, str(project), cwd=Path("/"))
    env["GO111MODULE"] = "on"
    env["GOFLAGS"] = "-mod=vendor"
    run("go", "vet", ".")
    run("go", "build", "-o", "consumer", ".")
    return project / "consumer"


@pytest.fixture(scope="module")
def consumer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _build_outside(tmp_path_factory.mktemp("go-consumer"), "quickstart").parent


def test_the_readme_hello_runs_outside_the_repo(
    tmp_path_factory: pytest.TempPathFactory, server: ServerProcess
) -> None:
    """The README's hello: create, streamed run, a file written and read, a folder uploaded,
    the session deleted (in at most 20 lines, and so it stays: it is the README's own text)."""
    hello = _build_outside(tmp_path_factory.mktemp("go-hello"), "hello")
    source = (GO_DIR / "examples" / "hello" / "main.go").read_text()
    body = source[source.index("func main() {") : source.index("\nfunc check")]
    assert len(body.strip().splitlines()) - 2 <= 20, body
    assert body.strip() in (GO_DIR / "README.md").read_text()
    folder = tmp_path_factory.mktemp("go-hello-folder")
    (folder / "a.txt").write_text("a\n")
    done = subprocess.run(
        [str(hello), str(folder)],
        env={**os.environ, "SANDBOXD_ADDR": server.address},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "hello sandbox\nhi\na.txt\n"


def test_module_builds_and_runs_outside_the_repo(consumer: Path, server: ServerProcess) -> None:
    env = {**os.environ, "SANDBOXD_ADDR": server.address, "SANDBOXD_TOKEN": ""}
    done = subprocess.run(
        [str(consumer / "consumer")], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and done.stdout == "hi\n", done.stdout + done.stderr


def test_wrong_token_is_a_typed_error(consumer: Path, token_server: ServerProcess) -> None:
    def run(token: str) -> str:
        env = {**os.environ, "SANDBOXD_ADDR": token_server.address, "SANDBOXD_TOKEN": token}
        done = subprocess.run(
            [str(consumer / "consumer")], env=env, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert run("wrong-token") == "error TOKEN_INVALID unauthenticated=true\n"
    assert run(TOKEN) == "hi\n"
