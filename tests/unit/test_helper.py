"""Tests for the in-container helper binary ``sbx`` (``helper/``).

These run on the host (no Docker): the binary is `make helper`'s build (or the same gcc
command when that is stale), made once per session by the `sbx` fixture of tests/agent_pipes.py,
and pointed at temporary roots via --root.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "helper" / "sbx.c"
LIST_MAX = 100_000


class Result:
    def __init__(self, cp: subprocess.CompletedProcess):
        self.rc = cp.returncode
        self.out: bytes = cp.stdout
        self.err: bytes = cp.stderr

    @property
    def records(self) -> list[dict]:
        return [json.loads(line) for line in self.out.decode("utf-8").splitlines()]

    @property
    def record(self) -> dict:
        recs = self.records
        assert len(recs) == 1, self.out
        return recs[0]

    @property
    def error(self) -> str:
        lines = self.err.decode("utf-8").splitlines()
        assert len(lines) == 1, f"expected one JSON error line, got {self.err!r}"
        obj = json.loads(lines[0])
        assert set(obj) == {"error", "message"}
        return obj["error"]

    def __repr__(self) -> str:
        return f"Result(rc={self.rc}, out={self.out[:300]!r}, err={self.err[:300]!r})"


def unpriv_kwargs() -> dict:
    """Run as nobody when we are root (root bypasses permission checks)."""
    if os.geteuid() == 0:
        return {"user": 65534, "group": 65534, "extra_groups": []}
    return {}


class Env:
    def __init__(self, sbx: str, root: Path, outside: Path):
        self.sbx = sbx
        self.root = root
        self.outside = outside

    def __call__(
        self, *args: str, input: bytes = b"", timeout: float = 10, few_fds: bool = False, **kw
    ) -> Result:
        cmd = [self.sbx, "--root", str(self.root), *args]
        if few_fds:
            # Far fewer descriptors than a deep tree has levels. Through prlimit rather than a
            # preexec_fn: Python code between fork and exec in a process that has gRPC loaded
            # (the whole suite runs in one) can abort in gRPC's fork handlers.
            cmd = ["prlimit", "--nofile=64:64", "--", *cmd]
        cp = subprocess.run(
            cmd, input=input, capture_output=True, timeout=timeout, umask=0o022, check=False, **kw
        )
        return Result(cp)

    def ok(self, *args: str, **kw) -> Result:
        r = self(*args, **kw)
        assert r.rc == 0 and r.err == b"", r
        return r

    def fail(self, name: str, *args: str, rc: int = 1, **kw) -> Result:
        r = self(*args, **kw)
        assert r.rc == rc, r
        assert r.error == name, r
        return r


def snapshot(p: Path) -> list:
    items = []
    for x in sorted(p.rglob("*")):
        st = x.lstat()
        data = x.read_bytes() if stat.S_ISREG(st.st_mode) else None
        items.append((str(x.relative_to(p)), st.st_mode, data, st.st_mtime_ns))
    return items


@pytest.fixture
def env(sbx, tmp_path):
    root = tmp_path / "ws"
    outside = tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (outside / "secret").write_text("secret\n")
    (root / "f").write_bytes(b"hello\n")
    (root / "sub").mkdir()
    (root / "sub" / "g").write_text("g\n")
    os.symlink("/etc", root / "etc")  # absolute symlink
    os.symlink("..", root / "up")  # relative, leaves the root
    os.symlink("../outside", root / "outl")  # directory outside
    os.symlink("../outside/secret", root / "outf")  # file outside
    os.symlink("sub", root / "subl")  # stays inside
    os.symlink("../../outside", root / "sub" / "esc")  # escape mid-path
    e = Env(sbx, root, outside)
    e.outside_before = snapshot(outside)
    yield e
    # Whatever a test did, nothing may ever have been touched outside.
    assert snapshot(outside) == e.outside_before


@pytest.fixture
def open_env(sbx):
    """A world-accessible root for tests that run as an unprivileged user."""
    d = Path(tempfile.mkdtemp(prefix="sbx-ws-"))
    os.chmod(d, 0o755)
    root = d / "ws"
    root.mkdir(mode=0o777)
    os.chmod(root, 0o777)
    yield Env(sbx, root, d)
    for p in d.rglob("*"):
        if p.is_dir() and not p.is_symlink():
            os.chmod(p, 0o755)
    shutil.rmtree(d)


def pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            state = fh.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


ESCAPES = [
    "/etc",
    "/etc/passwd",
    "../x",
    "a/../f",
    "etc/passwd",
    "up/x",
    "outl/secret",
    "sub/esc/secret",
]


# --------------------------------------------------------------------------
# stat
# --------------------------------------------------------------------------


def test_stat_file(env):
    rec = env.ok("stat", "f").record
    st = os.lstat(env.root / "f")
    assert rec == {
        "path": "f",
        "name": "f",
        "type": "file",
        "size": 6,
        "mode": stat.S_IMODE(st.st_mode),
        "mtime_ns": st.st_mtime_ns,
    }


def test_stat_root_dir_and_normalisation(env):
    assert env.ok("stat", ".").record["path"] == "."
    assert env.ok("stat", ".").record["type"] == "dir"
    rec = env.ok("stat", "./sub//g/").record
    assert (rec["path"], rec["name"], rec["type"]) == ("sub/g", "g", "file")
    assert env.ok("stat", "sub").record["type"] == "dir"


def test_stat_symlinks_are_not_followed(env):
    for name, target in [
        ("etc", "/etc"),
        ("up", ".."),
        ("outf", "../outside/secret"),
        ("subl", "sub"),
    ]:
        rec = env.ok("stat", name).record
        assert rec["type"] == "symlink" and rec["target"] == target, rec
    # An inside symlink as an intermediate component is followed.
    assert env.ok("stat", "subl/g").record["path"] == "subl/g"


@pytest.mark.parametrize("path", ESCAPES)
def test_stat_escape(env, path):
    env.fail("ESCAPE", "stat", path)


def test_stat_errors(env):
    env.fail("ENOENT", "stat", "missing")
    env.fail("ENOENT", "stat", "missing/x")
    env.fail("ENOTDIR", "stat", "f/x")
    env.fail("EINVAL", "stat", "")


def test_stat_other_type(env):
    os.mkfifo(env.root / "fifo")
    assert env.ok("stat", "fifo").record["type"] == "other"


def test_json_escaping_and_invalid_utf8(env):
    names = {
        b'q"b\\s': 'q"b\\s',
        b"nl\nx\x01": "nl\nx\x01",
        b"bad\xff\xc0\xafend": "bad\ufffd\ufffd\ufffdend",
        "ünï€😀".encode(): "ünï€😀",
    }
    d = env.root / "names"
    d.mkdir()
    for raw in names:
        os.close(os.open(os.path.join(os.fsencode(d), raw), os.O_CREAT | os.O_WRONLY, 0o644))
    os.symlink(b't\xfe"', os.path.join(os.fsencode(d), b"lnk"))
    r = env.ok("list", "names", "1")
    assert b"\\u000a" in r.out and b"\\u0001" in r.out
    got = {rec["name"] for rec in r.records}
    assert got == set(names.values()) | {"lnk"}
    lnk = next(rec for rec in r.records if rec["name"] == "lnk")
    assert lnk["target"] == 't\ufffd"'


# --------------------------------------------------------------------------
# read
# --------------------------------------------------------------------------


def test_read_ok(env):
    data = bytes(range(256)) * 1000
    (env.root / "bin").write_bytes(data)
    os.chmod(env.root / "bin", 0o640)
    r = env.ok("read", "bin", str(len(data)))
    header, _, body = r.out.partition(b"\n")
    assert json.loads(header) == {"size": len(data), "mode": 0o640}
    assert body == data


def test_read_limits(env):
    assert env.ok("read", "f", "6").out == b'{"size":6,"mode":420}\nhello\n'
    r = env.fail("TOO_LARGE", "read", "f", "5")
    assert r.out == b""
    (env.root / "empty").write_bytes(b"")
    assert env.ok("read", "empty", "0").out == b'{"size":0,"mode":420}\n'


def test_read_follows_inside_symlink(env):
    assert env.ok("read", "subl/g", "100").out.endswith(b"\ng\n")
    os.symlink("sub/g", env.root / "glink")
    assert env.ok("read", "glink", "100").out.endswith(b"\ng\n")


@pytest.mark.parametrize("path", [*ESCAPES, "outf"])
def test_read_escape(env, path):
    r = env.fail("ESCAPE", "read", path, "1000")
    assert r.out == b""


def test_read_errors(env):
    env.fail("EISDIR", "read", "sub", "100")
    env.fail("EISDIR", "read", ".", "100")
    os.mkfifo(env.root / "fifo")
    env.fail("EINVAL", "read", "fifo", "100")  # must not block on the FIFO
    env.fail("ENOENT", "read", "nope", "100")
    env.fail("ENOTDIR", "read", "f/x", "100")
    env.fail("EINVAL", "read", "f", "-1", rc=2)
    env.fail("EINVAL", "read", "f", rc=2)


def test_read_grows_past_limit(env):
    # A procfs file reports size 0 but yields data: the same situation as a
    # file growing after the size check. Needs a private bind mount.
    (env.root / "pv").write_bytes(b"")
    script = 'mount --bind /proc/version "$1/pv" || exit 99; "$2" --root "$1" read pv 5'
    cp = subprocess.run(
        ["unshare", "-m", "sh", "-c", script, "sh", str(env.root), env.sbx],
        capture_output=True,
        timeout=10,
        check=False,
    )
    if cp.returncode == 99 or b"unshare" in cp.stderr:
        pytest.skip(f"cannot bind-mount here: {cp.stderr!r}")
    r = Result(cp)
    assert r.rc == 1 and r.error == "TOO_LARGE", r
    assert r.out == b'{"size":0,"mode":292}\n'  # header, then nothing past the cap


def test_read_permission_denied(open_env):
    p = open_env.root / "private"
    p.write_text("x")
    os.chmod(p, 0o000)
    open_env.fail("EACCES", "read", "private", "10", **unpriv_kwargs())


# --------------------------------------------------------------------------
# write
# --------------------------------------------------------------------------


def test_write_new_file(env):
    rec = env.ok("write", "new.txt", "640", "100", input=b"data").record
    p = env.root / "new.txt"
    assert p.read_bytes() == b"data"
    assert stat.S_IMODE(p.stat().st_mode) == 0o640
    assert rec["path"] == "new.txt" and rec["type"] == "file" and rec["size"] == 4
    assert rec["mode"] == 0o640
    assert sorted(os.listdir(env.root)) == sorted(
        ["f", "sub", "etc", "up", "outl", "outf", "subl", "new.txt"]
    )


def test_write_mode_strips_special_bits(env):
    assert env.ok("write", "a", "4755", "10", input=b"x").record["mode"] == 0o755
    assert env.ok("write", "b", "7777", "10", input=b"x").record["mode"] == 0o777
    assert env.ok("write", "c", "0", "10", input=b"x").record["mode"] == 0


def test_write_overwrite_and_limits(env):
    env.ok("write", "f", "644", "3", input=b"abc")
    assert (env.root / "f").read_bytes() == b"abc"
    env.ok("write", "e", "644", "0", input=b"")
    assert (env.root / "e").read_bytes() == b""


def test_write_too_large_is_atomic(env):
    before = sorted(os.listdir(env.root))
    env.fail("TOO_LARGE", "write", "f", "644", "1000", input=b"x" * 200_000)
    assert (env.root / "f").read_bytes() == b"hello\n"
    assert sorted(os.listdir(env.root)) == before  # temp file gone


def test_write_idle_bound_ends_a_writer_whose_stdin_never_closes(env):
    """An engine need not pass EOF on when a cancelled upload's connection drops: the writer
    ends itself after --idle-ms without data and leaves no temp file."""
    before = sorted(os.listdir(env.root))
    with subprocess.Popen(
        [env.sbx, "--root", str(env.root), "write", "f", "644", "100", "--idle-ms", "200"],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    ) as proc:
        assert proc.stdin is not None and proc.stderr is not None
        proc.stdin.write(b"half")
        proc.stdin.flush()  # some data, then silence with stdin still open
        try:
            assert proc.wait(timeout=10) == 1
        finally:
            proc.kill()
        assert b'"TIMEOUT"' in proc.stderr.read()
    assert (env.root / "f").read_bytes() == b"hello\n"
    assert sorted(os.listdir(env.root)) == before


def test_write_idle_bound_is_checked(env):
    env.fail("EINVAL", "write", "f", "644", "10", "--idle-ms", "soon", input=b"x", rc=2)
    env.ok("write", "f", "644", "10", "--idle-ms", "5000", input=b"x")
    assert (env.root / "f").read_bytes() == b"x"


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGTERM])
def test_write_ended_by_a_signal_leaves_no_temp_file(env, sig):
    """The server ends a cancelled upload's writer with SIGHUP (the agent) or SIGTERM."""
    before = sorted(os.listdir(env.root))
    with subprocess.Popen(
        [env.sbx, "--root", str(env.root), "write", "f", "644", "100"],
        stdin=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
    ) as proc:
        assert proc.stdin is not None
        proc.stdin.write(b"half")
        proc.stdin.flush()
        deadline = time.monotonic() + 10
        while not any(n.endswith(".tmp") for n in os.listdir(env.root)):
            assert time.monotonic() < deadline, "the writer never made its temp file"
            time.sleep(0.01)
        proc.send_signal(sig)
        assert proc.wait(timeout=10) == 128 + sig  # our handler, not the default death
    assert sorted(os.listdir(env.root)) == before


def test_write_parents(env):
    rec = env.ok("write", "a/b/c.txt", "600", "100", "--parents", input=b"z").record
    assert rec["path"] == "a/b/c.txt"
    assert (env.root / "a/b/c.txt").read_bytes() == b"z"
    assert stat.S_IMODE((env.root / "a/b").stat().st_mode) == 0o755
    # Parents through an inside symlink are fine.
    env.ok("write", "subl/n/x", "644", "100", "--parents", input=b"q")
    assert (env.root / "sub/n/x").read_bytes() == b"q"


def test_write_errors(env):
    env.fail("ENOENT", "write", "nodir/x", "644", "10", input=b"x")
    env.fail("ENOTDIR", "write", "f/x", "644", "10", input=b"x")
    env.fail("ENOTDIR", "write", "f/x/y", "644", "10", "--parents", input=b"x")
    before = sorted(os.listdir(env.root / "sub"))
    env.fail("EISDIR", "write", "sub", "644", "10", input=b"x")
    env.fail("EISDIR", "write", ".", "644", "10", input=b"x")
    assert sorted(os.listdir(env.root / "sub")) == before
    env.fail("EINVAL", "write", "", "644", "10", input=b"x")
    for mode in ["9", "abc", "", "77777", "-1"]:
        env.fail("EINVAL", "write", "x", mode, "10", rc=2, input=b"x")
    env.fail("EINVAL", "write", "x", "644", "10", "--bogus", rc=2)


@pytest.mark.parametrize("path", [*ESCAPES, "outl/new", "etc/new", "up/new"])
@pytest.mark.parametrize("parents", [False, True])
def test_write_escape(env, path, parents):
    args = ["write", path, "644", "100"] + (["--parents"] if parents else [])
    env.fail("ESCAPE", *args, input=b"pwned")
    env.fail("ESCAPE", *(args[:1] + [path + "/deeper"] + args[2:]), input=b"pwned")


def test_write_through_outward_symlink_replaces_link(env):
    # The link is replaced by a regular file; the outside target is untouched
    # (the env fixture asserts the outside tree is unchanged).
    env.ok("write", "outf", "644", "100", input=b"new")
    p = env.root / "outf"
    assert not p.is_symlink() and p.read_bytes() == b"new"


def test_write_enospc(env, tmp_path):
    mnt = tmp_path / "small"
    mnt.mkdir()
    script = (
        'mount -t tmpfs -o size=64k none "$1" || exit 99; '
        '"$2" --root "$1" write big 644 100000000; rc=$?; '
        '"$2" --root "$1" list . 1; exit $rc'
    )
    cp = subprocess.run(
        ["unshare", "-m", "sh", "-c", script, "sh", str(mnt), env.sbx],
        input=b"x" * 1_000_000,
        capture_output=True,
        timeout=10,
        check=False,
    )
    if cp.returncode == 99 or b"unshare" in cp.stderr:
        pytest.skip(f"cannot mount a small tmpfs here: {cp.stderr!r}")
    r = Result(cp)
    assert r.rc == 1 and r.error == "ENOSPC", r
    assert r.out == b""  # no leftover temp file in the listing


def test_write_permission_denied(open_env):
    d = open_env.root / "ro"
    d.mkdir()
    os.chmod(d, 0o555)
    open_env.fail("EACCES", "write", "ro/x", "644", "10", input=b"x", **unpriv_kwargs())
    assert os.listdir(d) == []


# --------------------------------------------------------------------------
# list
# --------------------------------------------------------------------------


@pytest.fixture
def tree(env):
    r = env.root
    (r / "a/b/c").mkdir(parents=True)
    (r / "a/x").write_text("x")
    (r / "a/b/y").write_text("y")
    (r / "a/b/c/z").write_text("z")
    os.symlink("a", r / "link_in")
    return env


def paths(res: Result) -> list[str]:
    return [rec["path"] for rec in res.records]


TOP = ["a", "etc", "f", "link_in", "outf", "outl", "sub", "subl", "up"]


def test_list_depth(tree):
    assert paths(tree.ok("list", ".", "1")) == TOP
    assert paths(tree.ok("list", ".", "0")) == TOP
    two = paths(tree.ok("list", ".", "2"))
    assert two == [
        "a",
        "a/b",
        "a/x",
        "etc",
        "f",
        "link_in",
        "outf",
        "outl",
        "sub",
        "sub/esc",
        "sub/g",
        "subl",
        "up",
    ]
    three = paths(tree.ok("list", ".", "3"))
    assert "a/b/c" in three and "a/b/y" in three and "a/b/c/z" not in three
    assert "a/b/c/z" in paths(tree.ok("list", ".", "99"))


def test_list_never_descends_symlinks(tree):
    recs = tree.ok("list", ".", "10").records
    for rec in recs:
        first = rec["path"].split("/")[0]
        assert first not in {"link_in", "etc", "up", "outl", "subl"} or rec["path"] == first
    types = {rec["path"]: rec["type"] for rec in recs}
    assert types["link_in"] == "symlink" and types["sub/esc"] == "symlink"
    assert next(r for r in recs if r["path"] == "outl")["target"] == "../outside"


def test_list_subdir_and_inside_symlink(tree):
    assert paths(tree.ok("list", "a", "1")) == ["a/b", "a/x"]
    recs = tree.ok("list", "link_in", "2").records
    assert [r["path"] for r in recs] == ["link_in/b", "link_in/b/c", "link_in/b/y", "link_in/x"]
    assert [r["name"] for r in recs] == ["b", "c", "y", "x"]


def test_list_errors(tree):
    tree.fail("ENOTDIR", "list", "f", "1")
    tree.fail("ENOENT", "list", "nope", "1")
    for p in ["outl", "etc", "up", "/", "..", "sub/esc"]:
        tree.fail("ESCAPE", "list", p, "1")
    tree.fail("EINVAL", "list", ".", "x", rc=2)


def test_list_entry_cap(sbx, tmp_path):
    # tmpfs makes creating 100k inodes fast; fall back to tmp_path.
    base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else str(tmp_path)
    d = Path(tempfile.mkdtemp(prefix="sbx-cap-", dir=base))
    try:
        sub = d / "s"
        sub.mkdir()
        for i in range(LIST_MAX - 1):
            os.mknod(sub / f"f{i}")
        e = Env(sbx, d, d)
        r = e.ok("list", ".", "2")
        assert r.out.count(b"\n") == LIST_MAX
        os.mknod(d / "one-more")
        r = e.fail("TOO_LARGE", "list", ".", "2")
        assert r.out.count(b"\n") <= LIST_MAX
    finally:
        shutil.rmtree(d)


# --------------------------------------------------------------------------
# remove
# --------------------------------------------------------------------------


def test_remove_file_and_symlinks(env):
    env.ok("remove", "f")
    assert not (env.root / "f").exists()
    for link in ["outf", "outl", "etc", "up", "subl"]:
        assert env.ok("remove", link).out == b""
        assert not os.path.lexists(env.root / link)
    assert (env.root / "sub/g").exists()  # subl's target survives


def test_remove_dirs(env):
    (env.root / "empty").mkdir()
    env.ok("remove", "empty")
    env.fail("ENOTEMPTY", "remove", "sub")
    assert (env.root / "sub/g").exists()
    (env.root / "sub/deep/er").mkdir(parents=True)
    (env.root / "sub/deep/er/file").write_text("x")
    os.symlink("../../f", env.root / "sub/deep/tof")
    env.ok("remove", "sub", "--recursive")
    assert not (env.root / "sub").exists()
    # Symlinks inside were removed, never followed: f and outside intact.
    assert (env.root / "f").read_bytes() == b"hello\n"


def test_remove_errors(env):
    env.fail("EINVAL", "remove", ".")
    env.fail("EINVAL", "remove", ".", "--recursive")
    env.fail("ENOENT", "remove", "nope")
    env.fail("ENOTDIR", "remove", "f/x")
    for p in ESCAPES:
        env.fail("ESCAPE", "remove", p, "--recursive")
    env.fail("EINVAL", "remove", "f", "--parents", rc=2)


def _deep_tree(top: Path, depth: int) -> None:
    """`top/a/a/.../a/f` with `depth` directories, built by relative steps (no long paths)."""
    top.mkdir()
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth):
            os.mkdir("a", dir_fd=fd)
            nxt = os.open("a", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = nxt
        os.close(os.open("f", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd))
    finally:
        os.close(fd)


@pytest.fixture
def mem_env(sbx, tmp_path):
    """A root on tmpfs when the host has one, like the sandbox's workspace (disk is slow)."""
    base = Path("/dev/shm")
    d = tmp_path
    if os.access(base, os.W_OK):
        d = Path(tempfile.mkdtemp(prefix="sbx-deep-", dir=base))
    (d / "ws").mkdir()
    yield Env(sbx, d / "ws", d)
    if d != tmp_path:
        subprocess.run([sbx, "--root", str(d), "remove", "ws", "--recursive"], check=False)
        shutil.rmtree(d, ignore_errors=True)


def test_remove_recursive_deep_tree_with_bounded_descriptors(mem_env):
    _deep_tree(mem_env.root / "deep", 60_000)
    mem_env.ok("remove", "deep", "--recursive", few_fds=True, timeout=60)
    assert not (mem_env.root / "deep").exists()


def test_list_deep_tree_with_bounded_descriptors(mem_env):
    env = mem_env
    _deep_tree(env.root / "deep", 3_000)
    r = env.ok("list", "deep", "100000", few_fds=True, timeout=60)
    got = paths(r)
    # Listed, in pre-order, down to the directories whose children's paths could reach
    # PATH_MAX (path + "/" + a 255-byte name): "deep" + k * "/a" is descended while
    # 4 + 2k + 256 < 4096, so k runs to 1918.
    assert got == ["deep" + "/a" * k for k in range(1, 1919)]
    env.ok("remove", "deep", "--recursive", few_fds=True, timeout=60)


def test_remove_permission_denied(open_env):
    d = open_env.root / "ro"
    d.mkdir()
    (d / "x").write_text("x")
    os.chmod(d, 0o555)
    open_env.fail("EACCES", "remove", "ro/x", **unpriv_kwargs())
    assert (d / "x").exists()


# --------------------------------------------------------------------------
# mkdir
# --------------------------------------------------------------------------


def test_mkdir(env):
    rec = env.ok("mkdir", "d").record
    assert (rec["path"], rec["type"], rec["mode"]) == ("d", "dir", 0o755)
    env.fail("EEXIST", "mkdir", "d")
    env.fail("EEXIST", "mkdir", "f")
    env.fail("EEXIST", "mkdir", ".")
    assert env.ok("mkdir", ".", "--parents").record["path"] == "."
    assert env.ok("mkdir", "d", "--parents").record["type"] == "dir"
    assert env.ok("mkdir", "p/q/r", "--parents").record["path"] == "p/q/r"
    assert (env.root / "p/q/r").is_dir()
    env.fail("EEXIST", "mkdir", "f", "--parents")
    env.fail("EEXIST", "mkdir", "subl", "--parents")  # a symlink is not a dir
    env.fail("ENOENT", "mkdir", "x/y")
    env.fail("ENOTDIR", "mkdir", "f/y")
    env.fail("ENOTDIR", "mkdir", "f/y/z", "--parents")


@pytest.mark.parametrize("parents", [[], ["--parents"]])
def test_mkdir_escape(env, parents):
    for p in [*ESCAPES, "outl/new", "outl/new/deeper", "etc/x", "up/x"]:
        env.fail("ESCAPE", "mkdir", p, *parents)


# --------------------------------------------------------------------------
# usage
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["bogus"],
        ["stat"],
        ["stat", "a", "b"],
        ["list", ".", "-1"],
        ["run"],
        [
            "run",
            "--",
        ],
        ["run", "sh"],
        ["run", "--timeout-ms", "abc", "--", "true"],
        ["signal", "tok", "SIGFOO"],
        ["signal", "tok", "9"],
        ["kill"],
        ["mkdir", "x", "--recursive"],
    ],
)
def test_usage_errors(env, args):
    env.fail("EINVAL", *args, rc=2)


# --------------------------------------------------------------------------
# run: supervisor
# --------------------------------------------------------------------------


def token() -> str:
    return "t-" + uuid.uuid4().hex


def test_run_exit_codes(env):
    assert env("run", "--", "true").rc == 0
    assert env("run", "--", "sh", "-c", "exit 7").rc == 7
    assert env("run", "--", "sh", "-c", "kill -TERM $$").rc == 128 + signal.SIGTERM
    assert env("run", "--", "sh", "-c", "kill -KILL $$").rc == 128 + signal.SIGKILL


def test_run_stdio_and_cwd(env):
    r = env("run", "--", "sh", "-c", "cat; echo err >&2", input=b"in")
    assert (r.rc, r.out, r.err) == (0, b"in", b"err\n")
    real = os.path.realpath(env.root)
    assert env("run", "--", "pwd").out == f"{real}\n".encode()
    assert env("run", "--cwd", "sub", "--", "pwd").out == f"{real}/sub\n".encode()
    assert env("run", "--cwd", "subl", "--", "pwd").out == f"{real}/sub\n".encode()
    assert env("run", "--cwd", f"{real}/sub", "--", "pwd").out == f"{real}/sub\n".encode()


def test_run_signals_reset(env):
    # The supervisor blocks signals for itself; the command must not inherit that.
    r = env("run", "--", "sh", "-c", "grep -E '^Sig(Blk|Ign)' /proc/self/status")
    assert r.rc == 0
    for line in r.out.decode().splitlines():
        assert int(line.split()[1], 16) == 0, line


def test_run_exec_failures(env):
    r = env("run", "--", "no-such-command-xyz")
    assert (r.rc, r.error) == (127, "ENOENT")
    r = env("run", "--", "/nonexistent/cmd")
    assert (r.rc, r.error) == (127, "ENOENT")
    (env.root / "noexec").write_text("#!/bin/sh\n")
    r = env("run", "--", str(env.root / "noexec"))
    assert (r.rc, r.error) == (126, "EACCES")


@pytest.mark.parametrize("cwd", ["outl", "etc", "up", "..", "/tmp", "sub/esc"])
def test_run_bad_cwd_escape(env, cwd):
    r = env("run", "--cwd", cwd, "--", "sh", "-c", "echo ran")
    assert (r.rc, r.error, r.out) == (126, "ESCAPE", b"")


def test_run_bad_cwd_missing(env):
    r = env("run", "--cwd", "missing", "--", "true")
    assert (r.rc, r.error) == (126, "ENOENT")
    r = env("run", "--cwd", "f", "--", "true")
    assert (r.rc, r.error) == (126, "ENOTDIR")


def _run_and_get_pid(env, script: str, *opts: str) -> tuple[Result, int, float]:
    t0 = time.monotonic()
    r = env("run", *opts, "--", "sh", "-c", script, timeout=10)
    elapsed = time.monotonic() - t0
    pid = int(r.out.split()[0])
    return r, pid, elapsed


def test_run_background_child_killed(env):
    # The backgrounded sleep holds stdout: the run only returns (stream EOF)
    # if the supervisor killed it.
    r, pid, elapsed = _run_and_get_pid(env, "sleep 100 & echo $!")
    assert r.rc == 0 and elapsed < 3
    assert not pid_alive(pid)


def test_run_setsid_double_fork_killed(env):
    script = "p=$( (setsid sh -c 'echo $$; exec sleep 100 >/dev/null' &) ); echo \"$p\""
    r, pid, _ = _run_and_get_pid(env, script)
    assert r.rc == 0
    assert not pid_alive(pid)


def test_run_nohup_killed(env):
    r, pid, _ = _run_and_get_pid(env, "nohup sleep 100 >/dev/null 2>&1 & echo $!")
    assert r.rc == 0
    assert not pid_alive(pid)


def test_run_timeout(env):
    script = "setsid sh -c 'echo $$; exec sleep 100' & sleep 100"
    r, pid, elapsed = _run_and_get_pid(env, script, "--timeout-ms", "300")
    assert r.rc == 137
    assert 0.3 <= elapsed < 1.3
    assert not pid_alive(pid)


def test_run_fork_storm_fully_killed(env):
    marker = f"977.{os.getpid() % 1000}"
    script = f"while :; do (setsid sleep {marker} &); sleep {marker} & done"
    t0 = time.monotonic()
    r = env("run", "--timeout-ms", "300", "--", "sh", "-c", script, timeout=15)
    assert r.rc == 137
    assert time.monotonic() - t0 < 3
    survivors = []
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                cmdline = Path(f"/proc/{p}/cmdline").read_bytes()
            except OSError:
                continue
            if marker.encode() in cmdline and pid_alive(int(p)):
                survivors.append(int(p))
    for p in survivors:
        os.kill(p, signal.SIGKILL)
    assert survivors == []


def _wait_dead(pid: int, seconds: float = 5) -> bool:
    deadline = time.monotonic() + seconds
    while pid_alive(pid):
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            return False
        time.sleep(0.05)
    return True


def _fake_ls(env) -> None:
    fake = env.root / "ls"
    fake.write_text("#!/bin/sh\necho PLANTED\n")
    fake.chmod(0o755)


def test_run_looks_commands_up_on_the_fixed_path_not_the_callers(env):
    # The server's allowlist names `ls`: the caller's PATH must not swap in its own file.
    _fake_ls(env)
    r = env("run", "--", "ls", env={"PATH": str(env.root)})
    assert r.rc == 0 and b"PLANTED" not in r.out, r
    assert b"ls" in r.out  # the real ls listed the root, fake file included
    r = env("run", "--", "sh", "-c", 'echo "$PATH"', env={"PATH": str(env.root)})
    assert r.out == f"{env.root}\n".encode()  # the variable itself still reaches the command
    # An absolute argv[0] is taken as given (the server allows only system bin dirs).
    assert env("run", "--", str(env.root / "ls")).out == b"PLANTED\n"


def test_run_drops_loader_variables(env):
    names = ["LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT", "GCONV_PATH", "LOCPATH", "RES_OPTIONS"]
    script = "; ".join(f'echo "{n}=${{{n}}}"' for n in names) + '; echo "KEEP=$KEEP"'
    given = {n: str(env.root / "evil") for n in names} | {"PATH": os.environ["PATH"], "KEEP": "1"}
    r = env("run", "--", "sh", "-c", script, env=given)
    assert r.rc == 0, r
    assert r.out.decode().splitlines() == [f"{n}=" for n in names] + ["KEEP=1"]


def test_run_clean_env_passes_no_caller_variable(env):
    r = env(
        "run",
        "--clean-env",
        "--",
        "sh",
        "-c",
        "env | sort",
        env={"PATH": str(env.root), "TAR_OPTIONS": "--to-command=x", "FOO": "1"},
    )
    lines = sorted(r.out.decode().splitlines())
    lines = [x for x in lines if not x.startswith(("PWD=", "SHLVL=", "_=", "OLDPWD="))]
    assert lines == ["HOME=" + str(env.root), "LANG=C.UTF-8", "PATH=/usr/local/bin:/usr/bin:/bin"]


def test_run_command_killing_its_parent_leaves_nothing(env):
    # The command's parent is the monitor: killing it ends the run and the whole tree.
    t0 = time.monotonic()
    script = "sleep 4242 >/dev/null 2>&1 & echo $!; kill -KILL $PPID; sleep 100"
    r = env("run", "--", "sh", "-c", script)
    assert _wait_dead(int(r.out.split()[0]))
    assert r.rc == 137 and time.monotonic() - t0 < 5, r


# The topmost `sbx` above the command: the supervisor, whatever sits in between.
KILL_SUPERVISOR = (
    "p=$PPID; while :; do gp=$(cut -d' ' -f4 /proc/$p/stat); "
    '[ "$(cat /proc/$gp/comm 2>/dev/null)" = sbx ] || break; p=$gp; done; kill -KILL $p'
)


def test_run_command_killing_the_supervisor_leaves_nothing(env):
    # The monitor outlives the supervisor just long enough to kill the tree.
    script = f"sleep 4243 >/dev/null 2>&1 & echo $!; {KILL_SUPERVISOR}; sleep 100"
    with subprocess.Popen(
        [env.sbx, "--root", str(env.root), "run", "--", "sh", "-c", script],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    ) as p:
        try:
            pid = int(p.stdout.readline())
            assert _wait_dead(pid)
            assert p.wait(timeout=5) == -signal.SIGKILL
        finally:
            p.kill()


def test_run_command_signalling_its_parent_ends_the_tree(env):
    for sig in ("TERM", "HUP", "USR1", "INT"):
        script = f"sleep 4244 >/dev/null 2>&1 & echo $!; kill -{sig} $PPID; sleep 100"
        r = env("run", "--", "sh", "-c", script)
        assert _wait_dead(int(r.out.split()[0]))
        assert r.rc == 137, (sig, r)


def _start(env, tok: str, script: str) -> subprocess.Popen:
    return subprocess.Popen(
        [
            env.sbx,
            "--root",
            str(env.root),
            "run",
            "--id",
            tok,
            "--timeout-ms",
            "20000",
            "--",
            "sh",
            "-c",
            script,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )


def test_kill_by_token(env):
    tok = token()
    script = "setsid sh -c 'echo $$; exec sleep 100' & sleep 100 & wait"
    with _start(env, tok, script) as p:
        try:
            pid = int(p.stdout.readline())
            assert pid_alive(pid)
            env.fail("NOT_FOUND", "kill", tok[:-1])  # prefix is not a match
            assert p.poll() is None
            t0 = time.monotonic()
            assert env.ok("kill", tok).out == b""
            assert p.wait(timeout=5) == 137
            assert p.stdout.read() == b""  # stream closes: nothing holds it
            assert time.monotonic() - t0 < 1
            assert not pid_alive(pid)
        finally:
            p.kill()
    env.fail("NOT_FOUND", "kill", tok)


def test_signal_by_token(env):
    tok = token()
    script = "trap 'echo got; exit 3' TERM; echo ready; sleep 100 & wait"
    with _start(env, tok, script) as p:
        try:
            assert p.stdout.readline() == b"ready\n"
            env.ok("signal", tok, "SIGTERM")
            assert p.wait(timeout=5) == 3
            assert p.stdout.read() == b"got\n"
        finally:
            p.kill()


def test_signal_stop_cont_and_kill(env):
    tok = token()
    with _start(env, tok, "echo ready; while :; do sleep 0.05; done") as p:
        try:
            assert p.stdout.readline() == b"ready\n"
            env.ok("signal", tok, "SIGSTOP")
            env.ok("signal", tok, "SIGCONT")
            assert p.poll() is None
            env.ok("signal", tok, "SIGKILL")
            assert p.wait(timeout=5) == 128 + signal.SIGKILL
        finally:
            p.kill()


def _run_on_pty(env, *args: str, timeout: float = 10) -> tuple[int, bytes]:
    """Run sbx as the session leader of a fresh pty (what `docker exec -t` does)."""
    import pty as ptymod

    master, slave = ptymod.openpty()
    try:
        p = subprocess.Popen(
            [env.sbx, "--root", str(env.root), *args],
            preexec_fn=lambda: os.login_tty(slave),
            close_fds=True,
        )
        os.close(slave)
        out = b""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                chunk = os.read(master, 4096)
            except OSError:  # EIO: every slave end is closed
                break
            if not chunk:
                break
            out += chunk
        return p.wait(timeout=timeout), out
    finally:
        os.close(master)


def test_run_tty_foreground_group_and_size(env):
    script = (
        "stty size; set -- $(cut -d' ' -f5,6,8 /proc/$$/stat); "
        '[ "$1" = "$$" ] && [ "$2" != "$$" ] && [ "$3" = "$$" ] && echo foreground-ok'
    )
    rc, out = _run_on_pty(env, "run", "--tty", "33x101", "--", "sh", "-c", script)
    assert rc == 0, out
    # Its own group in the terminal's session (not a new session), in the foreground.
    assert b"33 101" in out and b"foreground-ok" in out, out


def test_run_tty_ctrl_c_reaches_the_command(env):
    script = "trap 'echo got-int; exit 9' INT; kill -INT 0; sleep 5"
    rc, out = _run_on_pty(env, "run", "--tty", "24x80", "--", "sh", "-c", script)
    assert rc == 9 and b"got-int" in out, out


@pytest.mark.parametrize("size", ["0x80", "24x0", "24", "x", "24x80x", "-1x5", "99999x5"])
def test_run_tty_bad_size(env, size):
    env.fail("EINVAL", "run", "--tty", size, "--", "true", rc=2)


def test_signal_and_kill_unknown_token(env):
    env.fail("NOT_FOUND", "kill", token())
    env.fail("NOT_FOUND", "signal", token(), "SIGTERM")


def test_supervisor_sigterm_kills_tree(env):
    tok = token()
    script = "setsid sh -c 'echo $$; exec sleep 100' & sleep 100"
    with _start(env, tok, script) as p:
        try:
            pid = int(p.stdout.readline())
            p.send_signal(signal.SIGTERM)
            assert p.wait(timeout=5) == 137
            assert not pid_alive(pid)
        finally:
            p.kill()


# --------------------------------------------------------------------------
# merge (the swap half of an archive import)
# --------------------------------------------------------------------------


def _stage(env, name: str = ".stage") -> Path:
    stage = env.root / name
    (stage / "sub").mkdir(parents=True)
    (stage / "sub" / "new").write_text("new\n")
    (stage / "f").write_text("replaced\n")
    (stage / "fresh").mkdir()
    (stage / "fresh" / "x").write_text("x\n")
    return stage


def test_merge_moves_entries_into_place(env):
    stage = _stage(env)
    env.ok("merge", ".stage", ".")
    assert not stage.exists()
    assert (env.root / "f").read_text() == "replaced\n"
    assert (env.root / "sub" / "g").read_text() == "g\n"  # merged, not replaced
    assert (env.root / "sub" / "new").read_text() == "new\n"
    assert (env.root / "fresh" / "x").read_text() == "x\n"


def test_merge_replace_empties_the_destination_first(env):
    _stage(env)
    env.ok("merge", ".stage", ".", "--replace")
    assert sorted(p.name for p in env.root.iterdir()) == ["f", "fresh", "sub"]
    assert not (env.root / "sub" / "g").exists()


def test_merge_replaces_symlinks_never_follows_them(env):
    stage = env.root / ".stage"
    (stage / "outl").mkdir(parents=True)
    (stage / "outl" / "planted").write_text("planted\n")
    (stage / "outf").write_text("file\n")
    env.ok("merge", ".stage", ".")
    assert (env.root / "outl").is_dir() and not (env.root / "outl").is_symlink()
    assert (env.root / "outl" / "planted").exists()
    assert (env.root / "outf").read_text() == "file\n"
    assert not (env.outside / "planted").exists()  # the fixture also checks outside


def test_merge_into_a_subfolder_and_errors(env):
    stage = env.root / ".stage"
    stage.mkdir()
    (stage / "y").write_text("y\n")
    env.ok("merge", ".stage", "sub")
    assert (env.root / "sub" / "y").read_text() == "y\n"
    stage.mkdir()
    for p in ESCAPES:
        env.fail("ESCAPE", "merge", ".stage", p)
    env.fail("ESCAPE", "merge", ".stage", "outl")
    env.fail("EINVAL", "merge", ".", "sub")
    env.fail("ENOENT", "merge", ".nope", "sub")
    env.fail("ESCAPE", "merge", "subl", "sub")  # a stage reached through a symlink
    assert stage.exists()


def test_merge_deep_trees_with_bounded_descriptors(mem_env):
    # Both trees 3,000 deep: the walk goes down both in step, one directory of each open.
    env = mem_env
    _deep_tree(env.root / ".stage", 3_000)
    _deep_tree(env.root / "dest", 3_000)
    fd = os.open(env.root / ".stage", os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(3_000):
        nxt = os.open("a", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = nxt
    with os.fdopen(os.open("new", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd), "w") as fh:
        fh.write("new\n")
    os.close(fd)
    env.ok("merge", ".stage", "dest", few_fds=True, timeout=60)
    assert not (env.root / ".stage").exists()
    fd = os.open(env.root / "dest", os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(3_000):
        nxt = os.open("a", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = nxt
    try:
        assert sorted(os.listdir(fd)) == ["f", "new"]
    finally:
        os.close(fd)
    env.ok("remove", "dest", "--recursive", few_fds=True, timeout=60)


def test_kill_by_token_reaches_a_stopped_supervisor(env):
    # The command stops its supervisor; `sbx kill` must still end the run at once.
    tok = token()
    script = f"echo $$; {KILL_SUPERVISOR.replace('kill -KILL', 'kill -STOP')}; sleep 100"
    with _start(env, tok, script) as p:
        try:
            pid = int(p.stdout.readline())
            time.sleep(0.3)
            env.ok("kill", tok)
            assert p.wait(timeout=5) == 137
            assert _wait_dead(pid)
        finally:
            p.kill()


# --------------------------------------------------------------------------
# all or nothing: a merge or a remove that fails midway
# --------------------------------------------------------------------------


def _entries(p: Path) -> list:
    """The tree as the API shows it (name, mode, content); a rename out and back changes
    the folders' mtimes, not their entries."""
    return [item[:3] for item in snapshot(p)]


def _unmovable_dir(path: Path) -> None:
    """A directory the unprivileged user cannot move to another folder (root's, 755): the
    step that fails midway, after other entries were already handled."""
    path.mkdir()
    (path / "inside").write_text("root's\n")
    os.chmod(path, 0o755)


def _open_stage(root: Path, names: dict[str, str]) -> Path:
    stage = root / ".stage"
    stage.mkdir()
    os.chmod(stage, 0o777)
    for name, text in names.items():
        (stage / name).write_text(text)
    return stage


def test_a_merge_refused_midway_puts_everything_back(open_env):
    root = open_env.root
    (root / "a").write_text("old a\n")
    os.chmod(root / "a", 0o666)
    _unmovable_dir(root / "z")
    stage = _open_stage(root, {"a": "new a\n", "z": "new z\n"})
    before = _entries(root)
    open_env.fail("EACCES", "merge", ".stage", ".", **unpriv_kwargs())
    assert _entries(root) == before  # "a" back in place, no trash left beside the stage
    assert sorted(p.name for p in stage.iterdir()) == ["a", "z"]


def test_a_replace_refused_midway_puts_everything_back(open_env):
    root = open_env.root
    dest = root / "dest"
    dest.mkdir(mode=0o777)
    os.chmod(dest, 0o777)
    for name in ("a", "b"):
        (dest / name).write_text(f"old {name}\n")
    _unmovable_dir(dest / "z")
    _open_stage(root, {"n": "new\n"})
    before = _entries(root)
    open_env.fail("EACCES", "merge", ".stage", "dest", "--replace", **unpriv_kwargs())
    assert _entries(root) == before


def test_a_replace_takes_back_a_readonly_folders_mode_on_undo(open_env):
    root = open_env.root
    dest = root / "dest"
    dest.mkdir(mode=0o777)
    os.chmod(dest, 0o777)
    ro = dest / "ro"
    ro.mkdir()
    (ro / "x").write_text("x\n")
    os.chown(ro, 65534, 65534)
    os.chmod(ro, 0o555)  # given u+w for its move, and 555 back when the merge is undone
    _unmovable_dir(dest / "z")
    _open_stage(root, {"n": "new\n"})
    before = _entries(root)
    open_env.fail("EACCES", "merge", ".stage", "dest", "--replace", **unpriv_kwargs())
    assert _entries(root) == before


def test_a_replace_moves_readonly_folders_of_the_user(open_env):
    root = open_env.root
    ro = root / "ro"
    ro.mkdir()
    (ro / "x").write_text("x\n")
    os.chown(ro, 65534, 65534)
    os.chmod(ro, 0o555)
    _open_stage(root, {"n": "new\n"})
    open_env.ok("merge", ".stage", ".", "--replace", **unpriv_kwargs())
    assert sorted(p.name for p in root.iterdir()) == ["n"]  # no stage, no trash left


def test_a_remove_that_fails_midway_leaves_no_half_tree(open_env):
    # Deleting "t" stops at "t/z" (root's): the tree was renamed aside first, so "t" is gone
    # whole, and what could not be deleted waits under the staging prefix for the start-up tidy.
    root = open_env.root
    t = root / "t"
    t.mkdir()
    (t / "a").write_text("a\n")
    os.chown(t / "a", 65534, 65534)
    os.chown(t, 65534, 65534)
    _unmovable_dir(t / "z")
    open_env.ok("remove", "t", "--recursive", **unpriv_kwargs())
    names = [p.name for p in root.iterdir()]
    assert "t" not in names
    assert len(names) == 1 and names[0].startswith(".sbx-import-rm-"), names


def test_a_refused_remove_changes_nothing(open_env):
    root = open_env.root
    parent = root / "p"
    parent.mkdir()
    t = parent / "t"
    t.mkdir()
    (t / "a").write_text("a\n")
    os.chown(t, 65534, 65534)
    os.chown(t / "a", 65534, 65534)
    os.chmod(parent, 0o755)  # root's: the user may not take "t" out of it
    before = _entries(root)
    open_env.fail("EACCES", "remove", "p/t", "--recursive", **unpriv_kwargs())
    assert _entries(root) == before


def test_a_refused_write_takes_back_the_folders_it_made(env):
    # Over its size limit, and ended by a signal mid-stream: "new/deeper" goes with the file.
    before = _entries(env.root)
    env.fail("TOO_LARGE", "write", "new/deeper/f", "644", "3", "--parents", input=b"four")
    assert _entries(env.root) == before
    proc = subprocess.Popen(
        [env.sbx, "--root", str(env.root), "write", "sub/new/deeper/f", "644", "100", "--parents"],
        stdin=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdin is not None
    proc.stdin.write(b"part")
    proc.stdin.flush()
    for _ in range(200):
        if (env.root / "sub" / "new" / "deeper").exists():
            break
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    proc.wait(10)
    proc.stdin.close()
    assert proc.stderr is not None
    proc.stderr.close()
    assert _entries(env.root) == before
    env.ok("write", "new/deeper/f", "644", "3", "--parents", input=b"ok")  # a write keeps them
    assert (env.root / "new" / "deeper" / "f").read_bytes() == b"ok"


def test_a_refused_mkdir_takes_back_the_parents_it_made(env):
    before = _entries(env.root)
    env.fail("EINVAL", "mkdir", "new/deeper/" + "n" * 256, "--parents")  # ENAMETOOLONG last
    assert _entries(env.root) == before
    env.ok("mkdir", "new/deeper/d", "--parents")
    assert (env.root / "new" / "deeper" / "d").is_dir()
