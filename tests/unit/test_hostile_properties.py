"""Property-based tests (hypothesis) of the validators every hostile input passes through.

For arbitrary input each validator either refuses with one of its documented reasons or returns
a value that provably keeps the rule: paths stay in /workspace, argv[0] names only a system
binary, tar members stay under the destination, refused addresses stay refused in every
spelling. No engine needed.
"""

from __future__ import annotations

import ipaddress
import posixpath
import tarfile

import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st
from sandboxd import targets as target
from sandboxd import validation
from sandboxd.archive import ArchiveLimits, MemberChecker, normalize_member_name
from sandboxd.egress import addresses
from sandboxd.errors import InvalidArgument, PermissionDenied, ResourceExhausted

# Per test, not a global profile: other modules keep their own hypothesis settings.
_SETTINGS = settings(max_examples=200, deadline=None)

# Text biased towards the characters that matter for escapes.
_TRICKY = st.sampled_from(["/", ".", "..", "\x00", "\\", "~", "workspace", "\u2215", "é", " "])
tricky_text = st.lists(st.one_of(_TRICKY, st.text(max_size=6)), max_size=12).map("".join)
safe_component = st.text(
    alphabet="abcdefghijklmnopqrstuvwxyz0123456789_-", min_size=1, max_size=20
).filter(lambda c: c not in (".", ".."))


# --------------------------------------------------------------------------------------------
# Paths
# --------------------------------------------------------------------------------------------


@_SETTINGS
@given(tricky_text)
@example("/workspace/../etc")
@example("a/./../b")
@example("/workspace")
@example("/\x00")
def test_path_is_refused_or_stays_inside(path: str) -> None:
    try:
        rel = validation.workspace_relpath(path)
    except InvalidArgument as exc:
        assert exc.reason in ("PATH_INVALID", "PATH_OUTSIDE_WORKSPACE")
        return
    assert "\x00" not in rel and not rel.startswith("/")
    assert ".." not in rel.split("/")
    absolute = posixpath.normpath(posixpath.join("/workspace", rel))
    assert absolute == "/workspace" or absolute.startswith("/workspace/")
    assert len(rel.encode()) <= validation.MAX_PATH_BYTES
    assert validation.workspace_relpath(rel) == rel  # normal form is a fixed point
    assert validation.workspace_abspath(rel) == absolute


@_SETTINGS
@given(st.lists(safe_component, min_size=1, max_size=8), st.integers(0, 7))
def test_any_dotdot_component_is_refused(parts: list[str], at: int) -> None:
    parts.insert(at % (len(parts) + 1), "..")
    for path in ("/".join(parts), "/workspace/" + "/".join(parts)):
        with pytest.raises(InvalidArgument) as excinfo:
            validation.workspace_relpath(path)
        assert excinfo.value.reason == "PATH_OUTSIDE_WORKSPACE"


@_SETTINGS
@given(st.lists(safe_component, min_size=1, max_size=8))
def test_plain_paths_are_accepted_in_both_spellings(parts: list[str]) -> None:
    rel = "/".join(parts)
    assert validation.workspace_relpath(rel) == rel
    assert validation.workspace_relpath("/workspace/" + rel) == rel
    assert validation.workspace_relpath("./" + rel + "/") == rel


# --------------------------------------------------------------------------------------------
# argv and env
# --------------------------------------------------------------------------------------------

argv0_text = st.one_of(
    tricky_text,
    st.sampled_from(["sh", "/bin/sh", "/usr/bin/env", "/tmp/x", "-x", "/bin/../tmp/x", ""]),
    st.builds(
        lambda d, n: f"{d}/{n}", st.sampled_from(["/bin", "/sbin", "/usr/bin", "/tmp"]), tricky_text
    ),
)


@_SETTINGS
@given(argv0_text, st.lists(st.text(max_size=20), max_size=5))
def test_argv_is_refused_or_names_only_a_system_binary(argv0: str, rest: list[str]) -> None:
    try:
        argv = validation.validate_argv([argv0, *rest])
    except InvalidArgument as exc:
        assert exc.reason == "INVALID_ARGV"
        return
    assert argv == [argv0, *rest]
    assert argv0.strip() and not argv0.startswith("-") and "\x00" not in argv0
    assert ".." not in argv0.split("/")
    if "/" in argv0:
        assert posixpath.dirname(argv0) in validation.ALLOWED_BIN_DIRS
    name = validation.command_name(argv0)
    assert "/" not in name and name not in ("", ".", "..")


@_SETTINGS
@given(argv0_text, st.lists(st.text(alphabet="abc", min_size=1, max_size=3), max_size=4))
def test_allowlist_matches_the_exact_base_name_only(argv0: str, allow: list[str]) -> None:
    try:
        validation.validate_argv([argv0])
    except InvalidArgument:
        return
    try:
        validation.check_command_allowed(argv0, allow, allow_all=False)
    except PermissionDenied as exc:
        assert exc.reason == "COMMAND_NOT_ALLOWED"
        assert validation.command_name(argv0) not in allow
        return
    assert validation.command_name(argv0) in allow


@_SETTINGS
@given(
    st.dictionaries(
        st.one_of(tricky_text, st.from_regex(r"\A[A-Za-z_]\w{0,8}\Z")), tricky_text, max_size=6
    )
)
@example({"Https_Proxy": "x"})
@example({"A\n": "x"})
def test_env_is_refused_or_safe(env: dict[str, str]) -> None:
    try:
        got = validation.validate_env(env)
    except InvalidArgument as exc:
        assert exc.reason in ("INVALID_ENV", "ENV_RESERVED")
        return
    assert got == env
    for key, value in got.items():
        assert validation.ENV_KEY_RE.match(key) and "\n" not in key
        assert key.lower() not in {k.lower() for k in validation.RESERVED_ENV_KEYS}
        assert "\x00" not in value


# --------------------------------------------------------------------------------------------
# Tar members (SnapshotService.ImportArchive)
# --------------------------------------------------------------------------------------------

_ARCHIVE_REASONS = {
    "ARCHIVE_MEMBER_INVALID",
    "ARCHIVE_ABSOLUTE_PATH",
    "ARCHIVE_PATH_TRAVERSAL",
    "ARCHIVE_TOO_MANY_MEMBERS",
    "ARCHIVE_THROUGH_SYMLINK",
    "ARCHIVE_SPECIAL_FILE",
    "ARCHIVE_MEMBER_UNSUPPORTED",
    "ARCHIVE_DUPLICATE_MEMBER",
    "ARCHIVE_LINK_OUTSIDE",
}


def _inside(path: str) -> bool:
    resolved = posixpath.normpath(posixpath.join("/dest", path))
    return resolved == "/dest" or resolved.startswith("/dest/")


@_SETTINGS
@given(tricky_text)
@example("../../etc/passwd")
@example("/etc/passwd")
@example("a/../../b")
def test_member_name_is_refused_or_stays_under_the_destination(raw: str) -> None:
    try:
        name = normalize_member_name(raw)
    except InvalidArgument as exc:
        assert exc.reason in _ARCHIVE_REASONS
        return
    assert not name.startswith("/") and ".." not in name.split("/")
    assert _inside(name)


member_names = st.lists(
    st.sampled_from(["a", "b", "..", ".", "link", "d", ""]), min_size=1, max_size=4
).map("/".join)
link_targets = st.one_of(
    member_names, st.sampled_from(["/etc", "/", "../x", "a/../../x", "", "link/x", "."])
)
member_types = st.sampled_from(
    [
        tarfile.REGTYPE,
        tarfile.DIRTYPE,
        tarfile.SYMTYPE,
        tarfile.LNKTYPE,
        tarfile.CHRTYPE,
        tarfile.FIFOTYPE,
    ]
)
members = st.lists(
    st.tuples(
        member_names, member_types, link_targets, st.integers(0, 0o7777), st.integers(0, 300)
    ),
    max_size=10,
)


@_SETTINGS
@given(members)
def test_accepted_members_never_leave_the_destination(
    entries: list[tuple[str, bytes, str, int, int]],
) -> None:
    checker = MemberChecker(ArchiveLimits(max_members=8, max_file_bytes=200, max_total_bytes=500))
    symlinks: dict[str, str] = {}
    for name, kind, link, mode, size in entries:
        info = tarfile.TarInfo(name)
        info.type = kind
        info.linkname = link
        info.mode = mode
        info.size = size
        try:
            out = checker.check(info)
        except InvalidArgument as exc:
            assert exc.reason in _ARCHIVE_REASONS, exc.reason
            return  # the import stops at the first bad member
        except ResourceExhausted as exc:
            assert exc.reason in ("FILE_TOO_LARGE", "WORKSPACE_FULL")
            return
        if out is None:
            continue
        assert _inside(out.name) and out.mode & 0o7000 == 0
        assert out.type not in (tarfile.CHRTYPE, tarfile.BLKTYPE, tarfile.FIFOTYPE)
        # never written through a symlink the archive planted
        assert not any(out.name.startswith(s + "/") for s in symlinks)
        if out.issym():
            assert _inside(posixpath.join(posixpath.dirname(out.name), out.linkname))
            symlinks[out.name] = out.linkname
        if out.islnk():
            assert _inside(out.linkname) and out.linkname not in symlinks
        if out.isreg():
            assert out.size <= 200
    assert checker.total_bytes <= 500


# --------------------------------------------------------------------------------------------
# Egress addresses and targets
# --------------------------------------------------------------------------------------------

ipv4 = st.integers(0, 2**32 - 1).map(ipaddress.IPv4Address)
refused_v4 = st.sampled_from([net for net, _ in addresses.REFUSED_V4]).flatmap(
    lambda net: st.integers(0, net.num_addresses - 1).map(lambda i: net[i])
)


@_SETTINGS
@given(refused_v4)
def test_refused_ipv4_is_refused_in_every_ipv6_wrapping(addr: ipaddress.IPv4Address) -> None:
    assert not addresses.classify(addr).allowed
    value = int(addr)
    for wrapped in (
        ipaddress.IPv6Address((0xFFFF << 32) | value),  # ::ffff:a.b.c.d
        ipaddress.IPv6Address((0x64FF9B << 96) | value),  # 64:ff9b::a.b.c.d
        ipaddress.IPv6Address(value),  # ::a.b.c.d
        ipaddress.IPv6Address((0x2002 << 112) | (value << 80)),  # 6to4
    ):
        assert not addresses.classify(wrapped).allowed, wrapped
        assert not addresses.check(wrapped, allow_private_networks=False).allowed


@_SETTINGS
@given(ipv4)
def test_allowed_ipv4_is_global_unicast(addr: ipaddress.IPv4Address) -> None:
    if addresses.classify(addr).allowed:
        assert not (
            addr.is_private
            or addr.is_loopback
            or addr.is_link_local
            or addr.is_multicast
            or addr.is_reserved
            or addr.is_unspecified
        ), addr
        mapped = ipaddress.IPv6Address((0xFFFF << 32) | int(addr))
        assert addresses.classify(mapped).allowed


@_SETTINGS
@given(st.integers(0, 2**128 - 1).map(ipaddress.IPv6Address))
def test_allowed_ipv6_is_in_2000_3_only(addr: ipaddress.IPv6Address) -> None:
    if addresses.classify(addr).allowed:
        if addr.ipv4_mapped is not None:
            # IPv4-mapped addresses are judged by the IPv4 address they carry (README, egress).
            assert addresses.classify(addr.ipv4_mapped).allowed
            return
        if addr in ipaddress.IPv6Network("64:ff9b::/96"):  # NAT64: the same rule
            assert addresses.classify(ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF)).allowed
            return
        assert addr in ipaddress.IPv6Network("2000::/3")
        for net in ("2001::/23", "2001:db8::/32", "2002::/16", "3fff::/20"):
            assert addr not in ipaddress.IPv6Network(net)


def _spellings(addr: ipaddress.IPv4Address) -> list[str]:
    a, b, c, d = addr.packed
    value = int(addr)
    return [
        str(addr),
        str(value),
        hex(value),
        f"{a}.{(b << 16) | (c << 8) | d}",
        f"0{a:o}.{b}.{c}.{d}",
        f"0x{a:x}.{b}.{c}.{d}",
        f"[::ffff:{addr}]",
        f"::ffff:{addr}",
        f"{addr}.",
    ]


@_SETTINGS
@given(ipv4)
def test_ip_literals_in_any_spelling_are_refused_as_targets(addr: ipaddress.IPv4Address) -> None:
    for spelling in _spellings(addr):
        with pytest.raises(target.TargetError) as excinfo:
            target.parse_authority(f"{spelling}:443")
        assert excinfo.value.reason == "IP_LITERAL", spelling
        with pytest.raises(target.TargetError) as excinfo:
            target.normalize_pattern(spelling)
        assert excinfo.value.reason == "IP_LITERAL", spelling


@_SETTINGS
@given(st.text(max_size=40), st.text(max_size=8))
def test_authority_is_refused_or_a_clean_name_and_port(host: str, port: str) -> None:
    assume(":" not in port)
    try:
        name, number = target.parse_authority(f"{host}:{port}")
    except target.TargetError:
        return
    assert 1 <= number <= 65535 and str(number) == port
    assert name == name.lower() and not name.endswith(".") and len(name) <= 253
    with pytest.raises(ValueError):
        ipaddress.ip_address(name)
