"""Runs tests/clients/conformance.json through the Python client against $SANDBOXD_ADDR.

Prints `STEP <id> ok` per passed step (tests/clients/test_conformance_python.py compares them
with the file's steps). Only `sandboxd_client` is used, so it runs from an installed wheel too:
    python conformance_python.py tests/clients/conformance.json
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import sys
from collections.abc import AsyncIterable, AsyncIterator
from typing import Any

from sandboxd_client import Exited, Output, SandboxClient, Session, Started, errors


def ok(step: dict[str, Any]) -> None:
    print(f"STEP {step['id']} ok", flush=True)


async def collect(events: AsyncIterable[Any]) -> tuple[list[Any], str, str]:
    seen = [e async for e in events]
    out = b"".join(e.data for e in seen if isinstance(e, Output) and e.stream == "stdout")
    err = b"".join(e.data for e in seen if isinstance(e, Output) and e.stream == "stderr")
    return seen, out.decode(), err.decode()


async def expect_error(call: Any, code: str, reason: str) -> None:
    try:
        await call
    except errors.SandboxError as exc:
        assert exc.code.name == code, f"{exc!r}: code {exc.code.name}, not {code}"
        assert exc.reason == reason, f"{exc!r}: reason {exc.reason}, not {reason}"
        return
    raise AssertionError(f"no error; expected {code} {reason}")


async def chunks(data: bytes, size: int) -> AsyncIterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i : i + size]


async def scenario(client: SandboxClient, spec: dict[str, Any]) -> None:
    steps = {s["id"]: s for s in spec["steps"]}
    labels = spec["labels"]

    s = steps["server_info"]
    assert (await client.server_info()).version
    ok(s)

    s = steps["create"]
    wf = s["workspace_file"]
    create = {
        "session_id": s["session_id"],
        "allow": s["allow"],
        "files": {wf["path"]: wf["content"].encode()},
        "labels": labels,
    }
    session = await client.create_session(**create)
    try:
        assert session.id == s["session_id"] and session.state == s["expect"]["state"]
        assert (await client.create_session(**create)).id == session.id  # idempotent
        ok(s)
        await with_session(client, session, steps, labels)
    finally:
        await session.delete()

    s = steps["delete"]
    await expect_error(client.get_session(session.id), s["expect"]["code"], s["expect"]["reason"])
    await session.delete()
    ok(s)


async def with_session(
    client: SandboxClient, session: Session, steps: dict[str, Any], labels: dict[str, str]
) -> None:
    s = steps["exec_stream"]
    seen, out, err = await collect(session.exec(s["argv"]))
    assert isinstance(seen[0], Started) and seen[0].process_id
    assert isinstance(seen[-1], Exited) and seen[-1].exit_code == s["expect"]["exit_code"]
    assert (out, err) == (s["expect"]["stdout"], s["expect"]["stderr"])
    ok(s)

    s = steps["exec_stdin"]
    seen, out, _ = await collect(session.exec(s["argv"], stdin=s["stdin"].encode()))
    assert out == s["expect"]["stdout"] and seen[-1].exit_code == s["expect"]["exit_code"]
    ok(s)

    s = steps["run"]
    result = await session.run(s["argv"])
    assert result.stdout.decode() == s["expect"]["stdout"]
    assert result.exit_code == s["expect"]["exit_code"]
    ok(s)

    s = steps["files"]
    await session.write_file(s["write"]["path"], s["write"]["content"].encode(), make_parents=True)
    assert (await session.read_file(s["write"]["path"])).decode() == s["write"]["content"]
    assert (await session.stat(s["write"]["path"])).size == s["expect"]["size"]
    await session.make_dir(s["make_dir"], parents=True)
    listed = {e.path async for e in session.list_dir("", depth=3)}
    assert set(s["expect"]["listed"]) <= listed, listed
    await session.remove(s["remove_dir"], recursive=True)
    ok(s)

    s = steps["export_import"]
    tar = b"".join([c async for c in session.export_archive(s["export_path"])])
    done = await session.import_archive(chunks(tar, 1000), s["import_path"])
    assert done.files >= s["expect"]["min_files"]
    assert (await session.read_file(s["expect"]["read_path"])).decode() == s["expect"]["content"]
    ok(s)

    s = steps["background"]
    await session.start_process(s["argv"], process_id=s["process_id"])
    assert s["process_id"] in [p.process_id async for p in session.processes()]
    seen, out, _ = await collect(session.attach(s["process_id"]))
    assert out == s["expect"]["stdout"]
    assert isinstance(seen[-1], Exited) and seen[-1].exit_code == s["expect"]["exit_code"]
    _, tail, _ = await collect(session.attach(s["process_id"], stdout_offset=s["stdout_offset"]))
    assert tail == s["expect"]["tail"], tail
    ok(s)

    s = steps["snapshot_fork"]
    snap = await session.snapshot()
    assert (await client.get_snapshot(snap.snapshot_id)).snapshot_id == snap.snapshot_id
    fork = await client.create_session(
        allow=["cat"], from_snapshot_id=snap.snapshot_id, labels=labels
    )
    async with fork:
        assert (await fork.read_file(s["expect"]["read_path"])).decode() == s["expect"]["content"]
    await client.delete_snapshot(snap.snapshot_id)
    ok(s)

    s = steps["errors"]
    for case in s["cases"]:
        call: Any
        if case["call"] == "ReadFile":
            call = session.read_file(case["path"])
        elif case["call"] == "Run":
            call = session.run(case["argv"])
        elif case["call"] == "GetSession":
            call = client.get_session(case["session_id"])
        else:
            raise AssertionError(f"unknown call {case['call']}")
        await expect_error(call, case["code"], case["reason"])
    ok(s)


async def main(path: str) -> None:
    run = secrets.token_hex(4)
    with open(path) as f:
        spec = json.loads(f.read().replace("{run}", run))
    async with SandboxClient(os.environ["SANDBOXD_ADDR"], timeout=60) as client:
        await scenario(client, spec)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
