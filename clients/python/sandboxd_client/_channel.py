"""The channel: plaintext or TLS, the bearer token on every call, gRPC's retry policy."""

from __future__ import annotations

from collections.abc import AsyncIterable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from sandboxd_client._rpc import RetryPolicy

MAX_MESSAGE = 64 * 1024 * 1024


@dataclass(frozen=True)
class TLS:
    """TLS settings: PEM bytes; all None means the system's root certificates."""

    root_certificates: bytes | None = None
    private_key: bytes | None = None
    certificate_chain: bytes | None = None
    server_name: str | None = None  # overrides the name checked against the certificate


class _BearerToken(grpc.AuthMetadataPlugin):  # type: ignore[misc]
    """Adds `authorization: Bearer <token>` to every call (TLS channels)."""

    def __init__(self, token: str) -> None:
        self._token = token

    def __call__(
        self, context: grpc.AuthMetadataContext, callback: grpc.AuthMetadataPluginCallback
    ) -> None:
        callback((("authorization", f"Bearer {self._token}"),), None)


def open_channel(
    address: str,
    token: str | None,
    tls: TLS | None,
    retry: RetryPolicy | None,
    extra: Sequence[tuple[str, Any]],
) -> grpc.aio.Channel:
    """A channel to `address`. The token goes over a plaintext channel too, since the
    server's default is loopback only; over any other link pass `tls`."""
    options: list[tuple[str, Any]] = [
        ("grpc.max_receive_message_length", MAX_MESSAGE),
        ("grpc.max_send_message_length", MAX_MESSAGE),
        ("grpc.enable_retries", 1 if retry is not None else 0),
    ]
    if retry is not None:
        options.append(("grpc.service_config", retry.service_config()))
    options.extend(extra)
    receive = [v for k, v in options if k == "grpc.max_receive_message_length"][-1]
    interceptors: list[Any] = [_ReplyLimit(int(receive) if int(receive) >= 0 else 2**62)]
    if tls is not None:
        creds = grpc.ssl_channel_credentials(
            tls.root_certificates, tls.private_key, tls.certificate_chain
        )
        if token is not None:
            creds = grpc.composite_channel_credentials(
                creds, grpc.metadata_call_credentials(_BearerToken(token))
            )
        if tls.server_name:
            options.append(("grpc.ssl_target_name_override", tls.server_name))
        return grpc.aio.secure_channel(address, creds, options=options, interceptors=interceptors)
    if token is not None:
        interceptors.extend(_token_interceptors(token))
    return grpc.aio.insecure_channel(address, options=options, interceptors=interceptors)


REPLY_FIELD = "max_reply_bytes"


class _ReplyLimit(grpc.aio.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    """Tells the server the largest reply this channel takes: without `max_reply_bytes` a
    server answers at most 4 MiB (gRPC's default receive limit), and this client receives up
    to its own limit. Set on a copy of every request that has the field (Run, ReadFile, every
    List), unless the caller set it."""

    def __init__(self, limit: int) -> None:
        self._limit = limit

    async def intercept_unary_unary(
        self, continuation: Callable[..., Any], details: grpc.aio.ClientCallDetails, req: Any
    ) -> Any:
        fields = getattr(getattr(req, "DESCRIPTOR", None), "fields_by_name", {})
        if self._limit > 0 and REPLY_FIELD in fields and not getattr(req, REPLY_FIELD):
            copy = type(req)()
            copy.CopyFrom(req)
            setattr(copy, REPLY_FIELD, self._limit)
            req = copy
        return await continuation(details, req)


def _token_interceptors(token: str) -> Sequence[grpc.aio.ClientInterceptor]:
    """Interceptors adding the bearer token to every kind of call on a plaintext channel."""
    pair = ("authorization", f"Bearer {token}")

    def with_token(details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        metadata = grpc.aio.Metadata(*(details.metadata or ()), pair)
        return grpc.aio.ClientCallDetails(
            details.method, details.timeout, metadata, details.credentials, details.wait_for_ready
        )

    class Unary(grpc.aio.UnaryUnaryClientInterceptor):  # type: ignore[misc]
        async def intercept_unary_unary(
            self, continuation: Callable[..., Any], details: grpc.aio.ClientCallDetails, req: Any
        ) -> Any:
            return await continuation(with_token(details), req)

    class UnaryStream(grpc.aio.UnaryStreamClientInterceptor):  # type: ignore[misc]
        async def intercept_unary_stream(
            self, continuation: Callable[..., Any], details: grpc.aio.ClientCallDetails, req: Any
        ) -> Any:
            return await continuation(with_token(details), req)

    class StreamUnary(grpc.aio.StreamUnaryClientInterceptor):  # type: ignore[misc]
        async def intercept_stream_unary(
            self,
            continuation: Callable[..., Any],
            details: grpc.aio.ClientCallDetails,
            reqs: AsyncIterable[Any],
        ) -> Any:
            return await continuation(with_token(details), reqs)

    class StreamStream(grpc.aio.StreamStreamClientInterceptor):  # type: ignore[misc]
        async def intercept_stream_stream(
            self,
            continuation: Callable[..., Any],
            details: grpc.aio.ClientCallDetails,
            reqs: AsyncIterable[Any],
        ) -> Any:
            return await continuation(with_token(details), reqs)

    return (Unary(), UnaryStream(), StreamUnary(), StreamStream())
