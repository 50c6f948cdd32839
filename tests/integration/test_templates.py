"""Templates built from a Dockerfile: build, list, create from, delete, and the
rules of a safe build (FROM, no network, time limit, context cap, tenants, cleanup)."""

from __future__ import annotations

import http.server
import io
import json
import os
import secrets
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from authutil import authed_stubs, write_tokens
from conftest import (
    ServerProcess,
    Stubs,
    error_info,
    own_server,
    remove_owned_containers,
    run,
    start_server,
)
from sandboxd.v1 import common_pb2, session_pb2, template_pb2, template_pb2_grpc

T = template_pb2
TOKENS = {"a-" + secrets.token_urlsafe(16): "alpha", "b-" + secrets.token_urlsafe(16): "beta"}
TOKEN_OF = {tenant: token for token, tenant in TOKENS.items()}
ALL = common_pb2.ShellPolicy(allow_all=True)
CONTEXT_CAP = 256 * 1024
TIMEOUT_S = 6
BUILD_MEMORY = 96 * 1024 * 1024
IDLE_S = 4


@pytest.fixture(scope="module")
def tpl_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp("templates")
    tokens = write_tokens(tmp / "tokens", TOKENS)
    with own_server(
        tmp / "data",
        "tpl" + secrets.token_hex(4),
        "--tokens-file",
        str(tokens),
        "--template-max-context-bytes",
        str(CONTEXT_CAP),
        "--template-build-timeout-s",
        str(TIMEOUT_S),
        "--template-build-memory-bytes",
        str(BUILD_MEMORY),
        "--stream-idle-timeout-s",
        str(IDLE_S),
    ) as srv:
        yield srv


def _stubs(srv: ServerProcess, tenant: str) -> tuple[Stubs, template_pb2_grpc.TemplateServiceStub]:
    s = authed_stubs(srv.address, TOKEN_OF[tenant])
    return s, template_pb2_grpc.TemplateServiceStub(s.channel)


@pytest.fixture(scope="module")
def alpha(tpl_server: ServerProcess) -> tuple[Stubs, template_pb2_grpc.TemplateServiceStub]:
    return _stubs(tpl_server, "alpha")


@pytest.fixture(scope="module")
def beta(tpl_server: ServerProcess) -> tuple[Stubs, template_pb2_grpc.TemplateServiceStub]:
    return _stubs(tpl_server, "beta")


def context_tar(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def requests(name: str, dockerfile: str, context: bytes = b"", chunk: int = 64 * 1024):
    yield T.BuildTemplateRequest(spec=T.TemplateSpec(name=name, dockerfile=dockerfile))
    for i in range(0, len(context), chunk):
        yield T.BuildTemplateRequest(context=context[i : i + chunk])


def build(
    tpl: template_pb2_grpc.TemplateServiceStub, name: str, dockerfile: str, context: bytes = b""
) -> tuple[list[str], T.Template]:
    lines, done = [], None
    for resp in tpl.BuildTemplate(requests(name, dockerfile, context), timeout=120):
        if resp.WhichOneof("event") == "log":
            lines.append(resp.log.line)
        else:
            done = resp.done.template
    assert done is not None, lines
    return lines, done


def build_error(
    tpl: template_pb2_grpc.TemplateServiceStub, name: str, dockerfile: str, context: bytes = b""
) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        for _ in tpl.BuildTemplate(requests(name, dockerfile, context), timeout=120):
            pass
    return info.value


def expect_error(code: grpc.StatusCode, call: Callable[[], object]) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call()
    assert info.value.code() == code, info.value.details()
    return info.value


def images_labelled(build_label_prefix: str = "io.sandboxd.template.name") -> set[str]:
    out = subprocess.run(
        ["docker", "images", "-aq", "--no-trunc", "--filter", f"label={build_label_prefix}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return set(out.split())


def images_of_template(name: str) -> set[str]:
    return images_labelled(f"io.sandboxd.template.name={name}")


def images_with_build_label() -> set[str]:
    return images_labelled("io.sandboxd.template.build")


def test_build_list_create_read_delete(alpha) -> None:
    stubs, tpl = alpha
    name = "hello-" + secrets.token_hex(3)
    dockerfile = "FROM busybox\nCOPY greeting.txt /opt/greeting.txt\nUSER root\n"
    lines, done = build(tpl, name, dockerfile, context_tar({"greeting.txt": b"hi from ctx\n"}))
    assert done.name == name and done.state == T.TEMPLATE_STATE_READY and not done.builtin
    assert done.size_bytes > 0
    assert any("COPY" in line for line in lines), lines
    listed = tpl.ListTemplates(T.ListTemplatesRequest())
    names = {t.name: t for t in listed.templates}
    assert names[name].state == T.TEMPLATE_STATE_READY
    assert names["busybox"].builtin and names["python"].builtin
    assert tpl.GetTemplate(T.GetTemplateRequest(name=name)).template.name == name

    session = stubs.sessions.CreateSession(
        session_pb2.CreateSessionRequest(template=name, shell=ALL)
    ).session
    try:
        assert session.template == name
        out = run(stubs, session.session_id, "cat", "/opt/greeting.txt")
        assert out.stdout == b"hi from ctx\n"
        # USER root in the Dockerfile does not make the session root.
        assert run(stubs, session.session_id, "id", "-u").stdout.strip() != b"0"
        # Deleting a template a live session uses is refused.
        err = expect_error(
            grpc.StatusCode.FAILED_PRECONDITION,
            lambda: tpl.DeleteTemplate(T.DeleteTemplateRequest(name=name)),
        )
        assert error_info(err).reason == "TEMPLATE_IN_USE"
    finally:
        stubs.sessions.DeleteSession(
            session_pb2.DeleteSessionRequest(session_id=session.session_id)
        )
    tpl.DeleteTemplate(T.DeleteTemplateRequest(name=name))
    err = expect_error(
        grpc.StatusCode.NOT_FOUND, lambda: tpl.GetTemplate(T.GetTemplateRequest(name=name))
    )
    assert error_info(err).reason == "TEMPLATE_NOT_FOUND"
    assert images_of_template(name) == set()


def test_template_on_template(alpha) -> None:
    stubs, tpl = alpha
    base, child = "base-" + secrets.token_hex(3), "child-" + secrets.token_hex(3)
    build(tpl, base, "FROM busybox\nRUN echo one > /one\n")
    _, done = build(tpl, child, f"FROM {base}\nRUN cat /one > /two\n")
    assert done.state == T.TEMPLATE_STATE_READY
    for n in (child, base):
        tpl.DeleteTemplate(T.DeleteTemplateRequest(name=n))


def test_the_base_is_pinned_to_the_checked_image(alpha) -> None:
    # The engine builds on the id the server inspected: its own log names the id, not the tag.
    _, tpl = alpha
    name = "pinned-" + secrets.token_hex(3)
    image_id = subprocess.run(
        ["docker", "image", "inspect", "-f", "{{.Id}}", "sandboxd-runtime:busybox"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    lines, done = build(tpl, name, "FROM busybox\nRUN true\n")
    assert done.state == T.TEMPLATE_STATE_READY
    steps = [line for line in lines if "FROM" in line]
    assert steps and all(image_id in line for line in steps), steps
    assert not any("sandboxd-runtime" in line for line in steps), steps
    tpl.DeleteTemplate(T.DeleteTemplateRequest(name=name))


FROM_RULE, INSTRUCTION_RULE = "TEMPLATE_FROM_NOT_ALLOWED", "TEMPLATE_INSTRUCTION_NOT_ALLOWED"


@pytest.mark.parametrize(
    ("dockerfile", "reason"),
    [
        ("FROM alpine:3.19\n", FROM_RULE),
        ("FROM nosuchimage-" + "x" * 8 + "\n", FROM_RULE),
        ("FROM busybox AS a\nFROM busybox\nCOPY --from=a /bin/sh /x\n", FROM_RULE),
        ("FROM busybox\nCOPY --from=alpine:3.19 /etc/os-release /x\n", FROM_RULE),
        ("ARG B=busybox\nFROM $B\n", FROM_RULE),
        ("FROM --platform=linux/amd64 busybox\n", FROM_RULE),
        ("# syntax=docker/dockerfile:1\nFROM busybox\n", INSTRUCTION_RULE),
        ("FROM busybox\nADD http://127.0.0.1/x /x\n", INSTRUCTION_RULE),
        ("FROM busybox\nVOLUME /data\n", INSTRUCTION_RULE),
        ("FROM busybox\nONBUILD RUN true\n", INSTRUCTION_RULE),
    ],
)
def test_from_and_instructions_refused(alpha, dockerfile: str, reason: str) -> None:
    _, tpl = alpha
    err = build_error(tpl, "bad-" + secrets.token_hex(3), dockerfile)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err.details()
    assert error_info(err).reason == reason


def _bridge_gateway() -> str:
    out = subprocess.run(
        ["docker", "network", "inspect", "bridge", "--format", "{{json .IPAM.Config}}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    gateways = [c.get("Gateway") for c in json.loads(out) if c.get("Gateway")]
    if gateways:
        return str(gateways[0])
    addr = subprocess.run(
        ["ip", "-4", "-o", "addr", "show", "docker0"], capture_output=True, text=True, check=True
    ).stdout.split()
    return addr[addr.index("inet") + 1].split("/")[0]


def test_run_with_network_fails_and_leaves_nothing(alpha) -> None:
    """A RUN that reaches for a server on this machine (the Docker bridge's gateway, which any
    bridged container reaches) fails: builds have no network at all."""
    _, tpl = alpha
    hits: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            hits.append(self.path)
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("0.0.0.0", 0), Handler)  # noqa: S104
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        port = httpd.server_address[1]
        name = "net-" + secrets.token_hex(3)
        before = images_with_build_label()
        probe = (
            f'RUN printf "GET /probe HTTP/1.0\\r\\n\\r\\n" | timeout 3 nc {_bridge_gateway()} '
            f"{port} | head -1 | grep 200\n"
        )
        err = build_error(tpl, name, "FROM busybox\nRUN echo step-one > /a\n" + probe)
        assert err.code() == grpc.StatusCode.FAILED_PRECONDITION, err.details()
        assert error_info(err).reason == "TEMPLATE_BUILD_FAILED"
        assert hits == []
        got = tpl.GetTemplate(T.GetTemplateRequest(name=name)).template
        assert got.state == T.TEMPLATE_STATE_FAILED and got.message
        assert images_with_build_label() - before == set()  # the RUN echo layer was pruned
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_build_over_time_limit(alpha) -> None:
    _, tpl = alpha
    name = "slow-" + secrets.token_hex(3)
    before = images_with_build_label()
    err = build_error(tpl, name, "FROM busybox\nRUN echo x > /x\nRUN sleep 60\n")
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err.details()
    assert error_info(err).reason == "TEMPLATE_BUILD_TIMEOUT"
    deadline = time.monotonic() + 30
    while images_with_build_label() - before and time.monotonic() < deadline:
        time.sleep(0.5)
    assert images_with_build_label() - before == set()


def _build_containers() -> set[str]:
    out = subprocess.run(
        ["docker", "ps", "-aq", "--filter", "label=io.sandboxd.template.build"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return set(out.split())


def test_cancelled_build_leaves_nothing(alpha, tpl_server: ServerProcess) -> None:
    _, tpl = alpha
    name = "gone-" + secrets.token_hex(3)
    before = images_with_build_label()
    call = tpl.BuildTemplate(
        requests(name, "FROM busybox\nRUN echo x > /x\nRUN sleep 60\n"), timeout=120
    )
    for resp in call:
        if "sleep" in resp.log.line:
            break
    time.sleep(1)  # the sleep step's container is running now
    call.cancel()
    deadline = time.monotonic() + 30
    while (images_with_build_label() - before or _build_containers()) and (
        time.monotonic() < deadline
    ):
        time.sleep(0.5)
    assert images_with_build_label() - before == set()
    assert _build_containers() == set()
    got = tpl.GetTemplate(T.GetTemplateRequest(name=name)).template
    assert got.state == T.TEMPLATE_STATE_FAILED
    tpl.DeleteTemplate(T.DeleteTemplateRequest(name=name))
    assert "Traceback" not in tpl_server.log(), tpl_server.log()


def test_build_steps_run_with_the_limits(alpha) -> None:
    """The step container of a RUN: no network, the memory cap without swap, a CPU quota; a
    step that outruns the build's time limit (it holds a hungry process) is ended."""
    _, tpl = alpha
    name = "lim-" + secrets.token_hex(3)
    call = tpl.BuildTemplate(requests(name, "FROM busybox\nRUN sleep 60\n"), timeout=120)
    seen: dict[str, object] = {}
    try:
        for resp in call:
            if "Running in" in resp.log.line:
                step = resp.log.line.split()[-1]
                out = subprocess.run(
                    ["docker", "inspect", step, "--format", "{{json .HostConfig}}"],
                    capture_output=True,
                    text=True,
                    check=True,
                ).stdout
                seen = json.loads(out)
                break
    except grpc.RpcError:
        pass
    call.cancel()
    assert seen["NetworkMode"] == "none"
    assert seen["Memory"] == BUILD_MEMORY and seen["MemorySwap"] == BUILD_MEMORY
    assert seen["CpuQuota"] == 100_000 and seen["CpuPeriod"] == 100_000


def test_busy_step_over_time_limit_is_ended(alpha) -> None:
    _, tpl = alpha
    started = time.monotonic()
    err = build_error(
        tpl,
        "busy-" + secrets.token_hex(3),
        "FROM busybox\nRUN head -c 268435456 /dev/zero | tr \\\\0 a | awk '{print length}'\n",
    )
    assert time.monotonic() - started < TIMEOUT_S + 20
    assert error_info(err).reason in ("TEMPLATE_BUILD_TIMEOUT", "TEMPLATE_BUILD_FAILED")


def test_image_healthcheck_never_runs(alpha) -> None:
    stubs, tpl = alpha
    name = "hc-" + secrets.token_hex(3)
    build(tpl, name, "FROM busybox\nHEALTHCHECK --interval=1s CMD touch /tmp/hc-ran\n")
    session = stubs.sessions.CreateSession(
        session_pb2.CreateSessionRequest(template=name, shell=ALL)
    ).session
    try:
        time.sleep(3)
        out = run(stubs, session.session_id, "sh", "-c", "ls /tmp/hc-ran 2>&1 || echo absent")
        assert b"absent" in out.stdout
    finally:
        stubs.sessions.DeleteSession(
            session_pb2.DeleteSessionRequest(session_id=session.session_id)
        )
    tpl.DeleteTemplate(T.DeleteTemplateRequest(name=name))


def test_context_over_cap(alpha) -> None:
    _, tpl = alpha
    big = context_tar({"big.bin": secrets.token_bytes(CONTEXT_CAP + 1)})
    err = build_error(tpl, "big-" + secrets.token_hex(3), "FROM busybox\nCOPY big.bin /\n", big)
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert error_info(err).reason == "TEMPLATE_CONTEXT_TOO_LARGE"


def test_other_tenant_cannot_see_or_use(alpha, beta) -> None:
    _, tpl_a = alpha
    stubs_b, tpl_b = beta
    name = "mine-" + secrets.token_hex(3)
    build(tpl_a, name, "FROM busybox\nRUN echo a > /a\n")
    try:
        for call in (
            lambda: tpl_b.GetTemplate(T.GetTemplateRequest(name=name)),
            lambda: tpl_b.DeleteTemplate(T.DeleteTemplateRequest(name=name)),
            lambda: stubs_b.sessions.CreateSession(
                session_pb2.CreateSessionRequest(template=name, shell=ALL)
            ),
        ):
            err = expect_error(grpc.StatusCode.NOT_FOUND, call)
            assert error_info(err).reason == "TEMPLATE_NOT_FOUND"
        assert name not in {t.name for t in tpl_b.ListTemplates(T.ListTemplatesRequest()).templates}
        # Nor can beta build FROM alpha's template.
        err = build_error(tpl_b, "steal-" + secrets.token_hex(3), f"FROM {name}\n")
        assert error_info(err).reason == "TEMPLATE_FROM_NOT_ALLOWED"
    finally:
        tpl_a.DeleteTemplate(T.DeleteTemplateRequest(name=name))


def test_builtin_names_refused(alpha) -> None:
    _, tpl = alpha
    err = build_error(tpl, "python", "FROM busybox\n")
    assert error_info(err).reason == "TEMPLATE_BUILTIN"
    err = expect_error(
        grpc.StatusCode.FAILED_PRECONDITION,
        lambda: tpl.DeleteTemplate(T.DeleteTemplateRequest(name="busybox")),
    )
    assert error_info(err).reason == "TEMPLATE_BUILTIN"


def test_first_message_must_be_spec(alpha) -> None:
    _, tpl = alpha
    with pytest.raises(grpc.RpcError) as info:
        for _ in tpl.BuildTemplate(iter([T.BuildTemplateRequest(context=b"x")]), timeout=30):
            pass
    assert error_info(info.value).reason == "TEMPLATE_SPEC_INVALID"


SANDBOXCTL = Path(sys.executable).parent / "sandboxctl"


def test_sandboxctl_template_build_ls_rm(tpl_server: ServerProcess, tmp_path: Path) -> None:
    name = "ctl-" + secrets.token_hex(3)
    (tmp_path / "hello.txt").write_text("from the cli\n")
    (tmp_path / "Dockerfile").write_text("FROM busybox\nCOPY hello.txt /opt/hello.txt\nUSER 0\n")
    env = {**os.environ, "SANDBOXD_ADDR": tpl_server.address, "SANDBOXD_TOKEN": TOKEN_OF["alpha"]}

    def ctl(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(SANDBOXCTL), *args], capture_output=True, text=True, env=env, timeout=120
        )

    built = ctl("template", "build", name, str(tmp_path))
    assert built.returncode == 0, built.stderr
    assert f"{name} READY" in built.stdout and "COPY" in built.stderr
    listed = ctl("template", "ls")
    assert name in listed.stdout and "busybox" in listed.stdout
    other = tmp_path / "other.Dockerfile"
    other.write_text("FROM busybox\nRUN false\n")
    failed = ctl("template", "build", name + "-x", str(tmp_path), "-f", str(other))
    assert failed.returncode != 0 and "TEMPLATE_BUILD_FAILED" in failed.stderr
    assert ctl("template", "rm", name, name + "-x").returncode == 0
    assert name not in ctl("template", "ls").stdout


async def test_python_client(tpl_server: ServerProcess) -> None:
    from sandboxd_client import BuildLogLine, SandboxClient, Template

    name = "py-" + secrets.token_hex(3)
    async with SandboxClient(tpl_server.address, token=TOKEN_OF["alpha"]) as client:
        events = [
            e
            async for e in client.build_template(
                name, "FROM busybox\nCOPY f /f\n", context_tar({"f": b"x"})
            )
        ]
        assert any(isinstance(e, BuildLogLine) for e in events)
        done = events[-1]
        assert isinstance(done, Template) and done.state == "READY" and done.name == name
        assert (await client.get_template(name)).size_bytes == done.size_bytes
        assert name in [t.name async for t in client.list_templates(page_size=1)]
        await client.delete_template(name)
        assert name not in [t.name async for t in client.list_templates()]


def test_readme_templates_walkthrough(tmp_path: Path) -> None:
    from test_readme import documented_walkthroughs, run_walkthrough

    script = documented_walkthroughs()["templates"]
    owner = "readmetpl" + secrets.token_hex(3)
    server = start_server(tmp_path / "data", owner)
    try:
        lines = run_walkthrough(script, server.address, tmp_path)
    finally:
        server.stop()
        remove_owned_containers(owner)
    output = "\n".join(text for _, text in lines)
    assert "TEMPLATE_STATE_READY" in output, output
    # "hello from a template\n", base64, as Run's stdout
    assert "aGVsbG8gZnJvbSBhIHRlbXBsYXRlCg==" in output, output
    assert "greeter-cli READY" in output, output
    assert images_of_template("greeter") == set() and images_of_template("greeter-cli") == set()


def test_stalled_upload_is_abandoned(alpha) -> None:
    """A client that sends its spec and then nothing does not hold a build slot for long."""
    _, tpl = alpha

    def stalled() -> Iterator[T.BuildTemplateRequest]:
        yield T.BuildTemplateRequest(spec=T.TemplateSpec(name="stall", dockerfile="FROM busybox\n"))
        time.sleep(IDLE_S + 8)
        yield T.BuildTemplateRequest(context=b"")

    started = time.monotonic()
    with pytest.raises(grpc.RpcError) as info:
        for _ in tpl.BuildTemplate(stalled(), timeout=60):
            pass
    assert error_info(info.value).reason == "STREAM_IDLE"
    assert time.monotonic() - started < IDLE_S + 6
