"""The sections of the server's configuration, each setting declared once: type (a `Kind`),
default, bounds or choices, help, and the external name flags, environment and TOML use.

`sandboxd.config.Config` gathers these sections; `sandboxd.settings` derives parsing, `--help`
and bound checks from the declarations, so adding a setting is one `setting(...)` line in its
section's module: `server` (the process, engine, metrics, isolation), `sessions` (limits,
leases, archives, events, agent, watches), `access` (tenants, egress, audit), `images`
(pulls, templates), `volumes` (named volumes), `admission` (fair shares), `previews`, `web`
and `e2b` (the doors beside gRPC). They sit here, below every room they configure, so that
the configuration never imports a room of the domain or a door.
"""

from sandboxd.config_sections.access import AuditSection, EgressSection, TenancySection
from sandboxd.config_sections.admission import AdmissionSection
from sandboxd.config_sections.e2b import E2bSection
from sandboxd.config_sections.images import ImagesSection, TemplatesSection
from sandboxd.config_sections.previews import PreviewsSection
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
from sandboxd.config_sections.web import WebSection

__all__ = [
    "AdmissionSection",
    "AgentSection",
    "ArchiveSection",
    "AuditSection",
    "E2bSection",
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
    "PreviewsSection",
    "ServerSection",
    "TemplatesSection",
    "TenancySection",
    "VolumesSection",
    "WatchSection",
    "WebSection",
]
