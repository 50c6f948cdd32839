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
        ("FROM alpine:3.19\nRUN a && \\\n  b\n", "alpine:3.19", ("RUN a &&   b",)),
        ("FROM busybox\r\nRUN a \\\r\n\r\n# note\r\n b\r\n", "busybox", ("RUN a  b",)),
        (
            "FROM busybox\nCOPY --chown=1000:1000 local.tar /x\nUSER root\n",
            "busybox",
            ("COPY --chown=1000:1000 local.tar /x", "USER root"),
        ),
        (
            'FROM busybox\nARG V=1\nENV A=${B:-c} D=$V\nLABEL version="1.0" team=me\n'
            "COPY $SRC /dst\nHEALTHCHECK --interval=5s CMD true\nRUN echo $HOME\n",
            "busybox",
            (
                "ARG V=1",
                "ENV A=${B:-c} D=$V",
                'LABEL version="1.0" team=me',
                "COPY $SRC /dst",
                "HEALTHCHECK --interval=5s CMD true",
                "RUN echo $HOME",
            ),
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
        "ARG B=busybox\nFROM $B\n",
        "FROM ${IMG}\n",
        "FROM --platform=linux/arm64 busybox\n",
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


# Each (Dockerfile, what the refusal names). KEPT: refused before and still, by the rule now
# named. HOSTILE: every row passed the checker this module replaced (measured against it);
# the groups say which the engine then acted on.
KEPT = [
    ("FROM busybox\nRUN echo \\\x0c\nADD http://127.0.0.1/x /x\n", "U+000C"),
    ("FROM busybox\nRUN echo \\\u2028\nADD http://127.0.0.1/x /x\n", "U+2028"),
    ("\ufeff# escape=`\nFROM busybox\n", "parser directive"),
    ("FROM busybox\nLABEL 'io.sandboxd'.x=1\n", "io.sandboxd"),
    ("FROM busybox\nLABEL a=1 b=2 \\\n  IO.SandBoxd.x=3\n", "io.sandboxd"),
    ("FROM busybox\nADD https://example.com/x /x\n", "ADD is not allowed"),
    ("FROM busybox\nADD git@github.com:a/b.git /b\n", "ADD is not allowed"),
    ("FROM busybox\nVOLUME /data\n", "VOLUME"),
    ('FROM busybox\nvolume ["/data"]\n', "VOLUME"),
    ("FROM busybox\nONBUILD RUN true\n", "ONBUILD"),
    ("FROM busybox\nRUN --network=host wget x\n", "no --network"),
    ("FROM busybox\nRUN --mount=type=bind,from=alpine,target=/x true\n", "no --mount"),
    ("FROM busybox\nLABEL io.sandboxd.template.build=other\n", "io.sandboxd"),
    ("# syntax=docker/dockerfile:1\nFROM busybox\n", "parser directive"),
    ("# escape=`\nFROM busybox\n", "parser directive"),
]
HOSTILE = [
    # A URL the builder's expansion makes: from an ARG, an ENV, a default. The engine fetched
    # the first two (tests/integration/test_hostile_templates.py).
    ("FROM busybox\nARG U=http://127.0.0.1:9/x\nADD $U /opt/x\n", "ADD is not allowed"),
    ("FROM busybox\nENV U=http://169.254.169.254/\nADD ${U} /x\n", "ADD is not allowed"),
    ("FROM busybox\nADD ${U:-http}$S /x\n", "ADD is not allowed"),
    ("FROM busybox\nADD --checksum=sha256:00 $U /x\n", "ADD is not allowed"),
    ("FROM busybox\nADD --keep-git-dir=true $G /x\n", "ADD is not allowed"),
    # ADD of a local archive: unpacked by the engine past every size counted.
    ("FROM busybox\nADD local.tar.gz /x\n", "use COPY"),
    # Lines the old lexer joined or cut where the engine's parser does not. The old server
    # sent the engine its own joined lines, so these did not reach it as written; they are
    # refused now so that no layout the two parsers could read apart is ever sent.
    ("FROM busybox\nADD ./a \\\n\n http://127.0.0.1/x /x\n", "ADD is not allowed"),
    ("FROM busybox\nLABEL a=1 \\\n\n io.sandboxd.x=2\n", "io.sandboxd"),
    ("FROM busybox\nRUN echo \\\u00a0\nADD http://127.0.0.1/x /x\n", "U+00A0"),
    ("FROM busybox\nRUN echo a\x00b\n", "U+0000"),
    ("FROM busybox\nRUN true \\", "ends inside a continued instruction"),
    ("# check=skip=all\nFROM busybox\n", "parser directive"),
    # The server's label namespace, however the key is spelled (the engine set the first
    # four: it takes escapes and quotes out and expands variables in keys).
    ("FROM busybox\nLABEL io\\.sandboxd.template.build=x\n", "io.sandboxd"),
    ('FROM busybox\nLABEL io.sand"boxd".template.build=x\n', "io.sandboxd"),
    ("FROM busybox\nARG K=io.sandboxd.template.build\nLABEL $K=other\n", "variables"),
    ("FROM busybox\nENV P=io.sand\nLABEL ${P}boxd.x=1\n", "variables"),
    # Flags the engine's flag parser reads after taking quotes and escapes out (`--from`).
    ("FROM busybox\nCOPY --fr\\om=alpine /etc/passwd /x\n", "--from=alpine"),
    ('FROM busybox\nCOPY --"from"=alpine /etc/passwd /x\n', "--from=alpine"),
    ("FROM busybox\nCOPY --chown=$U a /a\n", "literal --chown"),
    ("FROM busybox\nCOPY --chmod=4755 a /a\n", "--chmod"),
    # Heredocs and instructions this server does not build (the engine refused these itself;
    # refused here with the rule named).
    ("FROM busybox\nCOPY <<EOF /x\n", "heredocs"),
    ("FROM busybox\nRUN <<EOF\n", "heredocs"),
    ("FROM busybox\nFOO bar\n", "not an instruction"),
]


@pytest.mark.parametrize(("text", "names"), KEPT + HOSTILE)
def test_hostile_refused_with_the_rule_named(text: str, names: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        parse(text)
    assert info.value.reason == "TEMPLATE_INSTRUCTION_NOT_ALLOWED", info.value.message
    assert names in info.value.message


def test_the_engine_is_sent_one_checked_instruction_per_line() -> None:
    """Whatever the caller's layout, what the engine parses is the checked lines."""
    parsed = parse("FROM busybox\nRUN a \\\n# c\n\n  b\nLABEL x=1 \\\n y=2\n")
    text = parsed.rewritten("sha256:" + "c" * 64, ("io.sandboxd.template.build", "id"))
    assert text.splitlines()[2:] == ["RUN a   b", "LABEL x=1  y=2"]


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
