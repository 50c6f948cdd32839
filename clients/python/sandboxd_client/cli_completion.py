"""Shell completion for sandboxctl, generated from its own argparse parser.

    source <(sandboxctl completion bash)      # or: sandboxctl completion zsh > ~/.zfunc/_sandboxctl

Commands, sub-commands and each command's options complete; session ids do not (that would
need a call to the server on every TAB).
"""

from __future__ import annotations

import argparse


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _options(parser: argparse.ArgumentParser) -> list[str]:
    return sorted(s for a in parser._actions for s in a.option_strings)


def _table(parser: argparse.ArgumentParser) -> dict[str, list[str]]:
    """Words to offer after each command path ("" is the top level)."""
    table: dict[str, list[str]] = {}

    def walk(p: argparse.ArgumentParser, path: str) -> None:
        subs = _subcommands(p)
        table[path] = sorted(subs) + _options(p)
        for name, child in subs.items():
            walk(child, f"{path} {name}".strip())

    walk(parser, "")
    return table


def completion_script(parser: argparse.ArgumentParser, shell: str) -> str:
    table = _table(parser)
    cases = "\n".join(
        f'    "{path}") words="{" ".join(words)}" ;;' for path, words in sorted(table.items())
    )
    body = f"""_sandboxctl() {{
  local cur path="" w words
  cur="${{COMP_WORDS[COMP_CWORD]}}"
  for w in "${{COMP_WORDS[@]:1:COMP_CWORD-1}}"; do
    case "$w" in -*) ;; *) case " $(_sandboxctl_words "${{path}}") " in
      *" $w "*) path="${{path:+$path }}$w" ;; esac ;; esac
  done
  words=$(_sandboxctl_words "$path")
  COMPREPLY=($(compgen -W "$words" -- "$cur"))
}}
_sandboxctl_words() {{
  local words=""
  case "$1" in
{cases}
  esac
  echo "$words"
}}
"""
    if shell == "bash":
        return body + "complete -o default -F _sandboxctl sandboxctl"
    return (
        "#compdef sandboxctl\nautoload -U bashcompinit && bashcompinit\n"
        + body
        + ("complete -o default -F _sandboxctl sandboxctl")
    )
