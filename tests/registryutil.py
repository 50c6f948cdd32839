"""A private distribution registry for the registry tests and `make bench`: Debian's
`docker-registry` on 127.0.0.1 with htpasswd (bcrypt) auth, started and stopped by its user.

The Docker CLI logs in with its own DOCKER_CONFIG in the registry's temporary directory, never
the user's ~/.docker; that file (Docker's config.json `auths`) is also what the server is given
as `registry_auth_file`. The engine treats 127.0.0.0/8 registries as plain HTTP by default.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from base64 import b64encode
from dataclasses import dataclass, field
from pathlib import Path

USER = "sandboxd-tester"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Registry:
    root: Path
    port: int
    password: str
    proc: subprocess.Popen[bytes] | None = None
    pushed: list[str] = field(default_factory=list)

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def auth_file(self) -> Path:
        return self.root / "docker" / "config.json"

    def write_auth(self, path: Path, password: str) -> Path:
        """A config.json `auths` file with these credentials (for the server)."""
        pair = b64encode(f"{USER}:{password}".encode()).decode()
        path.write_text(json.dumps({"auths": {self.host: {"auth": pair}}}))
        return path

    def docker(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "DOCKER_CONFIG": str(self.root / "docker")}
        return subprocess.run(
            ["docker", *args], env=env, capture_output=True, text=True, check=check
        )

    def push(self, local: str, repo_tag: str) -> str:
        """Push `local` as host/repo_tag, untag it locally; returns the registry digest."""
        ref = f"{self.host}/{repo_tag}"
        self.docker("tag", local, ref)
        self.docker("push", "-q", ref)
        digests = self.docker("inspect", "--format", "{{json .RepoDigests}}", ref).stdout
        self.docker("rmi", ref)
        self.pushed.append(ref)
        repo = ref.rsplit(":", 1)[0]
        found = [d for d in json.loads(digests) if d.startswith(repo + "@")]
        return found[0].split("@", 1)[1]

    def manifest_requests(self) -> int:
        """Manifest requests the registry logged so far (the access log)."""
        log = (self.root / "registry.log").read_text(errors="replace")
        return sum(1 for line in log.splitlines() if "/manifests/" in line)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.root, ignore_errors=True)


def start_registry(root: Path) -> Registry:
    if shutil.which("docker-registry") is None or shutil.which("htpasswd") is None:
        raise RuntimeError("docker-registry and htpasswd are missing: run `make registry`")
    root.mkdir(parents=True, exist_ok=True)
    reg = Registry(root, _free_port(), os.urandom(12).hex())
    htpasswd = subprocess.run(
        ["htpasswd", "-Bbn", USER, reg.password], capture_output=True, text=True, check=True
    ).stdout
    (root / "htpasswd").write_text(htpasswd)
    (root / "config.yml").write_text(
        "version: 0.1\n"
        "log:\n  level: info\n  accesslog:\n    disabled: false\n"
        f"storage:\n  filesystem:\n    rootdirectory: {root / 'data'}\n"
        "  delete:\n    enabled: true\n"
        f"http:\n  addr: 127.0.0.1:{reg.port}\n"
        f"auth:\n  htpasswd:\n    realm: sandboxd-test\n    path: {root / 'htpasswd'}\n"
    )
    with (root / "registry.log").open("wb") as log:
        reg.proc = subprocess.Popen(
            ["docker-registry", "serve", str(root / "config.yml")], stdout=log, stderr=log
        )
    deadline = time.monotonic() + 15
    while True:
        try:
            urllib.request.urlopen(f"http://{reg.host}/v2/", timeout=1)
        except urllib.error.HTTPError:
            break  # 401: up, and asking for credentials
        except OSError:
            if time.monotonic() > deadline or reg.proc.poll() is not None:
                reg.stop()
                raise RuntimeError("docker-registry did not start") from None
            time.sleep(0.1)
    (root / "docker").mkdir()
    login = subprocess.run(
        ["docker", "login", "-u", USER, "--password-stdin", reg.host],
        input=reg.password,
        env={**os.environ, "DOCKER_CONFIG": str(root / "docker")},
        capture_output=True,
        text=True,
        check=False,
    )
    if login.returncode != 0:
        reg.stop()
        raise RuntimeError(f"docker login to the test registry failed: {login.stderr}")
    return reg
