"""The Dockerfile rules of a safe template build, pure and table-tested.

A build may start only from what a session could run: a template (built-in or the tenant's own)
or an allowlisted image, so `FROM` is the one place an image enters. Everything else that could
bring one in, or reach outside the build, is refused here, before the engine sees the file:
more than one `FROM` (build stages), `COPY/ADD --from`, `ADD` of a URL or git repository,
variables or flags in `FROM`, `ARG` before it, parser directives that change the frontend
(`# syntax=`) or the parser (`# escape=`), `ONBUILD` (triggers run in later builds, unseen),
`VOLUME` (session images may not declare any), and `RUN` flags (BuildKit mounts, network).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sandboxd.errors import InvalidArgument
from sandboxd.reasons import Reason

MAX_DOCKERFILE_BYTES = 64 * 1024
NAME_RE = re.compile(r"\A[a-z][a-z0-9-]{0,62}\Z")
_DIRECTIVE_RE = re.compile(r"\A#\s*(syntax|escape)\s*=", re.I)
_BASE_RE = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9._:/@-]{0,254}\Z")
_URL_RE = re.compile(r"://|\Agit@", re.I)
_REFUSED = {
    "ONBUILD": "ONBUILD triggers are not allowed",
    "VOLUME": "VOLUME is not allowed (session images may not declare volumes)",
}


@dataclass(frozen=True)
class Dockerfile:
    """A checked Dockerfile: its base as written, and the instructions after FROM."""

    base: str
    stage: str  # the `AS name` of the one stage, or ''
    body: tuple[str, ...]

    def rewritten(self, image: str, build_label: tuple[str, str]) -> str:
        """The text the engine builds: FROM the resolved image, then the build's label first,
        so every intermediate image carries it (a failed build is pruned by it)."""
        key, value = build_label
        head = f"FROM {image}" + (f" AS {self.stage}" if self.stage else "")
        return "\n".join([head, f'LABEL {key}="{value}"', *self.body]) + "\n"


def _refuse(message: str) -> InvalidArgument:
    return InvalidArgument(message, reason=Reason.TEMPLATE_FROM_NOT_ALLOWED)


def _logical_lines(text: str) -> list[str]:
    """Instructions with their continuation lines joined; comments and blanks dropped."""
    out: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            if _DIRECTIVE_RE.match(line) and not out:
                raise _refuse(f"parser directive {line[:60]!r} is not allowed")
            continue
        if pending and line.startswith("#"):
            continue  # a comment inside a continued instruction
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        out.append(pending + line)
        pending = ""
    if pending.strip():
        out.append(pending.strip())
    return out


def _check_from(args: list[str]) -> tuple[str, str]:
    if any(a.startswith("--") for a in args):
        raise _refuse("FROM takes no flags (--platform...)")
    if len(args) == 3 and args[1].upper() == "AS" and NAME_RE.match(args[2].lower()):
        args = args[:1] + [args[2]]
    elif len(args) != 1:
        raise _refuse("FROM takes one template or image name (optionally `AS name`)")
    base = args[0]
    if "$" in base or not _BASE_RE.match(base):
        raise _refuse(f"FROM {base[:100]!r}: not a template or image name (no variables)")
    return base, args[1] if len(args) == 2 else ""


def _check_instruction(keyword: str, args: list[str]) -> None:
    if keyword in _REFUSED:
        raise _refuse(_REFUSED[keyword])
    if keyword == "FROM":
        raise _refuse("one FROM only: multi-stage builds are not allowed")
    if keyword in ("COPY", "ADD") and any(a.lower().startswith("--from") for a in args):
        raise _refuse(f"{keyword} --from is not allowed (it reads another image)")
    if keyword == "ADD" and any(_URL_RE.search(a) for a in args if not a.startswith("--")):
        raise _refuse("ADD of a URL or git repository is not allowed (builds have no network)")
    if keyword == "LABEL" and "io.sandboxd" in " ".join(args).lower():
        raise _refuse("LABEL keys io.sandboxd.* are the server's")
    if keyword == "RUN" and args and args[0].startswith("--"):
        raise _refuse("RUN takes no flags (--mount, --network...)")


def parse(text: str) -> Dockerfile:
    """Check a Dockerfile against the rules above; InvalidArgument names the first broken one."""
    if len(text.encode()) > MAX_DOCKERFILE_BYTES:
        raise InvalidArgument(
            f"the Dockerfile is larger than {MAX_DOCKERFILE_BYTES} bytes",
            reason=Reason.TEMPLATE_SPEC_INVALID,
        )
    lines = _logical_lines(text)
    if not lines:
        raise InvalidArgument("the Dockerfile is empty", reason=Reason.TEMPLATE_SPEC_INVALID)
    first = lines[0].split()
    if first[0].upper() != "FROM":
        raise _refuse(f"the Dockerfile must start with FROM (not {first[0][:20].upper()})")
    base, stage = _check_from(first[1:])
    for line in lines[1:]:
        words = line.split()
        _check_instruction(words[0].upper(), words[1:])
    return Dockerfile(base, stage, tuple(lines[1:]))


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
