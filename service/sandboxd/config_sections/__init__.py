"""The sections of the server's configuration, each setting declared once: type (a `Kind`),
default, bounds or choices, help, and the external name flags, environment and TOML use.

`sandboxd.config.Config` gathers these sections; `sandboxd.settings` derives parsing, `--help`
and bound checks from the declarations, so adding a setting is one `setting(...)` line in its
section's module: `server` (the process, engine, metrics, isolation), `sessions` (limits,
leases, archives, events, agent, watches), `access` (tenants, egress, audit), `images`
(pulls, templates), `volumes` (named volumes). Previews declare theirs in
`sandboxd.previews.settings`.
"""

from sandboxd.config_sections.access import AuditSection, EgressSection, TenancySection
from sandboxd.config_sections.images import ImagesSection, TemplatesSection
from sandboxd.config_sections.server import (
    EngineSection,
    IsolationSection,
    MetricsSection,
    ServerSection,
)
from sandboxd.config_sections.sessions import (
    AgentSection,
    ArchiveSection,
    EventsSection,
    LeasesSection,
    LimitsSection,
    WatchSection,
)
from sandboxd.config_sections.units import GiB, KiB, MiB
from sandboxd.config_sections.volumes import VolumesSection

__all__ = [
    "AgentSection",
    "ArchiveSection",
    "AuditSection",
    "EgressSection",
    "EngineSection",
    "EventsSection",
    "GiB",
    "ImagesSection",
    "IsolationSection",
    "KiB",
    "LeasesSection",
    "LimitsSection",
    "MetricsSection",
    "MiB",
    "ServerSection",
    "TemplatesSection",
    "TenancySection",
    "VolumesSection",
    "WatchSection",
]
