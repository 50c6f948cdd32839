"""The fair-share settings (sandboxd.admission): on by default, every value documented."""

from __future__ import annotations

from dataclasses import dataclass

from sandboxd.settings import BOOL, DURATION, INT, SIZE, setting

MiB = 1024 * 1024


@dataclass(frozen=True)
class AdmissionSection:
    """How much of the server one tenant may take while other tenants are active.

    The shares bind only under contention: a tenant alone on the server (no other tenant made a
    call or moved command output within `contention_window_s`) is never refused or paced.
    """

    enabled: bool = setting(
        True,
        BOOL,
        "fair shares between tenants (off: no rate refusals, no output pacing)",
        flat="admission_enabled",
    )
    tenant_cpu: bool = setting(
        True,
        BOOL,
        "each tenant's sandboxes share one CPU weight at the kernel (cgroup cpu.shares 1024 "
        "split between them), so a tenant's CPU does not grow with its number of sessions",
        flat="admission_tenant_cpu",
    )
    cpu_demotion: bool = setting(
        True,
        BOOL,
        "a tenant whose command output comes faster than 1/8 of admission_output_bytes_per_s "
        "while other tenants are active gets the least CPU weight (cpu.shares 2) for its "
        "sandboxes until it has been calm for 5 s (with admission_tenant_cpu)",
        flat="admission_cpu_demotion",
    )
    demoted_cpu_millis: int = setting(
        500,
        INT,
        "with admission_cpu_demotion: the CPU time a demoted tenant's runc sandboxes get "
        "together, in millicpus, each an equal part of it (at least 10, never above its own "
        "limit) until the tenant is calm again; 0: the least weight only, no cap",
        lo=0,
        flat="admission_demoted_cpu_millis",
    )
    calls_per_s: int = setting(
        50,
        INT,
        "RPCs a tenant may start each second while other tenants are active (beyond: "
        "RESOURCE_EXHAUSTED TENANT_RATE_LIMITED with RetryInfo)",
        lo=1,
        flat="admission_calls_per_s",
    )
    call_burst: int = setting(
        50,
        INT,
        "RPCs a tenant may start at once above its rate before refusals begin",
        lo=1,
        flat="admission_call_burst",
    )
    output_bytes_per_s: int = setting(
        16 * MiB,
        SIZE,
        "command output of a tenant's sessions the server reads each second while other "
        "tenants are active (beyond: the tenant's agent channels are read later: backpressure)",
        lo=1,
        flat="admission_output_bytes_per_s",
    )
    output_burst_bytes: int = setting(
        4 * MiB,
        SIZE,
        "command output a tenant may move at once above its rate before pacing begins",
        lo=1,
        flat="admission_output_burst_bytes",
    )
    contention_window_s: float = setting(
        1.0,
        DURATION,
        "another tenant counts as active this long after its last call or output",
        lo=0,
        lo_open=True,
        hi=60,
        flat="admission_contention_window",
    )
