"""Image references: what the engine would refuse is INVALID_IMAGE before it is asked."""

from __future__ import annotations

import pytest
from sandboxd.errors import InvalidArgument
from sandboxd.validation import validate_image

ACCEPT = [
    "sandboxd-runtime:busybox",
    "alpine",
    "alpine:3.21",
    "library/alpine:latest",
    "registry.example.com:5000/team/tool:1.0",
    "localhost/x_y__z.w-v:TAG_1.0-rc",
    "ghcr.io/owner/image@sha256:" + "a" * 64,
    "alpine:3.21@sha256:" + "0" * 64,
    "sha256:" + "b" * 64,
    "0123456789ab",
]

REJECT = [
    "",
    "Bad Image!!",
    "UPPER:case",
    "a:b:c@@",
    "alpine:",
    "alpine:-tag",
    "/alpine",
    "alpine/",
    "al//pine",
    "alpine:" + "t" * 129,
    "alpine\n",
    "alpine\0",
    "-alpine",
    "alpine@sha256:short",
    "a" * 513,
]


@pytest.mark.parametrize("image", ACCEPT)
def test_accepts(image: str) -> None:
    assert validate_image(image) == image


@pytest.mark.parametrize("image", REJECT, ids=lambda i: repr(i)[:30])
def test_refuses(image: str) -> None:
    with pytest.raises(InvalidArgument) as excinfo:
        validate_image(image)
    assert excinfo.value.reason == "INVALID_IMAGE"
