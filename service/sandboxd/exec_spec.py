"""What a command request may ask for, checked before anything runs (pure).

The signal names `sbx signal` accepts, terminal sizes, and `prepare`: a caller's argv, cwd,
env, stdin, timeout and output cap against the rules and the session's policy.
"""

from __future__ import annotations

from dataclasses import dataclass

from sandboxd import validation
from sandboxd.errors import InvalidArgument
from sandboxd.models import ExecSpec, Limits, Session
from sandboxd.reasons import Reason

MAX_PTY_CELLS = 1000

# What SignalProcess and Interact may send; `sbx signal` accepts exactly these.
SIGNAL_NAMES = frozenset(
    {
        "SIGHUP",
        "SIGINT",
        "SIGQUIT",
        "SIGKILL",
        "SIGTERM",
        "SIGUSR1",
        "SIGUSR2",
        "SIGSTOP",
        "SIGCONT",
        "SIGWINCH",
    }
)


@dataclass(frozen=True)
class PtySize:
    rows: int
    cols: int


def validate_signal(name: str) -> str:
    """A signal name from the fixed set; anything else is refused before it reaches sbx."""
    if name not in SIGNAL_NAMES:
        raise InvalidArgument(
            f"signal {name[:32]!r} is not supported; use one of {', '.join(sorted(SIGNAL_NAMES))}",
            reason=Reason.INVALID_SIGNAL,
            metadata={"signal": name[:32]},
        )
    return name


def validate_pty_size(rows: int, cols: int) -> PtySize:
    """Terminal rows and columns, each 1 to 1000 (0 would be an unset field)."""
    for what, value in (("rows", rows), ("cols", cols)):
        if not 1 <= value <= MAX_PTY_CELLS:
            raise InvalidArgument(
                f"terminal {what} must be between 1 and {MAX_PTY_CELLS} (got {value})",
                reason=Reason.INVALID_PTY_SIZE,
                metadata={what: str(value)},
            )
    return PtySize(rows, cols)


@dataclass(frozen=True)
class ExecRequestInput:
    argv: list[str]
    cwd: str = ""
    env: dict[str, str] | None = None
    stdin: bytes = b""
    timeout_s: float | None = None
    max_output_bytes: int | None = None


# The output cap of an interactive command that asks for none: its output streams to the
# caller as it comes and nothing of it is kept, so no cap is needed to bound memory.
UNCAPPED_OUTPUT = 1 << 62


def prepare(
    session: Session,
    req: ExecRequestInput,
    max_limits: Limits,
    *,
    interactive_s: float | None = None,
) -> ExecSpec:
    """Validate a command against the rules and the session's policy; nothing runs yet.

    `interactive_s` (Interact): a command that asks for no timeout runs until it exits, up to
    this long (the longest lease: the session's own end bounds it sooner), and one that asks
    for no output cap has none. A terminal lasts as long as the person uses it; the session's
    10-second command timeout and 1 MiB cap are for commands whose output is collected.
    """
    argv = validation.validate_argv(req.argv)
    cwd = validation.validate_cwd(req.cwd)
    env = validation.validate_env(req.env or {})
    validation.check_command_allowed(
        argv[0], session.spec.shell.allow, session.spec.shell.allow_all
    )
    limits = session.spec.limits
    if interactive_s is not None and req.timeout_s is None:
        return ExecSpec(
            argv=argv,
            cwd=cwd,
            env=env,
            stdin=_checked_stdin(req.stdin, limits),
            timeout_s=interactive_s,
            max_output_bytes=(
                UNCAPPED_OUTPUT
                if req.max_output_bytes is None
                else _checked_cap(req.max_output_bytes, limits)
            ),
        )
    timeout = validation.positive_duration(
        limits.command_timeout_s if req.timeout_s is None else req.timeout_s,
        name="timeout",
        maximum=max_limits.command_timeout_s,
        reason=Reason.INVALID_TIMEOUT,
    )
    cap = _checked_cap(
        limits.output_bytes if req.max_output_bytes is None else req.max_output_bytes, limits
    )
    stdin = _checked_stdin(req.stdin, limits)
    return ExecSpec(
        argv=argv, cwd=cwd, env=env, stdin=stdin, timeout_s=timeout, max_output_bytes=cap
    )


def _checked_cap(cap: int, limits: Limits) -> int:
    if cap <= 0:
        raise InvalidArgument("max_output_bytes must be positive", reason=Reason.INVALID_OUTPUT_CAP)
    if cap > limits.output_bytes:
        raise InvalidArgument(
            f"max_output_bytes {cap} is above the session's output cap {limits.output_bytes}",
            reason=Reason.LIMIT_EXCEEDS_MAXIMUM,
            metadata={"limit": "max_output_bytes", "maximum": str(limits.output_bytes)},
        )
    return cap


def _checked_stdin(stdin: bytes, limits: Limits) -> bytes:
    if len(stdin) > limits.file_bytes:
        raise InvalidArgument(
            f"stdin of {len(stdin)} bytes is over the session's file cap {limits.file_bytes}",
            reason=Reason.STDIN_TOO_LARGE,
        )
    return stdin
