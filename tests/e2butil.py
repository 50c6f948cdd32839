"""What the E2B door's tests share: its URL from a live server's log, and whether the `base`
template's image is on the engine (`make base-image`)."""

from __future__ import annotations

import re
import subprocess
import time

from conftest import ServerProcess

_DOOR = re.compile(r"E2B door on (http://\S+:\d+)")


def door_url(srv: ServerProcess) -> str:
    for _ in range(100):
        m = _DOOR.search(srv.log())
        if m:
            return m.group(1)
        time.sleep(0.1)
    raise AssertionError("the E2B door did not start:\n" + srv.log())


def base_image_built() -> bool:
    done = subprocess.run(
        ["docker", "image", "inspect", "sandboxd-runtime:base"], capture_output=True, check=False
    )
    return done.returncode == 0
