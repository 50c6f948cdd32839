"""`sbx status` (death by a signal told from `exit 128+N`) and `sbx chmod` (never through a
symlink), on the helper binary itself."""

from __future__ import annotations

import os
import secrets
import stat

from test_helper import Env, env  # noqa: F401  (a fixture)


def _run_id() -> str:
    return "p-" + secrets.token_hex(8)


def test_status_tells_a_signal_from_a_plain_exit(env: Env) -> None:  # noqa: F811
    rid = _run_id()
    r = env("run", "--id", rid, "--", "sh", "-c", "kill -INT $$")
    assert r.rc == 130
    assert env.ok("status", rid).out == b"signal 2\n"
    assert env.ok("status", rid).out == b"exit\n"  # consumed
    rid = _run_id()
    assert env("run", "--id", rid, "--", "sh", "-c", "exit 130").rc == 130
    assert env.ok("status", rid).out == b"exit\n"


def test_status_refuses_a_path_for_an_id(env: Env) -> None:  # noqa: F811
    env.fail("EINVAL", "status", "../../etc/passwd", rc=2)


def test_chmod_sets_modes_and_never_follows_a_symlink(env: Env) -> None:  # noqa: F811
    env.ok("chmod", "sub", "555")
    assert stat.S_IMODE(os.lstat(env.root / "sub").st_mode) == 0o555
    env.ok("chmod", "sub", "755")
    before = stat.S_IMODE(os.stat(env.outside).st_mode)
    env.fail("EINVAL", "chmod", "outl", "700")  # a symlink to a directory outside
    assert stat.S_IMODE(os.stat(env.outside).st_mode) == before
    env.fail("ESCAPE", "chmod", "../outside", "700", rc=1)
