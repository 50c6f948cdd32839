"""Server configuration: nested frozen sections, each setting declared once, loaded at start-up.

Every setting is one `setting(...)` field of a section below: its type (a `Kind`), default,
bounds or choices, and help. Flags, `SANDBOXD_*` variables, the TOML file, `--help` and the
checks of `validate` are all derived from those declarations (`sandboxd.settings` holds the
machinery). Code reads `config.<section>.<field>`, e.g. `config.limits.default`.

Precedence: command-line flags > `SANDBOXD_*` environment > TOML file (`--config` or
`SANDBOXD_CONFIG`) > built-in defaults. Every setting keeps one external name in all three
places: `--default-memory-bytes`, `SANDBOXD_DEFAULT_MEMORY_BYTES`, `default_memory_bytes = ...`
(TOML also accepts `[limits]` tables keyed by field name). Any invalid value stops the server
with a `ConfigError` naming the setting and its source.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sandboxd import engine_address
from sandboxd.config_sections import (
    AdmissionSection,
    AgentSection,
    ArchiveSection,
    AuditSection,
    E2bSection,
    EgressSection,
    EngineSection,
    EventsSection,
    ImagesSection,
    IsolationSection,
    LeasesSection,
    LimitsSection,
    MetricsSection,
    MiB,
    PreviewsSection,
    ServerSection,
    TemplatesSection,
    TenancySection,
    VolumesSection,
    WatchSection,
    WebSection,
)
from sandboxd.config_sections.server import MAX_ID
from sandboxd.errors import ConfigError, ConfigProblems
from sandboxd.models import LIMIT_NAMES
from sandboxd.settings import (
    SettingTable,
    host_port_problem,
    is_loopback_host,
    parse_duration,
    parse_size,
)
from sandboxd.tokens import load_tokens
from sandboxd.validation.image_refs import parse_patterns

__all__ = [
    "DEFAULT_LIMITS",
    "MAX_LIMITS",
    "Config",
    "listens_on_loopback",
    "load_config",
    "parse_duration",
    "parse_size",
    "check_config",
    "problems",
    "validate",
    "validate_access",
]


@dataclass(frozen=True, init=False)
class Config:
    server: ServerSection = field(default_factory=ServerSection)
    engine: EngineSection = field(default_factory=EngineSection)
    limits: LimitsSection = field(default_factory=LimitsSection)
    leases: LeasesSection = field(default_factory=LeasesSection)
    tenancy: TenancySection = field(default_factory=TenancySection)
    egress: EgressSection = field(default_factory=EgressSection)
    images: ImagesSection = field(default_factory=ImagesSection)
    archive: ArchiveSection = field(default_factory=ArchiveSection)
    metrics: MetricsSection = field(default_factory=MetricsSection)
    isolation: IsolationSection = field(default_factory=IsolationSection)
    templates: TemplatesSection = field(default_factory=TemplatesSection)
    audit: AuditSection = field(default_factory=AuditSection)
    events: EventsSection = field(default_factory=EventsSection)
    watch: WatchSection = field(default_factory=WatchSection)
    previews: PreviewsSection = field(default_factory=PreviewsSection)
    agent: AgentSection = field(default_factory=AgentSection)
    volumes: VolumesSection = field(default_factory=VolumesSection)
    web: WebSection = field(default_factory=WebSection)
    admission: AdmissionSection = field(default_factory=AdmissionSection)
    e2b: E2bSection = field(default_factory=E2bSection)

    def __init__(self, **settings: Any) -> None:
        """Sections by name (`server=ServerSection(...)`), defaults for the rest.

        Settings may also be given by their external names (`Config(data_dir=..., pool_size=...)`,
        and so `dataclasses.replace(config, pool_size=...)`), the names of flags, environment and
        TOML: embedding code and tests write what an operator would. Reading is by section only.
        """
        for f in dataclasses.fields(self):
            value = settings.pop(f.name, None)
            object.__setattr__(self, f.name, value if value is not None else TABLE.new(f.name))
        if settings:
            replaced = self.replace(**settings)
            for f in dataclasses.fields(self):
                object.__setattr__(self, f.name, getattr(replaced, f.name))

    @property
    def max_message_bytes(self) -> int:
        # Room for the largest file a session may move through the API plus envelope.
        return self.limits.max_file_bytes + 1 * MiB

    def replace(self, **changes: Any) -> Config:
        """A copy with settings changed by their external names (`listen=`, `default_pids=`);
        `default_limits=`/`max_limits=` take a whole `Limits`."""
        flat: dict[str, Any] = {}
        for name, value in changes.items():
            prefix = {"default_limits": "default_", "max_limits": "max_"}.get(name)
            if prefix is None:
                flat[name] = value
            else:
                flat.update({prefix + n: getattr(value, n) for n in LIMIT_NAMES})
        replaced: Config = TABLE.replace(self, flat)
        return replaced


TABLE = SettingTable(Config)
DEFAULT_LIMITS = Config().limits.default
MAX_LIMITS = Config().limits.max


def _default_helper() -> Path:
    # A wheel (make package) carries it inside the package; a source checkout keeps it in
    # build/ (make helper); an older install put it beside the prefix.
    packaged = Path(__file__).resolve().parent / "bin" / "sbx"
    repo_build = Path(__file__).resolve().parents[2] / "build" / "sbx"
    for candidate in (packaged, repo_build, Path("/usr/local/lib/sandboxd/sbx")):
        if candidate.exists():
            return candidate
    return repo_build


def load_config(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> Config:
    """The configuration from flags, environment, file and defaults, or ConfigProblems."""
    env = os.environ if env is None else env
    raw = TABLE.gather(argv, env, extra_env=_EXTRA_ENV)
    values = TABLE.parse(raw)
    if "helper" not in values:
        values["helper"] = _default_helper()
    config: Config = TABLE.replace(Config(), values)
    validate(config)
    return config


_EXTRA_ENV = {"docker_host": "DOCKER_HOST"}


def check_config(
    argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None
) -> list[str]:
    """Every problem of the configuration `load_config` would load, each naming its setting
    and where its value came from (a flag, a variable, the file, or the default)."""
    env = os.environ if env is None else env
    try:
        raw = TABLE.gather(argv, env, extra_env=_EXTRA_ENV)
    except ConfigError as exc:  # the file itself: nothing in it can be judged
        return [str(exc)]
    found: list[str] = []
    values = TABLE.parse(raw, found)
    if "helper" not in values:
        values["helper"] = _default_helper()
    config: Config = TABLE.replace(Config(), values)
    for problem in problems(config):
        flat = problem.split(" ", 1)[0].rstrip(":")
        # A value that did not parse is already a problem; the config holds its default.
        given = flat in raw and flat in values
        source = raw[flat][1] if given else "the default" if flat in TABLE.places else ""
        found.append(f"{problem} (from {source})" if source else problem)
    return found


def validate(config: Config) -> None:
    """Stop at start-up on any problem (`problems` lists them all)."""
    found = list(problems(config))
    if found:
        raise ConfigProblems(found)


def problems(config: Config) -> Iterator[str]:
    """Every problem of a loaded configuration, each starting with the setting it is about."""
    yield from TABLE.declared_problems(config)
    for check in _CHECKS:
        try:
            yield from check(config)
        except ConfigError as exc:  # a check that can only say its first problem
            yield str(exc)


def _server_problems(config: Config) -> Iterator[str]:
    problem = host_port_problem(config.server.listen, "127.0.0.1:50051")
    if problem:
        yield f"listen {config.server.listen!r}: {problem}"


def _engine_problems(config: Config) -> Iterator[str]:
    engine = config.engine
    engine_address.from_settings(engine)  # the address and TLS files of the engine
    if not engine.image.strip():
        yield "image: must not be empty"
    host_ids_problem = _host_ids_problem(engine)
    if host_ids_problem:
        yield host_ids_problem
    if not engine.helper.is_file() or not os.access(engine.helper, os.X_OK):
        yield (
            f"helper {str(engine.helper)!r} is missing or not executable; "
            "build it with 'make helper' or point SANDBOXD_HELPER at it"
        )


def _limit_problems(config: Config) -> Iterator[str]:
    limits = config.limits
    for name in LIMIT_NAMES:
        default, maximum = getattr(limits, f"default_{name}"), getattr(limits, f"max_{name}")
        if default > maximum:
            yield f"default_{name} ({default}) is larger than max_{name} ({maximum})"
    if limits.default_disk_bytes > limits.max_disk_bytes:
        yield (
            f"default_disk_bytes ({limits.default_disk_bytes}) is larger than max_disk_bytes "
            f"({limits.max_disk_bytes})"
        )
    leases = config.leases
    if not 0 < leases.default_s <= leases.max_s:
        yield (
            f"lease_default_s ({leases.default_s}) must be positive and at most "
            f"lease_max_s ({leases.max_s})"
        )


def _image_problems(config: Config) -> Iterator[str]:
    try:
        parse_patterns(config.images.allowlist)
    except ValueError as exc:
        yield f"image_allowlist: {exc}"


def _access_problems(config: Config) -> Iterator[str]:
    validate_access(config)
    return iter(())


_CHECKS: tuple[Callable[[Config], Iterator[str]], ...] = (
    _server_problems,
    _access_problems,
    _engine_problems,
    _limit_problems,
    _image_problems,
)


def _host_ids_problem(engine: EngineSection) -> str | None:
    """The host uid block of sessions holds no id that is someone else's: the keeper's uid and
    gid (a session of that uid could signal the keeper), nobody (65534, every other container's
    default user), 65535 (16-bit -1), and it stays within what a uid may be."""
    first, count = engine.host_uid_first, engine.host_uid_count
    last = first + count - 1
    if last > MAX_ID:
        return f"host_uid_first + host_uid_count - 1 ({last}) is above {MAX_ID}"
    k_uid, _, k_gid = engine.keeper_user.partition(":")
    reserved = []
    # A keeper_user that is not numeric is its own problem (its setting's check says so).
    if k_uid.isascii() and k_uid.isdigit() and k_gid.isascii() and k_gid.isdigit():
        reserved += [
            (int(k_uid), "the keeper's uid (keeper_user)"),
            (int(k_gid), "the keeper's gid (keeper_user)"),
        ]
    reserved += [(65534, "nobody"), (65535, "the 16-bit -1")]
    for value, what in reserved:
        if first <= value <= last:
            return (
                f"host_uid_first..+host_uid_count ({first}-{last}) contains {value}, {what}; "
                "choose a block that does not"
            )
    return None


def listens_on_loopback(listen: str) -> bool:
    """True when the gRPC address is reachable only from this host."""
    return is_loopback_host(listen.rpartition(":")[0])


def validate_access(config: Config) -> None:
    """Authentication and TLS settings; refuses an unauthenticated public port."""
    t = config.tenancy
    if t.tokens_file is not None:
        load_tokens(t.tokens_file)  # a malformed file stops the server now, not per call
    if (t.tls_cert is None) != (t.tls_key is None):
        raise ConfigError("tls_cert and tls_key: set both (TLS) or neither (plaintext)")
    if t.tls_client_ca is not None and t.tls_cert is None:
        raise ConfigError("tls_client_ca: client certificates need TLS; set tls_cert and tls_key")
    for name in ("tls_cert", "tls_key", "tls_client_ca"):
        path = getattr(t, name)
        if path is not None and not os.access(path, os.R_OK):
            raise ConfigError(f"{name} {str(path)!r}: missing or not readable")
    if (
        t.tokens_file is None
        and not t.allow_insecure_public_listen
        and host_port_problem(config.server.listen, "127.0.0.1:50051") is None  # else said once
        and not listens_on_loopback(config.server.listen)
    ):
        raise ConfigError(
            f"listen {config.server.listen!r}: refusing to serve a non-loopback address without "
            "authentication; set tokens_file (and preferably tls_cert/tls_key), listen on "
            "127.0.0.1, or set allow_insecure_public_listen=true to accept the risk"
        )
    _validate_web_access(config)
    _validate_e2b_access(config)


def _validate_web_access(config: Config) -> None:
    """The web gateway answers with the gRPC port's authentication, so the same refusals hold;
    client certificates cannot pass through it, so it is refused where they are required."""
    t, listen = config.tenancy, config.web.listen
    if not listen or host_port_problem(listen, "127.0.0.1:8080") is not None:
        return
    if t.tls_client_ca is not None:
        raise ConfigError(
            f"web_listen {listen!r}: the web gateway cannot pass client certificates on; "
            "unset web_listen, or tls_client_ca"
        )
    if (
        t.tokens_file is None
        and not t.allow_insecure_public_listen
        and not listens_on_loopback(listen)
    ):
        raise ConfigError(
            f"web_listen {listen!r}: refusing to serve a non-loopback address without "
            "authentication; set tokens_file, listen on 127.0.0.1, or set "
            "allow_insecure_public_listen=true to accept the risk"
        )


def _validate_e2b_access(config: Config) -> None:
    """The E2B door is a client of the gRPC port with its callers' keys as bearer tokens: the
    same refusal of an unauthenticated public address, and none with client certificates."""
    t = config.tenancy
    e2b = config.e2b.listen
    if e2b:
        if t.tls_client_ca is not None:
            raise ConfigError(
                "e2b_listen: the E2B door reaches the gRPC port as a client and has no client "
                "certificate; it cannot serve with tls_client_ca set"
            )
        if (
            t.tokens_file is None
            and not t.allow_insecure_public_listen
            and host_port_problem(e2b, "127.0.0.1:3000") is None
            and not listens_on_loopback(e2b)
        ):
            raise ConfigError(
                f"e2b_listen {e2b!r}: refusing to serve a non-loopback address without "
                "authentication; set tokens_file, listen on 127.0.0.1, or set "
                "allow_insecure_public_listen=true to accept the risk"
            )
