"""Bearer-token authentication: the one server interceptor that names the tenant of a call.

Every RPC except health and reflection needs `authorization: Bearer <token>`; the token is
checked against the tokens file's sha256 digests (constant time, in `tenancy.TokenTable`). The
handler then runs with the tenant set in `tenancy.current_tenant`, so the domain scopes every
lookup without knowing gRPC. A refused call is UNAUTHENTICATED with an ErrorInfo reason, and the
servicer never runs.

AdminService is for operators: its methods need a tenant the tokens file marks `admin`
(PERMISSION_DENIED, reason ADMIN_REQUIRED, otherwise), except GetServerInfo, which says only
what the server enforces and which clients read to learn the limits. Without a tokens file the
one local tenant is the operator and may call everything.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

import grpc

from sandboxd import errors, tenancy
from sandboxd.api.chain import Layer, rewrap
from sandboxd.api.errors import to_status
from sandboxd.reasons import Reason

log = logging.getLogger(__name__)

# Probes and tools must work without credentials; neither reveals anything a tenant owns.
EXEMPT_PREFIXES = (
    "/grpc.health.v1.Health/",
    "/grpc.reflection.v1alpha.ServerReflection/",
    "/grpc.reflection.v1.ServerReflection/",
)
_SCHEME = "bearer "
ADMIN_PREFIX = "/sandboxd.v1.AdminService/"
OPEN_ADMIN_METHODS = frozenset({"/sandboxd.v1.AdminService/GetServerInfo"})


def bearer_token(metadata: Any) -> str | None:
    """The token of the single `authorization: Bearer ...` header; None if absent or unclear."""
    values = [v for k, v in (metadata or ()) if k.lower() == "authorization"]
    if len(values) != 1 or not isinstance(values[0], str):
        return None
    value = values[0]
    if not value[: len(_SCHEME)].lower() == _SCHEME:
        return None
    token = value[len(_SCHEME) :].strip()
    return token or None


class LocalTenantInterceptor(Layer):
    """Without a tokens file: every call is the local tenant's, with the operator's grants."""

    def __init__(self, private_networks: str = "deny") -> None:
        self._grants = tenancy.resolved_grants(tenancy.LOCAL_GRANTS, private_networks)

    def wrap(self, handler: Any, handler_call_details: Any) -> Any:
        return None if handler is None else _as_tenant(handler, None, self._grants)


class Tokens(Protocol):
    """Who a token belongs to and what that tenant was granted: a `tenancy.TokenTable`, or
    the server's `TokenFile`, which a SIGHUP replaces whole between two calls."""

    def authenticate(self, token: str) -> str | None: ...

    def grants_of(self, tenant: str) -> tenancy.TenantGrants: ...


class AuthInterceptor(Layer):
    def __init__(self, tokens: Tokens, private_networks: str = "deny") -> None:
        self._tokens = tokens
        self._private_networks = private_networks  # the server's egress_private_networks

    def wrap(self, handler: Any, handler_call_details: Any) -> Any:
        method: str = handler_call_details.method
        if handler is None or method.startswith(EXEMPT_PREFIXES):
            return handler
        token = bearer_token(handler_call_details.invocation_metadata)
        if token is None:
            log.warning("unauthenticated call to %s: no bearer token", method)
            return _refusing(
                handler,
                errors.Unauthenticated(
                    "this server needs 'authorization: Bearer <token>' metadata",
                    reason=Reason.TOKEN_MISSING,
                ),
            )
        tenant = self._tokens.authenticate(token)
        if tenant is None:
            log.warning("unauthenticated call to %s: unknown token", method)
            return _refusing(
                handler,
                errors.Unauthenticated(
                    "the bearer token is not valid", reason=Reason.TOKEN_INVALID
                ),
            )
        grants = tenancy.resolved_grants(self._tokens.grants_of(tenant), self._private_networks)
        if needs_admin(method) and not grants.admin:
            log.warning("tenant %s refused %s: not an admin tenant", tenant, method)
            return _refusing(
                handler,
                errors.PermissionDenied(
                    f"{method.rsplit('/', 1)[-1]} is an operator call; tenant {tenant!r} is not "
                    "marked 'admin' in the tokens file",
                    reason=Reason.ADMIN_REQUIRED,
                    metadata={"tenant": tenant},
                ),
            )
        return _as_tenant(handler, tenant, grants)


def needs_admin(method: str) -> bool:
    """Every AdminService method but the informational ones, including any added later."""
    return method.startswith(ADMIN_PREFIX) and method not in OPEN_ADMIN_METHODS


def _refusing(handler: Any, exc: errors.SandboxError) -> Any:
    """A handler that only aborts: the servicer never sees the call. It is a client-streaming
    one whatever the method is, so the server starts it at once instead of first reading the
    request message (a unary method's handler runs only once the whole message arrived: an
    unauthenticated caller could otherwise hold the stream, and a buffer of up to
    max_message_bytes, by sending it slowly or never). The client sees the status alone,
    which is all any refused call gets."""

    async def refuse(requests: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        await context.abort_with_status(to_status(exc))

    del handler
    return grpc.stream_unary_rpc_method_handler(refuse)


def _as_tenant(handler: Any, tenant: str | None, grants: tenancy.TenantGrants) -> Any:
    """The same handler, run with the caller's tenant (None: the local one) and grants set.

    Each RPC runs in its own asyncio task (its own context copy), so setting the variable
    inside the handler cannot leak into another call.
    """
    return rewrap(handler, lambda _, inner: _with_tenant(inner, tenant, grants))


def _with_tenant(
    inner: Callable[..., Any], tenant: str | None, grants: tenancy.TenantGrants
) -> Callable[..., Any]:
    if inspect.isasyncgenfunction(inner):

        async def streaming(request: Any, context: Any) -> AsyncIterator[Any]:
            _use(tenant, grants)
            async for item in inner(request, context):
                yield item

        return streaming

    async def unary(request: Any, context: Any) -> Any:
        _use(tenant, grants)
        result = inner(request, context)
        return await result if inspect.isawaitable(result) else result

    return unary


def _use(tenant: str | None, grants: tenancy.TenantGrants) -> None:
    if tenant is None:
        tenancy.use_grants(grants)
    else:
        tenancy.use_tenant(tenant, grants)
