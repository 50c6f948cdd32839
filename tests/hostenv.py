"""The host as the suite found it: interfaces, addresses, iptables rules, /etc/docker, images.

`make test` on a user's machine must leave the host's Docker engine as it was: a private
dockerd in the host's network namespace once deleted `docker0`. The session fixture `host_untouched`
(tests/conftest.py) takes a snapshot before the first test and compares it after the last, and
fails with a diff.

What is compared is what outlives a suite. Left out: the bridges of Docker networks that exist
at the time (sandboxd's `sbx<hash>` session bridges, `br-<id>`), with their iptables rules and
sandboxd's `SBX-<bridge>` chains, so sessions still running elsewhere on the engine do not
count; veth pairs (they go with their container); packet counters and link state (a bridge is
DOWN while no container is attached). A bridge or chain whose network is gone is a leak, and
is reported like any other change.

Images: every image the engine lists (by reference, dangling ones by id) that appeared during
the suite is a leftover: a snapshot image a test did not delete, a template, an image a test
built or pulled. Left out: the images the Makefile builds on purpose for the suite
(`sandboxd-runtime:busybox`, `:python` and `:base`), and images labelled with the owner id of a
server this run did not start (another suite's or the soak's, on the same engine;
`mountcheck.OWNERS` says which are ours). Only additions count: an image someone else removes
during a long run is not a leak.
"""

from __future__ import annotations

import difflib
import hashlib
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from sandboxd.labels import LABEL_OWNER

_VETH = re.compile(r"\bveth[0-9a-zA-Z]+\b")
_COUNTERS = re.compile(r"\[\d+:\d+\]")
_LINK = re.compile(r"^\d+:\s+(?P<name>[^:@\s]+)(?:@\S+)?:.*?link/(?P<type>\S+)(?: (?P<mac>\S+))?")
_ADDR = re.compile(r"^\d+:\s+(?P<name>\S+)\s+(?P<family>inet6?)\s+(?P<addr>\S+)")


@dataclass(frozen=True)
class HostState:
    links: tuple[str, ...]
    addresses: tuple[str, ...]
    iptables: tuple[str, ...]
    etc_docker: tuple[str, ...]
    images: tuple[str, ...] = ()
    disks: tuple[str, ...] = ()

    def diff(self, after: HostState) -> str:
        """A unified diff per part that changed; empty when the host is as it was."""
        out: list[str] = []
        for part in ("links", "addresses", "iptables", "etc_docker"):
            a, b = getattr(self, part), getattr(after, part)
            if a != b:
                out.extend(
                    difflib.unified_diff(
                        list(a), list(b), f"{part} before", f"{part} after", lineterm=""
                    )
                )
        added = sorted(set(after.images) - set(self.images))
        if added:
            out.append("images left behind (not there before the suite):")
            out.extend(f"+{line}" for line in added)
        disks = sorted(set(after.disks) - set(self.disks))
        if disks:
            out.append("disks left behind (volumes of this run's servers, detached loops):")
            out.extend(f"+{line}" for line in disks)
        return "\n".join(out)


def _lines(argv: list[str]) -> list[str]:
    if shutil.which(argv[0]) is None:
        return [f"<{argv[0]} not available>"]
    cp = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    if cp.returncode != 0:
        return [f"<{' '.join(argv)} failed: {cp.stderr.strip()[:200]}>"]
    return cp.stdout.splitlines()


def _ephemeral(bridges: frozenset[str]) -> re.Pattern[str]:
    """Names of per-network objects: veth ends, the live networks' bridges and their chains."""
    names = sorted(bridges - {"docker0"})
    alternatives = [_VETH.pattern] + [rf"\b(?:SBX-)?{re.escape(n)}\b" for n in names]
    return re.compile("|".join(alternatives))


def normalise_links(lines: list[str], bridges: frozenset[str] = frozenset()) -> tuple[str, ...]:
    """`ip -o link` as name, link type and address, per-network Docker interfaces left out."""
    ephemeral = _ephemeral(bridges)
    keep = set()
    for line in lines:
        m = _LINK.match(line)
        if m is None or ephemeral.search(m.group("name")):
            continue
        keep.add(f"{m.group('name')} {m.group('type')} {m.group('mac') or ''}".strip())
    return tuple(sorted(keep))


def normalise_addresses(lines: list[str], bridges: frozenset[str] = frozenset()) -> tuple[str, ...]:
    """`ip -o addr` as name, family and address/prefix (lifetimes and flags left out).

    IPv6 link-local addresses come and go with a bridge's carrier; they derive from the MAC,
    which the links part compares.
    """
    ephemeral = _ephemeral(bridges)
    keep = set()
    for line in lines:
        m = _ADDR.match(line)
        if m is None or ephemeral.search(m.group("name")) or m.group("addr").startswith("fe80:"):
            continue
        keep.add(f"{m.group('name')} {m.group('family')} {m.group('addr')}")
    return tuple(sorted(keep))


def normalise_iptables(lines: list[str], bridges: frozenset[str] = frozenset()) -> tuple[str, ...]:
    """`iptables-save` without comments, counters and rules of per-network objects."""
    ephemeral = _ephemeral(bridges)
    keep = []
    for line in lines:
        if line.startswith("#") or ephemeral.search(line):
            continue
        keep.append(_COUNTERS.sub("", line).rstrip())
    return tuple(keep)


def etc_docker(root: Path = Path("/etc/docker")) -> tuple[str, ...]:
    """Every file under /etc/docker with its mode and a digest of its content."""
    if not root.exists():
        return ("<absent>",)
    entries = []
    for path in sorted(root.rglob("*")):
        st = path.lstat()
        digest = ""
        if path.is_file() and not path.is_symlink():
            try:
                digest = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
            except OSError as err:
                digest = f"<{err.strerror}>"
        entries.append(f"{path.relative_to(root)} {oct(st.st_mode)} {digest}")
    return tuple(entries)


def live_bridges() -> frozenset[str]:
    """The bridge interface of every Docker network that exists now (queried after the host)."""
    ids = _lines(["docker", "network", "ls", "-q", "--filter", "driver=bridge"])
    if not ids or ids[0].startswith("<"):
        return frozenset()
    fmt = '{{.Id}} {{index .Options "com.docker.network.bridge.name"}}'
    names = set()
    for line in _lines(["docker", "network", "inspect", "--format", fmt, *ids]):
        net_id, _, name = line.partition(" ")
        if not line.startswith("<"):
            names.add(name.strip() or f"br-{net_id[:12]}")
    return frozenset(names)


# Built on purpose for the suite by the Makefile (scripts/build-*-image.sh), kept between runs
# (and rebuilt when their recipe changes). Tests' own `sandboxd-runtime:test-*` images are not.
_MAKEFILE_IMAGES = frozenset(
    {
        "sandboxd-runtime:busybox",
        "sandboxd-runtime:python",
        "sandboxd-runtime:base",
        os.environ.get("SANDBOXD_TEST_IMAGE", "sandboxd-runtime:busybox"),
    }
)


def normalise_images(
    lines: list[str], owner_of: dict[str, str], owners: frozenset[str] = frozenset()
) -> tuple[str, ...]:
    """`docker images` lines ("<id> <repository>:<tag>") as "reference id", without the
    Makefile's images and those of servers not in `owners` (`owner_of`: image id -> owner)."""
    keep = set()
    for line in lines:
        image_id, _, ref = line.partition(" ")
        if not ref or ref in _MAKEFILE_IMAGES:
            continue
        owner = owner_of.get(image_id)
        if owner and owner not in owners:
            continue  # another suite's server made it: that suite's check reports it
        short = image_id.removeprefix("sha256:")[:12]
        keep.add(f"{ref} {short}" + (f" (server {owner})" if owner else ""))
    return tuple(sorted(keep))


def images(owners: frozenset[str] = frozenset()) -> tuple[str, ...]:
    """The engine's images by reference (see `normalise_images`); `owners`: this run's servers."""
    fmt = "{{.ID}} {{.Repository}}:{{.Tag}}"
    lines = _lines(["docker", "images", "--no-trunc", "--format", fmt])
    if lines and lines[0].startswith("<"):
        return tuple(lines)
    owner_of: dict[str, str] = {}
    labelled = _lines(["docker", "images", "-q", "--no-trunc", "--filter", f"label={LABEL_OWNER}"])
    if labelled and not labelled[0].startswith("<"):
        owner_fmt = f'{{{{.Id}}}} {{{{index .Config.Labels "{LABEL_OWNER}"}}}}'
        inspect = ["docker", "image", "inspect", "--format", owner_fmt, *sorted(set(labelled))]
        for line in _lines(inspect):
            image_id, _, owner = line.partition(" ")
            owner_of[image_id] = owner.strip()
    return normalise_images(lines, owner_of, owners)


def disks(owners: frozenset[str] = frozenset()) -> tuple[str, ...]:
    """Disk volumes (a disk workspace's image and mount volumes, sandboxd.storage) of this
    run's servers, and loop devices whose backing file is gone (a disk removed while still
    attached: its space is never given back). Only additions count, like images."""
    found = []
    fmt = '{{.Name}} {{.Label "' + LABEL_OWNER + '"}}'
    for line in _lines(
        ["docker", "volume", "ls", "--filter", "label=io.sandboxd.disk", "--format", fmt]
    ):
        name, _, owner = line.partition(" ")
        if line.startswith("<") or owner.strip() in owners:
            found.append(f"volume {name}")
    if os.geteuid() == 0:
        for line in _lines(["losetup", "--list", "-n", "-O", "NAME,BACK-FILE"]):
            if line.rstrip().endswith("(deleted)"):
                found.append(f"loop {line.split()[0]} (its disk image was removed)")
    return tuple(sorted(found))


def snapshot(owners: frozenset[str] = frozenset()) -> HostState:
    links = _lines(["ip", "-o", "link"])
    addresses = _lines(["ip", "-o", "addr"])
    iptables = _lines(["iptables-save"]) if os.geteuid() == 0 else ["<not root>"]
    # After the host's state: a bridge seen above belongs to a network listed here.
    bridges = live_bridges()
    return HostState(
        links=normalise_links(links, bridges),
        addresses=normalise_addresses(addresses, bridges),
        iptables=normalise_iptables(iptables, bridges),
        etc_docker=etc_docker(),
        images=images(owners),
        disks=disks(owners),
    )


def settled_snapshot(tries: int = 5, pause_s: float = 0.5) -> HostState:
    """A snapshot two takes in a row agree on: Docker may be midway through adding or removing
    some other suite's network (its bridge listed, its rules half gone) at any one instant."""
    last = snapshot()
    for _ in range(tries):
        time.sleep(pause_s)
        current = snapshot()
        if current == last:
            return current
        last = current
    return last


def changes_since(
    before: HostState, owners: frozenset[str] = frozenset(), tries: int = 5, pause_s: float = 1.0
) -> str:
    """The diff from `before` that persists over `tries` looks (empty when none does);
    `owners`: the owner ids of the servers this run started (their images count)."""
    diff = ""
    for _ in range(tries):
        diff = before.diff(snapshot(owners))
        if not diff:
            return ""
        time.sleep(pause_s)
    return diff
