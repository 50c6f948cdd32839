"""Images from a registry: the pull policy of a create, shared pulls, digests and the sweep.

CreateSession asks `Pulls.ensure` for its image before anything of the session exists, so a
pull that fails leaves nothing behind. Concurrent asks for one reference share one pull (a task
owned here, cancelled on shutdown): a create whose deadline ends stops waiting, the pull goes
on for the others. `max_image_bytes` is checked twice: from the manifest's layer sizes before a
layer is fetched (where the registry declares them), and against the pull's own progress
totals while it runs. Images this server pulled are remembered (`pulled-images.json` in the
data dir) with their last use, which ListImages shows and the sweep reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Collection
from dataclasses import dataclass
from pathlib import Path

from sandboxd import domain_events, images, tenancy
from sandboxd.config import Config
from sandboxd.engine.protocol import Engine, ImageDetails, PullProgress
from sandboxd.errors import (
    FailedPrecondition,
    Internal,
    ResourceExhausted,
    SandboxError,
    Unavailable,
)
from sandboxd.futures import retrieve
from sandboxd.models import PullPolicy, SessionSpec, SessionState
from sandboxd.reasons import Reason
from sandboxd.registry import Reference, RegistryClient, load_credentials
from sandboxd.store import SessionStore

log = logging.getLogger(__name__)

_ID_RE = re.compile(r"\A(?:sha256:)?[0-9a-f]{12,64}\Z")
_PROGRESS_QUEUE = 64
_TOUCH_EVERY_S = 60.0


@dataclass(frozen=True)
class Resolved:
    """The image a session runs: `digest` as reported (registry digest, else the image id)
    and `image_id`, which the sandbox is created from on a resume."""

    digest: str
    image_id: str


@dataclass
class PulledImage:
    name: str
    digest: str
    image_id: str
    size_bytes: int
    pulled_at: float
    last_used_at: float = 0.0


@dataclass(frozen=True)
class PullEvent:
    """Progress of a shared pull, summed over its layers."""

    status: str
    current_bytes: int
    total_bytes: int
    layers_total: int
    layers_done: int


def digest_of(ref: Reference, details: ImageDetails) -> str:
    """The registry digest the engine recorded for this repository, else the image id."""
    for repo_digest in details.repo_digests:
        name, _, digest = repo_digest.partition("@")
        if Reference.parse(name + "@" + digest).name == ref.name:
            return digest
    return details.image_id


class PulledImages:
    """The images this server pulled, persisted as one small JSON file (atomic rewrite)."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self.by_name: dict[str, PulledImage] = {}
        with contextlib.suppress(OSError, ValueError, TypeError):
            for item in json.loads(path.read_text()):
                self.by_name[item["name"]] = PulledImage(**item)

    async def save(self) -> None:
        doc = json.dumps([dataclasses.asdict(p) for p in self.by_name.values()])
        await asyncio.to_thread(self._write, doc)

    def _write(self, doc: str) -> None:
        tmp = self._path.with_suffix(".tmp")
        tmp.write_text(doc)
        os.replace(tmp, self._path)


class _Flight:
    """One pull in progress and whoever watches it."""

    def __init__(self) -> None:
        self.task: asyncio.Task[Resolved] | None = None
        self.watchers: set[asyncio.Queue[PullEvent]] = set()
        self.layers: dict[str, tuple[int, int]] = {}
        self.done: set[str] = set()

    def publish(self, p: PullProgress) -> PullEvent:
        if p.layer and p.total:
            self.layers[p.layer] = (p.current, p.total)
        if p.layer and p.status in ("Pull complete", "Already exists", "Download complete"):
            self.done.add(p.layer)
        event = PullEvent(
            status=p.status,
            current_bytes=sum(c for c, _ in self.layers.values()),
            total_bytes=sum(t for _, t in self.layers.values()),
            layers_total=len(self.layers.keys() | self.done),
            layers_done=len(self.done),
        )
        for q in self.watchers:
            if q.full():  # progress is a gauge: a slow watcher skips lines, never the pull
                q.get_nowait()
            q.put_nowait(event)
        return event


class Pulls:
    def __init__(
        self,
        config: Config,
        engine: Engine,
        *,
        registry: RegistryClient | None = None,
        live_images: Callable[[], Awaitable[set[str]]] | None = None,
        observer: domain_events.Observer = domain_events.SILENT,  # a PullImage's image
    ) -> None:
        self._observer = observer
        self._config = config
        self._engine = engine
        self._registry = registry or RegistryClient()
        self._live_images = live_images  # image ids and names live sessions need
        self._flights: dict[str, _Flight] = {}
        self.records = PulledImages(config.server.data_dir / "pulled-images.json")
        self._last_use: dict[str, float] = {}
        self.pulls_started = 0  # how many pulls this server asked the engine for

    # ----- create ---------------------------------------------------------------------

    async def ensure(self, image: str, policy: PullPolicy) -> Resolved:
        """The image on the engine under `policy`, pulled if need be; its digest."""
        if _ID_RE.match(image):  # an image id (a snapshot): local only, never pulled
            details = await self._engine.inspect_image(image)
            if details is None:
                raise _absent(image)
            return Resolved(details.image_id, details.image_id)
        ref = Reference.parse(image)
        local = await self._engine.inspect_image(image)
        if policy is PullPolicy.NEVER or (policy is PullPolicy.IF_NOT_PRESENT and local):
            if local is None:
                raise _absent(image)
            return Resolved(digest_of(ref, local), local.image_id)
        if policy is PullPolicy.ALWAYS and local is not None and not ref.digest:
            remote = await self._registry.resolve(ref, await self._credentials(ref))
            if any(d.endswith("@" + remote.digest) for d in local.repo_digests):
                return Resolved(remote.digest, local.image_id)
        elif local is not None:  # a digest reference held already: nothing can have moved
            return Resolved(digest_of(ref, local), local.image_id)
        return await self.pull(image)

    async def for_session(
        self, image: str, policy: PullPolicy, *, like: SessionSpec | None = None
    ) -> Resolved:
        """A create's image; `like` (a fork's source session) pins the digest it ran."""
        if like is not None and like.image == image and like.image_id:
            return await self.pinned(like)
        return await self.ensure(image, policy)

    async def pinned(self, spec: SessionSpec) -> Resolved:
        """The exact image a session was created from (resume, fork), pulled by its digest
        when the engine no longer holds it; never what the tag names now."""
        if await self._engine.inspect_image(spec.image_id) is not None:
            return Resolved(spec.image_digest, spec.image_id)
        if spec.image_digest == spec.image_id or _ID_RE.match(spec.image):
            raise _absent(spec.image)
        return await self.pull(Reference.parse(spec.image).by_digest(spec.image_digest))

    async def note_use(self, image_id: str) -> None:
        """A session started from this image now (ListImages' last use, the sweep's clock)."""
        now = time.time()
        previous = self._last_use.get(image_id, 0.0)
        self._last_use[image_id] = now
        changed = False
        for rec in self.records.by_name.values():
            if rec.image_id == image_id and now - rec.last_used_at > _TOUCH_EVERY_S:
                rec.last_used_at, changed = now, True
        if changed and now - previous > _TOUCH_EVERY_S:
            await self.records.save()

    # ----- shared pulls ---------------------------------------------------------------

    async def pull(self, image: str) -> Resolved:
        """Pull (or join the pull in progress of) `image`; the caller may stop waiting."""
        return await asyncio.shield(self._flight(image).task)  # type: ignore[arg-type]

    async def watch(self, image: str) -> AsyncIterator[PullEvent | Resolved]:
        """Progress of the pull of `image` (joined or started), then its result."""
        flight = self._flight(image)
        queue: asyncio.Queue[PullEvent] = asyncio.Queue(_PROGRESS_QUEUE)
        flight.watchers.add(queue)
        task = flight.task
        assert task is not None
        try:
            while not task.done():
                getter = asyncio.ensure_future(queue.get())
                await asyncio.wait({getter, task}, return_when=asyncio.FIRST_COMPLETED)
                if getter.done():
                    yield getter.result()
                else:
                    getter.cancel()
            while not queue.empty():
                yield queue.get_nowait()
            resolved = await task
            self._observer.emit(
                domain_events.ImagePulled(tenancy.current(), image, resolved.digest)
            )
            yield resolved
        finally:
            flight.watchers.discard(queue)

    def _flight(self, image: str) -> _Flight:
        key = images.normalize_reference(image)
        flight = self._flights.get(key)
        if flight is None:
            flight = _Flight()
            flight.task = asyncio.create_task(self._run(key, image, flight), name=f"pull {key}")
            # Every waiter may have gone (deadlines): the outcome is still looked at.
            flight.task.add_done_callback(retrieve)
            self._flights[key] = flight
        return flight

    async def _run(self, key: str, image: str, flight: _Flight) -> Resolved:
        try:
            async with asyncio.timeout(self._config.images.pull_timeout_s):
                return await self._pull(image, flight)
        except TimeoutError:
            raise Unavailable(
                f"pulling {image!r} took longer than pull_timeout_s",
                reason=Reason.REGISTRY_UNREACHABLE,
                metadata={"image": image[:200]},
            ) from None
        finally:
            self._flights.pop(key, None)

    async def _pull(self, image: str, flight: _Flight) -> Resolved:
        ref = Reference.parse(image)
        auth = await self._credentials(ref)
        cap = self._config.images.max_image_bytes
        remote = await self._registry.resolve(ref, auth)
        if remote.size_bytes is not None and remote.size_bytes > cap:
            raise _too_large(image, remote.size_bytes, cap)
        self.pulls_started += 1
        log.info("pulling image %s (registry digest %s)", ref.pullable(), remote.digest)
        stream = self._engine.pull_image(ref.pullable(), auth)
        try:
            async for line in stream:
                event = flight.publish(line)
                if event.total_bytes > cap:
                    raise _too_large(image, event.total_bytes, cap)
        finally:
            await stream.aclose()  # type: ignore[attr-defined]
        details = await self._engine.inspect_image(ref.pullable())
        if details is None:
            raise Internal(
                f"the engine does not hold {image!r} after pulling it",
                reason=Reason.IMAGE_PULL_FAILED,
                metadata={"image": image[:200]},
            )
        digest = digest_of(ref, details)
        now = time.time()
        self.records.by_name[images.normalize_reference(image)] = PulledImage(
            name=images.normalize_reference(image),
            digest=digest,
            image_id=details.image_id,
            size_bytes=details.size_bytes,
            pulled_at=now,
        )
        await self.records.save()
        return Resolved(digest, details.image_id)

    async def _credentials(self, ref: Reference) -> dict[str, str] | None:
        """Read per pull (the operator may rotate them), off the event loop."""
        path = self._config.images.registry_auth_file
        if path is None:
            return None
        return (await asyncio.to_thread(load_credentials, path)).get(ref.registry)

    # ----- ListImages and the sweep ----------------------------------------------------

    async def usable(self, patterns: Collection[str]) -> list[tuple[PulledImage, float]]:
        """Pulled images (and the default image) a caller with these patterns may use."""
        found: list[tuple[PulledImage, float]] = []
        names = dict(self.records.by_name)
        default = images.normalize_reference(self._config.engine.image)
        if default not in names:
            details = await self._engine.inspect_image(self._config.engine.image)
            if details is not None:
                ref = Reference.parse(default)
                names[default] = PulledImage(
                    default, digest_of(ref, details), details.image_id, details.size_bytes, 0.0
                )
        for name, rec in sorted(names.items()):
            try:
                images.check_image(name, patterns)
            except SandboxError:
                continue
            last = max(rec.last_used_at, self._last_use.get(rec.image_id, 0.0))
            found.append((rec, last))
        return found

    async def sweep(self) -> int:
        """Remove pulled images unused for `image_unused_after_s` that no live session needs."""
        horizon = time.time() - self._config.images.unused_after_s
        needed: set[str] = set(await self._live_images()) if self._live_images else set()
        removed = 0
        for name, rec in list(self.records.by_name.items()):
            last = max(rec.last_used_at, rec.pulled_at, self._last_use.get(rec.image_id, 0.0))
            if last > horizon or name in needed or await self._only_name(rec, needed):
                continue
            try:
                await self._engine.remove_image(name)
                if rec.digest != rec.image_id:
                    await self._engine.remove_image(Reference.parse(name).by_digest(rec.digest))
            except SandboxError as exc:
                log.info("pulled image %s not removed yet: %s", name, exc)
                continue
            del self.records.by_name[name]
            removed += 1
        if removed:
            await self.records.save()
        return removed

    async def _only_name(self, rec: PulledImage, needed: set[str]) -> bool:
        """A session needs this image and no other name holds it: untagging would orphan it
        (another name holding the same image keeps it on the engine)."""
        if rec.image_id not in needed:
            return False
        details = await self._engine.inspect_image(rec.image_id)
        return details is None or len(details.repo_tags) <= 1

    async def close(self) -> None:
        """Cancel the pulls in progress (server shutdown)."""
        tasks = [f.task for f in self._flights.values() if f.task is not None]
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(BaseException):
                await t


async def live_images(store: SessionStore) -> set[str]:
    """Image ids and names the sessions that may run again (not ended) need."""
    needed: set[str] = set()
    for session in await store.all():
        if session.state not in (SessionState.EXPIRED, SessionState.FAILED):
            needed.update(
                x
                for x in (session.spec.image_id, images.normalize_reference(session.spec.image))
                if x
            )
    return needed


def _absent(image: str) -> FailedPrecondition:
    return FailedPrecondition(
        f"image {image!r} is not present on the engine and pull_policy NEVER forbids a pull",
        reason=Reason.IMAGE_NOT_FOUND,
        metadata={"image": image[:200]},
    )


def _too_large(image: str, size: int, cap: int) -> ResourceExhausted:
    return ResourceExhausted(
        f"image {image!r} is {size} bytes, over the server's max_image_bytes of {cap}",
        reason=Reason.IMAGE_TOO_LARGE,
        metadata={"image": image[:200], "limit": str(cap)},
    )
