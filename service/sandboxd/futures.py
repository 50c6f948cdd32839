"""Outcomes that nobody may be left to await.

asyncio logs "exception was never retrieved" for a future or task that ends with an exception
no one looked at, and a caller that went away (a deadline, a cancelled call) never looks. Every
place that leaves such an outcome behind marks it seen with `retrieve`, so the log holds only
failures someone should read.
"""

from __future__ import annotations

import asyncio
from typing import Any


def retrieve(fut: asyncio.Future[Any]) -> None:
    """Mark an outcome nobody awaits any more as seen (a done callback)."""
    if not fut.cancelled():
        fut.exception()
