"""The gRPC server of `serve`: interceptors, servicers, health, reflection and its port.

Servicers get the collaborators built by sandboxd.server.parts; authentication, TLS and the
stream guards are chosen from the configuration here.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import cast

import grpc
from grpc_health.v1 import health, health_pb2_grpc
from opentelemetry.trace import NoOpTracer

from sandboxd.api.admin_service import AdminService
from sandboxd.api.admission import CallAdmission
from sandboxd.api.audit_interceptor import AuditInterceptor
from sandboxd.api.audit_service import AuditService
from sandboxd.api.auth import AuthInterceptor, LocalTenantInterceptor
from sandboxd.api.chain import Chain, Layer
from sandboxd.api.filesystem_service import FilesystemService
from sandboxd.api.introspection import Health, add_reflection
from sandboxd.api.limits import StreamCaps, StreamGuard
from sandboxd.api.observe import MetricsInterceptor
from sandboxd.api.process_service import ProcessService
from sandboxd.api.reply_limit import ReplyLimit
from sandboxd.api.session_events import SessionEventRpcs
from sandboxd.api.session_leases import LeaseEcho
from sandboxd.api.session_lifecycle import SessionLifecycleRpcs
from sandboxd.api.session_network import SessionNetworkRpcs
from sandboxd.api.session_previews import SessionPreviewRpcs
from sandboxd.api.session_service import SessionService
from sandboxd.api.snapshot_service import SnapshotService
from sandboxd.api.template_service import TemplateService
from sandboxd.api.tracing import TracingInterceptor
from sandboxd.api.volume_service import VolumeService
from sandboxd.archive.calls import ArchiveCalls
from sandboxd.audit import AuditLog
from sandboxd.config import Config, listens_on_loopback
from sandboxd.dir_watch import DirWatches
from sandboxd.errors import ConfigError
from sandboxd.events.stats import StatsReader
from sandboxd.server.parts import Parts
from sandboxd.token_file import TokenFile
from sandboxd.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    audit_pb2,
    audit_pb2_grpc,
    filesystem_pb2,
    filesystem_pb2_grpc,
    process_pb2,
    process_pb2_grpc,
    session_pb2,
    session_pb2_grpc,
    snapshot_pb2,
    snapshot_pb2_grpc,
    template_pb2,
    template_pb2_grpc,
    volumes_pb2,
    volumes_pb2_grpc,
)

# The server's own log lines keep the logger name operators filter on.
log = logging.getLogger("sandboxd.server")

SERVICE_NAMES = (
    session_pb2.DESCRIPTOR.services_by_name["SessionService"].full_name,
    process_pb2.DESCRIPTOR.services_by_name["ProcessService"].full_name,
    filesystem_pb2.DESCRIPTOR.services_by_name["FilesystemService"].full_name,
    admin_pb2.DESCRIPTOR.services_by_name["AdminService"].full_name,
    snapshot_pb2.DESCRIPTOR.services_by_name["SnapshotService"].full_name,
    audit_pb2.DESCRIPTOR.services_by_name["AuditService"].full_name,
    template_pb2.DESCRIPTOR.services_by_name["TemplateService"].full_name,
    volumes_pb2.DESCRIPTOR.services_by_name["VolumeService"].full_name,
)


def transport_options(
    max_message_bytes: int, handshake_timeout_ms: int = 10_000, max_connections: int = 0
) -> list[tuple[str, int]]:
    """The gRPC port's transport limits, set here rather than left to the library's defaults
    (which change between releases), since any caller may reach them before authentication:
    - concurrent HTTP/2 streams per connection: bounded (a stream past it waits in the
      client, or is refused unstarted, REFUSED_STREAM, when sent before the client learnt the
      limit), so one connection holds at most that many calls, refused or not;
    - request metadata: 16 KiB in all (an authorization header is a few dozen bytes);
    - pings: a client may not ping without calls, nor more often than every 5 minutes without
      data; two strikes end the connection (GOAWAY too_many_pings);
    - a connection that has not finished its handshake (TLS and the HTTP/2 preface) within
      `handshake_timeout_ms` is closed (the library's default is 120 s);
    - a connection without any call for 5 minutes is closed (clients reconnect on their own):
      idle connections do not pile up.
    - open connections in all (`max_connections`, 0: none): past it a new connection is closed
      at once, so idle or half-open ones cannot take every file descriptor of the process,
      which the sessions' agents, the engine and the store need too.
    No per-source connection cap exists in gRPC's core; SECURITY.md says what covers it."""
    capped = [("grpc.max_allowed_incoming_connections", max_connections)] if max_connections else []
    return capped + [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.so_reuseport", 0),
        ("grpc.max_concurrent_streams", MAX_CONCURRENT_STREAMS),
        ("grpc.max_metadata_size", 16 * 1024),
        ("grpc.keepalive_permit_without_calls", 0),
        ("grpc.http2.min_ping_interval_without_data_ms", 300_000),
        ("grpc.http2.max_ping_strikes", 2),
        ("grpc.max_connection_idle_ms", 300_000),
        ("grpc.server_handshake_timeout_ms", handshake_timeout_ms),
    ]


MAX_CONCURRENT_STREAMS = 512


class _GenericOnly:
    """The server as the generated `add_*_to_server` functions see it: each service's methods
    by its generic handler (one lookup by name per call), not also as "registered" methods.

    grpcio's aio server keeps one pending request per registered method and, for every call
    that arrives, waits on all of them again (`asyncio.wait` over some sixty futures: a
    callback added and removed on each): about a fifth of the Python calls the server made
    per Run(["true"]). With none registered it waits on one request for any method."""

    def __init__(self, server: grpc.aio.Server) -> None:
        self._server = server

    def add_generic_rpc_handlers(self, handlers: Sequence[grpc.GenericRpcHandler]) -> None:
        self._server.add_generic_rpc_handlers(handlers)

    def add_registered_method_handlers(
        self, service_name: str, handlers: dict[str, grpc.RpcMethodHandler]
    ) -> None:
        """Left out: the same handlers came by `add_generic_rpc_handlers` already."""


def grpc_server(config: Config, parts: Parts) -> tuple[grpc.aio.Server, health.aio.HealthServicer]:
    """Every service on one server, not yet listening; its health servicer (the engine
    monitor and the shutdown drive it)."""
    p = parts
    served = grpc.aio.server(
        interceptors=[Chain(_layers(config, p))],
        options=transport_options(
            config.max_message_bytes, max_connections=config.server.max_connections
        ),
    )
    server = cast(grpc.aio.Server, _GenericOnly(served))
    leases = LeaseEcho(p.terms)
    session_pb2_grpc.add_SessionServiceServicer_to_server(
        SessionService(
            SessionLifecycleRpcs(p.sessions, leases),
            SessionNetworkRpcs(p.sessions, leases),
            SessionEventRpcs(
                p.sessions,
                p.hub,
                StatsReader(p.engine, p.hub, p.egress.bytes_moved, commands=p.commands),
            ),
            SessionPreviewRpcs(p.previews),
        ),
        server,
    )
    process_pb2_grpc.add_ProcessServiceServicer_to_server(
        ProcessService(p.sessions, p.executor, config, p.processes), server
    )
    filesystem_pb2_grpc.add_FilesystemServiceServicer_to_server(
        FilesystemService(
            p.sessions,
            p.files,
            p.transfer,
            DirWatches(p.files.helper, p.sessions, config.watch),
        ),
        server,
    )
    snapshot_pb2_grpc.add_SnapshotServiceServicer_to_server(
        SnapshotService(p.sessions, ArchiveCalls(p.archive, p.hashers, p.observer), p.snapshots),
        server,
    )
    admin_pb2_grpc.add_AdminServiceServicer_to_server(
        AdminService(
            config,
            p.engine,
            p.egress,
            p.sweeper,
            tiers=p.tiers,
            pulls=p.pulls,
            memory_suspend=p.sessions.memory_suspend_unsupported,
        ),
        server,
    )
    audit_pb2_grpc.add_AuditServiceServicer_to_server(AuditService(AuditLog(p.audit_store)), server)
    template_pb2_grpc.add_TemplateServiceServicer_to_server(
        TemplateService(p.templates, config.tenancy.stream_idle_timeout_s), server
    )
    volumes_pb2_grpc.add_VolumeServiceServicer_to_server(
        VolumeService(p.volumes, config.tenancy.stream_idle_timeout_s), server
    )
    health_servicer = Health()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    add_reflection(server, SERVICE_NAMES)
    return served, health_servicer


def listen(server: grpc.aio.Server, config: Config) -> int:
    """Bind the configured address (TLS when a certificate is configured); the port bound."""
    try:
        port = _add_port(server, config)
    except RuntimeError as exc:
        raise ConfigError(f"cannot listen on {config.server.listen}: {exc}") from None
    if port == 0:
        raise ConfigError(f"cannot listen on {config.server.listen} (address in use or invalid)")
    return port


def _layers(config: Config, p: Parts) -> list[Layer]:
    """Every call's interceptors, outermost first, run as one `Chain` (api/chain.py)."""
    # A tracer that records nothing (no exporter configured) gets no layer: its spans were
    # made and dropped on every call.
    tracing: list[Layer] = (
        [] if isinstance(p.tracer, NoOpTracer) else [TracingInterceptor(p.tracer)]
    )
    return [
        # Outermost: times every stream's reads and writes, whatever runs inside.
        StreamGuard(config.tenancy.stream_idle_timeout_s),
        *tracing,  # the call's span is current for all that follows
        MetricsInterceptor(p.metrics, access_log=config.metrics.access_log),
        *_interceptors(config, p.tokens),
        # Right inside authentication: a call over its tenant's fair share is refused before
        # the audit, the store or the servicer spend anything on it.
        *([CallAdmission(p.shares)] if p.shares is not None else []),
        # Inside authentication (the tenant is known): the call's scope, settled before it
        # answers, and its refusal.
        AuditInterceptor(p.observer),
        # Innermost: the tenant is known here (set by authentication, or the default).
        StreamCaps(config.tenancy.max_streams),
        # Innermost of all: every reply message the servicer makes, at most the caller's
        # limit (a request's max_reply_bytes, else 4 MiB).
        ReplyLimit(config.max_message_bytes),
    ]


def _interceptors(config: Config, tokens: TokenFile | None) -> list[Layer]:
    """Bearer-token authentication when a tokens file is configured; else one tenant."""
    if tokens is None:
        if not listens_on_loopback(config.server.listen):
            log.warning(
                "INSECURE: serving %s with no authentication (allow_insecure_public_listen): "
                "anyone who can reach this port can run commands",
                config.server.listen,
            )
        return [LocalTenantInterceptor(config.egress.private_networks)]
    log.info(
        "authentication on: %d token(s) for %d tenant(s)",
        len(tokens.table.entries),
        len(tokens.table.tenants),
    )
    if config.tenancy.tls_cert is None and not listens_on_loopback(config.server.listen):
        log.warning(
            "bearer tokens on %s travel in plaintext: set tls_cert and tls_key",
            config.server.listen,
        )
    return [AuthInterceptor(tokens, config.egress.private_networks)]


def _add_port(server: grpc.aio.Server, config: Config) -> int:
    """TLS when a certificate is configured, mutual TLS when a client CA is too."""
    if config.tenancy.tls_cert is None or config.tenancy.tls_key is None:
        return int(server.add_insecure_port(config.server.listen))
    try:
        key, cert = config.tenancy.tls_key.read_bytes(), config.tenancy.tls_cert.read_bytes()
        ca = config.tenancy.tls_client_ca.read_bytes() if config.tenancy.tls_client_ca else None
    except OSError as exc:
        raise ConfigError(f"cannot read TLS files: {exc}") from None
    credentials = grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=ca, require_client_auth=ca is not None
    )
    log.info("TLS on (%s)", "client certificates required" if ca else "server certificate only")
    return int(server.add_secure_port(config.server.listen, credentials))
