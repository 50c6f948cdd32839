"""A Dockerfile cut into instructions the way the engine's own parser cuts it.

The rules in `dockerfile` are only as good as this agreement: a checker that joins or splits
lines differently from the builder checks one file while the engine builds another (a
continuation the checker sees and the builder does not hides an instruction from the
checker). So this is a line-for-line port of the parts of Moby's parser
(`frontend/dockerfile/parser`) that decide where an instruction starts and ends and which
words of it are flags: `Parse`'s line assembly, `splitCommand`, `extractBuilderFlags` and
`parseWords`. The server then sends the engine the instructions it checked, one per line
(see `Dockerfile.rewritten`), so whatever the caller's layout, the engine parses exactly
the lines checked here.

dockerfile-parse (PyPI) was measured and not used: it expands `${X:-y}` as the literal
text, continues a line on a backslash followed by any Unicode space (Moby: only space and
tab) and honours `# escape=`, each a place where it and the builder read different files.

What the port cannot be sure of is refused before it is cut: control characters (NUL, form
feed, vertical tab, a CR that does not end a line...) and Unicode spaces other than space and
tab, where Go's `unicode.IsSpace` and Python's `str.isspace` disagree. With those gone, both
see the same whitespace: space and tab.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

# Moby: `\\[ \t]*$` with the default escape token (a `# escape=` directive is refused).
_CONTINUATION_RE = re.compile(r"\\[ \t]*\Z")
# Moby's `reDirective`; only the lines before the first instruction can be one.
DIRECTIVE_RE = re.compile(r"\A#\s*([a-zA-Z][a-zA-Z0-9]*)\s*=\s*(.+?)\s*\Z")
_SPACE = " \t"


class LexError(ValueError):
    """The file holds something the port cannot cut the way the engine would."""


@dataclass(frozen=True)
class Instruction:
    """One instruction as the engine's parser sees it.

    `keyword` upper-cased; `flags` the leading `--name[=value]` words with quotes and escapes
    taken out (as the engine's flag parser gets them); `args` the rest, unexpanded;
    `line` the whole instruction on one line (what the engine is sent)."""

    keyword: str
    flags: tuple[str, ...]
    args: str
    line: str
    number: int  # the line of the caller's file it starts on (1-based), for messages


def _check_characters(text: str) -> None:
    for n, ch in enumerate(text):
        if ch in "\n\t ":
            continue
        cat = unicodedata.category(ch)
        if ch == "\r" and text[n + 1 : n + 2] == "\n":
            continue
        if cat in ("Cc", "Zs", "Zl", "Zp") or ch == "\ufeff" and n > 0:
            line = text.count("\n", 0, n) + 1
            raise LexError(
                f"line {line}: character U+{ord(ch):04X} is not allowed in a Dockerfile here "
                "(control characters and spaces other than space and tab are refused)"
            )


def _lstrip(s: str) -> str:
    return s.lstrip(_SPACE)


def _is_comment(raw: str) -> bool:
    return _lstrip(raw).startswith("#")


def _trim_continuation(line: str) -> tuple[str, bool]:
    """(line without its continuation, whether the instruction ends here)."""
    m = _CONTINUATION_RE.search(line)
    if m is None:
        return line, True
    return line[: m.start()], False


def _lines(text: str) -> list[str]:
    """Go's bufio.ScanLines: split on LF, drop one CR before it; no empty last line."""
    text = text.removeprefix("\ufeff")
    _check_characters(text)
    parts = text.split("\n")
    if parts and parts[-1] == "":
        parts.pop()
    return [p.removesuffix("\r") for p in parts]


def split(text: str) -> tuple[list[str], list[Instruction]]:
    """(the parser directives before the first instruction, the instructions)."""
    raw = _lines(text)
    directives: list[str] = []
    out: list[Instruction] = []
    seeking_directives = True
    i = 0
    while i < len(raw):
        first = _lstrip(raw[i])
        number = i + 1
        i += 1
        if seeking_directives:
            if DIRECTIVE_RE.match(first):
                directives.append(first)
                continue
            seeking_directives = False
        if first.startswith("#"):
            first = ""  # Moby's trimComments: a comment line is an empty line
        line, end = _trim_continuation(first)
        if end and line == "":
            continue
        while not end:
            if i == len(raw):
                raise LexError(
                    f"line {number}: the file ends inside a continued instruction "
                    "(a last line ending with a backslash)"
                )
            cont = raw[i]
            i += 1
            if _is_comment(cont):
                continue
            if _lstrip(cont) == "":
                continue  # Moby skips an empty continuation line
            cont, end = _trim_continuation(cont)
            line += cont
        out.append(_instruction(line, number))
    return directives, out


def _instruction(line: str, number: int) -> Instruction:
    """Moby's splitCommand: the keyword, then the flags, then the arguments."""
    parts = re.split(r"[ \t]+", line.strip(_SPACE), maxsplit=1)
    keyword = parts[0].upper()
    args, flags = extract_flags(parts[1]) if len(parts) == 2 else ("", [])
    return Instruction(keyword, tuple(flags), args.strip(_SPACE), line.strip(_SPACE), number)


def extract_flags(line: str) -> tuple[str, list[str]]:
    """Moby's extractBuilderFlags: leading words that start with `--` are flags (quotes and
    backslashes in them are taken out); `--` alone ends them. (rest of the line, flags)."""
    words: list[str] = []
    word = ""
    blank_ok = False
    phase = "spaces"
    quote = ""
    pos = 0
    n = len(line)
    while pos <= n:
        ch = line[pos] if pos < n else ""
        if phase == "spaces":
            if pos == n:
                break
            if ch in _SPACE:
                pos += 1
                continue
            if ch != "-" or pos + 1 == n or line[pos + 1] != "-":
                return line[pos:], words
            phase = "word"
        if phase in ("word", "quote") and pos == n:
            if word != "--" and (blank_ok or word):
                words.append(word)
            break
        if phase == "word":
            if ch in _SPACE:
                phase = "spaces"
                if word == "--":
                    return line[pos:], words
                if blank_ok or word:
                    words.append(word)
                word, blank_ok = "", False
                pos += 1
                continue
            if ch in "'\"":
                quote, blank_ok, phase = ch, True, "quote"
                pos += 1
                continue
            if ch == "\\":
                if pos + 1 == n:
                    pos += 1
                    continue
                pos += 1
                ch = line[pos]
            word += ch
            pos += 1
            continue
        # phase == "quote"
        if ch == quote:
            phase = "word"
            pos += 1
            continue
        if ch == "\\":
            if pos + 1 == n:
                phase = "word"
                pos += 1
                continue
            pos += 1
            ch = line[pos]
        word += ch
        pos += 1
    return "", words


def parse_words(rest: str) -> list[str]:
    """Moby's parseWords: split on whitespace outside quotes, keeping quotes and escapes in
    the words (LABEL, ENV and ARG keys are cut from these before the builder expands them)."""
    words: list[str] = []
    word = ""
    blank_ok = False
    phase = "spaces"
    quote = ""
    pos = 0
    n = len(rest)
    while pos <= n:
        ch = rest[pos] if pos < n else ""
        if phase == "spaces":
            if pos == n:
                break
            if ch in _SPACE:
                pos += 1
                continue
            phase = "word"
        if phase in ("word", "quote") and pos == n:
            if blank_ok or word:
                words.append(word)
            break
        if phase == "word":
            if ch in _SPACE:
                phase = "spaces"
                if blank_ok or word:
                    words.append(word)
                word, blank_ok = "", False
                pos += 1
                continue
            if ch in "'\"":
                quote, blank_ok, phase = ch, True, "quote"
            if ch == "\\":
                if pos + 1 == n:
                    pos += 1
                    continue
                word += ch
                pos += 1
                ch = rest[pos]
            word += ch
            pos += 1
            continue
        if ch == quote:
            phase = "word"
        if ch == "\\" and quote != "'":
            if pos + 1 == n:
                phase = "word"
                pos += 1
                continue
            pos += 1
            word += "\\"
            ch = rest[pos]
        word += ch
        pos += 1
    return words
