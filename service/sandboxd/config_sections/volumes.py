"""Named volumes (VolumeService): how large one may be, and how much a tenant may hold."""

from __future__ import annotations

from dataclasses import dataclass

from sandboxd.config_sections.units import GiB, MiB
from sandboxd.settings import INT, SIZE, setting


@dataclass(frozen=True)
class VolumesSection:
    """Volumes are disks on the engine host: sparse, so a size is a ceiling, not a cost, until
    the sandbox fills it. The tenant caps bound what one tenant can make the host hold."""

    default_bytes: int = setting(
        1 * GiB,
        SIZE,
        "size of a volume created with size_bytes 0",
        lo=16 * MiB,
        flat="volume_default_bytes",
    )
    max_bytes: int = setting(
        20 * GiB, SIZE, "largest size_bytes of one volume", lo=16 * MiB, flat="volume_max_bytes"
    )
    tenant_max_volumes: int = setting(
        100, INT, "volumes per tenant (0: no cap)", lo=0, flat="tenant_max_volumes"
    )
    tenant_max_bytes: int = setting(
        100 * GiB,
        SIZE,
        "sizes of a tenant's volumes together (0: no cap)",
        lo=0,
        flat="tenant_max_volume_bytes",
    )
    mounts_per_session: int = setting(
        8, INT, "volumes one session may mount", lo=0, hi=64, flat="volume_mounts_per_session"
    )
