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

import pytest

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
