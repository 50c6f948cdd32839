"""The disk tool: one fixed shell script the server runs in a short-lived container.

A disk is a sparse file holding an ext4 filesystem, in an engine volume of its own, attached to
a loop device of the engine host (docs/workspaces.md says why, with the measurements). Making,
attaching, copying and removing one needs loop devices, which only a container with
CAP_SYS_ADMIN, CAP_MKNOD and the loop devices in its device cgroup can reach: the tool container.
It is the one privileged container sandboxd starts, so it is kept small (SECURITY.md, "Disk
workspaces"): its script is this module's constant, never built from input; its arguments are
an operation name from a fixed set and integers, each checked here before the engine sees them
(a disk's identity is which volume is mounted at /d, never a path argument); it has no
network, a read-only root, no other capability, no new privileges, and it runs runc (never a
tenant's runtime).

This module is pure (no engine calls): the script, the container document and the parser of
the one result line the script prints.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from sandboxd.errors import Internal

# The volumes of one disk: its image (holds `disk.img`) and one mount volume per (loop device,
# mount flags): a local volume of type ext4 whose device is the loop the image is attached to.
DISK_IMAGE_PREFIX = "sandboxd-disk-"
DISK_MOUNT_PREFIX = "sandboxd-diskmnt-"
LABEL_DISK = "io.sandboxd.disk"
LABEL_DISK_TOOL = "io.sandboxd.disk-tool"
LABEL_DISK_SIZE = "io.sandboxd.disk-size"

# A disk id: what the server generates (a workspace's, a named volume's), short enough that
# every engine name made from it stays under the engine's limits.
DISK_ID = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")
MIN_DISK_BYTES = 16 * 1024 * 1024  # ext4 with a journal needs a few MiB of its own
MAX_DISK_BYTES = 16 * 1024**4  # ext4 with 4 KiB blocks, and what any engine host would hold
OPERATIONS = frozenset({"create", "attach", "detach", "usage", "copy", "reap"})
# The scratch volume a reap mounts at /d: it is on the filesystem every disk image is on.
DISK_REAP_PREFIX = "sandboxd-diskreap-"

# Exit status the script uses for "the engine host lacks the room" (its output says how much).
EXIT_NO_ROOM = 3

# The script: `sh -c SCRIPT tool OP [SIZE UID GID]`. The image file is /d/disk.img (the disk's
# image volume), a copy's source /s/disk.img. Loop device nodes are made in the container's own
# /dev from the host's sysfs (a non-privileged /dev holds none). `losetup -j` finds the loop an
# image is already attached to (by device and inode), so attaching is idempotent and survives
# nothing but a host restart, after which it attaches again. mke2fs: no reserved blocks (the
# sandbox user is not root), lazy inode tables and journal (a 10 GiB disk costs about 4 MiB:
# measured), the root owned by the sandbox user with mode 0700 and no lost+found, like the
# tmpfs workspace. The result is one line: `disk dev=... size=... allocated=...`.
# `reap` detaches the loops left on a removed image (an image volume removed past `delete`: by
# hand, by a cleanup's `docker volume rm`): the kernel keeps such a loop and the file's blocks
# until it is detached. Only a loop the tool made can match: its file is `disk.img` seen through
# the bind mount of a finished tool container (so `/disk.img`), deleted, on the filesystem the
# engine's volumes are on (the device of /d, a scratch volume); a mounted one is detached when
# its last user closes it (`losetup -d` on a busy loop sets autoclear).
SCRIPT = r"""
set -eu
op=$1
img=/d/disk.img
nodes() {
  for s in /sys/class/block/loop*; do
    [ -e "$s/dev" ] || continue
    IFS=: read -r ma mi < "$s/dev"
    [ -b "/dev/${s##*/}" ] || /bin/busybox mknod "/dev/${s##*/}" b "$ma" "$mi"
  done
}
attached() { nodes; /sbin/losetup --list -n -O NAME -j "$img" | /bin/busybox head -n 1; }
attach() {
  dev=$(attached)
  tries=0
  while [ -z "$dev" ]; do
    tries=$((tries + 1))
    [ "$tries" -le 20 ] || { echo "no loop device could be attached" >&2; exit 4; }
    free=$(/sbin/losetup -f) || { echo "the engine host gives no loop device" >&2; exit 4; }
    nodes
    n=${free#/dev/loop}
    [ -b "$free" ] || /bin/busybox mknod "$free" b 7 "$n"
    if /sbin/losetup "$free" "$img" 2>/dev/null; then dev=$free
    else /bin/busybox sleep 0.1; dev=$(attached); fi
  done
}
report() {
  set -- $(/sbin/stat -c '%s %b %B' "$img")
  echo "disk dev=${dev:-} size=$1 allocated=$(($2 * $3))"
}
room() {
  avail=$(/bin/busybox df -Pk /d | /bin/busybox awk 'NR==2{print $4}')
  if [ $((avail * 1024)) -lt "$1" ]; then echo "disk noroom available=$((avail * 1024))"; exit 3; fi
}
case "$op" in
create)
  size=$2
  if [ ! -e "$img" ]; then
    room "$size"
    /bin/busybox rm -f /d/disk.tmp
    /bin/busybox truncate -s "$size" /d/disk.tmp
    /sbin/mke2fs -q -F -t ext4 -m 0 \
      -E "root_owner=$3:$4,lazy_itable_init=1,lazy_journal_init=1" /d/disk.tmp
    /sbin/debugfs -w -R "rmdir lost+found" /d/disk.tmp 2>/dev/null
    /sbin/debugfs -w -R "sif <2> mode 040700" /d/disk.tmp 2>/dev/null
    /bin/busybox sync
    /bin/busybox mv /d/disk.tmp "$img"
  fi
  attach
  report;;
attach) attach; report;;
usage) dev=$(attached); report;;
detach)
  tries=0
  dev=$(attached)
  while [ -n "$dev" ]; do  # a loop still open (an unmount under way) detaches when closed
    tries=$((tries + 1))
    [ "$tries" -le 50 ] || { echo "loop $dev of the disk stays attached" >&2; exit 5; }
    /sbin/losetup -d "$dev" || true
    /bin/busybox sleep 0.1
    dev=$(attached)
  done
  [ -e "$img" ] && report || echo "disk dev= size=0 allocated=0";;
reap)  # loops whose disk image was removed while attached: detached (lazily when mounted)
  nodes
  here=$(/sbin/stat -c '%Hd:%Ld' /d)
  /sbin/losetup --list -n -O NAME,BACK-MAJ:MIN,BACK-FILE | while read -r dev on file; do
    [ "$on" = "$here" ] && [ "$file" = "/disk.img (deleted)" ] || continue
    /sbin/losetup -d "$dev" && echo "disk reaped=$dev" || echo "disk unreaped=$dev"
  done
  echo "disk dev= size=0 allocated=0";;
copy)
  if [ ! -e "$img" ]; then
    /bin/busybox sync  # a mounted source's dirty pages into its image (sync(2) is host-wide)
    set -- $(/sbin/stat -c '%b %B' /s/disk.img)
    room $(($1 * $2))
    /bin/busybox rm -f /d/disk.tmp
    /sbin/cp --sparse=always /s/disk.img /d/disk.tmp
    /bin/busybox sync
    /bin/busybox mv /d/disk.tmp "$img"
  fi
  dev=""
  report;;
esac
"""


# The hand-over of a copied disk to its new owner: `sh -c OWN_SCRIPT own UID GID` in a container
# of the tool image mounting the disk at /w, as root with CHOWN, FOWNER and DAC_READ_SEARCH
# only. `-h` and no `-L`: a symlink is changed itself, never followed (the tree is a tenant's).
OWN_SCRIPT = '/bin/busybox chmod 0700 /w && /bin/busybox chown -R -h "$1:$2" /w'


@dataclass(frozen=True)
class ToolResult:
    """The script's result line: the loop device (empty when detached), the filesystem's size
    and the bytes the image really takes on the engine host (sparse: far less when empty)."""

    device: str = ""
    size_bytes: int = 0
    allocated_bytes: int = 0
    no_room: bool = False
    available_bytes: int = 0


def checked_id(disk_id: str) -> str:
    """A disk id the engine names are made of; anything else is a bug of the caller (ids are
    the server's, never a tenant's text)."""
    if not DISK_ID.fullmatch(disk_id):
        raise Internal(f"disk id {disk_id!r} is not one the server makes")
    return disk_id


def checked_size(size_bytes: int) -> int:
    if isinstance(size_bytes, bool) or not isinstance(size_bytes, int):
        raise Internal(f"disk size {size_bytes!r} is not an integer")
    if not MIN_DISK_BYTES <= size_bytes <= MAX_DISK_BYTES:
        raise Internal(f"disk size {size_bytes} is outside {MIN_DISK_BYTES}..{MAX_DISK_BYTES}")
    return size_bytes


def command(op: str, *numbers: int) -> list[str]:
    """The tool container's command line: the script, the operation and integer arguments."""
    if op not in OPERATIONS:
        raise Internal(f"disk tool operation {op!r} is unknown")
    if any(isinstance(n, bool) or not isinstance(n, int) or n < 0 for n in numbers):
        raise Internal(f"disk tool arguments {numbers!r} are not non-negative integers")
    return ["/bin/sh", "-c", SCRIPT, "disk-tool", op, *(str(n) for n in numbers)]


def confined_config(
    image: str,
    cmd: list[str],
    *,
    env_path: str,
    labels: dict[str, str],
    caps: list[str],
    memory_bytes: int,
    pids: int,
    **host: Any,
) -> dict[str, Any]:
    """A root container the server starts for one task on a disk or volume (the disk tool, a
    hand-over of ownership): runc, no network, a read-only root, every capability dropped but
    `caps`, no new privileges, small memory and process limits, kept after it exits so its
    log can be read. Every such container is made here, so none can drift from the others in
    what confines it; `host` adds its mounts or devices."""
    return {
        "Image": image,
        "Cmd": cmd,
        "Entrypoint": [],
        "User": "0:0",
        "WorkingDir": "/",
        "Env": [f"PATH={env_path}"],
        "Labels": labels,
        "NetworkDisabled": True,
        "HostConfig": {
            "NetworkMode": "none",
            "Runtime": "runc",
            "ReadonlyRootfs": True,
            "CapDrop": ["ALL"],
            "CapAdd": caps,
            "SecurityOpt": ["no-new-privileges:true"],
            "Privileged": False,
            **host,
            "Memory": memory_bytes,
            "PidsLimit": pids,
            "RestartPolicy": {"Name": "no"},
            "AutoRemove": False,
            "LogConfig": {"Type": "json-file", "Config": {"max-size": "64k"}},
        },
    }


def tool_config(
    image: str,
    op: str,
    numbers: tuple[int, ...],
    *,
    disk_volume: str,
    labels: dict[str, str],
    source_volume: str = "",
) -> dict[str, Any]:
    """The tool container: runc, no network, read-only root, only SYS_ADMIN (loop ioctls) and
    MKNOD (loop nodes in its own /dev), the loop devices and nothing else in its device cgroup."""
    binds = [f"{disk_volume}:/d"]
    if source_volume:
        binds.append(f"{source_volume}:/s:ro")
    return confined_config(
        image,
        command(op, *numbers),
        env_path="/sbin:/bin",
        labels=labels,
        caps=["SYS_ADMIN", "MKNOD"],
        memory_bytes=256 * 1024 * 1024,
        pids=64,
        Devices=[
            {
                "PathOnHost": "/dev/loop-control",
                "PathInContainer": "/dev/loop-control",
                "CgroupPermissions": "rwm",
            }
        ],
        DeviceCgroupRules=["b 7:* rwm"],
        Binds=binds,
    )


# The capabilities a chown of another user's tree needs, and no more.
OWN_CAPS = ("CHOWN", "FOWNER", "DAC_READ_SEARCH")


def hand_over_config(
    image: str,
    script: str,
    volume: str,
    target: str,
    ids: tuple[int, int],
    *,
    env_path: str,
    labels: dict[str, str],
    what: str,
) -> dict[str, Any]:
    """The container that gives every file below `target` (where `volume` is mounted) to the
    non-root numeric ids uid:gid, by `script` with the two as its only arguments; anything
    else is refused as Internal naming `what`. For a copied disk and a named volume alike."""
    uid, gid = ids
    numeric = all(isinstance(n, int) and not isinstance(n, bool) for n in (uid, gid))
    if not numeric or not (0 < uid < 2**31 and 0 < gid < 2**31):
        raise Internal(f"{what} owner {uid}:{gid} is not a non-root numeric id")
    return confined_config(
        image,
        ["/bin/sh", "-c", script, "own", str(uid), str(gid)],
        env_path=env_path,
        labels=labels,
        caps=list(OWN_CAPS),
        memory_bytes=64 * 1024 * 1024,
        pids=16,
        Binds=[],  # the volume by name only, never a host path
        Mounts=[
            {
                "Type": "volume",
                "Source": volume,
                "Target": target,
                "VolumeOptions": {"NoCopy": True},
            }
        ],
    )


def own_config(
    image: str, volume: str, uid: int, gid: int, labels: dict[str, str]
) -> dict[str, Any]:
    """The container that gives every file of a copied disk to uid:gid (a fork's, a
    snapshot's own host id): the tool image, runc, no network, a read-only root, and only the
    capabilities a chown of another user's tree needs."""
    return hand_over_config(
        image,
        OWN_SCRIPT,
        volume,
        "/w",
        (uid, gid),
        env_path="/sbin:/bin",
        labels=labels,
        what="disk",
    )


_REAPED = re.compile(r"disk reaped=(?P<dev>/dev/loop\d+)")


def parse_reaped(output: str) -> list[str]:
    """The loop devices a reap detached (or marked to detach when their last user closes)."""
    found = (_REAPED.fullmatch(line.strip()) for line in output.splitlines())
    return [m.group("dev") for m in found if m is not None]


_RESULT = re.compile(
    r"disk (dev=(?P<dev>/dev/loop\d*)? size=(?P<size>\d+) allocated=(?P<alloc>\d+)"
    r"|noroom available=(?P<avail>\d+))"
)


def parse_result(output: str) -> ToolResult:
    """The last result line of the script's output; none is Internal (with the output)."""
    for line in reversed(output.splitlines()):
        found = _RESULT.fullmatch(line.strip())
        if found is None:
            continue
        if found.group("avail") is not None:
            return ToolResult(no_room=True, available_bytes=int(found.group("avail")))
        return ToolResult(
            device=found.group("dev") or "",
            size_bytes=int(found.group("size")),
            allocated_bytes=int(found.group("alloc")),
        )
    raise Internal(f"the disk tool gave no result: {output.strip()[-400:]!r}")
