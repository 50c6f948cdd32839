"""The archive member rules of SECURITY.md, one member at a time, in archive order.

Pure: no I/O, no threads. The import thread (pipe.py, transfer.py) asks `MemberChecker` about
every member tarfile parses and writes only the sanitised copy it gets back.

Memory and CPU of one check are bounded whatever the archive: names are remembered as keyed
64-bit hashes of their path prefixes (never as strings, so a deep 4 KiB name costs a few
integers, not every prefix spelled out), the number of distinct folders is capped, and a
member costs time linear in its name. A hash collision can only make a set look like it holds
a name it does not: that refuses a good archive (or lets a hardlink point at a missing file,
which `tar -x` then refuses), never lets a member through a symlink.

Extended headers (PAX, GNU long names) are capped before tarfile reads them, and a PAX record
may not carry a long run of digits: Python's tarfile before 3.11.10 / 3.12.6 searches PAX
data with a regular expression that is quadratic in such runs (CVE-2024-6232) and holds the
GIL meanwhile, which would freeze every RPC of the server.
"""

from __future__ import annotations

import posixpath
import re
import sys
import tarfile
from dataclasses import dataclass

from sandboxd import validation
from sandboxd.errors import InvalidArgument, ResourceExhausted
from sandboxd.reasons import Reason

# The largest PAX or GNU extension record read at all: two full paths (name and link target,
# 4 KiB each) and the usual attributes fit many times over.
MAX_EXTENDED_HEADER_BYTES = 16 * 1024
# Longest run of digits allowed in a PAX record (mtimes with nanoseconds have 20; a name
# of more than 64 digits in a row is refused: the cost of the quadratic search stays small).
MAX_PAX_DIGIT_RUN = 64
# Global PAX headers accumulate in tarfile for the rest of the archive: bound what they hold.
MAX_GLOBAL_PAX_BYTES = 64 * 1024
DEFAULT_MAX_MEMBERS = 100_000
FOLDERS_PER_MEMBER = 2  # distinct folders (proper prefixes) allowed per member of the cap

# What tar adds around a member's data, allowed per member beyond the workspace cap: a header
# block, the padding to a block, and a PAX record for a name or link target of a few hundred
# bytes. Longer names and targets count against the cap like data.
MEMBER_OVERHEAD_BYTES = 1024
END_OVERHEAD_BYTES = 2 * tarfile.BLOCKSIZE + tarfile.RECORDSIZE

_DIGIT_RUN = re.compile(rb"[0-9]{%d}" % (MAX_PAX_DIGIT_RUN + 1))


@dataclass(frozen=True)
class ArchiveLimits:
    """The caps one import is held to."""

    max_members: int
    max_file_bytes: int
    max_total_bytes: int
    # The server's own snapshot coming back: whatever the sandbox could make is accepted
    # (fifos, link targets that point anywhere, a file as large as the workspace) as long as
    # nothing lands outside the destination. A caller's archive is held to every rule.
    trusted: bool = False


def stream_allowance(content_bytes: int, members: int) -> int:
    """The most bytes a tar stream of `members` members and `content_bytes` of data may take.

    The one bound for both directions: an export stops past it (a sparse file would otherwise
    stream gigabytes out of a small tmpfs), an import counts every byte it writes against it;
    so whatever exports within the caps imports again.
    """
    return content_bytes + members * MEMBER_OVERHEAD_BYTES + END_OVERHEAD_BYTES


def refuse(reason: str, name: str, why: str) -> InvalidArgument:
    return InvalidArgument(
        f"archive member {name!r}: {why}", reason=reason, metadata={"member": name[:512]}
    )


def invalid(why: str) -> InvalidArgument:
    return InvalidArgument(f"the archive is not acceptable: {why}", reason=Reason.ARCHIVE_INVALID)


def tarfile_has_pax_regex_bug(version: tuple[int, int, int] | None = None) -> bool:
    """True for the interpreters whose tarfile parses PAX records in quadratic time."""
    major, minor, micro = version or sys.version_info[:3]
    if (major, minor) < (3, 11):
        return True
    return (major, minor) == (3, 11) and micro < 10 or (major, minor) == (3, 12) and micro < 6


def ensure_safe_tarfile(
    max_extended_bytes: int = MAX_EXTENDED_HEADER_BYTES,
    max_digit_run: int = MAX_PAX_DIGIT_RUN,
    version: tuple[int, int, int] | None = None,
) -> None:
    """Refuse to start imports on an interpreter with CVE-2024-6232 unless the caps hold.

    Quadratic work stays small only while records are small and digit runs short; the server
    calls this at start-up so a later change of either cap cannot quietly reopen the hole.
    """
    if not tarfile_has_pax_regex_bug(version):
        return
    if max_extended_bytes > 64 * 1024 or max_digit_run > 64:
        raise RuntimeError(
            "this Python's tarfile parses PAX headers in quadratic time (CVE-2024-6232): "
            "archive imports need the extended-header caps (at most 64 KiB records and "
            "64-digit runs), or Python 3.11.10 / 3.12.6 or later"
        )


def check_extended_header(size: int) -> None:
    """Called before an extension record of `size` bytes is read into memory."""
    if size > MAX_EXTENDED_HEADER_BYTES:
        raise invalid(
            f"an extended (PAX or GNU) header of {size} bytes; the limit is "
            f"{MAX_EXTENDED_HEADER_BYTES}"
        )


def check_extended_payload(data: bytes) -> None:
    """Called on an extension record before tarfile parses it: no long digit runs."""
    if _DIGIT_RUN.search(data) is not None:
        raise invalid(f"an extended header holds more than {MAX_PAX_DIGIT_RUN} digits in a row")


def check_global_headers(pax_headers: dict[str, str]) -> None:
    """Global PAX headers stay with tarfile for the rest of the archive: bound them."""
    if len(pax_headers) > 64 or sum(len(k) + len(v) for k, v in pax_headers.items()) > (
        MAX_GLOBAL_PAX_BYTES
    ):
        raise invalid(f"global PAX headers hold more than {MAX_GLOBAL_PAX_BYTES} bytes")


def normalize_member_name(raw: str) -> str:
    """The member's path relative to the destination; "" for the destination itself.

    Absolute names and any `..` are refused outright rather than stripped: an archive that
    carries them was made to escape, and quietly rewriting it would hide that.
    """
    if "\0" in raw:
        raise refuse(Reason.ARCHIVE_MEMBER_INVALID, raw, "the name contains NUL")
    if raw.startswith("/"):
        raise refuse(Reason.ARCHIVE_ABSOLUTE_PATH, raw, "absolute names are not allowed")
    if len(raw) > 4 * validation.MAX_PATH_BYTES:
        raise refuse(Reason.ARCHIVE_MEMBER_INVALID, raw[:256], "the name is too long")
    parts = [p for p in raw.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise refuse(Reason.ARCHIVE_PATH_TRAVERSAL, raw, "'..' is not allowed in a member name")
    name = "/".join(parts)
    # Names are bytes on Linux: tarfile hands non-UTF-8 ones over as surrogate escapes. What
    # the kernel would refuse (a component over NAME_MAX, a path of PATH_MAX with its NUL) is
    # refused here, by name, rather than by tar midway as an internal error.
    if len(name.encode(errors="surrogateescape")) >= validation.MAX_PATH_BYTES:
        raise refuse(Reason.ARCHIVE_MEMBER_INVALID, raw[:256], "the name is too long")
    longest = max((len(p.encode(errors="surrogateescape")) for p in parts), default=0)
    if longest > validation.MAX_PATH_COMPONENT_BYTES:
        raise refuse(
            Reason.ARCHIVE_MEMBER_INVALID,
            raw[:256],
            f"a name in it is {longest} bytes, over the {validation.MAX_PATH_COMPONENT_BYTES} "
            "a file name may have",
        )
    return name


def prefix_hashes(name: str) -> list[int]:
    """Keyed hashes of the name's prefixes, shortest first; the last one is the name's own.

    Chained component by component (linear in the name). str hashes are keyed per process
    (SipHash, PYTHONHASHSEED unset), so an archive cannot aim at collisions.
    """
    out: list[int] = []
    h = 0
    for part in name.split("/"):
        h = hash((h, part))
        out.append(h)
    return out


class MemberChecker:
    """Checks members one by one, in archive order, and says what to write for each.

    Keeps just enough state to catch what only order reveals: a member written through a
    symlink the archive itself planted, a hardlink to something that is not an earlier file.
    """

    def __init__(
        self,
        limits: ArchiveLimits,
        existing_symlinks: set[str] | None = None,
        *,
        existing_hashes: set[int] | None = None,
    ) -> None:
        """`existing_symlinks` (or their `prefix_hashes`, `existing_hashes`): symlinks already
        in the destination, relative to it."""
        self.limits = limits
        self._existing = {prefix_hashes(s)[-1] for s in existing_symlinks or () if s}
        self._existing |= existing_hashes or set()
        self._symlinks: set[int] = set()
        self._files: set[int] = set()
        self._seen: set[int] = set()
        self._dirs: set[int] = set()
        self._parents: set[int] = set()  # every proper prefix of a seen name
        self._max_parents = FOLDERS_PER_MEMBER * limits.max_members + 1024
        self.members = 0
        self.total_bytes = 0
        # Directories unpacked with u+rwx whose own mode is applied once the merge is done.
        self.deferred_modes: list[tuple[str, int]] = []

    def release(self) -> None:
        """Drop what the check remembers (up to a few tens of MiB for a large archive).

        Called once the archive was refused: the refusal's traceback holds this checker
        through its frames, and the exception sits in reference cycles (its traceback's
        frames hold the futures and locals that hold it), which only the cyclic garbage
        collector breaks, at a time of its own choosing. Six refused imports of 100 deep
        names each had kept 120 MiB of these sets alive.
        """
        for remembered in (self._existing, self._symlinks, self._files, self._seen):
            remembered.clear()
        self._dirs.clear()
        self._parents.clear()
        self.deferred_modes.clear()

    def _through_symlink(self, name: str, chain: list[int]) -> str | None:
        for i, h in enumerate(chain[:-1]):
            if h in self._symlinks or h in self._existing:
                return "/".join(name.split("/")[: i + 1])
        return None

    def check(self, info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        """A sanitised copy of `info` to write, None to skip it (the root entry)."""
        raw = info.name
        name = normalize_member_name(raw)
        self.members += 1
        if self.members > self.limits.max_members:
            raise refuse(
                Reason.ARCHIVE_TOO_MANY_MEMBERS,
                raw,
                f"the archive has more than {self.limits.max_members} members",
            )
        if not name:
            if not info.isdir():
                raise refuse(Reason.ARCHIVE_MEMBER_INVALID, raw, "the root must be a directory")
            return None
        chain = prefix_hashes(name)
        own = chain[-1]
        link = self._through_symlink(name, chain)
        if link is not None:
            raise refuse(
                Reason.ARCHIVE_THROUGH_SYMLINK,
                raw,
                f"it would be written through the symlink {link!r}",
            )
        fifo = info.type == tarfile.FIFOTYPE and self.limits.trusted
        if info.type in (tarfile.CHRTYPE, tarfile.BLKTYPE, tarfile.FIFOTYPE) and not fifo:
            raise refuse(
                Reason.ARCHIVE_SPECIAL_FILE, raw, "devices, fifos and sockets are not allowed"
            )
        if info.sparse is not None or info.type == tarfile.GNUTYPE_SPARSE:
            raise refuse(Reason.ARCHIVE_MEMBER_UNSUPPORTED, raw, "sparse members are not allowed")
        out = tarfile.TarInfo(name)
        out.mtime = info.mtime
        out.mode = info.mode & 0o777  # setuid, setgid and sticky bits are stripped
        if fifo:
            self._claim(raw, own)
            out.type = tarfile.FIFOTYPE
        elif info.isdir():
            if own in self._seen and own not in self._dirs:
                raise refuse(Reason.ARCHIVE_DUPLICATE_MEMBER, raw, "the name appears twice")
            out.type = tarfile.DIRTYPE
            if out.mode & 0o700 != 0o700:
                # tar -x makes a directory before its children: one its owner cannot write
                # (555) or enter would refuse them. Unpack it open, close it after the merge.
                self.deferred_modes.append((name, out.mode))
                out.mode |= 0o700
        elif info.issym():
            self._check_link_target(raw, name, info.linkname, symbolic=True)
            self._claim(raw, own)
            self._symlinks.add(own)
            out.type = tarfile.SYMTYPE
            out.linkname = info.linkname
        elif info.islnk():
            target = self._check_link_target(raw, name, info.linkname, symbolic=False)
            self._claim(raw, own)
            if prefix_hashes(target)[-1] in self._symlinks:
                self._symlinks.add(own)  # another name of a symlink: never written through
            out.type = tarfile.LNKTYPE
            out.linkname = target
        elif info.isreg():
            if info.size > self.limits.max_file_bytes:
                raise ResourceExhausted(
                    f"archive member {raw!r} is {info.size} bytes, over the file cap of "
                    f"{self.limits.max_file_bytes}",
                    reason=Reason.FILE_TOO_LARGE,
                    metadata={"member": raw[:512], "limit": str(self.limits.max_file_bytes)},
                )
            self.total_bytes += info.size
            if self.total_bytes > self.limits.max_total_bytes:
                raise ResourceExhausted(
                    f"the archive holds more than the workspace cap of "
                    f"{self.limits.max_total_bytes} bytes",
                    reason=Reason.WORKSPACE_FULL,
                    metadata={"limit": str(self.limits.max_total_bytes)},
                )
            self._claim(raw, own)
            self._files.add(own)
            out.type = tarfile.REGTYPE
            out.size = info.size
        else:
            raise refuse(Reason.ARCHIVE_MEMBER_UNSUPPORTED, raw, f"member type {info.type!r}")
        self._seen.add(own)
        if out.type == tarfile.DIRTYPE:
            self._dirs.add(own)
        self._add_parents(raw, chain)
        return out

    def _add_parents(self, raw: str, chain: list[int]) -> None:
        # The set is closed under prefixes: stop at the first one already there.
        for h in reversed(chain[:-1]):
            if h in self._parents:
                break
            self._parents.add(h)
        if len(self._parents) > self._max_parents:
            raise refuse(
                Reason.ARCHIVE_TOO_MANY_MEMBERS,
                raw,
                f"the archive names more than {self._max_parents} distinct folders",
            )

    def _claim(self, raw: str, own: int) -> None:
        if own in self._seen:
            raise refuse(Reason.ARCHIVE_DUPLICATE_MEMBER, raw, "the name appears twice")
        if own in self._parents:
            raise refuse(
                Reason.ARCHIVE_DUPLICATE_MEMBER, raw, "a directory of that name came earlier"
            )

    def _check_link_target(self, raw: str, name: str, target: str, *, symbolic: bool) -> str:
        if not target or "\0" in target:
            raise refuse(Reason.ARCHIVE_LINK_OUTSIDE, raw, "the link target is empty or has NUL")
        if symbolic and self.limits.trusted:
            # A symlink is stored, never followed: by tar -x (no member is written through
            # one, see _through_symlink), by merge (renameat) or by the helper (RESOLVE_BENEATH).
            if len(target.encode(errors="surrogateescape")) > validation.MAX_PATH_BYTES:
                raise refuse(Reason.ARCHIVE_LINK_OUTSIDE, raw, "the link target is too long")
            return target
        if target.startswith("/"):
            raise refuse(
                Reason.ARCHIVE_LINK_OUTSIDE, raw, f"the link target {target!r} is absolute"
            )
        if len(target.encode(errors="surrogateescape")) > validation.MAX_PATH_BYTES:
            raise refuse(Reason.ARCHIVE_LINK_OUTSIDE, raw, "the link target is too long")
        base = posixpath.dirname(name) if symbolic else ""
        resolved = posixpath.normpath(posixpath.join(base, target))
        if resolved == ".." or resolved.startswith("../"):
            raise refuse(
                Reason.ARCHIVE_LINK_OUTSIDE,
                raw,
                f"the link target {target!r} leaves the destination",
            )
        if symbolic:
            return target
        resolved = normalize_member_name(resolved)
        chain = prefix_hashes(resolved)
        own = chain[-1]
        if self._through_symlink(resolved, chain) is not None or own in self._existing:
            raise refuse(Reason.ARCHIVE_LINK_OUTSIDE, raw, "a hardlink to a symlink")
        if own in self._symlinks:
            if not self.limits.trusted:
                raise refuse(Reason.ARCHIVE_LINK_OUTSIDE, raw, "a hardlink to a symlink")
            # The server's own snapshot of a symlink with two names (`ln` of a symlink in the
            # sandbox): tar -x makes it with link(2), which never follows the symlink.
            return resolved
        if own not in self._files:
            raise refuse(
                Reason.ARCHIVE_LINK_OUTSIDE,
                raw,
                f"the hardlink target {target!r} is not an earlier file",
            )
        return resolved
