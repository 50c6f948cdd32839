"""The Dockerfile rules of a safe template build, pure and table-tested.

The engine runs each `RUN` in a container with no network, but it executes the other
instructions itself, on its own host: `ADD <url>` or `ADD <git repo>` is fetched from the
engine host's network (its loopback, the LAN, cloud metadata), `COPY --from=<image>` and a
second `FROM` read (or pull) other images, `ONBUILD` plants instructions for later builds,
and `LABEL` writes the `io.sandboxd.*` keys the server files its own images by. So the rules
are an allowlist of instructions, each checked on the words the engine's parser gives it
(`dockerfile_lex`, a port of that parser), and the engine is sent the checked instructions,
one per line, never the caller's text.

Variables: the builder expands `$X`, `${X:-y}`, `${X:+y}` and escapes in FROM, ADD, COPY,
LABEL, ENV, ARG, WORKDIR, USER, EXPOSE, STOPSIGNAL and VOLUME, after the parser has cut the
line. Rather than model that expansion, every place where its result could matter takes no
`$` at all (FROM, LABEL, COPY's flags) and the instructions whose expansion could fetch or
mount something are refused whole (ADD, VOLUME, ONBUILD); where `$` is left (COPY's paths,
WORKDIR, USER, ENV...) no value it could expand to reaches outside the build: COPY reads the
context only. `RUN`'s `$` is expanded by the shell inside the network-less step.

Refused, with the rule named: `ADD` in every form (URLs, git repositories, `--checksum`,
`--keep-git-dir`, and local archives, which it unpacks past every size the server counted:
use COPY), a second `FROM` (build stages), `--from` anywhere in COPY, flags other than
COPY's literal `--chown`, variables in FROM, parser directives (`# syntax=`, `# escape=`),
heredocs, `ONBUILD`, `VOLUME`, unknown instructions, and any LABEL key in the
`io.sandboxd.` namespace however it is spelled (case, quotes, escapes, old `LABEL k v` form).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sandboxd.errors import InvalidArgument
from sandboxd.reasons import Reason
from sandboxd.templates import dockerfile_lex
from sandboxd.templates.dockerfile_lex import Instruction

MAX_DOCKERFILE_BYTES = 64 * 1024
NAME_RE = re.compile(r"\A[a-z][a-z0-9-]{0,62}\Z")
_BASE_RE = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9._:/@-]{0,254}\Z")
_CHOWN_RE = re.compile(r"\A--chown=[A-Za-z0-9_.:-]{1,64}\Z")
_HEALTHCHECK_FLAG_RE = re.compile(r"\A--(interval|timeout|start-period|retries)=[0-9a-z.]{1,16}\Z")
_HEREDOC_RE = re.compile(r"(?:\A|[ \t])<<-?[\"']?[A-Za-z_]")
NAMESPACE = "io.sandboxd"
# What the builder may run on the caller's say: every other keyword is refused.
_ALLOWED = frozenset(
    {
        "RUN",
        "CMD",
        "ENTRYPOINT",
        "ENV",
        "ARG",
        "LABEL",
        "WORKDIR",
        "USER",
        "EXPOSE",
        "COPY",
        "SHELL",
        "STOPSIGNAL",
        "HEALTHCHECK",
        "MAINTAINER",
    }
)
_REFUSED = {
    "ADD": "ADD is not allowed: the engine fetches its URLs and git repositories from its own "
    "host's network and unpacks its archives past the build's size limits; use COPY",
    "ONBUILD": "ONBUILD triggers are not allowed (they run in later builds, unchecked)",
    "VOLUME": "VOLUME is not allowed (session images may not declare volumes)",
    "FROM": "one FROM only: multi-stage builds are not allowed",
}


@dataclass(frozen=True)
class Dockerfile:
    """A checked Dockerfile: its base as written, and the checked instructions after FROM."""

    base: str
    stage: str  # the `AS name` of the one stage, or ''
    body: tuple[str, ...]

    def rewritten(self, image: str, build_label: tuple[str, str]) -> str:
        """The text the engine builds: FROM the resolved image, then the build's label first,
        so every intermediate image carries it (a failed build is pruned by it), then the
        checked instructions, one per line: the engine parses exactly what was checked."""
        key, value = build_label
        head = f"FROM {image}" + (f" AS {self.stage}" if self.stage else "")
        return "\n".join([head, f'LABEL {key}="{value}"', *self.body]) + "\n"


def _refuse_from(message: str) -> InvalidArgument:
    return InvalidArgument(message, reason=Reason.TEMPLATE_FROM_NOT_ALLOWED)


def _refuse(ins: Instruction | None, message: str) -> InvalidArgument:
    where = f"line {ins.number} ({ins.keyword}): " if ins is not None else ""
    return InvalidArgument(
        where + message,
        reason=Reason.TEMPLATE_INSTRUCTION_NOT_ALLOWED,
        metadata={"instruction": ins.keyword} if ins is not None else {},
    )


def _check_from(ins: Instruction) -> tuple[str, str]:
    if ins.flags:
        raise _refuse_from("FROM takes no flags (--platform...)")
    args = ins.args.split()
    if len(args) == 3 and args[1].upper() == "AS" and NAME_RE.match(args[2].lower()):
        args = args[:1] + [args[2]]
    elif len(args) != 1:
        raise _refuse_from("FROM takes one template or image name (optionally `AS name`)")
    base = args[0]
    if "$" in base or not _BASE_RE.match(base):
        raise _refuse_from(f"FROM {base[:100]!r}: not a template or image name (no variables)")
    return base, args[1] if len(args) == 2 else ""


def in_namespace(text: str) -> bool:
    """Whether `text` could spell a key of the server's namespace once the builder has taken
    out its quotes and escapes (which only ever remove characters): compared without any
    quote or backslash, in any case."""
    plain = re.sub(r"[\"'\\]", "", text).lower()
    return NAMESPACE in plain


def _check_label(ins: Instruction) -> None:
    if "$" in ins.line:
        raise _refuse(
            ins,
            "LABEL may not use variables (the builder expands them into keys and values "
            "after this check; this API takes no build args, so write the value out)",
        )
    if in_namespace(ins.args):
        raise _refuse(ins, f"LABEL keys {NAMESPACE}.* are the server's")
    words = dockerfile_lex.parse_words(ins.args)
    if not words:
        raise _refuse(ins, "LABEL needs key=value")


def _check_flags(ins: Instruction) -> None:
    for flag in ins.flags:
        if ins.keyword == "COPY" and _CHOWN_RE.match(flag):
            continue
        if ins.keyword == "HEALTHCHECK" and _HEALTHCHECK_FLAG_RE.match(flag):
            continue
        raise _refuse(
            ins,
            f"flag {flag[:40]!r} is not allowed (COPY takes a literal --chown only; RUN "
            "takes none: no --mount, no --network)",
        )


def _check_instruction(ins: Instruction) -> None:
    if ins.keyword in _REFUSED:
        if ins.keyword == "FROM":
            raise _refuse_from(_REFUSED["FROM"])
        raise _refuse(ins, _REFUSED[ins.keyword])
    if ins.keyword not in _ALLOWED:
        raise _refuse(ins, f"{ins.keyword[:20]!r} is not an instruction this server builds")
    if ins.keyword == "COPY" and "--from" in ins.line.lower():
        raise _refuse_from(
            f"line {ins.number}: COPY --from is not allowed (it reads another image)"
        )
    _check_flags(ins)
    if ins.keyword in ("RUN", "COPY") and _HEREDOC_RE.search(ins.args):
        raise _refuse(ins, "heredocs (<<EOF) are not supported")
    if ins.keyword == "LABEL":
        _check_label(ins)


def parse(text: str) -> Dockerfile:
    """Check a Dockerfile against the rules above; InvalidArgument names the first broken one."""
    if len(text.encode()) > MAX_DOCKERFILE_BYTES:
        raise InvalidArgument(
            f"the Dockerfile is larger than {MAX_DOCKERFILE_BYTES} bytes",
            reason=Reason.TEMPLATE_SPEC_INVALID,
        )
    try:
        directives, instructions = dockerfile_lex.split(text)
    except dockerfile_lex.LexError as e:
        raise _refuse(None, str(e)) from None
    if directives:
        raise _refuse(None, f"parser directive {directives[0][:60]!r} is not allowed")
    if not instructions:
        raise InvalidArgument("the Dockerfile is empty", reason=Reason.TEMPLATE_SPEC_INVALID)
    first = instructions[0]
    if first.keyword != "FROM":
        raise _refuse_from(f"the Dockerfile must start with FROM (not {first.keyword[:20]})")
    base, stage = _check_from(first)
    for ins in instructions[1:]:
        _check_instruction(ins)
    return Dockerfile(base, stage, tuple(ins.line for ins in instructions[1:]))


def check_name(name: str) -> str:
    """A template name: lowercase letters, digits and '-', starting with a letter, at most 63."""
    if not NAME_RE.match(name):
        raise InvalidArgument(
            f"template name {name[:70]!r}: lowercase letters, digits and '-', starting with a "
            "letter, at most 63 characters",
            reason=Reason.TEMPLATE_SPEC_INVALID,
            metadata={"template": name[:64]},
        )
    return name
