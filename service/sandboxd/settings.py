"""The machinery behind `sandboxd.config`: a setting declared once, read from every source.

A section is a frozen dataclass whose fields are `setting(...)`: the metadata holds the
`Spec` (kind, bounds, choices, help, external name). `SettingTable` walks the sections once and
derives from the specs the flags, the `SANDBOXD_*` variables, the TOML keys, `--help`, the
parsing of text and TOML values, and the bound checks. Nothing here knows a setting by name.
"""

from __future__ import annotations

import argparse
import dataclasses
import ipaddress
import logging
import re
import tomllib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandboxd.digits import decimal
from sandboxd.errors import ConfigError, ConfigProblems

log = logging.getLogger(__name__)

KiB, MiB, GiB = 1024, 1024**2, 1024**3

# Settings an earlier release had, by name, with why they went: a configuration file that
# still sets one loads (with a warning) rather than stopping a server at its upgrade.
RETIRED: dict[str, str] = {
    "egress_allow_unfiltered": (
        "sandboxes have no network interface: egress always goes through the proxy over the "
        "agent's channel, so there is no unfiltered mode to allow"
    ),
}

_SIZE_RE = re.compile(r"^\s*(\d+)\s*([kKmMgG]i?[bB]?|[bB])?\s*$")
_SIZE_UNITS = {"": 1, "b": 1, "k": KiB, "m": MiB, "g": GiB}
_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def parse_size(text: str) -> int:
    """Bytes from '1048576', '256Mi', '64MiB', '1G' (binary units either way)."""
    m = _SIZE_RE.match(text)
    if not m:
        raise ValueError(f"{text!r} is not a size (examples: 1048576, 256Mi, 1GiB)")
    unit = (m.group(2) or "").lower()[:1]
    return int(m.group(1)) * _SIZE_UNITS[unit]


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


def _parse_int(text: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise ValueError(f"{text!r} is not a whole number") from None


def _optional_path(text: str) -> Path | None:
    return Path(text) if text.strip() else None


@dataclass(frozen=True)
class Kind:
    """How text becomes a value, and which TOML types are accepted as they are."""

    name: str
    parse: Callable[[str], Any]
    numeric: str = ""  # "int" or "float": TOML numbers accepted; "" : TOML text only

    def coerce(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.parse(value)
        if isinstance(value, bool):
            if self.name == "bool":
                return value
            raise TypeError("expected a value, got a boolean")
        if isinstance(value, int | float) and self.numeric == "int":
            if isinstance(value, float) and not value.is_integer():
                raise ValueError(f"{value} is not a whole number")
            return int(value)
        if isinstance(value, int | float) and self.numeric == "float":
            return float(value)
        if isinstance(value, int | float):
            raise TypeError(f"expected text, got the number {value}")
        raise TypeError(f"unsupported value {value!r}")


TEXT = Kind("text", str)
PATH = Kind("path", Path)
OPTIONAL_PATH = Kind("path", _optional_path)
INT = Kind("int", _parse_int, "int")
SIZE = Kind("size", parse_size, "int")
DURATION = Kind("duration", parse_duration, "float")
BOOL = Kind("bool", _parse_bool)


@dataclass(frozen=True)
class Spec:
    kind: Kind
    help: str
    flat: str = ""  # external name; empty: the field name
    lo: float | None = None
    lo_open: bool = False  # lo itself refused (positive durations)
    hi: float | None = None
    choices: tuple[str, ...] = ()
    check: Callable[[Any], str | None] | None = None  # a problem text, or None

    def problem(self, value: Any) -> str | None:
        if self.choices and value not in self.choices:
            return f"use {' or '.join(self.choices)}"
        if self.lo == 0 and not self.lo_open and value < 0:
            return "must not be negative"
        if self.lo is not None and (value < self.lo or (self.lo_open and value == self.lo)):
            return f"must be {'above' if self.lo_open else 'at least'} {_num(self.lo)}"
        if self.hi is not None and value > self.hi:
            return f"must be at most {_num(self.hi)}"
        return self.check(value) if self.check is not None else None


_META = "sandboxd.setting"


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def setting(
    default: Any,
    kind: Kind,
    help: str,
    *,
    flat: str = "",
    lo: float | None = None,
    lo_open: bool = False,
    hi: float | None = None,
    choices: tuple[str, ...] = (),
    check: Callable[[Any], str | None] | None = None,
) -> Any:
    """Declare one setting as a dataclass field of a section."""
    spec = Spec(kind, help, flat, lo, lo_open, hi, choices, check)
    return dataclasses.field(default=default, metadata={_META: spec})


def host_port_problem(value: str, example: str, *, ip_only: bool = True) -> str | None:
    host, sep, port_text = value.rpartition(":")
    port = decimal(port_text, max_digits=5)
    if not sep or not host or port is None or not 0 <= port <= 65535:
        return f"expected host:port, e.g. {example}"
    host = host.strip("[]")
    if ip_only and host not in ("localhost", "0.0.0.0", "::"):
        try:
            ipaddress.ip_address(host)
        except ValueError:
            return f"{host!r} is not an IP address"
    return None


def is_loopback_host(host: str) -> bool:
    """Whether a host name or address (brackets allowed) reaches only this machine: the one
    rule for a listener that may go without TLS and for an engine or registry reached in the
    clear."""
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _shown_default(value: Any) -> str:
    """A default as an operator would write it: sizes in MiB or GiB where they divide."""
    if value is None or value == "":
        return "unset"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int) and value >= 1 << 20:
        for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20)):
            if value % size == 0:
                return f"{value // size} {unit}"
    if isinstance(value, tuple | list | frozenset):
        return ",".join(str(v) for v in value) or "none"
    return str(value)


class SettingTable:
    """Every setting of a config class: flat name -> (section, field, spec)."""

    def __init__(self, config_cls: type[Any]) -> None:
        self._cls = config_cls
        self.places: dict[str, tuple[str, str]] = {}
        self.specs: dict[str, Spec] = {}
        self.sections: dict[str, type[Any]] = {}
        for sec in dataclasses.fields(config_cls):
            section_cls: Any = sec.default_factory
            self.sections[sec.name] = section_cls
            for f in dataclasses.fields(section_cls):
                spec: Spec = f.metadata[_META]
                flat = spec.flat or f.name
                assert flat not in self.places, f"setting {flat} declared twice"
                self.places[flat] = (sec.name, f.name)
                self.specs[flat] = spec

    def new(self, section: str) -> Any:
        """A section with its defaults."""
        return self.sections[section]()

    def parser(self) -> argparse.ArgumentParser:
        from sandboxd import __version__

        parser = argparse.ArgumentParser(
            prog="sandboxd",
            usage="sandboxd [serve | check-config] [--config FILE] [--SETTING VALUE ...]",
            description="Serve isolated Docker sandboxes over gRPC. `sandboxd check-config` "
            "lists every problem of a configuration (its setting and source) and exits 1 if any.",
            epilog="Every flag can also be set as SANDBOXD_<NAME> or in the TOML file.",
        )
        parser.add_argument("--version", action="version", version=f"sandboxd {__version__}")
        parser.add_argument("--config", help="TOML configuration file (or SANDBOXD_CONFIG)")
        groups = {
            name: parser.add_argument_group(name, (cls.__doc__ or "").strip())
            for name, cls in self.sections.items()
        }
        for flat, (section, _) in self.places.items():
            spec = self.specs[flat]
            groups[section].add_argument(
                "--" + flat.replace("_", "-"),
                dest=flat,
                metavar=spec.kind.name.upper(),
                help=f"{spec.help} (default: {_shown_default(self.default(flat))})".replace(
                    "%", "%%"
                ),
            )
        return parser

    def gather(
        self, argv: Sequence[str] | None, env: Mapping[str, str], extra_env: Mapping[str, str]
    ) -> dict[str, tuple[Any, str]]:
        """Raw values with their source, the highest precedence winning."""
        args = self.parser().parse_args(argv)
        raw: dict[str, tuple[Any, str]] = {}
        config_file = args.config or env.get("SANDBOXD_CONFIG")
        if config_file:
            raw.update(self._read_toml(Path(config_file)))
        for flat, var in extra_env.items():
            if env.get(var):
                raw[flat] = (env[var], f"environment {var}")
        for flat in self.places:
            var = "SANDBOXD_" + flat.upper()
            if var in env:
                raw[flat] = (env[var], f"environment {var}")
        for flat in self.places:
            value = getattr(args, flat)
            if value is not None:
                raw[flat] = (value, f"flag --{flat.replace('_', '-')}")
        return raw

    def parse(
        self, raw: Mapping[str, tuple[Any, str]], problems: list[str] | None = None
    ) -> dict[str, Any]:
        """Typed values; a value that does not parse is a problem naming the setting and its
        source, gathered in `problems` when given (every one is reported), else raised."""
        values: dict[str, Any] = {}
        found: list[str] = []
        for flat, (value, source) in raw.items():
            try:
                values[flat] = self.specs[flat].kind.coerce(value)
            except (ValueError, TypeError) as exc:
                found.append(f"{flat} (from {source}): {exc}")
        if problems is not None:
            problems.extend(found)
        elif found:
            raise ConfigProblems(found)
        return values

    def replace(self, config: Any, flat_values: Mapping[str, Any]) -> Any:
        per_section: dict[str, dict[str, Any]] = {}
        for flat, value in flat_values.items():
            if flat not in self.places:
                raise TypeError(f"unknown setting {flat}")
            section, name = self.places[flat]
            per_section.setdefault(section, {})[name] = value
        return dataclasses.replace(
            config,
            **{
                s: dataclasses.replace(getattr(config, s), **changes)
                for s, changes in per_section.items()
            },
        )

    def declared_problems(self, config: Any) -> Iterator[str]:
        """The bounds, choices and checks of every declaration, each broken one once."""
        for flat, (section, name) in self.places.items():
            value = getattr(getattr(config, section), name)
            problem = self.specs[flat].problem(value)
            if problem:
                yield f"{flat}: {problem} (got {value!r})"

    def default(self, flat: str) -> Any:
        section, name = self.places[flat]
        return getattr(self.new(section), name)

    def _read_toml(self, path: Path) -> dict[str, tuple[Any, str]]:
        try:
            with path.open("rb") as fh:
                data = tomllib.load(fh)
        except FileNotFoundError:
            raise ConfigError(f"configuration file {path} does not exist") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"configuration file {path} is not valid TOML: {exc}") from None
        found: dict[str, tuple[Any, str]] = {}
        unknown: list[str] = []
        for key, value in data.items():
            if key in self.sections and isinstance(value, dict):
                # [section] tables: keys are the section's field names (or the flat names).
                by_field = {f: flat for flat, (s, f) in self.places.items() if s == key}
                for sub, sub_value in value.items():
                    flat = by_field.get(sub, sub if self.places.get(sub, ("",))[0] == key else "")
                    if flat:
                        found[flat] = (sub_value, f"file {path} [{key}]")
                    elif f"{key}_{sub}" in RETIRED or sub in RETIRED:
                        name = f"{key}_{sub}" if f"{key}_{sub}" in RETIRED else sub
                        log.warning(
                            "configuration file %s: [%s] %s is retired (%s)",
                            path,
                            key,
                            sub,
                            RETIRED[name],
                        )
                    else:
                        unknown.append(f"{key}.{sub}")
            elif key in self.places:
                found[key] = (value, f"file {path}")
            elif key in RETIRED:
                log.warning("configuration file %s: %s is retired (%s)", path, key, RETIRED[key])
            else:
                unknown.append(key)
        if unknown:
            raise ConfigError(f"configuration file {path}: unknown settings {', '.join(unknown)}")
        return found
