"""The Docker adapter refuses aiodocker/aiohttp versions its private-attribute use was not
checked against, and no module but engine/compat.py reaches into those libraries' privates."""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

import pytest
from sandboxd.engine import compat
from sandboxd.errors import ConfigError

SERVICE = Path(__file__).resolve().parents[2] / "service" / "sandboxd"


def test_installed_versions_are_supported() -> None:
    compat.check_versions()  # the pinned ones


@pytest.mark.parametrize("dist", sorted(compat.SUPPORTED))
def test_an_unsupported_version_is_refused_with_a_clear_error(
    dist: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = metadata.version
    monkeypatch.setattr(
        compat.metadata, "version", lambda name: "99.0.0" if name == dist else real(name)
    )
    with pytest.raises(ConfigError, match=rf"{dist} 99\.0\.0 is not supported"):
        compat.check_versions()


def test_private_attributes_are_reached_only_in_compat() -> None:
    private = re.compile(
        r"(?<!self)\.(_init|_resp|_buffer|_container)\b|_stream\._queue|connector\._limit"
    )
    offenders = [
        f"{path.relative_to(SERVICE)}:{n}"
        for path in SERVICE.rglob("*.py")
        if path.name != "compat.py" and "v1" not in path.parts
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if private.search(line)
    ]
    assert offenders == []
