"""The hostile tenant of `bench_fairness`: floods one server for a bounded time, in its own process.

Run in a process of its own so that its client-side work (decoding the output it floods itself
with) never shares an event loop with the bystander whose latency is measured: what the
bystander sees is the server's doing alone.

    python bench/fairness_flood.py ADDRESS TOKEN SESSION_ID[,SESSION_ID...] SECONDS [KINDS]

KINDS is `all` (the default) or a comma-separated choice of start,exec,attach,run,cpu (`cpu`
is not part of `all`).

Every kind of flood at once, for SECONDS, then it stops by itself and prints one JSON line of
counts (calls made, refusals by status code and reason, bytes received):
- a start storm: StartProcess of `yes` (a background process that writes as fast as it can)
  in a tight loop, over and over (the server's own live reader drains each one's output);
- output floods: concurrent Exec streams of `yes`, read as fast as the channel carries them;
- many streams: AttachProcess readers on the background processes;
- a Run storm: concurrent Run(["true"]) loops;
- CPU burners (`cpu`): background busy loops that write nothing, CPU_BURNERS of them spread over
  the sessions, started once.
"""

from __future__ import annotations

import asyncio
import collections
import json
import sys
import time
from typing import Any

import grpc
from google.rpc import error_details_pb2, status_pb2

OPTIONS = [("grpc.max_receive_message_length", 64 * 1024 * 1024)]
EXEC_STREAMS = 16
RUN_LOOPS = 32
START_LOOPS = 4
ATTACH_READERS = 16
CPU_BURNERS = 16


class Flood:
    def __init__(
        self, address: str, token: str, sessions: list[str], seconds: float, kinds: str = "all"
    ) -> None:
        from sandboxd.v1 import process_pb2_grpc  # noqa: PLC0415 - after sys.path is set

        self.channel = grpc.aio.insecure_channel(address, options=OPTIONS)
        self.processes = process_pb2_grpc.ProcessServiceStub(self.channel)
        self.md = (("authorization", f"Bearer {token}"),)
        self.sessions = sessions
        self.kinds = {"start", "exec", "attach", "run"} if kinds == "all" else set(kinds.split(","))
        self.messages: dict[str, str] = {}  # one message per kind of refusal, for the report
        self.until = time.monotonic() + seconds
        self.counts: collections.Counter[str] = collections.Counter()
        self.retry_info = 0  # refusals that said when to retry
        self.started: collections.deque[tuple[str, str]] = collections.deque(maxlen=256)

    def live(self) -> bool:
        return time.monotonic() < self.until

    def refused(self, exc: grpc.RpcError) -> None:
        code = exc.code().name if isinstance(exc, grpc.aio.AioRpcError) else "UNKNOWN"
        reason = ""
        for key, value in exc.trailing_metadata() or ():  # type: ignore[union-attr]
            if key != "grpc-status-details-bin":
                continue
            status = status_pb2.Status.FromString(value)
            for detail in status.details:
                if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                    info = error_details_pb2.ErrorInfo()
                    detail.Unpack(info)
                    reason = info.reason
                if detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
                    self.retry_info += 1
        key = f"refused {code} {reason}".rstrip()
        self.counts[key] += 1
        self.messages.setdefault(key, str(exc.details())[:200])

    async def pause_after_refusal(self) -> None:
        # A hostile tenant does not honour RetryInfo; a short pause keeps the client's own
        # loop from spinning on instant refusals (which would measure the client, not us).
        await asyncio.sleep(0.001)

    async def start_storm(self, i: int) -> None:
        from sandboxd.v1 import process_pb2  # noqa: PLC0415

        n = 0
        while self.live():
            sid = self.sessions[(i + n) % len(self.sessions)]
            n += 1
            try:
                resp = await self.processes.StartProcess(
                    process_pb2.StartProcessRequest(session_id=sid, argv=["yes", "flood"]),
                    metadata=self.md,
                )
                self.counts["start ok"] += 1
                self.started.append((sid, resp.process.process_id))
            except grpc.RpcError as exc:
                self.refused(exc)
                await self.pause_after_refusal()

    async def exec_flood(self, i: int) -> None:
        from sandboxd.v1 import process_pb2  # noqa: PLC0415

        while self.live():
            sid = self.sessions[i % len(self.sessions)]
            try:
                call = self.processes.Exec(
                    process_pb2.ExecRequest(session_id=sid, argv=["yes", "output flood"]),
                    metadata=self.md,
                )
                async for msg in call:
                    self.counts["exec bytes"] += len(msg.output.data)
                    if not self.live():
                        call.cancel()
                        break
                self.counts["exec ok"] += 1
            except grpc.RpcError as exc:
                if self.live():
                    self.refused(exc)
                    await self.pause_after_refusal()

    async def attach_reader(self, i: int) -> None:
        from sandboxd.v1 import process_pb2  # noqa: PLC0415

        while self.live():
            if not self.started:
                await asyncio.sleep(0.05)
                continue
            sid, pid = self.started[i % len(self.started)]
            try:
                call = self.processes.AttachProcess(
                    process_pb2.AttachProcessRequest(session_id=sid, process_id=pid),
                    metadata=self.md,
                )
                async for msg in call:
                    self.counts["attach bytes"] += len(msg.output.data)
                    if not self.live():
                        call.cancel()
                        break
                self.counts["attach ok"] += 1
            except grpc.RpcError as exc:
                if self.live():
                    self.refused(exc)
                    await self.pause_after_refusal()

    async def run_storm(self, i: int) -> None:
        from sandboxd.v1 import process_pb2  # noqa: PLC0415

        while self.live():
            sid = self.sessions[i % len(self.sessions)]
            try:
                await self.processes.Run(
                    process_pb2.RunRequest(session_id=sid, argv=["true"]), metadata=self.md
                )
                self.counts["run ok"] += 1
            except grpc.RpcError as exc:
                self.refused(exc)
                await self.pause_after_refusal()

    async def cpu_burners(self) -> None:
        from sandboxd.v1 import process_pb2  # noqa: PLC0415

        for n in range(CPU_BURNERS):
            sid = self.sessions[n % len(self.sessions)]
            try:
                await self.processes.StartProcess(
                    process_pb2.StartProcessRequest(
                        session_id=sid, argv=["sh", "-c", "while :; do :; done"]
                    ),
                    metadata=self.md,
                )
                self.counts["burner ok"] += 1
            except grpc.RpcError as exc:
                self.refused(exc)
        while self.live():
            await asyncio.sleep(0.1)

    async def main(self) -> dict[str, Any]:
        k = self.kinds
        tasks = [
            *(self.start_storm(i) for i in range(START_LOOPS if "start" in k else 0)),
            *(self.exec_flood(i) for i in range(EXEC_STREAMS if "exec" in k else 0)),
            *(self.attach_reader(i) for i in range(ATTACH_READERS if "attach" in k else 0)),
            *(self.run_storm(i) for i in range(RUN_LOOPS if "run" in k else 0)),
            *([self.cpu_burners()] if "cpu" in k else []),
        ]
        try:
            await asyncio.gather(*tasks)
        finally:
            await self.channel.close()
        return {**dict(self.counts), "retry_info": self.retry_info, "messages": self.messages}


def main() -> int:
    from pathlib import Path  # noqa: PLC0415

    repo = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(repo / "service"))
    address, token, sessions, seconds = sys.argv[1:5]
    kinds = sys.argv[5] if len(sys.argv) > 5 else "all"

    async def flood() -> dict[str, Any]:
        return await Flood(address, token, sessions.split(","), float(seconds), kinds).main()

    counts = asyncio.run(flood())
    print(json.dumps(counts, sort_keys=True), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
