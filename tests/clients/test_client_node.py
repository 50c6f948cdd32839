"""The Node client (clients/node) against this suite's live server: its own tests (`node
--test`), the conformance scenario, and the `npm pack` tarball installed into a project
outside the repository (protos shipped inside, declarations compiled there with tsc).

Dependencies come from the committed package-lock.json (`npm ci`), installed only when the
lock file changed since the last install.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest
from conftest import REPO, ServerProcess
from polyglot import (
    CONFORMANCE,
    PROTO_DIR,
    TOKEN,
    conformance_steps,
    passed_steps,
    service_rpcs,
    token_server,
)

NODE_DIR = REPO / "clients" / "node"
__all__ = ["token_server"]


def ensure_node_deps() -> None:
    """`npm ci` unless node_modules already matches package-lock.json."""
    lock = NODE_DIR / "package-lock.json"
    stamp = NODE_DIR / "node_modules" / ".sandboxd-installed"
    if stamp.exists() and stamp.read_bytes() == lock.read_bytes():
        return
    done = subprocess.run(
        ["npm", "ci", "--no-audit", "--no-fund"],
        cwd=NODE_DIR,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, f"npm ci failed:\n{done.stdout}\n{done.stderr}"
    stamp.write_bytes(lock.read_bytes())


def node(
    *args: str, cwd: Path = NODE_DIR, env: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k != "SANDBOXD_PROTO_DIR"}
    return subprocess.run(
        ["node", *args],
        cwd=cwd,
        env={**clean, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(scope="module", autouse=True)
def _deps() -> None:
    assert shutil.which("node") and shutil.which("npm"), "Node 20 and npm are needed"
    ensure_node_deps()


def test_node_client(server: ServerProcess) -> None:
    result = node("--test", "--test-reporter=spec", "test/", env={"SANDBOXD_ADDR": server.address})
    assert result.returncode == 0, f"node --test failed:\n{result.stdout}\n{result.stderr}"


def test_typescript_declarations() -> None:
    """src/index.d.ts compiles under `tsc --strict` with a typical use of the client."""
    result = subprocess.run(
        ["npm", "run", "--silent", "check:types"],
        cwd=NODE_DIR,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, f"tsc failed:\n{result.stdout}\n{result.stderr}"


def test_node_conformance(server: ServerProcess) -> None:
    result = node("conformance/run.mjs", str(CONFORMANCE), env={"SANDBOXD_ADDR": server.address})
    assert passed_steps(result.stdout) == conformance_steps(), result.stdout + result.stderr
    assert result.returncode == 0, result.stderr


def test_wrong_token_is_a_typed_error(token_server: ServerProcess) -> None:
    script = """
      import * as sbx from './src/index.js';
      const c = new sbx.SandboxClient(process.env.SANDBOXD_ADDR,
        { token: process.argv[1], timeout: 5 });
      try { await c.createSession({}); console.log('no error'); }
      catch (e) { console.log(JSON.stringify({ name: e.name, reason: e.reason,
        unauth: e instanceof sbx.Unauthenticated })); }
      finally { c.close(); }
    """
    wrong = node(
        "--input-type=module",
        "-e",
        script,
        "wrong-token",
        env={"SANDBOXD_ADDR": token_server.address},
        timeout=30,
    )
    assert json.loads(wrong.stdout) == {
        "name": "TokenInvalidError",
        "reason": "TOKEN_INVALID",
        "unauth": True,
    }, wrong.stderr
    right = node(
        "--input-type=module",
        "-e",
        script.replace("c.createSession({})", "c.serverInfo()"),
        TOKEN,
        env={"SANDBOXD_ADDR": token_server.address},
        timeout=30,
    )
    assert right.stdout.strip() == "no error", right.stdout + right.stderr


@pytest.fixture(scope="module")
def consumer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A project outside the repository with the `npm pack` tarball installed."""
    tmp = tmp_path_factory.mktemp("node-consumer")
    assert REPO not in tmp.parents
    packed = subprocess.run(
        ["npm", "pack", "--pack-destination", str(tmp)],
        cwd=NODE_DIR,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert packed.returncode == 0, packed.stderr
    tarball = tmp / packed.stdout.strip().splitlines()[-1]
    with tarfile.open(tarball) as tar:
        members = set(tar.getnames())
    for proto in PROTO_DIR.glob("*.proto"):
        assert f"package/proto/sandboxd/v1/{proto.name}" in members, f"{proto.name} not shipped"
    assert not (NODE_DIR / "proto").exists(), "postpack leaves no copy in the checkout"

    project = tmp / "app"
    project.mkdir()
    (project / "package.json").write_text(
        json.dumps({"name": "app", "private": True, "type": "module"})
    )
    dev = json.loads((NODE_DIR / "package.json").read_text())["devDependencies"]
    install = subprocess.run(
        [
            "npm",
            "install",
            "--no-audit",
            "--no-fund",
            "--prefer-offline",
            str(tarball),
            f"typescript@{dev['typescript']}",
            f"@types/node@{dev['@types/node']}",
        ],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert install.returncode == 0, install.stdout + install.stderr
    return project


def test_packed_client_types_outside_the_repo(consumer: Path) -> None:
    source = (NODE_DIR / "test" / "types-check.ts").read_text()
    (consumer / "consumer.ts").write_text(source.replace("'../src/index.js'", "'@sandboxd/client'"))
    (consumer / "tsconfig.json").write_text(
        json.dumps(
            {
                "compilerOptions": {
                    "target": "ES2022",
                    "module": "NodeNext",
                    "moduleResolution": "NodeNext",
                    "strict": True,
                    "noEmit": True,
                    "skipLibCheck": False,
                    "types": ["node"],
                },
                "files": ["consumer.ts"],
            }
        )
    )
    tsc = subprocess.run(
        ["node", "node_modules/typescript/bin/tsc", "--noEmit", "-p", "tsconfig.json"],
        cwd=consumer,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert tsc.returncode == 0, tsc.stdout + tsc.stderr


def test_packed_client_runs_outside_the_repo(consumer: Path, server: ServerProcess) -> None:
    """The README quickstart, every RPC, and the conformance scenario, through the tarball."""
    readme = (NODE_DIR / "README.md").read_text()
    quickstart = re.search(r"```js\n(.*?)```", readme, flags=re.DOTALL)
    assert quickstart
    (consumer / "quickstart.mjs").write_text(quickstart.group(1))
    code = [ln for ln in quickstart.group(1).splitlines() if ln.strip() and "import" not in ln]
    assert len(code) <= 12, code  # the hello stays short: it is the README's own text
    (consumer / "project").mkdir(exist_ok=True)
    (consumer / "project" / "a.txt").write_text("a\n")
    env = {"SANDBOXD_ADDR": server.address}
    ran = node("quickstart.mjs", cwd=consumer, env=env, timeout=120)
    expected = "hello sandbox\nhi\na.txt\n"
    assert ran.returncode == 0 and ran.stdout == expected, ran.stdout + ran.stderr

    surface = node(
        "--input-type=module",
        "-e",
        """
        import * as sbx from '@sandboxd/client';
        const c = new sbx.SandboxClient('127.0.0.1:1', { checkServer: false });
        const wanted = JSON.parse(process.argv[1]);
        const missing = [];
        for (const [svc, rpcs] of Object.entries(wanted)) {
          const prop = c[sbx.serviceProperty(svc.split('.').at(-1))];
          for (const rpc of rpcs) {
            if (typeof prop?.[sbx.methodName(rpc)] !== 'function') missing.push(`${svc}/${rpc}`);
          }
        }
        c.close();
        console.log(JSON.stringify({ missing, protoDir: sbx.PROTO_DIR }));
        """,
        json.dumps(service_rpcs()),
        cwd=consumer,
    )
    report = json.loads(surface.stdout)
    assert report["missing"] == [], f"RPCs the Node client lacks: {report['missing']}"
    assert Path(report["protoDir"]).is_relative_to(consumer), report["protoDir"]

    shutil.copy(NODE_DIR / "conformance" / "run.mjs", consumer / "conformance.mjs")
    conf = node(
        "conformance.mjs",
        str(CONFORMANCE),
        cwd=consumer,
        env={**env, "SANDBOXD_CLIENT_MODULE": "@sandboxd/client"},
    )
    assert passed_steps(conf.stdout) == conformance_steps(), conf.stdout + conf.stderr
