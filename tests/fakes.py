"""In-memory stand-ins for Docker-free unit tests: `FakeEngine` (sandboxd.engine.Engine: the
lifecycle, images, disks) and `FakeCommands` (sandboxd.commands.SandboxCommands: commands in
those sandboxes, asked for in the domain's terms).

The engine keeps sandboxes and images in dicts and behaves like the Docker adapter where the
domain can tell: names are unique (a second create is ENGINE_CONFLICT), a missing image or
sandbox is ENGINE_OBJECT_NOT_FOUND, removal is idempotent, `sandbox_shape` ignores bookkeeping.
Its sandboxes run no agent (`agent_port` is None). The commands run against a per-sandbox dict
of workspace files, by kind: a tool (`ToolRun`), a plain or a supervised command run `tar -x
-f -` (`-C DIR` too), `tar -c -f - .` and `cat FILE`; the helper's own subcommands and dials
are not there (exit 127). The contract tests (tests/engine_contract.py) run the same scenarios
against these fakes and the real engine with its commands.

Test hooks: `fail(method, exc)` makes the next call of a method raise; `lose`, `stop` and
`tamper` change a sandbox behind the server's back.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import itertools
import json
import tarfile
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sandboxd.commands import (
    DetachedExecs,
    Plain,
    SandboxCommand,
    SandboxCommands,
    Supervised,
    ToolRun,
    Where,
)
from sandboxd.engine.protocol import (
    AgentAttach,
    BuildLimits,
    Engine,
    ExecStatus,
    ImageDetails,
    NetworkInfo,
    PullProgress,
    SandboxInfo,
    SandboxRequest,
    SandboxStats,
    SandboxStatus,
)
from sandboxd.errors import FailedPrecondition, Internal, NotFound, ResourceExhausted, SandboxError
from sandboxd.isolation import Isolation
from sandboxd.profile import HELPER_IN_CONTAINER
from sandboxd.storage.disk_tool import checked_id, checked_size
from sandboxd.storage.disks import WORKSPACE_FLAGS, DiskMount, DiskUsage, MountFlags

WORKSPACE = "/workspace"


@dataclass
class FakeSandbox:
    sandbox_id: str
    request: SandboxRequest
    running: bool = False
    files: dict[str, bytes] = field(default_factory=dict)  # workspace-relative path -> content
    dirs: set[str] = field(default_factory=set)
    limits_changed: bool = False
    cpu_shares: int = 1024  # its cgroup's weight: the request's, or the engine's default
    cpu_millis: int = 0  # its CPU limit when changed in place (0: the request's)


@dataclass
class FakeDisk:
    """A disk (sandboxd.storage.disks): its files outlive the sandboxes that mount it."""

    size_bytes: int
    uid: int
    gid: int
    files: dict[str, bytes] = field(default_factory=dict)
    dirs: set[str] = field(default_factory=set)


class FakeDisks:
    """In-memory `Disks`, as the engine's behave where the domain can tell: idempotent create
    (another size is ENGINE_CONFLICT), ENGINE_DISK_FULL past `free_bytes` and
    DISK_STORAGE_UNAVAILABLE without the tool (`tool = False`), both leaving nothing behind;
    a disk a sandbox mounts cannot be deleted (ENGINE_CONFLICT); sandboxes on a disk share its
    files, so a rebuilt sandbox finds them."""

    def __init__(self, engine: FakeEngine) -> None:
        self._engine = engine
        self.disks: dict[str, FakeDisk] = {}
        self.free_bytes = 1 << 40
        self.tool = True
        self.frozen: list[str] = []  # the container each copy paused ("" for none)
        self.orphan_loops: list[str] = []  # loops on removed images, for `reap`

    def _mounted(self, disk_id: str) -> bool:
        return any(b.request.spec.disk_id == disk_id for b in self._engine.sandboxes.values())

    async def create(self, disk_id: str, size_bytes: int, uid: int, gid: int) -> DiskUsage:
        self._engine._call("disks.create")
        checked_id(disk_id)
        checked_size(size_bytes)
        have = self.disks.get(disk_id)
        if have is not None:
            if have.size_bytes != size_bytes:
                raise FailedPrecondition(
                    f"disk {disk_id} has another size", reason="ENGINE_CONFLICT"
                )
            return DiskUsage(disk_id, size_bytes, 4 << 20)
        if not self.tool:
            raise FailedPrecondition("no disk tool image", reason="DISK_STORAGE_UNAVAILABLE")
        if size_bytes > self.free_bytes:
            raise ResourceExhausted("the engine host is full", reason="ENGINE_DISK_FULL")
        self.disks[disk_id] = FakeDisk(size_bytes, uid, gid)
        return DiskUsage(disk_id, size_bytes, 4 << 20)

    async def exists(self, disk_id: str) -> bool:
        self._engine._call("disks.exists")
        return disk_id in self.disks

    async def attach(self, disk_id: str, flags: MountFlags = WORKSPACE_FLAGS) -> str:
        self._engine._call("disks.attach")
        if disk_id not in self.disks:
            raise NotFound(f"disk {disk_id} not found", reason="ENGINE_OBJECT_NOT_FOUND")
        return f"sandboxd-diskmnt-{disk_id}-loop0-{flags.tag()}"

    def mount(self, volume: str, target: str, *, read_only: bool = False) -> DiskMount:
        return DiskMount(volume, target, read_only)

    async def usage(self, disk_id: str) -> DiskUsage:
        self._engine._call("disks.usage")
        disk = self.disks.get(disk_id)
        if disk is None:
            raise NotFound(f"disk {disk_id} not found", reason="ENGINE_OBJECT_NOT_FOUND")
        used = sum(len(v) for v in disk.files.values())
        return DiskUsage(disk_id, disk.size_bytes, (4 << 20) + used)

    async def copy(
        self, source_id: str, disk_id: str, uid: int = 0, gid: int = 0, *, freeze: str = ""
    ) -> DiskUsage:
        self._engine._call("disks.copy")
        source = self.disks.get(source_id)
        if source is None:
            raise NotFound(f"disk {source_id} not found", reason="ENGINE_OBJECT_NOT_FOUND")
        if disk_id not in self.disks:
            taken = (await self.usage(source_id)).allocated_bytes
            if taken > self.free_bytes:
                raise ResourceExhausted("the engine host is full", reason="ENGINE_DISK_FULL")
            self.frozen.append(freeze)
            self.disks[disk_id] = FakeDisk(
                source.size_bytes,
                uid or source.uid,
                gid or source.gid,
                dict(source.files),
                set(source.dirs),
            )
        return await self.usage(disk_id)

    async def delete(self, disk_id: str) -> bool:
        self._engine._call("disks.delete")
        if self._mounted(disk_id):
            raise FailedPrecondition(f"disk {disk_id} is in use", reason="ENGINE_CONFLICT")
        return self.disks.pop(disk_id, None) is not None

    async def reap(self) -> list[str]:
        """The `orphan_loops` (loops whose image was removed while attached), detached."""
        self._engine._call("disks.reap")
        if not self.tool:
            raise FailedPrecondition("no disk tool image", reason="DISK_STORAGE_UNAVAILABLE")
        reaped, self.orphan_loops = self.orphan_loops, []
        return reaped

    async def list_ids(self) -> list[str]:
        self._engine._call("disks.list_ids")
        return sorted(self.disks)


class FakeExecStream:
    """stdin is collected until close_stdin; the command runs then (or at the first read, which
    like the real engine's waits for stdin's end when the exec was opened with stdin)."""

    def __init__(
        self,
        engine: FakeEngine,
        exec_id: str,
        sandbox: FakeSandbox,
        command: SandboxCommand,
        stdin: bool = False,
    ):
        self._stdin_open = asyncio.Event()
        if not stdin:
            self._stdin_open.set()
        self.exec_id = exec_id
        self._engine = engine
        self._sandbox = sandbox
        self._command = command
        self._stdin = bytearray()
        self._output: list[tuple[int, bytes]] | None = None
        self.code: int | None = None

    def _run(self) -> None:
        if self._output is None:
            if not self._sandbox.running:
                raise FailedPrecondition("container is not running", reason="ENGINE_CONFLICT")
            self.code, self._output = _run(self._sandbox, self._command, bytes(self._stdin))

    async def read(self) -> tuple[int, bytes] | None:
        await self._stdin_open.wait()
        self._run()
        assert self._output is not None
        return self._output.pop(0) if self._output else None

    async def read_joined(self, limit: int) -> tuple[int, bytes] | None:
        return await self.read()

    async def write(self, data: bytes) -> None:
        self._stdin += data

    def close_stdin(self) -> None:
        self._stdin_open.set()
        self._run()

    async def close(self) -> None:
        return None

    async def exit_code(self) -> int | None:
        return self.code

    async def wait_exit_code(self) -> int:
        self._run()
        return -1 if self.code is None else self.code


def _workspace_rel(cwd: str) -> str:
    rel = cwd.strip("/")
    rel = rel[len("workspace") :].lstrip("/") if rel.startswith("workspace") else rel
    return "" if rel in ("", ".") else rel


def _run(
    box: FakeSandbox, command: SandboxCommand, stdin: bytes
) -> tuple[int, list[tuple[int, bytes]]]:
    match command:
        case ToolRun(cwd, argv, None):
            return _tool(box, _workspace_rel(cwd), list(argv), stdin)
        case Supervised():
            return _tool(box, _workspace_rel(command.cwd), list(command.argv), stdin)
        case Plain(argv):
            return _tool(box, "", list(argv), stdin)
        case _:  # the helper's own subcommands and compression, dials: the fake has no helper
            return 127, [(2, f"{HELPER_IN_CONTAINER}: not found\n".encode())]


def _tool(
    box: FakeSandbox, cwd: str, argv: list[str], stdin: bytes
) -> tuple[int, list[tuple[int, bytes]]]:
    if argv[:1] == ["tar"] and "-x" in argv:
        if "-C" in argv:
            cwd = _workspace_rel(argv[argv.index("-C") + 1])
        return _untar(box, cwd, stdin)
    if argv[:1] == ["tar"] and "-c" in argv:
        return 0, [(1, _tar(box, cwd))]
    if argv[:1] == ["cat"] and len(argv) == 2:
        rel = _workspace_rel(argv[1])
        if rel not in box.files:
            return 1, [(2, f"cat: can't open '{argv[1]}': No such file or directory\n".encode())]
        return 0, [(1, box.files[rel])] if box.files[rel] else []
    return 127, [(2, f"{argv[0] if argv else ''}: not found\n".encode())]


def _untar(box: FakeSandbox, cwd: str, data: bytes) -> tuple[int, list[tuple[int, bytes]]]:
    total = sum(len(v) for v in box.files.values())
    cap = box.request.spec.limits.workspace_bytes
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
            for member in tar:
                name = "/".join(p for p in (cwd, member.name.strip("./")) if p)
                if member.isdir():
                    box.dirs.add(name)
                elif member.isfile():
                    content = tar.extractfile(member).read()  # type: ignore[union-attr]
                    total += len(content)
                    if total > cap:
                        return 1, [(2, b"tar: write error: No space left on device\n")]
                    box.files[name] = content
    except tarfile.TarError as exc:
        return 1, [(2, f"tar: {exc}\n".encode())]
    return 0, []


def _tar(box: FakeSandbox, cwd: str) -> bytes:
    buf = io.BytesIO()
    prefix = cwd + "/" if cwd else ""
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for d in sorted(box.dirs):
            if d.startswith(prefix):
                info = tarfile.TarInfo("./" + d[len(prefix) :])
                info.type = tarfile.DIRTYPE
                info.mode = 0o755
                tar.addfile(info)
        for path, content in sorted(box.files.items()):
            if path.startswith(prefix):
                info = tarfile.TarInfo("./" + path[len(prefix) :])
                info.size = len(content)
                info.mode = 0o644
                tar.addfile(info, io.BytesIO(content))
    return buf.getvalue()


_MEMORY = b"fake memory image\n"  # a checkpoint is not the workspace's tar


class FakeEngine:
    def __init__(self, images: Sequence[str] = ("sandboxd-runtime:busybox",)) -> None:
        self.images: dict[str, dict[str, str]] = {image: {} for image in images}
        self.builds: list[str] = []  # the Dockerfiles build_image was given
        self.image_sizes: dict[str, int] = {}  # by name; inspect_image says 1000 for others
        self.build_step_s = 0.0  # how long each build step takes (a watcher's chance)
        self.build_steps: list[str] = []  # every build step started, in order
        self.commit_bytes = 1000  # the size of the image commit_sandbox makes
        self.sandboxes: dict[str, FakeSandbox] = {}
        self.calls: list[str] = []
        self._ids = itertools.count(1)
        self._failures: dict[str, SandboxError] = {}
        self.stats: dict[str, SandboxStats] = {}
        self.ooms: asyncio.Queue[str] = asyncio.Queue()

        # The isolation tiers whose runtime is "registered"; a test adds or removes some.
        self.tiers: set[Isolation] = {Isolation.RUNC}
        self.gvisor_cpu = False  # a remote engine: a running gVisor sandbox's CPU is fixed
        # A registry the fake pulls from: pullable reference -> (digest, layer sizes).
        self.remote: dict[str, tuple[str, tuple[int, ...]]] = {}
        self.digests: dict[str, str] = {}  # image name -> registry digest once pulled
        # Networks (as an older server left them): id -> (name, labels, containers attached).
        self.networks: dict[str, tuple[str, dict[str, str], int]] = {}
        self.disks = FakeDisks(self)
        # Memory checkpoints: the engine's own copy by (sandbox, name), the workspace as a tar
        # (the fake's "memory"); `experimental` False is an engine without checkpoints.
        self.experimental = True
        self.checkpoints: dict[tuple[str, str], bytes] = {}

    # ----- test hooks ---------------------------------------------------------------------

    def fail(self, method: str, exc: SandboxError | None = None) -> None:
        """The next call of `method` raises `exc` (an internal engine error by default)."""
        self._failures[method] = exc or Internal(f"injected failure of {method}")

    def _call(self, method: str) -> None:
        self.calls.append(method)
        exc = self._failures.pop(method, None)
        if exc is not None:
            raise exc

    def lose(self, sandbox_id: str) -> None:
        self.sandboxes.pop(sandbox_id, None)

    def stop(self, sandbox_id: str) -> None:
        self.sandboxes[sandbox_id].running = False

    def tamper(self, sandbox_id: str) -> None:
        self.sandboxes[sandbox_id].limits_changed = True

    def _get(self, sandbox_id: str) -> FakeSandbox:
        box = self.sandboxes.get(sandbox_id)
        if box is None:
            raise NotFound(
                f"No such container: {sandbox_id[:12]}", reason="ENGINE_OBJECT_NOT_FOUND"
            )
        return box

    # ----- Engine -------------------------------------------------------------------------

    async def ping(self) -> str:
        self._call("ping")
        return "fake"

    async def image_exists(self, image: str) -> bool:
        self._call("image_exists")
        # By name, or by the id inspect_image gives it (a built template's image).
        return image in self.images or any(
            image == "sha256:" + hashlib.sha256(name.encode()).hexdigest() for name in self.images
        )

    async def isolation_tiers(self) -> frozenset[Isolation]:
        self._call("isolation_tiers")
        return frozenset(self.tiers)

    def sandbox_shape(self, request: SandboxRequest) -> str:
        spec = request.spec
        shaped = {
            "image": spec.image,
            "limits": spec.limits.to_dict(),
            "env": spec.env,
            "user": spec.user,
            "egress_port": request.egress_port,
            "isolation": spec.isolation.value,
            "storage": spec.storage.value,
        }
        return hashlib.sha256(json.dumps(shaped, sort_keys=True).encode()).hexdigest()

    async def create_sandbox(self, request: SandboxRequest) -> str:
        self._call("create_sandbox")
        if request.spec.image not in self.images:
            raise NotFound(f"No such image: {request.spec.image}", reason="ENGINE_OBJECT_NOT_FOUND")
        if any(b.request.name == request.name for b in self.sandboxes.values()):
            raise FailedPrecondition(
                f'Conflict. The container name "/{request.name}" is already in use',
                reason="ENGINE_CONFLICT",
            )
        if request.spec.isolation not in self.tiers:  # Docker: "unknown or invalid runtime name"
            raise Internal(f"unknown or invalid runtime name: {request.spec.isolation.value}")
        box = FakeSandbox("", request, cpu_shares=request.cpu_shares or 1024)
        if request.spec.on_disk:  # mounted from its disk, as the engine's attach does
            await self.disks.attach(request.spec.disk_id)
            disk = self.disks.disks[request.spec.disk_id]
            box.files, box.dirs = disk.files, disk.dirs
        sandbox_id = hashlib.sha256(f"fake-{next(self._ids)}".encode()).hexdigest()
        box.sandbox_id = sandbox_id
        self.sandboxes[sandbox_id] = box
        self._call("create_sandbox:after")  # a create whose answer is lost
        return sandbox_id

    async def start_sandbox(self, sandbox_id: str) -> None:
        self._call("start_sandbox")
        self._get(sandbox_id).running = True

    def cpu_in_place(self, isolation: Isolation) -> bool:
        """runc always; gVisor as a local Docker engine's host cgroup allows (`gvisor_cpu`)."""
        return isolation is Isolation.RUNC or self.gvisor_cpu

    async def set_cpu_shares(self, sandbox_id: str, shares: int, cpu_millis: int = 0) -> None:
        self._call("set_cpu_shares")
        box = self._get(sandbox_id)
        if not self.cpu_in_place(box.request.spec.isolation):  # as Docker answers for runsc
            raise Internal("runsc did not terminate successfully: no update subcommand")
        box.cpu_shares = shares
        if cpu_millis:
            box.cpu_millis = cpu_millis

    async def remove_sandbox(self, sandbox_id: str) -> None:
        self._call("remove_sandbox")
        self.sandboxes.pop(sandbox_id, None)

    async def inspect_sandbox(
        self, sandbox_id: str, expected: SandboxRequest | None = None
    ) -> SandboxStatus | None:
        self._call("inspect_sandbox")
        box = self.sandboxes.get(sandbox_id)
        if box is None:
            return None
        conforms = expected is None or (
            not box.limits_changed
            and box.request.spec.limits == expected.spec.limits
            and box.request.spec.isolation is expected.spec.isolation
            # The workspace its own: a tmpfs, or a volume of the expected disk.
            and box.request.spec.storage is expected.spec.storage
            and box.request.spec.disk_id == expected.spec.disk_id
        )
        return SandboxStatus(running=box.running, conforms=conforms)

    async def list_sandboxes(self, owner_id: str) -> list[SandboxInfo]:
        self._call("list_sandboxes")
        return [
            SandboxInfo(
                sandbox_id=b.sandbox_id,
                name=b.request.name,
                session_id=b.request.session_id,
                pool_generation=b.request.pool_generation,
                running=b.running,
            )
            for b in self.sandboxes.values()
            if b.request.owner_id == owner_id
        ]

    @property
    def agent_port(self) -> AgentAttach | None:
        return None  # its sandboxes run no agent: FakeCommands runs their commands

    async def memory_checkpoints(self) -> str:
        self._call("memory_checkpoints")
        if not self.experimental:
            return "the Docker engine is not in experimental mode (checkpoints need it)"
        return "" if Isolation.GVISOR in self.tiers else "no gVisor runtime is registered"

    async def checkpoint_sandbox(self, sandbox_id: str, name: str) -> None:
        self._call("checkpoint_sandbox")
        box = self._get(sandbox_id)
        self.checkpoints[(sandbox_id, name)] = _MEMORY + _tar(box, "")
        box.running = False  # frozen, written, stopped
        self._call("checkpoint_sandbox:after")  # failing past the point of no return

    async def read_checkpoint(self, sandbox_id: str, name: str) -> AsyncIterator[bytes]:
        self._call("read_checkpoint")
        data = self.checkpoints[(sandbox_id, name)]
        for i in range(0, len(data), 4096):
            yield data[i : i + 4096]

    async def restore_sandbox(
        self, sandbox_id: str, name: str, chunks: AsyncIterator[bytes]
    ) -> None:
        self._call("restore_sandbox")
        box = self._get(sandbox_id)
        data = b"".join([c async for c in chunks])
        self._call("restore_sandbox:placed")
        box.files, box.dirs = {}, set()
        _untar(box, "", data.removeprefix(_MEMORY))
        box.running = True

    async def commit_sandbox(
        self, sandbox_id: str, repository: str, tag: str, labels: Mapping[str, str]
    ) -> str:
        self._call("commit_sandbox")
        self._get(sandbox_id)
        image_id = "sha256:" + hashlib.sha256(f"{repository}:{tag}".encode()).hexdigest()
        self.images[image_id] = dict(labels)
        self.image_sizes[image_id] = self.commit_bytes
        return image_id

    async def remove_work_leftovers(self, owner_id: str) -> list[str]:
        self._call("remove_work_leftovers")
        return []  # the fake's commit leaves nothing behind

    async def remove_image(self, image: str) -> None:
        self._call("remove_image")
        self.images.pop(image, None)

    async def list_images(self, owner_id: str) -> list[str]:
        self._call("list_images")
        return [
            i for i, labels in self.images.items() if labels.get("io.sandboxd.owner") == owner_id
        ]

    # ----- observation ---------------------------------------------------------------------

    async def list_networks(self, owner_id: str) -> list[NetworkInfo]:
        self._call("list_networks")
        return [
            NetworkInfo(network_id=nid, name=name, containers=held)
            for nid, (name, labels, held) in self.networks.items()
            if labels.get("io.sandboxd.owner") == owner_id
        ]

    async def remove_network(self, network_id: str) -> None:
        self._call("remove_network")
        held = self.networks.get(network_id, ("", {}, 0))[2]
        if held:
            raise Internal(f"network {network_id} has active endpoints")
        self.networks.pop(network_id, None)

    def set_stats(self, sandbox_id: str, stats: SandboxStats) -> None:
        self.stats[sandbox_id] = stats

    def oom_kill(self, sandbox_id: str) -> None:
        """As if the kernel OOM-killed a process in the sandbox."""
        self.ooms.put_nowait(sandbox_id)

    async def sandbox_stats(self, sandbox_id: str) -> SandboxStats:
        self._call("sandbox_stats")
        if sandbox_id not in self.sandboxes:
            raise NotFound(f"no sandbox {sandbox_id}")
        return self.stats.get(sandbox_id, SandboxStats())

    async def oom_kills(self, owner_id: str) -> AsyncIterator[str]:
        while True:
            sandbox_id = await self.ooms.get()
            box = self.sandboxes.get(sandbox_id)
            if box is not None and box.request.owner_id == owner_id:
                yield sandbox_id

    # ----- registry pulls -------------------------------------------------------------------

    async def inspect_image(self, image: str) -> ImageDetails | None:
        self._call("inspect_image")
        for name in self.images:
            image_id = "sha256:" + hashlib.sha256(name.encode()).hexdigest()
            digest = self.digests.get(name, "")
            repo = name.rsplit(":", 1)[0] if "/" in name or ":" in name else name
            refs = {name, image_id, f"{repo}@{digest}" if digest else name}
            if image in refs:
                return ImageDetails(
                    image_id=image_id,
                    repo_digests=(f"{repo}@{digest}",) if digest else (),
                    repo_tags=(name,),
                    size_bytes=self.image_sizes.get(name, 1000),
                )
        return None

    async def pull_image(
        self, reference: str, auth: Mapping[str, str] | None = None
    ) -> AsyncIterator[PullProgress]:
        self._call("pull_image")
        if reference not in self.remote:
            raise NotFound(f"manifest unknown: {reference}", reason="REGISTRY_IMAGE_NOT_FOUND")
        digest, layers = self.remote[reference]
        for i, size in enumerate(layers):
            await asyncio.sleep(0)
            yield PullProgress("Downloading", f"layer{i}", size, size)
            yield PullProgress("Pull complete", f"layer{i}")
        self.images[reference] = {}
        self.digests[reference] = digest

    # ----- image builds ---------------------------------------------------------------------

    async def build_image(
        self,
        context: Path,
        *,
        dockerfile: str,
        tag: str,
        labels: Mapping[str, str],
        limits: BuildLimits,
    ) -> AsyncGenerator[str, None]:
        """Runs no step: logs each instruction, fails on `RUN false`, grows the image by N
        bytes on `RUN write N` (an intermediate image of that size, as the engine commits
        one), tags `tag` with `labels` (and the Dockerfile's LABELs) when all went well."""
        self._call("build_image")
        with tarfile.open(context) as tar:
            member = tar.extractfile(dockerfile)
            assert member is not None
            text = member.read().decode()
        self.builds.append(text)
        own = dict(labels)
        lines = text.splitlines()
        size = self.image_sizes.get(lines[0].removeprefix("FROM ").split()[0], 1000)
        for n, line in enumerate(lines, 1):
            await asyncio.sleep(self.build_step_s)
            self.build_steps.append(line)
            yield f"Step {n} : {line}"
            if line.startswith("LABEL "):
                key, _, value = line[6:].partition("=")
                own[key] = value.strip('"')
            if line.startswith("RUN write "):
                size += int(line.split()[2])
                self.images[f"intermediate-{n}"] = dict(own)
                self.image_sizes[f"intermediate-{n}"] = size
            if line.strip() == "RUN false":
                self.images[f"intermediate-{n}"] = dict(own)
                raise FailedPrecondition(
                    "The command '/bin/sh -c false' returned a non-zero code: 1",
                    reason="TEMPLATE_BUILD_FAILED",
                )
        self.images[tag] = own
        self.image_sizes[tag] = size

    async def build_usage(self, labels: Mapping[str, str]) -> int:
        self._call("build_usage")
        return max(
            (
                self.image_sizes.get(name, 1000)
                for name, own in self.images.items()
                if all(own.get(k) == v for k, v in labels.items())
            ),
            default=0,
        )

    async def prune_images(self, labels: Mapping[str, str]) -> None:
        self._call("prune_images")
        for name, own in list(self.images.items()):
            if all(own.get(k) == v for k, v in labels.items()):
                del self.images[name]


class FakeCommands:
    """Commands in the fake engine's sandboxes (sandboxd.commands.SandboxCommands), by kind.

    Calls are counted on the engine as `exec`, `exec_resize` and `exec_status` (its
    `fail` hook applies to them too), the names the command path's engine calls have."""

    def __init__(self, engine: FakeEngine) -> None:
        self._engine = engine
        self._execs: dict[str, FakeExecStream] = {}

    @property
    def detached(self) -> DetachedExecs | None:
        return None  # no agent keeps anything

    @contextlib.asynccontextmanager
    async def open(
        self, where: Where, command: SandboxCommand, *, stdin: bool = False
    ) -> AsyncIterator[FakeExecStream]:
        engine = self._engine
        engine._call("exec")
        box = engine._get(where.container_id)
        if not box.running:
            raise FailedPrecondition(
                f"container {where.container_id[:12]} is not running", reason="ENGINE_CONFLICT"
            )
        stream = FakeExecStream(engine, f"exec-{next(engine._ids)}", box, command, stdin)
        self._execs[stream.exec_id] = stream
        try:
            yield stream
        finally:
            await stream.close()

    async def resize(self, exec_id: str, rows: int, cols: int) -> None:
        self._engine._call("exec_resize")

    async def status(self, exec_id: str) -> ExecStatus:
        self._engine._call("exec_status")
        stream = self._execs[exec_id]
        return ExecStatus(running=stream.code is None, exit_code=stream.code)


if TYPE_CHECKING:  # `make lint` checks the fakes against the ports they stand in for

    def _conforms(engine: FakeEngine, commands: FakeCommands) -> tuple[Engine, SandboxCommands]:
        return engine, commands


class FakeArchive:
    """The archive side of snapshots over the fake's files: export is `tar -c` of the
    workspace, import replaces it with the tar (what ArchiveIO does through the helper)."""

    def __init__(self, engine: FakeEngine) -> None:
        self._engine = engine
        self.export_gate: Any = None  # an asyncio.Event an export waits on, when set
        self.exported: Any = None  # an asyncio.Event set once an export has read the tar

    async def export(self, session: Any, path: str) -> AsyncIterator[bytes]:
        data = _tar(self._engine._get(session.container_id), _workspace_rel(path))
        if self.exported is not None:
            self.exported.set()
        if self.export_gate is not None:  # the tar is read; the stream has not ended yet
            await self.export_gate.wait()
        yield data

    async def check_restorable(self, session: Any, chunks: AsyncIterator[bytes]) -> None:
        """The fake restores whatever it exported: read it through, as the real check does."""
        del session
        async for _ in chunks:
            pass

    async def tidy(self, session: Any) -> None:
        """The fake unpacks in one step: it never leaves a staging folder to remove."""
        del session

    async def import_(
        self,
        session: Any,
        path: str,
        replace: bool,
        chunks: AsyncIterator[bytes],
        *,
        trusted: bool = False,
    ) -> None:
        del trusted  # the fake unpacks everything it is given
        data = b"".join([c async for c in chunks])
        box = self._engine._get(session.container_id)
        if replace:
            box.files.clear()
            box.dirs.clear()
        code, out = _untar(box, _workspace_rel(path), data)
        if code != 0:
            raise SandboxError(b"".join(d for _, d in out).decode())
