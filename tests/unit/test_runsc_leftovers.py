"""Leftover runsc processes of a failed gVisor start: found by argv[0] and the container id
in their command line, and ended; nothing else is touched. Real processes, no Docker."""

from __future__ import annotations

import secrets
import subprocess
import sys
import time

from sandboxd.engine.runsc_leftovers import end_leftovers, find_leftovers


def _spawn(argv0: str, *args: str) -> subprocess.Popen[bytes]:
    code = "import time; time.sleep(60)"
    return subprocess.Popen([argv0, "-c", code, *args], executable=sys.executable)


def test_the_leftovers_of_one_container_are_ended_and_nothing_else() -> None:
    cid, other = secrets.token_hex(32), secrets.token_hex(32)
    bundle = f"--bundle=/var/run/docker/containerd/daemon/io.containerd.runtime.v2.task/moby/{cid}"
    gofer = _spawn("runsc-gofer", "gofer", bundle)
    sandbox = _spawn("runsc-sandbox", "boot", bundle)
    bystander = _spawn("runsc-gofer", "gofer", f"--bundle=/moby/{other}")
    unrelated = _spawn("python3", bundle)  # names the id but is not runsc
    procs = (gofer, sandbox, bystander, unrelated)
    try:
        time.sleep(0.2)
        assert find_leftovers(cid) == sorted([gofer.pid, sandbox.pid])
        assert find_leftovers(cid[:12]) == []  # only a full id ever matches
        assert sorted(end_leftovers(cid)) == sorted([gofer.pid, sandbox.pid])
        assert gofer.wait(5) and sandbox.wait(5)  # killed: a non-zero status
        assert bystander.poll() is None and unrelated.poll() is None
        assert find_leftovers(cid) == []
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_after_a_checkpoint_the_containerd_shim_of_the_removed_container_goes_too() -> None:
    from sandboxd.engine.runsc_leftovers import AFTER_CHECKPOINT

    cid, other = secrets.token_hex(32), secrets.token_hex(32)
    shim = _spawn("containerd-shim-runc-v2", "-namespace", "moby", "-id", cid)
    bystander = _spawn("containerd-shim-runc-v2", "-namespace", "moby", "-id", other)
    try:
        time.sleep(0.2)
        assert find_leftovers(cid) == []  # a failed start never ends a shim
        assert end_leftovers(cid, names=AFTER_CHECKPOINT) == [shim.pid]
        assert shim.wait(5) and bystander.poll() is None
    finally:
        for p in (shim, bystander):
            p.kill()
            p.wait()
