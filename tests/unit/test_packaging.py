"""The example configuration and the systemd unit an operator installs cannot drift from the
server: the example is rendered from the settings model, and the unit names real commands."""

from __future__ import annotations

import configparser
import re
import shlex
import subprocess
import sys
from pathlib import Path

from sandboxd.config import TABLE, Config, load_config
from sandboxd.tools.genconfig import EXAMPLE, render

REPO = Path(__file__).resolve().parents[2]
UNIT = REPO / "packaging" / "sandboxd.service"
SETTING_LINE = re.compile(r"^#([a-z_]+) = ", re.M)


def test_the_example_config_is_generated_from_the_settings() -> None:
    assert EXAMPLE.read_text() == render(), "packaging/sandboxd.toml is stale: run `make config`"


def test_the_example_names_every_setting_once() -> None:
    text = EXAMPLE.read_text()
    sections = re.split(r"^\[(\w+)\]$", text, flags=re.M)[1:]
    named = {
        (section, field)
        for section, body in zip(sections[::2], sections[1::2], strict=True)
        for field in SETTING_LINE.findall(body)
    }
    assert named == set(TABLE.places.values())
    assert len(SETTING_LINE.findall(text)) == len(TABLE.places)


def test_every_default_in_the_example_is_the_servers(tmp_path: Path) -> None:
    """Uncommented whole, the example configures exactly the defaults."""
    text = SETTING_LINE.sub(lambda m: f"{m.group(1)} = ", EXAMPLE.read_text())
    text = re.sub(r'^helper = ""\n', "", text, flags=re.M)  # found at start-up, not declared
    path = tmp_path / "all.toml"
    path.write_text(text)
    assert load_config(["--config", str(path)], env={}) == load_config([], env={})
    assert load_config([], env={}) != Config()  # (the helper is found at load: compare loads)


def test_the_example_passes_check_config() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "sandboxd", "check-config", "--config", str(EXAMPLE)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_unit_runs_the_server_with_the_example_config() -> None:
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str  # type: ignore[assignment,method-assign]
    unit.read(UNIT)
    service = unit["Service"]
    start = shlex.split(service["ExecStart"])
    assert Path(start[0]).name == "sandboxd" and start[1] == "serve"
    assert start[2:] == ["--config", "/etc/sandboxd/sandboxd.toml"]
    check = shlex.split(service["ExecStartPre"])
    assert check[1] == "check-config" and check[2:] == start[2:]
    assert "-HUP" in service["ExecReload"]  # the tokens file is reloaded on SIGHUP
    assert service["KillSignal"] == "SIGTERM"
    drain = TABLE.default("shutdown_grace_s") + TABLE.default("shutdown_snapshot_s")
    assert float(service["TimeoutStopSec"]) > drain + 10, "systemd would kill a graceful stop"
    assert "docker.service" in unit["Unit"]["After"]
