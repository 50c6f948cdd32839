"""Templates a tenant builds from a Dockerfile, and the built-in ones: build, look up, delete.

A template belongs to the tenant that built it; others get NOT_FOUND, as for a name never used.
A build starts only from a template or an allowlisted image (`dockerfile`) that declares no
ONBUILD triggers, runs with no network and the server's memory, CPU and time limits, and
stops at a size limit (`build_run`): `max_image_bytes`, or the room left in the tenant's image
quota (`sandboxd.templates.quota`) when that is less. It leaves nothing behind when it fails, is
cancelled or passes a limit: every image it made carries its build label and is pruned by
it. The image it makes passes the session image rules again afterwards (no VOLUMEs).

Deleting a template that a live session (one that may run again) was created from is refused
(TEMPLATE_IN_USE): the session's sandbox, or its restart after a suspension, needs the image.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

from sandboxd import domain_events, images, paging, tenancy
from sandboxd.config import Config
from sandboxd.engine.protocol import BuildLimits, Engine
from sandboxd.errors import (
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    SandboxError,
)
from sandboxd.models import SessionState
from sandboxd.reasons import Reason
from sandboxd.store import SessionStore
from sandboxd.templates import build_run, context, dockerfile
from sandboxd.templates.builtin import BUILTIN_TEMPLATES
from sandboxd.templates.builtin_images import BuiltinImages
from sandboxd.templates.quota import ImageQuota
from sandboxd.templates.store import TemplateRecord, TemplateState, TemplateStore

LABEL_BUILD = "io.sandboxd.template.build"
LABEL_TEMPLATE = "io.sandboxd.template.name"
TAG_REPOSITORY = images.TEMPLATE_REPOSITORY
SETTLE_S = 3.0  # a cancelled build's last step may still commit; prune again after this
SETTLE_ROUNDS = 10
CLOSE_GRACE_S = 5.0  # the longest shutdown waits for that prune beyond its settle time

InUse = Callable[[str, str], Awaitable[bool]]


@dataclass(frozen=True)
class BuildLog:
    line: str


def _not_found(name: str) -> NotFound:
    return NotFound(
        f"no template {name[:64]!r} (built-in: {', '.join(BUILTIN_TEMPLATES)})",
        reason=Reason.TEMPLATE_NOT_FOUND,
        metadata={"template": name[:64]},
    )


def _builtin_refused(name: str, what: str) -> FailedPrecondition:
    return FailedPrecondition(
        f"{name!r} is a built-in template: it cannot be {what}",
        reason=Reason.TEMPLATE_BUILTIN,
        metadata={"template": name},
    )


class Templates:
    def __init__(
        self,
        config: Config,
        engine: Engine,
        store: TemplateStore,
        spool_dir: Path,
        in_use: InUse,
        *,
        quota: ImageQuota,
        settle_s: float = SETTLE_S,
        watch_every_s: float = build_run.WATCH_EVERY_S,
        builtins: BuiltinImages | None = None,
        observer: domain_events.Observer = domain_events.SILENT,  # builds done, deletions
    ) -> None:
        self._observer = observer
        self._builtins = builtins  # None: built-in images are made by `make image` alone
        self._settle_s = settle_s
        self._quota = quota
        self._watch_every_s = watch_every_s
        self._config = config
        self._engine = engine
        self._store = store
        self._spool_dir = spool_dir
        self._in_use = in_use
        self._building: set[tuple[str, str]] = set()
        self._cleanups: set[asyncio.Task[None]] = set()
        self._started = datetime.now(UTC)

    async def close(self) -> None:
        """Shutdown: the pending prunes of abandoned builds run first (an abandoned step's
        commit may still land), bounded by their settle time; then any left is cancelled."""
        pending = list(self._cleanups)
        if pending:
            await asyncio.wait(pending, timeout=2 * self._settle_s + CLOSE_GRACE_S)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        if self._builtins is not None:
            await self._builtins.close()

    def _builtin_images(self) -> dict[str, str]:
        return {
            "busybox": self._config.engine.image,
            "python": self._config.templates.python_image,
            "base": self._config.templates.base_image,
        }

    async def recover(self) -> None:
        """Prune what failed builds left, a build the server's crash cut short among them
        (called when the engine answers, at start-up and after an outage)."""
        for build_id in await self._store.failed_build_ids():
            await self._prune(build_id)
        if self._builtins is not None:  # the built-in images this engine lacks, built aside
            await self._builtins.ensure_all()

    async def require_ready(self, image: str) -> None:
        """A create about to run `image`: TEMPLATE_NOT_READY while it is a built-in's image the
        server is still building (or failed to), never a pull."""
        if self._builtins is not None:
            await self._builtins.require(image)

    # ----- reads ------------------------------------------------------------------------

    async def ready_images(self, tenant: str) -> dict[str, str]:
        """The tenant's built templates, name -> image id (CreateSession `template`)."""
        return {
            t.name: t.image
            for t in await self._store.of_tenant(tenant)
            if t.state is TemplateState.READY
        }

    async def _builtin(self, name: str) -> TemplateRecord:
        image = self._builtin_images()[name]
        status = await self._builtins.status(name) if self._builtins is not None else None
        if status is not None:
            return TemplateRecord(
                name, status.state, self._started, builtin=True, image=image, message=status.message
            )
        details = await self._engine.inspect_image(image)
        if details is None:
            return TemplateRecord(
                name,
                TemplateState.FAILED,
                self._started,
                builtin=True,
                image=image,
                message=f"image {image} is not on the engine (make image / make python-image)",
            )
        return TemplateRecord(
            name,
            TemplateState.READY,
            self._started,
            builtin=True,
            image=image,
            size_bytes=details.size_bytes,
        )

    async def get(self, name: str) -> TemplateRecord:
        if name in BUILTIN_TEMPLATES:
            return await self._builtin(name)
        found = await self._store.get(tenancy.current(), name)
        if found is None:
            raise _not_found(name)
        return found

    async def list(self, page_size: int, page_token: str) -> tuple[list[TemplateRecord], str]:
        size = paging.page_size(page_size)
        bound = f"ListTemplates|{tenancy.current()}"  # a token answers this list only
        after = paging.decode_token(page_token, lambda k: bool(dockerfile.NAME_RE.match(k)), bound)
        own = await self._store.of_tenant(tenancy.current())
        everything = [await self._builtin(n) for n in BUILTIN_TEMPLATES] + own
        everything.sort(key=lambda t: t.name)
        rest = [t for t in everything if t.name > after]
        page = rest[:size]
        token = paging.encode_token(page[-1].name, bound) if len(rest) > size else ""
        return page, token

    # ----- delete -----------------------------------------------------------------------

    async def delete(self, name: str) -> None:
        if name in BUILTIN_TEMPLATES:
            raise _builtin_refused(name, "deleted")
        tenant = tenancy.current()
        found = await self._store.get(tenant, name)
        if found is None:
            raise _not_found(name)
        if (tenant, name) in self._building:
            raise FailedPrecondition(
                f"template {name!r} is being built", reason=Reason.TEMPLATE_BUSY
            )
        if await self._in_use(tenant, name):
            raise FailedPrecondition(
                f"template {name!r} is used by live sessions: delete them first",
                reason=Reason.TEMPLATE_IN_USE,
                metadata={"template": name},
            )
        await self._store.delete(tenant, name)
        await self._remove(found)
        self._observer.emit(domain_events.TemplateDeleted(tenant, name))

    async def _remove(self, t: TemplateRecord) -> None:
        if t.build_id:
            await self._engine.prune_images({LABEL_BUILD: t.build_id})

    # ----- build ------------------------------------------------------------------------

    async def _resolve_base(self, tenant: str, base: str) -> tuple[str, int]:
        """The image id a FROM names, as inspected here, and its size: the engine builds on
        that id, so a tag moved after this check cannot change the base."""
        builtin = self._builtin_images()
        own = await self._store.get(tenant, base)
        if base in builtin:
            image = builtin[base]
        elif own is not None and own.state is TemplateState.READY:
            image = own.image
        else:
            try:
                images.check_image(
                    base,
                    images.allowed_patterns(
                        self._config.images.allowlist,
                        tenancy.current_grants().image_allowlist,
                        default_image=self._config.engine.image,
                    ),
                )
            except PermissionDenied:
                raise InvalidArgument(
                    f"FROM {base[:100]!r}: neither a template ({', '.join(BUILTIN_TEMPLATES)} "
                    "or one of yours) nor an image on this server's allowlist",
                    reason=Reason.TEMPLATE_FROM_NOT_ALLOWED,
                    metadata={"image": base[:100]},
                ) from None
            image = base
        details = await self._engine.inspect_image(image)
        if details is None or not await self._engine.image_exists(image):
            raise InvalidArgument(
                f"FROM {base[:100]!r}: the image is not present on the engine",
                reason=Reason.TEMPLATE_FROM_NOT_ALLOWED,
                metadata={"image": base[:100]},
            )
        if details.onbuild:
            raise InvalidArgument(
                f"FROM {base[:100]!r}: the image declares ONBUILD triggers, which the build "
                f"would run unchecked ({details.onbuild[0][:100]!r}...)",
                reason=Reason.TEMPLATE_FROM_NOT_ALLOWED,
                metadata={"image": base[:100]},
            )
        return details.image_id, details.size_bytes

    def _claim(self, tenant: str, name: str) -> None:
        if (tenant, name) in self._building:
            raise FailedPrecondition(
                f"template {name!r} is being built", reason=Reason.TEMPLATE_BUSY
            )
        running = sum(1 for t, _ in self._building if t == tenant)
        if running >= self._config.templates.max_builds:
            raise ResourceExhausted(
                f"{running} template builds are running (template_max_builds); retry later",
                reason=Reason.TEMPLATE_BUILDS_BUSY,
            )
        self._building.add((tenant, name))

    async def build(
        self, name: str, text: str, chunks: AsyncIterator[bytes]
    ) -> AsyncIterator[BuildLog | TemplateRecord]:
        """Log lines as the engine reports them, then the READY template."""
        dockerfile.check_name(name)
        if name in BUILTIN_TEMPLATES:
            raise _builtin_refused(name, "built over")
        parsed = dockerfile.parse(text)
        tenant = tenancy.current()
        self._claim(tenant, name)
        try:
            base, base_bytes = await self._resolve_base(tenant, parsed.base)
            room = await self._quota.check_room(tenant, f"template {name!r}", besides=name)
            limit = build_run.SizeLimit(room, self._config.images.max_image_bytes, base_bytes)
            async for event in self._build(tenant, name, parsed, base, chunks, limit):
                if isinstance(event, TemplateRecord):  # READY: the last
                    self._observer.emit(
                        domain_events.TemplateBuilt(tenant, name, event.image, event.size_bytes)
                    )
                yield event
        finally:
            self._building.discard((tenant, name))
            self._quota.building.pop((tenant, name), None)

    async def _build(
        self,
        tenant: str,
        name: str,
        parsed: dockerfile.Dockerfile,
        base: str,
        chunks: AsyncIterator[bytes],
        limit: build_run.SizeLimit,
    ) -> AsyncIterator[BuildLog | TemplateRecord]:
        build_id = secrets.token_hex(8)
        previous = await self._store.get(tenant, name)
        keep_previous = previous is not None and previous.state is TemplateState.READY
        record = TemplateRecord(
            name,
            TemplateState.BUILDING,
            datetime.now(UTC),
            tenant=tenant,
            tag=f"{TAG_REPOSITORY}:{build_id}",
            build_id=build_id,
            message="building",
        )
        if not keep_previous:
            await self._store.put(record)
        path = self._spool_dir / f"template-{build_id}.tar"
        await asyncio.to_thread(self._spool_dir.mkdir, parents=True, exist_ok=True)
        try:
            await context.spool(chunks, path, self._config.templates.max_context_bytes)
            member = f".sandboxd-dockerfile-{build_id}"
            text = parsed.rewritten(base, (LABEL_BUILD, build_id))
            await asyncio.to_thread(context.add_dockerfile, path, member, text)
            judge = self._judge(tenant, name, limit)
            recent: deque[str] = deque(maxlen=build_run.RECENT_LINES)
            try:
                async for line in self._run(path, member, record, judge, limit.file_bytes):
                    recent.append(line)
                    yield BuildLog(line)
            except FailedPrecondition as e:
                if e.reason == Reason.TEMPLATE_BUILD_FAILED and build_run.hit_file_limit(recent):
                    raise limit.file_limit_refused(name, self._quota.refused) from e
                raise
            details = await self._engine.inspect_image(record.tag)
            await self._engine.image_exists(record.tag)  # refuses VOLUMEs (from the base)
            if details is None:
                raise FailedPrecondition(
                    "the build finished without an image", reason=Reason.TEMPLATE_BUILD_FAILED
                )
            if (refusal := judge(details.size_bytes)) is not None:
                raise refusal
            record = replace(
                record,
                state=TemplateState.READY,
                image=details.image_id,
                size_bytes=details.size_bytes,
                message="",
            )
            await self._store.put(record)
        except BaseException as e:
            await asyncio.shield(self._prune(build_id))
            self._clean_up(build_id)
            if not keep_previous:
                message = e.message if isinstance(e, SandboxError) else "the build was cancelled"
                await asyncio.shield(
                    self._store.put(replace(record, state=TemplateState.FAILED, message=message))
                )
            raise
        finally:
            with contextlib.suppress(OSError):
                await asyncio.to_thread(path.unlink, missing_ok=True)
        if previous is not None and keep_previous:
            await self._remove(previous)
        yield record

    def _judge(self, tenant: str, name: str, limit: build_run.SizeLimit) -> build_run.Judge:
        """The refusal for a build that has made `size` bytes: over `max_image_bytes`, or
        over the tenant's room less what its other running builds have made."""

        def judge(size: int) -> SandboxError | None:
            self._quota.building[(tenant, name)] = size
            if (refusal := limit.too_large(size)) is not None:
                return refusal
            if size > limit.room - self._quota.running(tenant, besides=name):
                return self._quota.refused(f"template {name!r} ({size} bytes so far)")
            return None

        return judge

    def _run(
        self,
        path: Path,
        member: str,
        record: TemplateRecord,
        judge: build_run.Judge,
        file_bytes: int,
    ) -> AsyncIterator[str]:
        cfg = self._config.templates
        limits = BuildLimits(cfg.build_memory_bytes, cfg.build_millicpus, file_bytes)
        labels = {LABEL_BUILD: record.build_id}
        lines = self._engine.build_image(
            path,
            dockerfile=member,
            tag=record.tag,
            labels={**labels, LABEL_TEMPLATE: record.name},
            limits=limits,
        )
        return build_run.run(
            lines,
            timeout_s=cfg.build_timeout_s,
            measure=lambda: self._engine.build_usage(labels),
            judge=judge,
            abandon=lambda: self._prune(record.build_id),
            watch_every_s=self._watch_every_s,
        )

    async def _prune(self, build_id: str) -> None:
        with contextlib.suppress(SandboxError):
            await self._engine.prune_images({LABEL_BUILD: build_id})

    def _clean_up(self, build_id: str) -> None:
        """Prune again until an abandoned build has settled: its last commit may land late
        (measured: a 400 MB step's commit landed after a prune 3 s on), so every `settle_s`,
        until two measures in a row find nothing of it, for at most SETTLE_ROUNDS."""

        async def prune() -> None:
            quiet = 0
            for _ in range(SETTLE_ROUNDS):
                await asyncio.sleep(self._settle_s)
                await self._prune(build_id)
                with contextlib.suppress(SandboxError):
                    left = await self._engine.build_usage({LABEL_BUILD: build_id})
                    quiet = quiet + 1 if left == 0 else 0
                if quiet >= 2:
                    return

        task = asyncio.get_running_loop().create_task(prune())
        self._cleanups.add(task)
        task.add_done_callback(self._cleanups.discard)

    async def wait_cleanups(self) -> None:
        """Until every pending prune ran (tests, and shutdown's grace)."""
        await asyncio.gather(*list(self._cleanups), return_exceptions=True)


async def template_in_use(store: SessionStore, tenant: str, name: str) -> bool:
    """Whether a session of the tenant that may run again was created from the template."""
    return any(
        s.tenant == tenant
        and s.spec.template == name
        and s.state not in (SessionState.EXPIRED, SessionState.FAILED)
        for s in await store.all()
    )
