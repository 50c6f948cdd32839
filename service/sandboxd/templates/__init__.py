"""Templates: what a sandbox is made of, by name (see `builtin`)."""

from sandboxd.templates.builtin import BUILTIN_TEMPLATES, resolve_template

__all__ = ["BUILTIN_TEMPLATES", "resolve_template"]
