"""Sections of the images sessions run: registry pulls and template builds."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sandboxd.config_sections.units import GiB
from sandboxd.settings import (
    BOOL,
    DURATION,
    INT,
    OPTIONAL_PATH,
    SIZE,
    TEXT,
    setting,
)


@dataclass(frozen=True)
class ImagesSection:
    """Which images sessions may run."""

    allowlist: str = setting(
        "sandboxd-runtime:*",
        TEXT,
        "comma-separated image patterns sessions may use ('*' any run of characters); the "
        "default image and a tenant's own snapshot images are always allowed; a registry on "
        "loopback or a private address only by a pattern that names its host",
        flat="image_allowlist",
    )
    registry_auth_file: Path | None = setting(
        None,
        OPTIONAL_PATH,
        "registry credentials for pulls, in the format of Docker's config.json `auths` "
        "(read by the server only; never taken from callers, never logged)",
        flat="registry_auth_file",
    )
    max_image_bytes: int = setting(
        8 * GiB,
        SIZE,
        "largest image a pull may fetch (the manifest's layer sizes, then the pull's progress)",
        lo=1,
        flat="max_image_bytes",
    )
    pull_timeout_s: float = setting(
        600.0,
        DURATION,
        "longest one pull may take (a create also ends it at its own deadline)",
        lo=1,
        flat="pull_timeout_s",
    )
    unused_after_s: float = setting(
        7 * 24 * 3600.0,
        DURATION,
        "a pulled image no session used for this long is removed by the sweep",
        lo=0,
        flat="image_unused_after_s",
    )


@dataclass(frozen=True)
class TemplatesSection:
    """Templates sessions may be created from by name."""

    python_image: str = setting(
        "sandboxd-runtime:python",
        TEXT,
        "image of the built-in `python` template (make python-image builds it)",
        flat="template_python_image",
    )
    build_builtins: bool = setting(
        True,
        BOOL,
        "build a built-in template's missing sandboxd-runtime image in the background when the "
        "engine answers (its recipe ships in the package); off: `make image` and `make "
        "python-image` alone make them",
        flat="template_build_builtins",
    )
    base_image: str = setting(
        "sandboxd-runtime:base",
        TEXT,
        "image of the built-in `base` template: bash, python3, curl and the user `user` "
        "(make base-image builds it)",
        flat="template_base_image",
    )
    max_context_bytes: int = setting(
        64 * 1024**2,
        SIZE,
        "largest build context BuildTemplate accepts (counted while it streams in)",
        lo=1,
        flat="template_max_context_bytes",
    )
    build_timeout_s: float = setting(
        300.0,
        DURATION,
        "longest a template build may run before it is stopped and cleaned up",
        lo=1,
        flat="template_build_timeout_s",
    )
    max_builds: int = setting(
        2, INT, "template builds one tenant may run at once", lo=1, flat="template_max_builds"
    )
    build_memory_bytes: int = setting(
        1024**3,
        SIZE,
        "memory limit of each template build step",
        lo=6 * 1024**2,
        flat="template_build_memory_bytes",
    )
    build_millicpus: int = setting(
        1000,
        INT,
        "CPU each template build step may use, in thousandths of a CPU",
        lo=10,
        flat="template_build_millicpus",
    )
