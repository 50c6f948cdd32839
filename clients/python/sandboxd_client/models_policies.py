"""What a session may use and reach, as `sandboxd_client.models` spells it: resource limits, the
shell policy, the network policy with its egress proxy's quotas and secrets. Inputs as well as
results: each has `from_pb` and (but ShellPolicy) `to_pb`.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Self

from sandboxd_client._convert import duration, enum_name, enum_value, seconds
from sandboxd_client._lazy import lazy

if TYPE_CHECKING:
    from sandboxd_client._gen.sandboxd.v1 import common_pb2, secrets_pb2
else:  # loaded on first use (sandboxd_client._lazy)
    common_pb2 = lazy("sandboxd_client._gen.sandboxd.v1.common_pb2")
    secrets_pb2 = lazy("sandboxd_client._gen.sandboxd.v1.secrets_pb2")


@dataclasses.dataclass(frozen=True)
class ResourceLimits:
    """Zero fields take the server's default."""

    memory_bytes: int = 0
    cpu_millis: int = 0
    pids: int = 0
    workspace_bytes: int = 0
    file_bytes: int = 0
    output_bytes: int = 0
    command_timeout: float | None = None

    @classmethod
    def from_pb(cls, m: common_pb2.ResourceLimits) -> Self:
        return cls(
            m.memory_bytes,
            m.cpu_millis,
            m.pids,
            m.workspace_bytes,
            m.file_bytes,
            m.output_bytes,
            seconds(m.command_timeout) if m.HasField("command_timeout") else None,
        )

    def to_pb(self) -> common_pb2.ResourceLimits:
        return common_pb2.ResourceLimits(
            memory_bytes=self.memory_bytes,
            cpu_millis=self.cpu_millis,
            pids=self.pids,
            workspace_bytes=self.workspace_bytes,
            file_bytes=self.file_bytes,
            output_bytes=self.output_bytes,
            command_timeout=duration(self.command_timeout),
        )


@dataclasses.dataclass(frozen=True)
class ShellPolicy:
    allow: tuple[str, ...] = ()
    allow_all: bool = False

    @classmethod
    def from_pb(cls, m: common_pb2.ShellPolicy) -> Self:
        return cls(tuple(m.allow), m.allow_all)


@dataclasses.dataclass(frozen=True)
class ProxyQuotas:
    """Quotas of a session's egress proxy; zero/None takes the server's default."""

    max_connections: int = 0
    max_dns_lookups: int = 0
    max_requests: int = 0
    max_bytes_up: int = 0
    max_bytes_down: int = 0
    idle_timeout: float | None = None
    tunnel_lifetime: float | None = None
    header_timeout: float | None = None

    @classmethod
    def from_pb(cls, m: common_pb2.ProxyQuotas) -> Self:
        def opt(name: Any) -> float | None:
            return seconds(getattr(m, name)) if m.HasField(name) else None

        return cls(
            m.max_connections,
            m.max_dns_lookups,
            m.max_requests,
            m.max_bytes_up,
            m.max_bytes_down,
            opt("idle_timeout"),
            opt("tunnel_lifetime"),
            opt("header_timeout"),
        )

    def to_pb(self) -> common_pb2.ProxyQuotas:
        return common_pb2.ProxyQuotas(
            max_connections=self.max_connections,
            max_dns_lookups=self.max_dns_lookups,
            max_requests=self.max_requests,
            max_bytes_up=self.max_bytes_up,
            max_bytes_down=self.max_bytes_down,
            idle_timeout=duration(self.idle_timeout),
            tunnel_lifetime=duration(self.tunnel_lifetime),
            header_timeout=duration(self.header_timeout),
        )


@dataclasses.dataclass(frozen=True)
class SecretBinding:
    """A secret the server's egress proxy adds for `hosts`; the sandbox's variable `name` holds
    a placeholder. `value` is write-only (a session read back has it empty); or `secret_ref`."""

    name: str
    hosts: tuple[str, ...] = ()
    value: bytes = dataclasses.field(default=b"", repr=False)
    secret_ref: str = ""
    header: str = ""
    template: str = ""

    @classmethod
    def from_pb(cls, m: secrets_pb2.SecretBinding) -> Self:
        return cls(m.name, tuple(m.hosts), m.value, m.secret_ref, m.header, m.template)

    def to_pb(self) -> secrets_pb2.SecretBinding:
        return secrets_pb2.SecretBinding(
            name=self.name,
            hosts=list(self.hosts),
            value=self.value,
            secret_ref=self.secret_ref,
            header=self.header,
            template=self.template,
        )


@dataclasses.dataclass(frozen=True)
class NetworkPolicy:
    """`mode` "DENY" (no network, the default) or "ALLOWLIST" (declared names and ports)."""

    mode: str = "DENY"
    allowed_domains: tuple[str, ...] = ()
    allowed_ports: tuple[int, ...] = ()
    allow_private_networks: bool = False
    quotas: ProxyQuotas | None = None
    secrets: tuple[SecretBinding, ...] = ()
    refuse_misdirected_secrets: bool = False

    @classmethod
    def from_pb(cls, m: common_pb2.NetworkPolicy) -> Self:
        return cls(
            enum_name(common_pb2.NetworkMode, m.mode, "NETWORK_MODE_"),
            tuple(m.allowed_domains),
            tuple(m.allowed_ports),
            m.allow_private_networks,
            ProxyQuotas.from_pb(m.quotas) if m.HasField("quotas") else None,
            tuple(SecretBinding.from_pb(b) for b in m.secrets),
            m.refuse_misdirected_secrets,
        )

    def to_pb(self) -> common_pb2.NetworkPolicy:
        return common_pb2.NetworkPolicy(
            mode=enum_value(common_pb2.NetworkMode, self.mode, "NETWORK_MODE_"),
            allowed_domains=list(self.allowed_domains),
            allowed_ports=list(self.allowed_ports),
            allow_private_networks=self.allow_private_networks,
            quotas=self.quotas.to_pb() if self.quotas is not None else None,
            secrets=[b.to_pb() for b in self.secrets],
            refuse_misdirected_secrets=self.refuse_misdirected_secrets,
        )
