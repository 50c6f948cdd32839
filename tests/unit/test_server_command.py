"""The `sandboxd` command an operator types: `--version`, `--help` with every default, and
`check-config`, which lists every problem of a configuration with its setting and source."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import HELPER
from sandboxd import __version__
from sandboxd.__main__ import main
from sandboxd.config import check_config, load_config
from sandboxd.errors import ConfigProblems

H = ["--helper", str(HELPER)]
CLEAN_ENV: dict[str, str] = {}


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"sandboxd {__version__}"


def test_help_shows_each_default(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "check-config" in text
    assert "(default: 256 MiB)" in text  # default_memory_bytes
    assert "(default: 127.0.0.1:50051)" in text  # listen
    assert "--version" in text


def test_a_good_configuration_is_ok(capsys: pytest.CaptureFixture[str]) -> None:
    assert check_config(H, CLEAN_ENV) == []
    assert main(["check-config", *H]) == 0
    assert "configuration OK" in capsys.readouterr().out


def test_every_problem_is_listed_with_its_setting_and_source(tmp_path: Path) -> None:
    config = tmp_path / "sandboxd.toml"
    config.write_text('listen = "nothere"\ndefault_memory_bytes = "lots"\n')
    env = {"SANDBOXD_DEFAULT_PIDS": "-3"}
    found = check_config(["--config", str(config), "--helper", "/nonexistent/sbx"], env)
    text = "\n".join(found)
    assert f"default_memory_bytes (from file {config})" in text  # does not parse
    assert "default_pids: must be at least 1 (got -3) (from environment SANDBOXD_DEFAULT_PIDS)" in (
        text
    )
    assert f"expected host:port, e.g. 127.0.0.1:50051 (from file {config})" in text
    assert "is missing or not executable" in text and "(from flag --helper)" in text
    assert len(found) >= 4


def test_a_value_that_did_not_parse_is_not_blamed_twice(tmp_path: Path) -> None:
    config = tmp_path / "sandboxd.toml"
    config.write_text('default_memory_bytes = "lots"\n')
    found = check_config(["--config", str(config), *H, "--max-memory-bytes", "1Mi"], CLEAN_ENV)
    (larger,) = [p for p in found if "is larger than" in p]
    assert larger.endswith("(from the default)")


def test_check_config_exits_1_and_says_how_many(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["check-config", *H, "--default-pids", "0", "--listen", "x"]) == 1
    err = capsys.readouterr().err
    assert "default_pids" in err and "listen" in err and "2 problem(s)" in err


def test_serve_stops_at_start_up_naming_the_first_and_counting_the_rest() -> None:
    with pytest.raises(ConfigProblems) as refused:
        load_config([*H, "--default-pids", "0", "--listen", "x"], CLEAN_ENV)
    assert len(refused.value.problems) == 2
    assert "check-config" in str(refused.value)


def test_serve_is_the_default_word(capsys: pytest.CaptureFixture[str]) -> None:
    """`sandboxd serve ...` and `sandboxd ...` load the same way (a bad setting stops both
    before any engine is reached)."""
    assert main(["serve", *H, "--default-pids", "0"]) == 2
    assert main([*H, "--default-pids", "0"]) == 2
    assert capsys.readouterr().err.count("default_pids") == 2


_SERVED_LIMIT = """
import resource, sys
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
import sandboxd.__main__ as served

async def serve(config, ready=None):
    print(resource.getrlimit(resource.RLIMIT_NOFILE)[0], hard)

served.serve = serve
sys.exit(served._serve(sys.argv[1:]))
"""


def test_the_served_process_raises_its_open_files_limit_to_the_hard_one(tmp_path: Path) -> None:
    """Started at a soft limit of 256 (below a service manager's usual 1024), `serve` runs with
    the hard limit: a thousand live sessions hold more descriptors than 1024 (one each). Before,
    it kept the limit it was given."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", _SERVED_LIMIT, *H, "--data-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    soft, hard = (int(v) for v in done.stdout.split())
    if hard == -1:  # RLIM_INFINITY: the kernel's per-process most
        hard = int(Path("/proc/sys/fs/nr_open").read_text())
    assert soft == hard > 256, done.stdout + done.stderr
