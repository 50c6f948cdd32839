"""A private Docker engine that can checkpoint gVisor sandboxes, for the memory-suspend tests.

Docker's checkpoints need the engine in experimental mode, which a shared engine may not be in
(and a suite must never restart or reconfigure the host's engine). So the suite starts its own
dockerd: `--experimental`, runsc registered as `runsc` (with --network=none, as ensure-gvisor.sh
does), listening on a unix socket in a temp dir, with its own data root, exec root, pidfile and
config file, and in a network namespace of its own (`ip netns add`): a second dockerd with
`--bridge none` in the host's namespace deletes the host's docker0. It has no bridge, no
iptables and no forwarding: nothing the host's engine owns is touched (tests/hostenv.py checks).
The runtime image is copied in with `docker save | docker load`. `stop()` removes everything
it made, also after a failure.

`unavailable()` says why it cannot run here (not root, no dockerd/runsc/ip/nsenter), so a test
skips with that reason instead of failing.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

TOOLS = ("dockerd", "docker", "ip", "nsenter", "runsc")


def unavailable() -> str:
    """Empty when a private checkpointing engine can be started here; else why not."""
    if os.geteuid() != 0:
        return "needs root to run a private dockerd"
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        return f"needs {', '.join(missing)} (make gvisor installs runsc)"
    return ""


class CheckpointEngine:
    def __init__(self) -> None:
        # A short path: a unix socket's path is limited to 107 bytes.
        self.root = Path(tempfile.mkdtemp(prefix="sbxck-", dir="/tmp"))
        self.netns = f"sbxck-{secrets.token_hex(3)}"
        self.proc: subprocess.Popen[bytes] | None = None
        self._netns_made = False

    @property
    def socket(self) -> Path:
        return self.root / "docker.sock"

    @property
    def docker_host(self) -> str:
        return f"unix://{self.socket}"

    def docker(
        self, *args: str, check: bool = True, **kw: object
    ) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(  # type: ignore[call-overload, no-any-return]
            ["docker", "-H", self.docker_host, *args],
            capture_output=True,
            timeout=120,
            check=check,
            **kw,
        )

    def start(self, images: tuple[str, ...]) -> None:
        subprocess.run(["ip", "netns", "add", self.netns], check=True, capture_output=True)
        self._netns_made = True
        subprocess.run(
            ["ip", "netns", "exec", self.netns, "ip", "link", "set", "lo", "up"],
            check=True,
            capture_output=True,
        )
        runsc = shutil.which("runsc")
        config = {
            "experimental": True,
            "runtimes": {"runsc": {"path": runsc, "runtimeArgs": ["--network=none"]}},
        }
        (self.root / "daemon.json").write_text(json.dumps(config) + "\n")
        log = (self.root / "dockerd.log").open("ab")
        self.proc = subprocess.Popen(
            ["nsenter", f"--net=/run/netns/{self.netns}", "--", "dockerd"]
            + ["--host", self.docker_host, "--config-file", str(self.root / "daemon.json")]
            + ["--data-root", str(self.root / "data"), "--exec-root", str(self.root / "exec")]
            + ["--pidfile", str(self.root / "docker.pid")]
            + ["--bridge", "none", "--iptables=false", "--ip-masq=false", "--ip-forward=false"]
            + ["--userland-proxy=false", "--shutdown-timeout", "2"],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        deadline = time.monotonic() + 60
        while self.docker("version", check=False).returncode != 0:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the private dockerd did not start:\n{self.log()}")
            time.sleep(0.25)
        for image in images:
            self.load(image)

    def load(self, image: str) -> None:
        """An image of the host's engine into this one (`docker save | docker load`)."""
        saved = subprocess.Popen(["docker", "save", image], stdout=subprocess.PIPE)
        assert saved.stdout is not None
        with saved.stdout:
            self.docker("load", stdin=saved.stdout)
        assert saved.wait(120) == 0

    def log(self) -> str:
        with contextlib.suppress(OSError):
            return (self.root / "dockerd.log").read_text(errors="replace")[-3000:]
        return ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            ids = self.docker("ps", "-aq", check=False).stdout.split()
            if ids:
                self.docker("rm", "-f", *[i.decode() for i in ids], check=False)
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        with open("/proc/self/mounts") as fh:
            mounts = [line.split()[1] for line in fh]
        for target in sorted((m for m in mounts if m.startswith(str(self.root))), reverse=True):
            subprocess.run(["umount", "-l", target], check=False, capture_output=True)
        if self._netns_made:
            subprocess.run(["ip", "netns", "del", self.netns], check=False, capture_output=True)
        shutil.rmtree(self.root, ignore_errors=True)
