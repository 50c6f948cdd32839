"""The Dockerfile rules of a safe template build (sandboxd.templates.dockerfile): table-tested."""

from __future__ import annotations

import pytest
from sandboxd.errors import InvalidArgument
from sandboxd.templates.dockerfile import Dockerfile, check_name, parse


@pytest.mark.parametrize(
    ("text", "base", "body"),
    [
        ("FROM busybox\n", "busybox", ()),
        ("from python\nRUN echo hi\n", "python", ("RUN echo hi",)),
        ("# a comment\n\nFROM my-tpl AS build\nCOPY a /a\n", "my-tpl", ("COPY a /a",)),
        ("FROM alpine:3.19\nRUN a && \\\n  b\n", "alpine:3.19", ("RUN a &&  b",)),
        (
            "FROM busybox\nADD local.tar /x\nUSER root\n",
            "busybox",
            ("ADD local.tar /x", "USER root"),
        ),
        (
            "FROM registry.local:5000/team/img@sha256:" + "a" * 64 + "\n",
            "registry.local:5000/team/img@sha256:" + "a" * 64,
            (),
        ),
    ],
)
def test_accepted(text: str, base: str, body: tuple[str, ...]) -> None:
    parsed = parse(text)
    assert (parsed.base, parsed.body) == (base, body)


@pytest.mark.parametrize(
    "text",
    [
        "FROM busybox AS a\nFROM busybox\n",  # multi-stage
        "FROM busybox\nCOPY --from=alpine /x /x\n",
        "FROM busybox\nCOPY --FROM=0 /x /x\n",
        "FROM busybox\nADD --chown=1 --from=x a b\n",
        "ARG B=busybox\nFROM $B\n",
        "FROM ${IMG}\n",
        "FROM --platform=linux/arm64 busybox\n",
        "# syntax=docker/dockerfile:1\nFROM busybox\n",
        "# escape=`\nFROM busybox\n",
        "FROM busybox\nADD https://example.com/x /x\n",
        "FROM busybox\nADD git@github.com:a/b.git /b\n",
        "FROM busybox\nVOLUME /data\n",
        'FROM busybox\nvolume ["/data"]\n',
        "FROM busybox\nONBUILD RUN true\n",
        "FROM busybox\nRUN --network=host wget x\n",
        "FROM busybox\nRUN --mount=type=bind,from=alpine,target=/x true\n",
        "FROM busybox\nLABEL io.sandboxd.template.build=other\n",
        "FROM busybox extra\n",
        "FROM\n",
        "RUN true\n",
        "FROM bad image name!\n",
    ],
)
def test_refused(text: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        parse(text)
    assert info.value.reason == "TEMPLATE_FROM_NOT_ALLOWED"


@pytest.mark.parametrize("text", ["", "# only a comment\n\n", "x" * (64 * 1024 + 1)])
def test_empty_or_too_large(text: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        parse(text)
    assert info.value.reason == "TEMPLATE_SPEC_INVALID"


def test_rewritten_pins_the_base_and_labels_every_step() -> None:
    parsed = Dockerfile("busybox", "", ("RUN echo hi",))
    text = parsed.rewritten("sha256:" + "b" * 64, ("io.sandboxd.template.build", "abc"))
    assert text.splitlines() == [
        "FROM sha256:" + "b" * 64,
        'LABEL io.sandboxd.template.build="abc"',
        "RUN echo hi",
    ]


@pytest.mark.parametrize("name", ["a", "my-template", "x" * 63, "t1-2"])
def test_names_accepted(name: str) -> None:
    assert check_name(name) == name


@pytest.mark.parametrize("name", ["", "A", "1abc", "-x", "x" * 64, "a_b", "a/b", "a:b"])
def test_names_refused(name: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        check_name(name)
    assert info.value.reason == "TEMPLATE_SPEC_INVALID"
