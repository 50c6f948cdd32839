"""The built-in templates: `busybox` (the server's default image), `python` (Debian 12 with
python3 and its standard library, built offline by sandboxd/runtime_images/python.sh, which
the server runs itself when the engine lacks the image: builtin_images.py) and `base` (Debian 12
with bash, python3, curl and a user `user` whose home /home/user is the workspace, built by
sandboxd/runtime_images/base.sh: the template E2B's SDK names by default).

A template resolves to the image a session runs; the image then passes the same checks as a
named one (allowlist, present on the engine, no VOLUMEs), so a template can never reach an image
the caller could not name. Pure: nothing here asks the engine.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from sandboxd.errors import InvalidArgument, NotFound
from sandboxd.reasons import Reason

BUILTIN_TEMPLATES = ("busybox", "python", "base")


class TemplateImages(Protocol):
    """The tenant-built templates a create may name (sandboxd.templates.builds.Templates)."""

    async def ready_images(self, tenant: str) -> dict[str, str]:
        """Name -> image id of the tenant's built templates."""
        ...

    async def require_ready(self, image: str) -> None:
        """TEMPLATE_NOT_READY while `image` is a built-in's that is still being built."""
        ...


def resolve_template(
    name: str,
    image: str,
    *,
    default_image: str,
    python_image: str,
    base_image: str,
    own: Mapping[str, str] | None = None,
) -> str:
    """The image of a create request that names `name` (and maybe `image`): '' keeps `image`.

    `own`: the calling tenant's built templates, name -> image id (sandboxd.templates.builds)."""
    if not name:
        return image
    if image:
        raise InvalidArgument(
            "set either template or image, not both", reason=Reason.TEMPLATE_WITH_IMAGE
        )
    images = {
        **(own or {}),
        "busybox": default_image,
        "python": python_image,
        "base": base_image,
    }
    if name not in images:
        raise NotFound(
            f"no template {name[:64]!r} (built-in: {', '.join(BUILTIN_TEMPLATES)})",
            reason=Reason.TEMPLATE_NOT_FOUND,
            metadata={"template": name[:64]},
        )
    return images[name]
