"""Python's cyclic garbage collector, tuned for a server whose objects are mostly short-lived.

Under a load of small commands the collector took a tenth of the server's loop: every command
makes a few hundred container objects (coroutines, futures, frames, dicts), so with the default
first-generation threshold (700) a young collection ran every other command, and each one that
reached the oldest generation walked every object start-up made (the configuration, the
protobuf descriptors, the gRPC and Docker clients), which never become garbage.

So, in the served process only (`sandboxd.__main__`, not a test that serves in-process):
- `tune` raises the young threshold: most of a command's objects are freed by reference
  counting before a collection could see them, so fewer are walked at all, and cycles are
  still found (a few thousand allocations later);
- `freeze_start_up`, once the server is up, moves everything alive then into the permanent
  generation (`gc.freeze`): no collection walks it again.
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 20_000  # allocations minus frees between young collections (default 700)
OLDER_THRESHOLDS = (20, 20)  # young collections per middle one, middle per full (default 10, 10)


def tune() -> None:
    gc.set_threshold(YOUNG_THRESHOLD, *OLDER_THRESHOLDS)


def freeze_start_up() -> None:
    """After start-up: what is alive now stays alive, so no collection walks it again."""
    gc.collect()
    gc.freeze()
