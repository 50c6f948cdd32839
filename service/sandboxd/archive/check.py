"""The import's check loop: tarfile over the client's stream, every member through the
rules (policy.py), the sanitised archive out to a sink (or nowhere: a dry run that only
checks, as for a snapshot just taken). Runs on a thread of its own (pipe.py says why).
tarfile sums each header with tar_checksum.py's function (the same sums, a fifth of the CPU)."""

from __future__ import annotations

import tarfile

from sandboxd.archive import policy, tar_checksum
from sandboxd.archive.pipe import BLOCK, OUT_BATCH, Sink, Source
from sandboxd.archive.policy import MemberChecker
from sandboxd.errors import InvalidArgument
from sandboxd.reasons import Reason

_ZEROS = bytes(BLOCK)
tar_checksum.install()


def check_and_forward(source: Source, sink: Sink | None, checker: MemberChecker) -> tuple[int, int]:
    """Runs on the import thread: parse, check, re-emit. Returns (members, content bytes).

    tarfile parses the headers (`r:` over the forward-only source); each member goes out as
    the header tarfile would write for the sanitised TarInfo (`addfile` in PAX format), then
    its data passed through as it came, then the padding; at the end, tarfile's end blocks.
    """
    try:
        return _check_and_forward(source, sink, checker)
    except BaseException:
        checker.release()  # a refused archive's state is never needed again (policy.py)
        raise


def _check_and_forward(
    source: Source, sink: Sink | None, checker: MemberChecker
) -> tuple[int, int]:
    written = 0
    try:
        src = tarfile.open(fileobj=source, mode="r:")  # type: ignore[call-overload]
    except tarfile.ReadError as exc:
        raise InvalidArgument(
            f"the data is not a tar archive ({exc})", reason=Reason.ARCHIVE_INVALID
        ) from None
    try:
        while True:
            try:
                info = src.next()
            except tarfile.TarError as exc:
                raise InvalidArgument(
                    f"the archive is damaged ({exc})", reason=Reason.ARCHIVE_INVALID
                ) from None
            except RecursionError:  # tarfile recurses once per chained extension header
                raise policy.invalid("too many extended headers in a row") from None
            if info is None:
                break
            # tarfile keeps every TarInfo it has seen: 100 000 members would be tens of MiB.
            # Nothing here looks back, so let them go.
            src.members.clear()
            policy.check_global_headers(src.pax_headers)
            clean = checker.check(info)
            if clean is None:
                continue
            if sink is not None:
                sink.limit = policy.stream_allowance(
                    checker.limits.max_total_bytes, checker.members
                )
            if sink is not None:
                sink.write(clean.tobuf(tarfile.PAX_FORMAT, tarfile.ENCODING, "surrogateescape"))
            if clean.isreg():
                remaining = clean.size
                while remaining:
                    view = source.read_view(min(remaining, OUT_BATCH))
                    if not view:
                        raise _truncated(info.name)
                    if sink is not None:
                        sink.content(view, source.position - len(view))
                    remaining -= len(view)
                if sink is not None and clean.size % BLOCK:
                    sink.write(_ZEROS[: BLOCK - clean.size % BLOCK])
                written += clean.size
        _check_end(source, src.offset)
        if sink is not None:
            # tarfile's close() in `w` mode: two zero blocks, then zeros to a whole record.
            end = 2 * BLOCK + (-(sink.written + 2 * BLOCK)) % tarfile.RECORDSIZE
            sink.write(bytes(end))
            sink.flush()
    finally:
        src.close()
    return checker.members, written


def _truncated(name: str) -> InvalidArgument:
    return InvalidArgument(
        f"the archive ends inside member {name!r} (truncated, or the header lies about its size)",
        reason=Reason.ARCHIVE_TRUNCATED,
        metadata={"member": name[:512]},
    )


def _check_end(source: Source, offset: int) -> None:
    """tarfile's stream mode ends quietly on a missing or garbage header: refuse both."""
    block = source.block_at(offset)
    if block is None or len(block) < BLOCK:
        raise InvalidArgument(
            "the archive is truncated (no end-of-archive marker)", reason=Reason.ARCHIVE_TRUNCATED
        )
    if block.count(0) != BLOCK:
        raise InvalidArgument(
            "the archive holds data that is not a tar header (damaged, or a member lies about "
            "its size)",
            reason=Reason.ARCHIVE_INVALID,
        )
