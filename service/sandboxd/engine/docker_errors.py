"""Docker engine errors as domain errors, in one place for the adapter's modules.

A connection that fails is `EngineUnavailable` (retryable), a missing object `NotFound`
(ENGINE_OBJECT_NOT_FOUND), a conflict `FailedPrecondition` (ENGINE_CONFLICT), and anything
else the engine refuses `Internal` carrying the engine's own message.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import aiodocker
import aiohttp

from sandboxd.errors import EngineUnavailable, FailedPrecondition, Internal, NotFound
from sandboxd.reasons import Reason


@contextlib.contextmanager
def translate_errors(what: str, on_error: Callable[[str], None] | None = None) -> Iterator[None]:
    try:
        yield
    except aiodocker.DockerError as exc:
        if exc.status == 900:  # aiodocker's code for "could not connect to the engine"
            if on_error is not None:
                on_error("unavailable")
            raise EngineUnavailable(
                f"{what}: the Docker engine does not answer ({exc.message})"
            ) from exc
        if on_error is not None:
            on_error({404: "not_found", 409: "conflict"}.get(exc.status, "internal"))
        message = str(exc.message).strip() if exc.message else f"HTTP {exc.status}"
        if exc.status == 404:
            raise NotFound(f"{what}: {message}", reason=Reason.ENGINE_OBJECT_NOT_FOUND) from exc
        if exc.status == 409:
            raise FailedPrecondition(f"{what}: {message}", reason=Reason.ENGINE_CONFLICT) from exc
        raise Internal(f"{what}: the engine answered {exc.status}: {message}") from exc
    except (TimeoutError, aiohttp.ClientError, OSError) as exc:
        if on_error is not None:
            on_error("unavailable")
        raise EngineUnavailable(
            f"{what}: the Docker engine does not answer ({type(exc).__name__}: {exc})"
        ) from exc
