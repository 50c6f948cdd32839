"""Unit and property tests for sandboxd.validation: every accept and every refuse in the spec."""

from __future__ import annotations

import posixpath
import unicodedata
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sandboxd.errors import InvalidArgument, PermissionDenied, SandboxError
from sandboxd.validation import (
    ALLOWED_BIN_DIRS,
    ENV_KEY_RE,
    LOADER_ENV_KEYS,
    MAX_ARG_BYTES,
    MAX_ARGS,
    MAX_ARGV_TOTAL_BYTES,
    MAX_DURATION_S,
    MAX_ENV_ENTRIES,
    MAX_ENV_KEY_BYTES,
    MAX_ENV_VALUE_BYTES,
    MAX_LABELS,
    MAX_PATH_BYTES,
    MAX_SPAN_S,
    RESERVED_ENV_KEYS,
    SESSION_ID_RE,
    WORKSPACE,
    check_command_allowed,
    command_name,
    duration_seconds,
    parse_user,
    positive_duration,
    validate_argv,
    validate_cwd,
    validate_env,
    validate_file_mode,
    validate_labels,
    validate_process_id,
    validate_session_id,
    workspace_abspath,
    workspace_relpath,
)

# Deterministic (derandomize) so CI never flakes; no example database written to the tree.
PROPERTY = settings(max_examples=300, deadline=None, database=None, derandomize=True)


def _expect(
    exc: type[SandboxError], reason: str, fn: Callable[..., object], *args: object
) -> SandboxError:
    """Both the class (the gRPC code) and the reason (ErrorInfo) are part of the contract."""
    with pytest.raises(exc) as info:
        fn(*args)
    assert info.value.reason == reason, info.value.message
    assert info.value.message
    return info.value


# --------------------------------------------------------------------------------------------
# Constants
# --------------------------------------------------------------------------------------------


def test_constants_match_the_spec() -> None:
    assert WORKSPACE == "/workspace"
    assert MAX_PATH_BYTES == 4096
    assert ALLOWED_BIN_DIRS == ("/bin", "/usr/bin", "/usr/local/bin")
    assert (MAX_ARGS, MAX_ARG_BYTES, MAX_ARGV_TOTAL_BYTES) == (1024, 65536, 262144)
    assert (MAX_ENV_ENTRIES, MAX_ENV_KEY_BYTES, MAX_ENV_VALUE_BYTES) == (256, 256, 32768)
    assert MAX_LABELS == 64
    assert RESERVED_ENV_KEYS == frozenset(
        {
            "HTTP_PROXY",
            "HTTPS_PROXY",
            "http_proxy",
            "https_proxy",
            "NO_PROXY",
            "no_proxy",
            "ALL_PROXY",
            "all_proxy",
        }
    )


# --------------------------------------------------------------------------------------------
# Paths
# --------------------------------------------------------------------------------------------

PATH_ACCEPT = [
    ("a", "a"),
    ("a/b", "a/b"),
    ("./a//b/", "a/b"),
    ("a/./b", "a/b"),
    ("/workspace/a/b", "a/b"),
    ("/workspace//a/./b/", "a/b"),
    ("/workspace", "."),
    ("/workspace/", "."),
    ("/workspace/.", "."),
    (".", "."),
    ("./", "."),
    ("./.", "."),
    ("workspace", "workspace"),  # relative: /workspace/workspace
    ("...", "..."),
    ("..a/b..", "..a/b.."),
    (".hidden", ".hidden"),
    ("a b/ c", "a b/ c"),
    ("ünïcode/файл", "ünïcode/файл"),
    ("x" * 255, "x" * 255),
    ("é" * 127, "é" * 127),  # 254 bytes
]


@pytest.mark.parametrize(("path", "rel"), PATH_ACCEPT)
def test_workspace_relpath_accepts(path: str, rel: str) -> None:
    assert workspace_relpath(path) == rel


@pytest.mark.parametrize(("path", "rel"), PATH_ACCEPT)
def test_workspace_abspath(path: str, rel: str) -> None:
    expected = WORKSPACE if rel == "." else f"{WORKSPACE}/{rel}"
    assert workspace_abspath(path) == expected


PATH_REJECT = [
    ("", "PATH_INVALID"),
    ("a\x00b", "PATH_INVALID"),
    ("\x00", "PATH_INVALID"),
    ("/workspace/a\x00", "PATH_INVALID"),
    ("a/" * 2048 + "b", "PATH_INVALID"),  # 4097 bytes
    ("é" * 2049, "PATH_INVALID"),  # 4098 bytes, 2049 characters
    ("x" * 256, "PATH_INVALID"),
    ("a/" + "é" * 128, "PATH_INVALID"),  # component of 256 bytes
    ("/workspace/" + "x" * 256, "PATH_INVALID"),
    ("a\udc80", "PATH_INVALID"),  # lone surrogate: not encodable
    ("..", "PATH_OUTSIDE_WORKSPACE"),
    ("../etc/passwd", "PATH_OUTSIDE_WORKSPACE"),
    ("a/../b", "PATH_OUTSIDE_WORKSPACE"),
    ("a/b/../../..", "PATH_OUTSIDE_WORKSPACE"),
    ("a/..", "PATH_OUTSIDE_WORKSPACE"),
    ("./..", "PATH_OUTSIDE_WORKSPACE"),
    ("/workspace/..", "PATH_OUTSIDE_WORKSPACE"),
    ("/workspace/a/../b", "PATH_OUTSIDE_WORKSPACE"),
    ("/workspace/../workspace/a", "PATH_OUTSIDE_WORKSPACE"),
    ("/etc/passwd", "PATH_OUTSIDE_WORKSPACE"),
    ("/workspacex", "PATH_OUTSIDE_WORKSPACE"),
    ("/workspacex/a", "PATH_OUTSIDE_WORKSPACE"),
    ("/works", "PATH_OUTSIDE_WORKSPACE"),
    ("/", "PATH_OUTSIDE_WORKSPACE"),
    ("//", "PATH_OUTSIDE_WORKSPACE"),
    ("/.", "PATH_OUTSIDE_WORKSPACE"),
    ("/tmp/workspace", "PATH_OUTSIDE_WORKSPACE"),
    ("/WORKSPACE/a", "PATH_OUTSIDE_WORKSPACE"),
]


@pytest.mark.parametrize(("path", "reason"), PATH_REJECT)
def test_workspace_relpath_rejects(path: str, reason: str) -> None:
    err = _expect(InvalidArgument, reason, workspace_relpath, path)
    assert "path" in err.metadata
    assert len(err.metadata["path"]) < 200  # truncated, never the whole 4 KiB


@pytest.mark.parametrize(("path", "reason"), PATH_REJECT)
def test_workspace_abspath_rejects(path: str, reason: str) -> None:
    _expect(InvalidArgument, reason, workspace_abspath, path)


def test_path_boundary_is_exactly_4096_bytes() -> None:
    parts = ["x" * 255] * 16  # 16 * 256 - 1 = 4095 bytes
    path = "/".join(parts) + "/"  # 4096 bytes
    assert len(path.encode()) == MAX_PATH_BYTES
    assert workspace_relpath(path) == "/".join(parts)
    _expect(InvalidArgument, "PATH_INVALID", workspace_relpath, path + "/")


def test_outside_message_is_readable() -> None:
    err = _expect(InvalidArgument, "PATH_OUTSIDE_WORKSPACE", workspace_relpath, "/etc/passwd")
    assert err.message == "path '/etc/passwd' is outside /workspace"
    assert err.metadata == {"path": "/etc/passwd"}


@pytest.mark.parametrize("path", [".", "./", "/workspace", "/workspace/", "/workspace/./"])
def test_root_refused_when_not_allowed(path: str) -> None:
    err = _expect(
        InvalidArgument, "PATH_INVALID", lambda p: workspace_relpath(p, allow_root=False), path
    )
    assert err.message.startswith("the workspace root itself cannot be")


def test_non_root_fine_when_root_not_allowed() -> None:
    assert workspace_relpath("/workspace/a", allow_root=False) == "a"


CWD_CASES = [
    ("", "/workspace"),
    (".", "/workspace"),
    ("/workspace", "/workspace"),
    ("src", "/workspace/src"),
    ("./src//lib/", "/workspace/src/lib"),
    ("/workspace/src", "/workspace/src"),
]


@pytest.mark.parametrize(("cwd", "expected"), CWD_CASES)
def test_validate_cwd_accepts(cwd: str, expected: str) -> None:
    assert validate_cwd(cwd) == expected


@pytest.mark.parametrize(
    ("cwd", "reason"),
    [
        ("/", "PATH_OUTSIDE_WORKSPACE"),
        ("/tmp", "PATH_OUTSIDE_WORKSPACE"),
        ("..", "PATH_OUTSIDE_WORKSPACE"),
        ("/workspace/../etc", "PATH_OUTSIDE_WORKSPACE"),
        ("/workspacex", "PATH_OUTSIDE_WORKSPACE"),
        ("a\x00", "PATH_INVALID"),
        ("a" * 4097, "PATH_INVALID"),
    ],
)
def test_validate_cwd_rejects(cwd: str, reason: str) -> None:
    _expect(InvalidArgument, reason, validate_cwd, cwd)


_PATH_PIECES = st.sampled_from(
    ["", ".", "..", "...", "workspace", "workspacex", "a", "b", "etc", " ", "\x00", "é", "x" * 255]
)
_STRUCTURED_PATHS = st.builds(
    lambda lead, parts: lead + "/".join(parts),
    st.sampled_from(["", "/", "//", "./", "/workspace/", "/workspace"]),
    st.lists(_PATH_PIECES, max_size=8),
)


@PROPERTY
@given(st.one_of(st.text(), _STRUCTURED_PATHS))
def test_property_relpath_stays_inside(path: str) -> None:
    try:
        rel = workspace_relpath(path)
    except InvalidArgument:
        return
    assert not rel.startswith("/")
    if rel != ".":
        parts = rel.split("/")
        assert ".." not in parts
        assert "." not in parts
        assert "" not in parts
    joined = posixpath.normpath(posixpath.join("/workspace", rel))
    assert joined.startswith("/workspace")
    assert joined == WORKSPACE or joined.startswith(WORKSPACE + "/")
    # Normalisation is idempotent and agrees with the absolute form.
    assert workspace_relpath(rel) == rel
    assert workspace_relpath(workspace_abspath(path)) == rel


# --------------------------------------------------------------------------------------------
# argv
# --------------------------------------------------------------------------------------------

ARGV_ACCEPT = [
    ["ls"],
    ["ls", "-la", "/"],
    ["/bin/ls"],
    ["/usr/bin/env", "FOO=1"],
    ["/usr/local/bin/python3", "-c", "print(1)"],
    ["python3.11"],
    ["x", ""],  # empty later arguments are legitimate
    ["echo", "..", "-n", "../x", "a\nb"],  # only argv[0] has path rules
    ["git-lfs"],
    ["a" * 100],
    ["echo", "x" * MAX_ARG_BYTES],
    ["echo"] * MAX_ARGS,
]


@pytest.mark.parametrize("argv", ARGV_ACCEPT, ids=lambda a: repr(a)[:40])
def test_validate_argv_accepts(argv: list[str]) -> None:
    result = validate_argv(argv)
    assert result == argv
    assert result is not argv


def test_validate_argv_returns_list_from_tuple() -> None:
    assert validate_argv(("ls", "-l")) == ["ls", "-l"]


def test_argv_total_boundary() -> None:
    full = ["echo"] + ["x" * 65536] * 3 + ["x" * (MAX_ARGV_TOTAL_BYTES - 3 * 65536 - 4)]
    assert validate_argv(full) == full
    _expect(InvalidArgument, "INVALID_ARGV", validate_argv, [*full, "y"])


ARGV_REJECT = [
    [],
    [""],
    ["", "x"],
    ["ls\x00"],
    ["ls", "a\x00b"],
    ["ls"] * (MAX_ARGS + 1),
    ["echo", "x" * (MAX_ARG_BYTES + 1)],
    ["echo", "é" * (MAX_ARG_BYTES // 2 + 1)],
    ["echo"] + ["x" * 65536] * 4,
    ["ls", "\udc80"],
    ["-rf"],
    ["-"],
    ["--help"],
    [".."],
    ["."],
    ["../bin/ls"],
    ["/usr/bin/../bin/ls"],
    ["/bin/.."],
    ["/bin/./ls"],
    ["/tmp/x"],
    ["./x"],
    ["bin/ls"],
    ["/bin/sub/x"],
    ["/bin/"],
    ["//bin/ls"],
    ["/bin//ls"],
    ["/workspace/ls"],
    ["/usr/local/bin/"],
    ["/sbin/ip"],
    ["/usr/sbin/ip"],
    ["/BIN/ls"],
    [" "],
    ["\t"],
    ["   \n "],
    ["l\ns"],
    ["ls\r"],
    ["ls\x1b[31m"],
    ["ls\x7f"],
    ["ls\u0085"],  # C1 control
    ["l\u202es"],  # bidi override
    ["l\u200bs"],  # zero-width space
    ["ls\u2028"],  # line separator
]


@pytest.mark.parametrize("argv", ARGV_REJECT, ids=lambda a: repr(a)[:40])
def test_validate_argv_rejects(argv: list[str]) -> None:
    _expect(InvalidArgument, "INVALID_ARGV", validate_argv, argv)


@pytest.mark.parametrize("argv", ["ls", "ls -l", b"ls"])
def test_validate_argv_rejects_a_bare_string(argv: object) -> None:
    _expect(InvalidArgument, "INVALID_ARGV", validate_argv, argv)


def test_validate_argv_rejects_non_string_argument() -> None:
    _expect(InvalidArgument, "INVALID_ARGV", validate_argv, ["ls", 3])


def _argv0_within_rules(argv0: str) -> bool:
    """The spec's argv[0] rules, written independently of the implementation."""
    if argv0 == "" or argv0.strip() == "" or argv0.startswith("-") or "\x00" in argv0:
        return False
    if any(unicodedata.category(ch) == "Cc" for ch in argv0):
        return False
    if ".." in argv0.split("/"):
        return False
    if "/" in argv0:
        directory, base = posixpath.split(argv0)
        return directory in ALLOWED_BIN_DIRS and base not in ("", ".", "..")
    return True


_ARGV0_PIECES = st.sampled_from(
    ["/", "bin", "usr", "local", "sbin", ".", "..", "-", "ls", " ", "\t", "\x00", "\n", "é"]
)
_STRUCTURED_ARGV0 = st.lists(_ARGV0_PIECES, max_size=8).map("".join)


@PROPERTY
@given(
    st.lists(st.one_of(st.text(), _STRUCTURED_ARGV0), max_size=4),
)
def test_property_argv0_within_rules(argv: list[str]) -> None:
    try:
        result = validate_argv(argv)
    except InvalidArgument as err:
        assert err.reason == "INVALID_ARGV"
        return
    assert result == argv
    assert _argv0_within_rules(result[0])
    name = command_name(result[0])
    assert name and "/" not in name and name not in (".", "..")


# --------------------------------------------------------------------------------------------
# Command names and the shell policy
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv0", "name"),
    [
        ("/usr/bin/ls", "ls"),
        ("ls", "ls"),
        ("/bin/ls", "ls"),
        ("/usr/local/bin/python3", "python3"),
        ("python3.11", "python3.11"),
    ],
)
def test_command_name(argv0: str, name: str) -> None:
    assert command_name(argv0) == name


@pytest.mark.parametrize(
    ("argv0", "allow", "allow_all"),
    [
        ("ls", {"ls"}, False),
        ("/bin/ls", {"ls"}, False),
        ("/usr/local/bin/python3", ["python3", "ls"], False),
        ("anything", set(), True),
        ("anything", {"ls"}, True),
        ("/usr/bin/cat", frozenset({"cat"}), False),
    ],
)
def test_check_command_allowed_accepts(argv0: str, allow: set[str], allow_all: bool) -> None:
    check_command_allowed(argv0, allow, allow_all)


@pytest.mark.parametrize(
    ("argv0", "allow"),
    [
        ("ls", set()),
        ("rm", {"ls"}),
        ("/bin/rm", {"ls", "cat"}),
        ("LS", {"ls"}),
        ("/bin/ls", {"/bin/ls"}),  # the allowlist holds names, not paths
        ("ls", {"ls "}),
    ],
)
def test_check_command_allowed_rejects(argv0: str, allow: set[str]) -> None:
    err = _expect(
        PermissionDenied, "COMMAND_NOT_ALLOWED", check_command_allowed, argv0, allow, False
    )
    assert command_name(argv0) in err.message
    assert "ShellPolicy.allow" in err.message
    assert "allow_all" in err.message


def test_empty_allowlist_message_says_everything_is_denied() -> None:
    err = _expect(PermissionDenied, "COMMAND_NOT_ALLOWED", check_command_allowed, "ls", [], False)
    assert "every command is denied until the session declares an allowlist" in err.message
    assert err.metadata == {"command": "ls"}


def test_non_empty_allowlist_message_says_how_to_allow() -> None:
    err = _expect(
        PermissionDenied, "COMMAND_NOT_ALLOWED", check_command_allowed, "rm", ["ls"], False
    )
    assert "every command is denied" not in err.message
    assert "add 'rm' to ShellPolicy.allow" in err.message


# --------------------------------------------------------------------------------------------
# Environment
# --------------------------------------------------------------------------------------------

ENV_ACCEPT = [
    {},
    {"A": "1"},
    {"_": ""},
    {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
    {"a_b_9": "multi\nline ünïcode"},
    {"K" * MAX_ENV_KEY_BYTES: "v"},
    {"V": "x" * MAX_ENV_VALUE_BYTES},
    {f"K{i}": str(i) for i in range(MAX_ENV_ENTRIES)},
    {"PROXY": "x", "HTTP_PROXY_X": "y", "MY_http_proxy": "z"},
    # Only the loader's exact names: lower case or a longer name is an ordinary variable.
    {"ld_preload": "x", "OLD_PATH": "y", "GCONV_PATH_X": "z", "TMPDIR": "/tmp"},
]


@pytest.mark.parametrize("env", ENV_ACCEPT, ids=lambda e: repr(e)[:40])
def test_validate_env_accepts(env: dict[str, str]) -> None:
    result = validate_env(env)
    assert result == env
    assert result is not env


ENV_REJECT = [
    ({"": "x"}, "INVALID_ENV"),
    ({"1A": "x"}, "INVALID_ENV"),
    ({"A-B": "x"}, "INVALID_ENV"),
    ({"A B": "x"}, "INVALID_ENV"),
    ({"A=B": "x"}, "INVALID_ENV"),
    ({"A\n": "x"}, "INVALID_ENV"),
    ({"A\x00": "x"}, "INVALID_ENV"),
    ({"É": "x"}, "INVALID_ENV"),
    ({"K" * (MAX_ENV_KEY_BYTES + 1): "v"}, "INVALID_ENV"),
    ({"A": "a\x00b"}, "INVALID_ENV"),
    ({"A": "x" * (MAX_ENV_VALUE_BYTES + 1)}, "INVALID_ENV"),
    ({"A": "é" * (MAX_ENV_VALUE_BYTES // 2 + 1)}, "INVALID_ENV"),
    ({"A": "\udc80"}, "INVALID_ENV"),
    ({f"K{i}": "" for i in range(MAX_ENV_ENTRIES + 1)}, "INVALID_ENV"),
    *[({key: "http://evil"}, "ENV_RESERVED") for key in sorted(RESERVED_ENV_KEYS)],
    ({"Http_Proxy": "http://evil"}, "ENV_RESERVED"),
    ({"hTTps_proxy": "http://evil"}, "ENV_RESERVED"),
    ({"OK": "1", "HTTPS_PROXY": ""}, "ENV_RESERVED"),
    # Loader and libc variables: an allowlisted program would load the caller's files.
    *[
        ({key: "/workspace/evil"}, "ENV_RESERVED")
        for key in ["LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT", "LD_DEBUG", "LD_X", "LD_"]
    ],
    *[({key: "/workspace/evil"}, "ENV_RESERVED") for key in sorted(LOADER_ENV_KEYS)],
    ({"OK": "1", "LD_PRELOAD": ""}, "ENV_RESERVED"),
]


@pytest.mark.parametrize(("env", "reason"), ENV_REJECT, ids=lambda e: repr(e)[:40])
def test_validate_env_rejects(env: dict[str, str], reason: str) -> None:
    _expect(InvalidArgument, reason, validate_env, env)


def test_reserved_env_message_explains() -> None:
    err = _expect(InvalidArgument, "ENV_RESERVED", validate_env, {"HTTP_PROXY": "x"})
    assert "cannot be overridden" in err.message


@pytest.mark.parametrize(("key", "ok"), [("A", True), ("A\n", False), ("_9", True), ("9", False)])
def test_env_key_re(key: str, ok: bool) -> None:
    assert (ENV_KEY_RE.match(key) is not None) is ok
    assert (ENV_KEY_RE.fullmatch(key) is not None) is ok


# --------------------------------------------------------------------------------------------
# User
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("user", "expected"),
    [
        ("", (65534, 65534)),
        ("65534:65534", (65534, 65534)),
        ("1000:1000", (1000, 1000)),
        ("1:1", (1, 1)),
        ("1000:65534", (1000, 65534)),
        ("2147483647:2147483647", (2**31 - 1, 2**31 - 1)),
        ("01000:01000", (1000, 1000)),
    ],
)
def test_parse_user_accepts(user: str, expected: tuple[int, int]) -> None:
    assert parse_user(user) == expected


@pytest.mark.parametrize(
    ("user", "root"),
    [
        ("root", True),
        ("ROOT", True),
        ("root:root", True),
        ("0", True),
        ("00", True),
        ("0:0", True),
        ("0:1000", True),
        ("1000:0", True),
        ("000:000", True),
        ("65534:root", True),
        ("nobody", False),
        ("nobody:nogroup", False),
        ("65534", False),
        ("1000:", False),
        (":1000", False),
        (":", False),
        ("+1000:1000", False),
        ("-1:1000", False),
        ("1000:-1", False),
        (" 1000:1000", False),
        ("1000 :1000", False),
        ("1000:1000 ", False),
        ("1000:1000\n", False),
        ("1000:1000:1000", False),
        ("1e3:1000", False),
        ("0x3e8:1000", False),
        ("１０００:１０００", False),  # full-width digits
        ("٣:٣", False),  # Arabic-Indic digits
        ("2147483648:1000", False),
        ("1000:2147483648", False),
        ("4294967295:4294967295", False),
        ("9" * 5000 + ":1", False),
    ],
)
def test_parse_user_rejects(user: str, root: bool) -> None:
    err = _expect(InvalidArgument, "INVALID_USER", parse_user, user)
    if root:
        assert "root" in err.message and "refused" in err.message
    else:
        assert "uid" in err.message and "gid" in err.message


_USER_PIECES = st.sampled_from(["0", "00", "1", "65534", ":", "root", " ", "-", "+", "2147483648"])


@PROPERTY
@given(st.one_of(st.text(), st.lists(_USER_PIECES, max_size=5).map("".join)))
def test_property_parse_user_never_root(user: str) -> None:
    try:
        uid, gid = parse_user(user)
    except InvalidArgument as err:
        assert err.reason == "INVALID_USER"
        return
    assert uid != 0 and gid != 0
    assert 0 < uid <= 2**31 - 1 and 0 < gid <= 2**31 - 1


# --------------------------------------------------------------------------------------------
# Ids
# --------------------------------------------------------------------------------------------

ID_ACCEPT = ["a", "0", "abc-123", "my_session.v2", "a" * 63, "9z", "a..", "a-"]
ID_REJECT = [
    "",
    "A",
    "Abc",
    "-a",
    "_a",
    ".a",
    "a" * 64,
    "a b",
    "a/b",
    "a\n",
    "a\x00",
    "é",
    "a:b",
    "../x",
]


@pytest.mark.parametrize("value", ID_ACCEPT)
def test_ids_accept(value: str) -> None:
    assert validate_session_id(value) == value
    assert validate_process_id(value) == value
    assert SESSION_ID_RE.match(value)


@pytest.mark.parametrize("value", ID_REJECT)
def test_ids_reject(value: str) -> None:
    _expect(InvalidArgument, "INVALID_SESSION_ID", validate_session_id, value)
    _expect(InvalidArgument, "INVALID_PROCESS_ID", validate_process_id, value)
    assert SESSION_ID_RE.match(value) is None


# --------------------------------------------------------------------------------------------
# Labels
# --------------------------------------------------------------------------------------------

LABELS_ACCEPT = [
    {},
    {"team": "infra"},
    {"a": ""},
    {"app.example.com/name": "web-1"},
    {"A1": "x", "b_c-d.e/f": "ünïcode value"},
    {"k" * 128: "v"},
    {"k": "v" * 256},
    {"k": "é" * 128},
    {f"k{i}": "v" for i in range(MAX_LABELS)},
]


@pytest.mark.parametrize("labels", LABELS_ACCEPT, ids=lambda e: repr(e)[:40])
def test_validate_labels_accepts(labels: dict[str, str]) -> None:
    result = validate_labels(labels)
    assert result == labels
    assert result is not labels


LABELS_REJECT = [
    {"": "v"},
    {"-a": "v"},
    {"a-": "v"},
    {".a": "v"},
    {"a/": "v"},
    {"a b": "v"},
    {"a\n": "v"},
    {"é": "v"},
    {"k" * 129: "v"},
    {"k": "v" * 257},
    {"k": "é" * 129},
    {"k": "a\x00b"},
    {"k": "a\nb"},
    {"k": "a\tb"},
    {"k": "\x1b[31m"},
    {"k": "a\u202eb"},
    {"k": "\udc80"},
    {f"k{i}": "v" for i in range(MAX_LABELS + 1)},
]


@pytest.mark.parametrize("labels", LABELS_REJECT, ids=lambda e: repr(e)[:40])
def test_validate_labels_rejects(labels: dict[str, str]) -> None:
    _expect(InvalidArgument, "INVALID_LABELS", validate_labels, labels)


# --------------------------------------------------------------------------------------------
# File modes
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "default", "expected"),
    [
        (0, 0o644, 0o644),
        (0, 0o755, 0o755),
        (0o644, 0o600, 0o644),
        (0o600, 0o644, 0o600),
        (0o777, 0o644, 0o777),
        (0o1, 0o644, 0o1),
        (0o4755, 0o644, 0o755),  # setuid stripped
        (0o2755, 0o644, 0o755),  # setgid stripped
        (0o1777, 0o644, 0o777),  # sticky stripped
        (0o7777, 0o644, 0o777),
        (0o4000, 0o644, 0o000),
    ],
)
def test_validate_file_mode_accepts(mode: int, default: int, expected: int) -> None:
    assert validate_file_mode(mode, default=default) == expected


@pytest.mark.parametrize("mode", [-1, -0o644, 0o10000, 0o17777, 2**32, 2**63])
def test_validate_file_mode_rejects(mode: int) -> None:
    _expect(InvalidArgument, "INVALID_MODE", lambda m: validate_file_mode(m, default=0o644), mode)


@PROPERTY
@given(st.integers(min_value=-(2**40), max_value=2**40))
def test_property_file_mode_never_set_id(mode: int) -> None:
    try:
        result = validate_file_mode(mode, default=0o644)
    except InvalidArgument as err:
        assert err.reason == "INVALID_MODE"
        return
    assert 0 <= result <= 0o777


# --------------------------------------------------------------------------------------------
# Durations
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "nanos", "expected"),
    [
        (0, 0, 0.0),
        (1, 500_000_000, 1.5),
        (-1, -500_000_000, -1.5),
        (0, -1, -1e-9),
        (MAX_DURATION_S, 999_999_999, MAX_DURATION_S + 0.999999999),
        (-MAX_DURATION_S, -999_999_999, -MAX_DURATION_S - 0.999999999),
    ],
)
def test_duration_seconds_accepts_every_valid_duration(
    seconds: int, nanos: int, expected: float
) -> None:
    assert duration_seconds(seconds, nanos) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("seconds", "nanos"),
    [
        (1, -1),  # mixed signs
        (-1, 1),
        (0, 1_000_000_000),  # nanos out of range
        (0, -1_000_000_000),
        (MAX_DURATION_S + 1, 0),  # beyond +-10,000 years
        (-(2**63), 0),
        (2**63 - 1, 999_999_999),
    ],
)
def test_duration_seconds_refuses_malformed_durations(seconds: int, nanos: int) -> None:
    _expect(InvalidArgument, "INVALID_ARGUMENT", duration_seconds, seconds, nanos)


@pytest.mark.parametrize(
    ("seconds", "reason"),
    [
        (0.0, "INVALID_TIMEOUT"),
        (-1e-9, "INVALID_TIMEOUT"),
        (-float(MAX_DURATION_S), "INVALID_TIMEOUT"),
        (float("nan"), "INVALID_TIMEOUT"),
        (float("inf"), "INVALID_TIMEOUT"),
        (3600.000000001, "LIMIT_EXCEEDS_MAXIMUM"),
    ],
)
def test_positive_duration_refuses_what_is_not_positive_or_over_the_maximum(
    seconds: float, reason: str
) -> None:
    _expect(
        InvalidArgument,
        reason,
        lambda: positive_duration(
            seconds, name="timeout", maximum=3600.0, reason="INVALID_TIMEOUT"
        ),
    )


def test_positive_duration_clamps_to_the_span_the_server_computes_with() -> None:
    """An operator's maximum may be the largest Duration; a clock time 10,000 years ahead
    does not exist (datetime ends at 9999), so the value is clamped to 100 years."""
    import datetime

    top = float(MAX_DURATION_S)
    got = positive_duration(top, name="ttl", maximum=top, reason="LEASE_INVALID")
    assert got == MAX_SPAN_S
    datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=got)  # no OverflowError
    assert positive_duration(1e-9, name="ttl", maximum=top, reason="LEASE_INVALID") == 1e-9
