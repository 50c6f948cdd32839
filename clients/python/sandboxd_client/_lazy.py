"""Modules imported on first use, so that a program pays only for the services it calls.

A generated `_pb2` module costs its descriptors' parsing on import (the process service's
alone is a few milliseconds), and `sandboxctl exec` needs one service of the dozen. A module
names such an import `lazy(...)` (with the real import under TYPE_CHECKING, for the type
checker) and the first attribute read does an ordinary import: dependencies load first and
in order, exactly as an import at the top would.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any


class LazyModule:
    """Stands for the module `name` until one of its attributes is read."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        module: ModuleType = importlib.import_module(self._name)
        return getattr(module, attr)

    def __repr__(self) -> str:
        return f"<lazy module {self._name!r}>"


def lazy(name: str) -> Any:
    """The module `name`, imported when first used (typed as the module under TYPE_CHECKING)."""
    return LazyModule(name)
