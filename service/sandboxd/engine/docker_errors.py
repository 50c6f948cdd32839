"""Docker engine errors as domain errors, in one place for the adapter's modules.

A connection that fails is `EngineUnavailable` (retryable), a missing object `NotFound`
(ENGINE_OBJECT_NOT_FOUND), a conflict `FailedPrecondition` (ENGINE_CONFLICT), and anything
else the engine refuses `Internal` carrying the engine's own message.
"""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import Callable, Iterator

import aiodocker
import aiohttp

from sandboxd.errors import EngineUnavailable, FailedPrecondition, Internal, NotFound
from sandboxd.reasons import Reason


def _tls_failure(exc: BaseException, detail: str) -> bool:
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ssl.SSLError | aiohttp.ClientSSLError):
            return True
        seen = seen.__cause__ or seen.__context__
    return "[SSL" in detail


def engine_unavailable(what: str, exc: BaseException, detail: str) -> EngineUnavailable:
    """The error of an engine that cannot be reached; a TLS failure (a remote engine refusing
    the client certificate, or one not signed by docker_tls_ca) says so, and what to check."""
    if _tls_failure(exc, detail):
        return EngineUnavailable(
            f"{what}: the TLS connection to the Docker engine failed ({detail}); check "
            "docker_tls_ca, docker_tls_cert and docker_tls_key against the engine's TLS set-up"
        )
    return EngineUnavailable(f"{what}: the Docker engine does not answer ({detail})")


@contextlib.contextmanager
def translate_errors(what: str, on_error: Callable[[str], None] | None = None) -> Iterator[None]:
    try:
        yield
    except aiodocker.DockerError as exc:
        if exc.status == 900:  # aiodocker's code for "could not connect to the engine"
            if on_error is not None:
                on_error("unavailable")
            raise engine_unavailable(what, exc, str(exc.message)) from exc
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
        raise engine_unavailable(what, exc, f"{type(exc).__name__}: {exc}") from exc
