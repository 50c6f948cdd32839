"""Configuration: precedence of flag > SANDBOXD_* environment > TOML file > default, parsing of
sizes and durations, validation messages that name the setting, and the exit a person sees."""

from __future__ import annotations

import dataclasses
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import HELPER, REPO
from sandboxd.config import (
    DEFAULT_LIMITS,
    MAX_LIMITS,
    Config,
    load_config,
    parse_duration,
    parse_size,
    validate,
)
from sandboxd.errors import ConfigError

MiB, GiB = 1024**2, 1024**3
H = ["--helper", str(HELPER)]  # validation needs an executable helper


def _toml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "sandboxd.toml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1048576", 1048576),
        ("256Mi", 256 * MiB),
        ("256MiB", 256 * MiB),
        ("64M", 64 * MiB),
        ("1GiB", GiB),
        ("4k", 4096),
        ("12b", 12),
    ],
)
def test_parse_size(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [("10", 10.0), ("10s", 10.0), ("500ms", 0.5), ("15m", 900.0), ("2h", 7200.0), ("1.5s", 1.5)],
)
def test_parse_duration(text: str, expected: float) -> None:
    assert parse_duration(text) == expected


@pytest.mark.parametrize("text", ["", "lots", "-1", "1TiB", "1.5Mi", "Mi"])
def test_parse_size_refuses(text: str) -> None:
    with pytest.raises(ValueError):
        parse_size(text)


@pytest.mark.parametrize("text", ["", "soon", "-1s", "10d", "1m30s"])
def test_parse_duration_refuses(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)


def test_defaults() -> None:
    c = load_config(H, env={})
    assert c.server.listen == "127.0.0.1:50051"
    assert c.server.data_dir == Path("./data")
    assert c.engine.image == "sandboxd-runtime:busybox"
    assert c.engine.docker_host == ""
    assert c.limits.default == DEFAULT_LIMITS
    assert c.limits.max == MAX_LIMITS
    assert c.limits.default.memory_bytes == 256 * MiB
    assert c.leases.default_s == 900.0 and c.leases.max_s == 86400.0
    assert c.server.shutdown_grace_s == 5.0
    assert c.server.log_level == "INFO"


FILE = """
listen = "127.0.0.1:6001"
default_memory_bytes = "128Mi"
max_cpu_millis = 1500
lease_default_s = "10m"
default_command_timeout_s = "30s"
shutdown_grace_s = 7
log_level = "WARNING"
"""


def test_file_over_defaults(tmp_path: Path) -> None:
    c = load_config([*H, "--config", str(_toml(tmp_path, FILE))], env={})
    assert c.server.listen == "127.0.0.1:6001"
    assert c.limits.default.memory_bytes == 128 * MiB
    assert c.limits.max.cpu_millis == 1500
    assert c.leases.default_s == 600.0
    assert c.limits.default.command_timeout_s == 30.0
    assert c.server.shutdown_grace_s == 7.0
    assert c.server.log_level == "WARNING"
    # what the file does not set keeps its default
    assert c.limits.default.pids == DEFAULT_LIMITS.pids
    assert c.limits.max.memory_bytes == MAX_LIMITS.memory_bytes


def test_environment_over_file(tmp_path: Path) -> None:
    env = {
        "SANDBOXD_CONFIG": str(_toml(tmp_path, FILE)),  # the file named by the environment
        "SANDBOXD_LISTEN": "127.0.0.1:6002",
        "SANDBOXD_DEFAULT_MEMORY_BYTES": "64Mi",
        "SANDBOXD_LEASE_DEFAULT_S": "15m",
    }
    c = load_config(H, env=env)
    assert c.server.listen == "127.0.0.1:6002"
    assert c.limits.default.memory_bytes == 64 * MiB
    assert c.leases.default_s == 900.0
    assert c.limits.max.cpu_millis == 1500  # still from the file
    assert c.server.log_level == "WARNING"


def test_flag_over_environment(tmp_path: Path) -> None:
    env = {
        "SANDBOXD_LISTEN": "127.0.0.1:6002",
        "SANDBOXD_DEFAULT_MEMORY_BYTES": "64Mi",
        "SANDBOXD_MAX_PIDS": "300",
        "SANDBOXD_DEFAULT_COMMAND_TIMEOUT_S": "20s",
    }
    argv = [
        *H,
        "--config",
        str(_toml(tmp_path, FILE)),
        "--listen",
        "127.0.0.1:6003",
        "--default-memory-bytes",
        "32Mi",
        "--default-command-timeout-s",
        "500ms",
        "--lease-max-s",
        "2h",
    ]
    c = load_config(argv, env=env)
    assert c.server.listen == "127.0.0.1:6003"
    assert c.limits.default.memory_bytes == 32 * MiB
    assert c.limits.default.command_timeout_s == 0.5
    assert c.leases.max_s == 7200.0
    assert c.limits.max.pids == 300  # environment, no flag
    assert c.leases.default_s == 600.0  # file, nothing above it


def test_config_flag_over_config_environment(tmp_path: Path) -> None:
    chosen = tmp_path / "chosen.toml"
    chosen.write_text('image = "chosen:1"\n')
    ignored = tmp_path / "ignored.toml"
    ignored.write_text('image = "ignored:1"\n')
    c = load_config([*H, "--config", str(chosen)], env={"SANDBOXD_CONFIG": str(ignored)})
    assert c.engine.image == "chosen:1"


def test_docker_host_sources(tmp_path: Path) -> None:
    plain = {"SANDBOXD_DOCKER_ALLOW_PLAIN_TCP": "true"}  # tcp:// without TLS, allowed explicitly
    assert load_config(
        H, env={"DOCKER_HOST": "tcp://10.0.0.1:2375", **plain}
    ).engine.docker_host == ("tcp://10.0.0.1:2375")
    both = {"DOCKER_HOST": "tcp://10.0.0.1:2375", "SANDBOXD_DOCKER_HOST": "unix:///run/d.sock"}
    assert load_config(H, env=both).engine.docker_host == "unix:///run/d.sock"
    flag = [*H, "--docker-host", "unix:///run/flag.sock"]
    assert load_config(flag, env=both).engine.docker_host == "unix:///run/flag.sock"
    # DOCKER_HOST is the environment, so it beats the file
    path = _toml(tmp_path, 'docker_host = "unix:///run/file.sock"\n')
    assert (
        load_config([*H, "--config", str(path)], env={}).engine.docker_host
        == "unix:///run/file.sock"
    )
    assert (
        load_config(
            [*H, "--config", str(path)], env={"DOCKER_HOST": "tcp://h:1", **plain}
        ).engine.docker_host
        == "tcp://h:1"
    )


def test_unknown_file_key_refused(tmp_path: Path) -> None:
    path = _toml(tmp_path, 'listen = "127.0.0.1:1"\ndefault_memory = "1Gi"\n')
    with pytest.raises(ConfigError, match="unknown settings default_memory"):
        load_config([*H, "--config", str(path)], env={})


def test_bad_file_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config([*H, "--config", str(tmp_path / "missing.toml")], env={})
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config([*H, "--config", str(_toml(tmp_path, "listen = \n"))], env={})


@pytest.mark.parametrize(
    ("argv", "env", "named"),
    [
        (["--default-memory-bytes", "lots"], {}, "default_memory_bytes (from flag"),
        ([], {"SANDBOXD_LEASE_MAX_S": "forever"}, "lease_max_s (from environment"),
        ([], {"SANDBOXD_MAX_PIDS": "1.5"}, "max_pids (from environment SANDBOXD_MAX_PIDS)"),
        (["--docker-pool-size", "many"], {}, "docker_pool_size (from flag --docker-pool-size)"),
    ],
)
def test_unparsable_value_names_setting_and_source(
    argv: list[str], env: dict[str, str], named: str
) -> None:
    with pytest.raises(ConfigError) as excinfo:
        load_config([*H, *argv], env=env)
    assert named in str(excinfo.value)


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("default_pids = true", "default_pids"),
        ("max_cpu_millis = 1.5", "max_cpu_millis"),
        ("listen = 50051", "listen"),
        ("image = [1]", "image"),
    ],
)
def test_badly_typed_file_value_names_setting(tmp_path: Path, text: str, named: str) -> None:
    with pytest.raises(ConfigError) as excinfo:
        load_config([*H, "--config", str(_toml(tmp_path, text + "\n"))], env={})
    assert str(excinfo.value).startswith(f"{named} (from file ")


def _limits(which: str, **values: Any) -> dict[str, Any]:
    base = DEFAULT_LIMITS if which == "default_limits" else MAX_LIMITS
    return {which: dataclasses.replace(base, **values)}


# Every check in config.validate: (changes to a valid Config, a word the message must hold).
VALIDATION_CASES: list[tuple[dict[str, Any], str]] = [
    ({"listen": "127.0.0.1"}, "listen"),
    ({"listen": ":50051"}, "listen"),
    ({"listen": "127.0.0.1:99999"}, "listen"),
    ({"listen": "127.0.0.1:http"}, "listen"),
    ({"listen": "example.com:50051"}, "listen"),
    ({"docker_host": "http://127.0.0.1:2375"}, "docker_host"),
    ({"docker_host": "/var/run/docker.sock"}, "docker_host"),
    ({"image": "  "}, "image"),
    (_limits("default_limits", pids=0), "default_pids"),
    (_limits("max_limits", cpu_millis=-1), "max_cpu_millis"),
    (_limits("default_limits", workspace_bytes=2 * GiB), "default_workspace_bytes"),
    (_limits("default_limits", command_timeout_s=7200.0), "default_command_timeout_s"),
    (_limits("default_limits", memory_bytes=4 * MiB), "default_memory_bytes"),
    ({"lease_default_s": 0.0}, "lease_default_s"),
    ({"lease_default_s": 100000.0}, "lease_default_s"),
    ({"reaper_interval_s": 0.0}, "reaper_interval_s"),
    ({"engine_check_interval_s": -1.0}, "engine_check_interval_s"),
    ({"shutdown_grace_s": -1.0}, "shutdown_grace_s"),
    ({"docker_pool_size": 5}, "docker_pool_size"),
    ({"log_level": "LOUD"}, "log_level"),
    ({"keeper_user": "0:0"}, "keeper_user"),
    ({"keeper_user": "nobody"}, "keeper_user"),
    ({"keeper_user": "00:00"}, "keeper_user"),
    ({"keeper_user": "0:65533"}, "keeper_user"),
    ({"keeper_user": "65533:000"}, "keeper_user"),
    ({"keeper_user": "+0:1"}, "keeper_user"),
    ({"keeper_user": "\u0661:1"}, "keeper_user"),
    ({"egress_private_networks": "maybe"}, "egress_private_networks"),
    ({"tenant_max_streams": -1}, "tenant_max_streams"),
    ({"stream_idle_timeout_s": 0.0}, "stream_idle_timeout_s"),
    ({"egress_resolver_threads": 0}, "egress_resolver_threads"),
    ({"egress_dns_timeout_s": 0.0}, "egress_dns_timeout_s"),
    ({"image_allowlist": "Bad Image!"}, "image_allowlist"),
    ({"owner_id": "not ok!"}, "owner_id"),
    ({"helper": Path("/nonexistent/sbx")}, "helper"),
    (_limits("default_limits", cpu_millis=5), "default_cpu_millis"),
    ({"keepalive_interval_s": 0.0}, "keepalive_interval_s"),
    ({"proxy_port": 0}, "proxy_port"),
    ({"log_format": "xml"}, "log_format"),
    ({"pool_size": 1000}, "pool_size"),
    ({"metrics_listen": "9464"}, "metrics_listen"),
    ({"tls_cert": Path("/etc/hostname")}, "tls_cert"),
    ({"tls_client_ca": Path("/etc/hostname")}, "tls_client_ca"),
    ({"tls_cert": Path("/nonexistent.pem"), "tls_key": Path("/nonexistent.pem")}, "tls_cert"),
    ({"tenant_max_sessions": -1}, "tenant_max_sessions"),
    ({"listen": "0.0.0.0:50051"}, "listen"),
]


@pytest.mark.parametrize(
    ("changes", "named"), VALIDATION_CASES, ids=[n for _, n in VALIDATION_CASES]
)
def test_validation_names_the_setting(changes: dict[str, Any], named: str) -> None:
    valid = Config().replace(helper=HELPER)
    validate(valid)  # the base is valid: only the change can fail it
    with pytest.raises(ConfigError) as excinfo:
        validate(valid.replace(**changes))
    assert named in str(excinfo.value)


def test_helper_not_executable(tmp_path: Path) -> None:
    helper = tmp_path / "sbx"
    helper.write_bytes(HELPER.read_bytes())
    helper.chmod(0o644)
    with pytest.raises(ConfigError, match="helper"):
        validate(Config().replace(helper=helper))


def test_validation_runs_on_loaded_values(tmp_path: Path) -> None:
    """load_config validates what it assembled from several sources together."""
    with pytest.raises(ConfigError, match="default_memory_bytes"):
        load_config(
            [*H, "--max-memory-bytes", "128Mi"], env={"SANDBOXD_DEFAULT_MEMORY_BYTES": "256Mi"}
        )


def _sandboxd(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sandboxd", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env={**os.environ, **(env or {})},
    )


@pytest.mark.parametrize(
    ("args", "env", "named"),
    [
        (("--default-memory-bytes", "lots"), {}, "default_memory_bytes"),
        ((), {"SANDBOXD_LOG_LEVEL": "LOUD"}, "log_level"),
        (("--listen", "nowhere"), {}, "listen"),
    ],
)
def test_bad_setting_exits_2_with_one_line(
    tmp_path: Path, args: tuple[str, ...], env: dict[str, str], named: str
) -> None:
    proc = _sandboxd("--helper", str(HELPER), "--data-dir", str(tmp_path), *args, env=env)
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("sandboxd: configuration error: ")
    assert named in lines[0]
    assert not list(tmp_path.iterdir()), "a refused configuration wrote to the data directory"


def test_missing_helper_exits_2() -> None:
    proc = _sandboxd("--helper", "/nonexistent/sbx")
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]
    assert "helper" in proc.stderr and "make helper" in proc.stderr


def test_address_in_use_exits_2(tmp_path: Path) -> None:
    """A listen address that cannot be bound is found only at start: still no traceback."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = _sandboxd(
            "--helper",
            str(HELPER),
            "--data-dir",
            str(tmp_path),
            "--listen",
            f"127.0.0.1:{port}",
            "--owner-id",
            "cfgtest",
        )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("sandboxd: ") and f"127.0.0.1:{port}" in last


def test_every_setting_is_declared_once_and_documented() -> None:
    """One declaration per setting drives flags, environment, TOML and the documented table."""
    from sandboxd.config import TABLE

    readme = "".join(doc.read_text() for doc in sorted((REPO / "docs").glob("*.md")))
    for flat, (section, field) in TABLE.places.items():
        assert flat in readme or flat.startswith(("default_", "max_")), flat
        assert hasattr(getattr(Config(), section), field), (flat, section, field)
        assert not hasattr(Config(), flat) or flat == section  # read by section only
    assert Config().limits.default == DEFAULT_LIMITS and Config().limits.max == MAX_LIMITS
    with pytest.raises(AttributeError):
        _ = Config().no_such_setting


def test_section_tables_in_the_file(tmp_path: Path) -> None:
    path = _toml(
        tmp_path,
        '[leases]\ndefault_s = "10m"\n[limits]\nmax_pids = 100\n'
        '[egress]\nprivate_networks = "allow"\negress_resolver_threads = 2\n',
    )
    c = load_config([*H, "--config", str(path)], env={})
    assert c.leases.default_s == 600.0 and c.limits.max.pids == 100
    assert c.egress.private_networks == "allow" and c.egress.resolver_threads == 2
    with pytest.raises(ConfigError, match="unknown settings leases.nope"):
        load_config([*H, "--config", str(_toml(tmp_path, "[leases]\nnope = 1\n"))], env={})


@pytest.mark.parametrize("spelling", ["0:0", "00:00", "0:1000", "1000:0", "000:1"])
def test_root_keeper_refused_from_every_source(spelling: str) -> None:
    with pytest.raises(ConfigError, match="keeper_user"):
        load_config([*H, "--keeper-user", spelling], env={})
    with pytest.raises(ConfigError, match="keeper_user"):
        load_config(H, env={"SANDBOXD_KEEPER_USER": spelling})


@pytest.mark.parametrize(
    "text", ["egress_allow_unfiltered = true\n", "[egress]\nallow_unfiltered = true\n"]
)
def test_a_retired_setting_in_the_file_loads_with_a_warning(
    tmp_path: Path, text: str, caplog: pytest.LogCaptureFixture
) -> None:
    """An upgraded server keeps starting with its old file; the log says what went and why."""
    path = _toml(tmp_path, text)
    load_config([*H, "--config", str(path)], env={})
    assert "allow_unfiltered is retired" in caplog.text
