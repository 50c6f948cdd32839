"""How the server reaches its Docker engine: a local socket, or a remote engine over TCP with TLS.

A remote engine is `docker_host = "tcp://host:port"` with the engine's CA (`docker_tls_ca`) and
a client certificate (`docker_tls_cert`, `docker_tls_key`), as `dockerd --tlsverify` expects.
Whoever reaches an engine's API owns its host, so a `tcp://` address without TLS is refused
unless the operator says so (`docker_allow_plain_tcp`). The TLS context is built once, at
start-up: a missing, unreadable or mismatched file stops the server with a message naming the
setting, never the first session.
"""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp

from sandboxd.config_sections import EngineSection
from sandboxd.errors import ConfigError
from sandboxd.settings import is_loopback_host

LOCAL_SOCKET = "unix:///var/run/docker.sock"
_FILES = ("docker_tls_ca", "docker_tls_cert", "docker_tls_key")


@dataclass(frozen=True)
class EngineAddress:
    """Where the engine is: the URL aiohttp talks to (http(s)://host:port, or a unix socket
    path), the TLS context of a tcp:// engine, and whether it runs on this host."""

    url: str
    socket_path: str = ""
    tls: ssl.SSLContext | None = None
    local: bool = True

    def connector(self, limit: int) -> aiohttp.BaseConnector:
        """A connector to the engine holding at most `limit` connections (0: any)."""
        if self.socket_path:
            return aiohttp.UnixConnector(self.socket_path, limit=limit)
        return aiohttp.TCPConnector(ssl=self.tls or True, limit=limit)


def _host_port(docker_host: str) -> tuple[str, int]:
    parts = urlsplit(docker_host)
    try:
        port = parts.port
    except ValueError:
        port = None
    rest = parts.path or parts.query or parts.fragment
    if not parts.hostname or port is None or rest not in ("", "/"):
        raise ConfigError(f"docker_host {docker_host!r}: expected tcp://host:port")
    return parts.hostname, port


def _readable(name: str, path: Path) -> Path:
    if not path.is_file() or not os.access(path, os.R_OK):
        raise ConfigError(f"{name} {str(path)!r}: missing or not readable")
    return path


def client_context(
    ca: Path | None, cert: Path | None, key: Path | None, *, verify: bool
) -> ssl.SSLContext:
    """The TLS context of a remote engine; ConfigError naming the setting that is wrong."""
    if (cert is None) != (key is None):
        raise ConfigError("docker_tls_cert and docker_tls_key: set both or neither")
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if ca is not None:
        try:
            ctx.load_verify_locations(cafile=str(_readable("docker_tls_ca", ca)))
        except ssl.SSLError as exc:
            raise ConfigError(f"docker_tls_ca {str(ca)!r}: not a PEM CA bundle ({exc})") from None
    if cert is not None and key is not None:
        try:
            ctx.load_cert_chain(
                str(_readable("docker_tls_cert", cert)), str(_readable("docker_tls_key", key))
            )
        except ssl.SSLError as exc:
            raise ConfigError(
                f"docker_tls_cert {str(cert)!r} / docker_tls_key {str(key)!r}: not a PEM "
                f"certificate and its private key ({exc})"
            ) from None
    if not verify:
        # The operator's choice (docker_tls_verify=false): encrypted, but anyone on the path
        # may pose as the engine.
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


def engine_address(
    docker_host: str,
    *,
    ca: Path | None = None,
    cert: Path | None = None,
    key: Path | None = None,
    verify: bool = True,
    allow_plain_tcp: bool = False,
) -> EngineAddress:
    """The checked address of the engine (see the module's docstring); ConfigError if wrong."""
    host = docker_host or LOCAL_SOCKET
    tls_files = {n: p for n, p in zip(_FILES, (ca, cert, key), strict=True) if p is not None}
    if host.startswith("unix://"):
        if tls_files:
            raise ConfigError(
                f"{', '.join(tls_files)}: TLS is for a tcp:// docker_host, not {host!r}"
            )
        return EngineAddress(url="unix://localhost", socket_path=host[len("unix://") :])
    if not host.startswith("tcp://"):
        raise ConfigError(f"docker_host {host!r}: must start with unix:// or tcp://")
    name, port = _host_port(host)
    netloc = f"[{name}]:{port}" if ":" in name else f"{name}:{port}"
    local = is_loopback_host(name)
    if not tls_files:
        if not allow_plain_tcp:
            raise ConfigError(
                f"docker_host {host!r}: a tcp:// engine needs TLS (docker_tls_ca, "
                "docker_tls_cert, docker_tls_key; DOCKER_TLS_VERIFY and DOCKER_CERT_PATH are "
                "not read): whoever reaches an engine's plain TCP port owns its host. Set "
                "docker_allow_plain_tcp=true to accept that risk"
            )
        return EngineAddress(url=f"http://{netloc}", local=local)
    tls = client_context(ca, cert, key, verify=verify)
    return EngineAddress(url=f"https://{netloc}", tls=tls, local=local)


def from_settings(engine: EngineSection) -> EngineAddress:
    """The engine address of the server's `[engine]` settings."""
    return engine_address(
        engine.docker_host,
        ca=engine.docker_tls_ca,
        cert=engine.docker_tls_cert,
        key=engine.docker_tls_key,
        verify=engine.docker_tls_verify,
        allow_plain_tcp=engine.docker_allow_plain_tcp,
    )
