"""Server configuration: one frozen dataclass, loaded once at start-up.

Precedence: command-line flags > `SANDBOXD_*` environment > TOML file (`--config` or
`SANDBOXD_CONFIG`) > built-in defaults. Every setting has the same name in all three places:
`--default-memory-bytes`, `SANDBOXD_DEFAULT_MEMORY_BYTES`, `default_memory_bytes = ...`.
Any invalid value stops the server with a `ConfigError` naming the setting and its source.
"""

from __future__ import annotations

import argparse
import dataclasses
import ipaddress
import os
import re
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandboxd.errors import ConfigError
from sandboxd.models import LIMIT_NAMES, Limits

KiB, MiB, GiB = 1024, 1024**2, 1024**3

DEFAULT_LIMITS = Limits(
    memory_bytes=256 * MiB,
    cpu_millis=500,
    pids=64,
    workspace_bytes=64 * MiB,
    file_bytes=1 * MiB,
    output_bytes=1 * MiB,
    command_timeout_s=10.0,
)
MAX_LIMITS = Limits(
    memory_bytes=2 * GiB,
    cpu_millis=2000,
    pids=512,
    workspace_bytes=1 * GiB,
    file_bytes=16 * MiB,
    output_bytes=16 * MiB,
    command_timeout_s=3600.0,
)


@dataclass(frozen=True)
class Config:
    listen: str = "127.0.0.1:50051"
    data_dir: Path = Path("./data")
    image: str = "sandboxd-runtime:busybox"
    docker_host: str = ""  # empty: aiodocker's own default (DOCKER_HOST or the local socket)
    helper: Path = Path()  # resolved by load_config
    owner_id: str = ""  # empty: generated once and kept in the data directory
    keeper_user: str = "65533:65533"
    default_limits: Limits = DEFAULT_LIMITS
    max_limits: Limits = MAX_LIMITS
    lease_default_s: float = 900.0
    lease_max_s: float = 86400.0
    reaper_interval_s: float = 5.0
    engine_check_interval_s: float = 2.0
    shutdown_grace_s: float = 5.0
    keepalive_interval_s: float = 15.0  # a quiet process stream sends a keepalive this often
    docker_pool_size: int = 1024
    log_level: str = "INFO"
    archive_max_members: int = 100_000
    shutdown_snapshot_s: float = 10.0
    log_format: str = "json"  # json: one object per line; text: for a person at a terminal
    pool_size: int = 0  # started containers kept warm for default sessions (0: no pool)
    metrics_listen: str = ""  # Prometheus endpoint host:port; empty: no metrics server
    # Authentication, TLS and tenant quotas (sandboxd.tenancy, sandboxd.api.auth).
    tokens_file: Path | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_client_ca: Path | None = None
    tenant_max_sessions: int = 0  # 0: unlimited
    tenant_max_memory_bytes: int = 0
    tenant_max_concurrent_execs: int = 0
    allow_insecure_public_listen: bool = False
    # Egress allowlist (sandboxd.egress): the proxy port on each session network's gateway,
    # a static name map consulted before DNS, and the opt-in to run without a host filter.
    proxy_port: int = 3128
    proxy_hosts: str = ""
    egress_allow_unfiltered: bool = False

    @property
    def max_message_bytes(self) -> int:
        # Room for the largest file a session may move through the API plus envelope.
        return self.max_limits.file_bytes + 1 * MiB


_SIZE_RE = re.compile(r"^\s*(\d+)\s*([kKmMgG]i?[bB]?|[bB])?\s*$")
_SIZE_UNITS = {"": 1, "b": 1, "k": KiB, "m": MiB, "g": GiB}


def parse_size(text: str) -> int:
    """Bytes from '1048576', '256Mi', '64MiB', '1G' (binary units either way)."""
    m = _SIZE_RE.match(text)
    if not m:
        raise ValueError(f"{text!r} is not a size (examples: 1048576, 256Mi, 1GiB)")
    unit = (m.group(2) or "").lower()[:1]
    return int(m.group(1)) * _SIZE_UNITS[unit]


_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def parse_duration(text: str) -> float:
    """Seconds from '10', '10s', '500ms', '15m', '2h'."""
    m = _DURATION_RE.match(text)
    if not m:
        raise ValueError(f"{text!r} is not a duration (examples: 10s, 500ms, 15m, 2h)")
    return float(m.group(1)) * _DURATION_UNITS[m.group(2)]


def _parse_bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"{text!r} is not a boolean (true or false)")


def _optional_path(text: str) -> Path | None:
    return Path(text) if text.strip() else None


def _parse_int(text: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise ValueError(f"{text!r} is not a whole number") from None


@dataclass(frozen=True)
class _Setting:
    name: str
    parse: Callable[[str], Any]
    help: str


_LIMIT_PARSERS: dict[str, Callable[[str], Any]] = {
    "memory_bytes": parse_size,
    "cpu_millis": _parse_int,
    "pids": _parse_int,
    "workspace_bytes": parse_size,
    "file_bytes": parse_size,
    "output_bytes": parse_size,
    "command_timeout_s": parse_duration,
}

_SETTINGS: list[_Setting] = [
    _Setting("listen", str, "address to serve gRPC on, host:port"),
    _Setting("data_dir", Path, "directory for the session database and server state"),
    _Setting("image", str, "default runtime image of a session"),
    _Setting("docker_host", str, "Docker engine address, unix:// or tcp:// (else DOCKER_HOST)"),
    _Setting("helper", Path, "path of the static sbx helper binary mounted into containers"),
    _Setting("owner_id", str, "label value marking this server's containers"),
    _Setting("keeper_user", str, "uid:gid of each container's idle main process"),
    _Setting("lease_default_s", parse_duration, "lease of a session that asks for none"),
    _Setting("lease_max_s", parse_duration, "longest lease a session may have"),
    _Setting("reaper_interval_s", parse_duration, "how often expired leases are reaped"),
    _Setting("engine_check_interval_s", parse_duration, "how often the engine is pinged"),
    _Setting("shutdown_grace_s", parse_duration, "grace for in-flight RPCs on SIGTERM"),
    _Setting("keepalive_interval_s", parse_duration, "keepalive period of quiet process streams"),
    _Setting("docker_pool_size", _parse_int, "connections to the engine (one per open stream)"),
    _Setting("log_level", str, "DEBUG, INFO, WARNING or ERROR"),
    _Setting("archive_max_members", _parse_int, "most members one imported tar may hold"),
    _Setting(
        "shutdown_snapshot_s",
        parse_duration,
        "time SIGTERM gives to snapshotting running sessions (0: none)",
    ),
    _Setting("log_format", str, "json (one object per line) or text"),
    _Setting("pool_size", _parse_int, "warm containers kept for default sessions (0: off)"),
    _Setting("metrics_listen", str, "Prometheus /metrics address host:port (empty: off)"),
    _Setting("tokens_file", _optional_path, "bearer tokens: one 'tenant sha256hex' per line"),
    _Setting("tls_cert", _optional_path, "PEM certificate chain of the gRPC port (TLS)"),
    _Setting("tls_key", _optional_path, "PEM private key of tls_cert"),
    _Setting("tls_client_ca", _optional_path, "PEM CA bundle; set: client certificates required"),
    _Setting("tenant_max_sessions", _parse_int, "live sessions per tenant (0: unlimited)"),
    _Setting("tenant_max_memory_bytes", parse_size, "memory of a tenant's sessions (0: no cap)"),
    _Setting("tenant_max_concurrent_execs", _parse_int, "running commands per tenant (0: no cap)"),
    _Setting(
        "allow_insecure_public_listen",
        _parse_bool,
        "serve a non-loopback address without a tokens file (unsafe)",
    ),
    _Setting("proxy_port", _parse_int, "egress proxy port on each session network's gateway"),
    _Setting("proxy_hosts", str, "static egress name map name=address,... (before DNS)"),
    _Setting(
        "egress_allow_unfiltered",
        _parse_bool,
        "allow ALLOWLIST sessions when no iptables filter can be installed (weaker)",
    ),
]
for _limit in LIMIT_NAMES:
    _SETTINGS.append(_Setting(f"default_{_limit}", _LIMIT_PARSERS[_limit], f"default {_limit}"))
    _SETTINGS.append(_Setting(f"max_{_limit}", _LIMIT_PARSERS[_limit], f"largest {_limit}"))

_BY_NAME = {s.name: s for s in _SETTINGS}


def _env_name(name: str) -> str:
    return "SANDBOXD_" + name.upper()


def _flag_name(name: str) -> str:
    return "--" + name.replace("_", "-")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sandboxd",
        description="Serve isolated Docker sandboxes over gRPC.",
        epilog="Every flag can also be set as SANDBOXD_<NAME> or in the TOML file.",
    )
    parser.add_argument("--config", help="TOML configuration file (or SANDBOXD_CONFIG)")
    for s in _SETTINGS:
        parser.add_argument(_flag_name(s.name), dest=s.name, metavar="VALUE", help=s.help)
    return parser


def _default_helper() -> Path:
    # A source checkout keeps it in build/ (make helper); an install puts it beside the prefix.
    repo_build = Path(__file__).resolve().parents[2] / "build" / "sbx"
    for candidate in (repo_build, Path("/usr/local/lib/sandboxd/sbx")):
        if candidate.exists():
            return candidate
    return repo_build


def load_config(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> Config:
    env = os.environ if env is None else env
    args = _parser().parse_args(argv)
    raw: dict[str, tuple[Any, str]] = {}

    config_file = args.config or env.get("SANDBOXD_CONFIG")
    if config_file:
        raw.update(_read_toml(Path(config_file)))
    if env.get("DOCKER_HOST"):
        raw["docker_host"] = (env["DOCKER_HOST"], "environment DOCKER_HOST")
    for s in _SETTINGS:
        if _env_name(s.name) in env:
            raw[s.name] = (env[_env_name(s.name)], f"environment {_env_name(s.name)}")
    for s in _SETTINGS:
        value = getattr(args, s.name)
        if value is not None:
            raw[s.name] = (value, f"flag {_flag_name(s.name)}")

    values: dict[str, Any] = {}
    for name, (value, source) in raw.items():
        setting = _BY_NAME[name]
        try:
            values[name] = (
                setting.parse(value) if isinstance(value, str) else _coerce(value, setting)
            )
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"{name} (from {source}): {exc}") from None

    default_limits = _limits_from(values, "default_", DEFAULT_LIMITS)
    max_limits = _limits_from(values, "max_", MAX_LIMITS)
    plain = {k: v for k, v in values.items() if not k.startswith(("default_", "max_"))}
    if "helper" not in plain:
        plain["helper"] = _default_helper()
    config = Config(default_limits=default_limits, max_limits=max_limits, **plain)
    validate(config)
    return config


def _coerce(value: Any, setting: _Setting) -> Any:
    """TOML already typed the value; accept numbers for numeric settings, text for the rest."""
    if isinstance(value, bool) and setting.parse is _parse_bool:
        return value
    if isinstance(value, bool):
        raise TypeError(f"expected a value for {setting.name}, got a boolean")
    if isinstance(value, int | float) and setting.parse in (parse_size, _parse_int):
        if isinstance(value, float) and not value.is_integer():
            raise ValueError(f"{value} is not a whole number")
        return int(value)
    if isinstance(value, int | float) and setting.parse is parse_duration:
        return float(value)
    if isinstance(value, int | float):
        raise TypeError(f"expected text, got the number {value}")
    raise TypeError(f"unsupported value {value!r}")


def _read_toml(path: Path) -> dict[str, tuple[Any, str]]:
    try:
        with path.open("rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"configuration file {path} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"configuration file {path} is not valid TOML: {exc}") from None
    unknown = sorted(set(data) - set(_BY_NAME))
    if unknown:
        raise ConfigError(f"configuration file {path}: unknown settings {', '.join(unknown)}")
    return {k: (v, f"file {path}") for k, v in data.items()}


def _limits_from(values: dict[str, Any], prefix: str, base: Limits) -> Limits:
    overrides = {n: values[prefix + n] for n in LIMIT_NAMES if prefix + n in values}
    return dataclasses.replace(base, **overrides)


def validate(config: Config) -> None:
    validate_access(config)
    host, sep, port = config.listen.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"listen {config.listen!r}: expected host:port, e.g. 127.0.0.1:50051")
    host = host.strip("[]")
    if host not in ("localhost", "0.0.0.0", "::"):
        try:
            ipaddress.ip_address(host)
        except ValueError:
            raise ConfigError(f"listen {config.listen!r}: {host!r} is not an IP address") from None
    if config.docker_host and not config.docker_host.startswith(("unix://", "tcp://")):
        raise ConfigError(f"docker_host {config.docker_host!r}: must start with unix:// or tcp://")
    if not config.image.strip():
        raise ConfigError("image: must not be empty")
    for name in LIMIT_NAMES:
        default = getattr(config.default_limits, name)
        maximum = getattr(config.max_limits, name)
        for setting, value in ((f"default_{name}", default), (f"max_{name}", maximum)):
            if value <= 0:
                raise ConfigError(f"{setting} ({value}): limits must be positive")
        if default > maximum:
            raise ConfigError(f"default_{name} ({default}) is larger than max_{name} ({maximum})")
    if config.default_limits.memory_bytes < 6 * MiB:
        raise ConfigError("default_memory_bytes: Docker needs at least 6 MiB")
    if config.default_limits.cpu_millis < 10:
        raise ConfigError("default_cpu_millis: the kernel's smallest CPU quota is 10 millis")
    if not 0 < config.lease_default_s <= config.lease_max_s:
        raise ConfigError(
            f"lease_default_s ({config.lease_default_s}) must be positive and at most "
            f"lease_max_s ({config.lease_max_s})"
        )
    for name in ("reaper_interval_s", "engine_check_interval_s", "keepalive_interval_s"):
        if getattr(config, name) <= 0:
            raise ConfigError(f"{name}: must be positive")
    if config.shutdown_grace_s < 0:
        raise ConfigError("shutdown_grace_s: must not be negative")
    if config.docker_pool_size < 10:
        raise ConfigError("docker_pool_size: at least 10 connections are needed")
    if config.archive_max_members < 1:
        raise ConfigError("archive_max_members: must be positive")
    if config.shutdown_snapshot_s < 0:
        raise ConfigError("shutdown_snapshot_s: must not be negative")
    if not 1 <= config.proxy_port <= 65535:
        raise ConfigError(f"proxy_port {config.proxy_port}: must be 1-65535")
    if config.log_level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise ConfigError(f"log_level {config.log_level!r}: use DEBUG, INFO, WARNING or ERROR")
    if config.log_format not in ("json", "text"):
        raise ConfigError(f"log_format {config.log_format!r}: use json or text")
    if not 0 <= config.pool_size <= 256:
        raise ConfigError(f"pool_size ({config.pool_size}): between 0 and 256")
    if config.metrics_listen:
        m_host, m_sep, m_port = config.metrics_listen.rpartition(":")
        if not m_sep or not m_host or not m_port.isdigit() or not 0 <= int(m_port) <= 65535:
            raise ConfigError(
                f"metrics_listen {config.metrics_listen!r}: expected host:port, e.g. 127.0.0.1:9464"
            )
    if not re.fullmatch(r"\d+:\d+", config.keeper_user) or config.keeper_user.startswith("0:"):
        raise ConfigError(f"keeper_user {config.keeper_user!r}: a numeric non-root uid:gid")
    if config.owner_id and not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", config.owner_id):
        raise ConfigError(f"owner_id {config.owner_id!r}: letters, digits, '_', '.', '-' only")
    if not config.helper.is_file() or not os.access(config.helper, os.X_OK):
        raise ConfigError(
            f"helper {str(config.helper)!r} is missing or not executable; "
            "build it with 'make helper' or point SANDBOXD_HELPER at it"
        )


def listens_on_loopback(listen: str) -> bool:
    """True when the gRPC address is reachable only from this host."""
    host = listen.rpartition(":")[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def validate_access(config: Config) -> None:
    """Authentication, TLS and quota settings; refuses an unauthenticated public port."""
    from sandboxd.tenancy import load_tokens  # tenancy imports nothing from here

    if config.tokens_file is not None:
        load_tokens(config.tokens_file)  # a malformed file stops the server now, not per call
    if (config.tls_cert is None) != (config.tls_key is None):
        raise ConfigError("tls_cert and tls_key: set both (TLS) or neither (plaintext)")
    if config.tls_client_ca is not None and config.tls_cert is None:
        raise ConfigError("tls_client_ca: client certificates need TLS; set tls_cert and tls_key")
    for name in ("tls_cert", "tls_key", "tls_client_ca"):
        path = getattr(config, name)
        if path is not None and not os.access(path, os.R_OK):
            raise ConfigError(f"{name} {str(path)!r}: missing or not readable")
    for name in ("tenant_max_sessions", "tenant_max_memory_bytes", "tenant_max_concurrent_execs"):
        if getattr(config, name) < 0:
            raise ConfigError(f"{name}: must not be negative (0 means unlimited)")
    if (
        config.tokens_file is None
        and not config.allow_insecure_public_listen
        and not listens_on_loopback(config.listen)
    ):
        raise ConfigError(
            f"listen {config.listen!r}: refusing to serve a non-loopback address without "
            "authentication; set tokens_file (and preferably tls_cert/tls_key), listen on "
            "127.0.0.1, or set allow_insecure_public_listen=true to accept the risk"
        )
