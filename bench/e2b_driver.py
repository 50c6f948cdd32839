"""Run by the official SDK's virtualenv (build/e2b-venv) for bench/bench_e2b.py: one sandbox,
then one `commands.run("true")` per `run` line on stdin, its seconds printed; `quit` ends it.
Plain SDK code, with E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY set by the bench."""

from __future__ import annotations

import sys
import time

from e2b import Sandbox

sbx = Sandbox.create("base", timeout=600)
print(sbx.sandbox_id, flush=True)
try:
    for line in sys.stdin:
        if line.strip() != "run":
            break
        start = time.perf_counter()
        sbx.commands.run("true")
        print(time.perf_counter() - start, flush=True)
finally:
    sbx.kill()
