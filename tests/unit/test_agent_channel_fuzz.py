"""Fuzzing the server's channel reader: random bytes, truncated and mutated frames
after a good handshake. The reader never raises, never blocks past a bound (it is back to
waiting on the pipe within one event-loop turn per chunk), keeps its buffer bounded, and the
damage stays on that channel: a second channel on the same loop goes on serving an exec."""

from __future__ import annotations

import asyncio
import struct

import agent_wire as w
from agent_peer import ScriptedAgent
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sandboxd.agent.channel import Channel, State
from sandboxd.agent.frames import HEADER, MAX_PAYLOAD

TYPES = st.sampled_from([*range(0x01, 0x06), *range(0x10, 0x1A), 0x00, 0x06, 0x7F, 0xFF])


@st.composite
def frame_bytes(draw: st.DrawFn) -> bytes:
    ftype = draw(TYPES)
    stream = draw(st.sampled_from([0, 1, 2, 3, 4, 99, 2**32 - 1]))
    payload = draw(
        st.one_of(
            st.binary(max_size=64),
            st.sampled_from(
                [
                    b"{}",
                    b'{"exit_code":0,"signal":null}',
                    b"\x01abc",
                    b"\x00\x00\x10\x00",
                    b'{"nonce":"x","version":1}',
                    b"{",
                    b"\x02",
                    b"",
                ]
            ),
        )
    )
    raw = struct.pack(">IBI", len(payload), ftype, stream) + payload
    mutate = draw(st.sampled_from(["keep", "truncate", "length", "sync"]))
    if mutate == "truncate":
        raw = raw[: draw(st.integers(0, max(0, len(raw) - 1)))]
    elif mutate == "length":
        length = draw(st.sampled_from([MAX_PAYLOAD + 1, 2**32 - 1, len(payload) + 5, 0]))
        raw = struct.pack(">I", length) + raw[4:]
    elif mutate == "sync":
        raw = w.SYNC + raw
    return raw


CHUNKS = st.lists(
    st.one_of(frame_bytes(), frame_bytes(), frame_bytes(), st.binary(min_size=1, max_size=200)),
    max_size=40,
)


async def _ready(agent: ScriptedAgent, channel: Channel) -> None:
    starting = asyncio.create_task(channel.start())
    await agent.handshake()
    await asyncio.wait_for(starting, 2)


async def _fuzz(chunks: list[bytes]) -> None:
    victim, bystander = ScriptedAgent(stdin_chunks=10_000), ScriptedAgent()
    cv = Channel(victim.transport, name="victim", window=4096, handshake_s=5, resend_s=5)
    cb = Channel(bystander.transport, name="bystander", window=4096)
    await _ready(victim, cv)
    await _ready(bystander, cb)
    opening = asyncio.create_task(cv.open("exec", {"argv": ["/x"]}))
    await victim.accept_open()
    stream = await asyncio.wait_for(opening, 2)
    for chunk in chunks:
        victim.send(chunk)
        # The reader takes a chunk and is waiting on the pipe again after one loop turn.
        for _ in range(3):
            await asyncio.sleep(0)
        assert victim.transport.to_server.empty(), "the reader is stuck"
        assert cv._decoder.buffered <= HEADER.size + MAX_PAYLOAD + len(chunk)
        if cv.state is State.CONNECTING:  # an epoch ended: answer, and fuzz the next one
            victim.send_json(w.HELLO_OK, 0, {"version": 1, "nonce": cv._nonce})
            await asyncio.sleep(0)
            assert cv.state is State.READY
    assert all(not t.done() for t in cv._tasks), [t for t in cv._tasks if t.done()]
    assert cv.state in (State.READY, State.CONNECTING, State.LOST)
    if stream.ended:
        assert stream.error is None or stream.error.reason.startswith(("AGENT_", "NOT_", "INT"))
    # The bystander never noticed.
    opening = asyncio.create_task(cb.open("exec", {"argv": ["/y"]}))
    sid, _ = await bystander.accept_open()
    good = await asyncio.wait_for(opening, 2)
    bystander.output(sid, b"ok")
    bystander.exit(sid)
    assert await asyncio.wait_for(good.read(), 2) == (1, b"ok")
    assert cb.state is State.READY and cb.epoch == 1
    await cv.close()
    await cb.close()


@settings(
    max_examples=300,
    deadline=2000,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(CHUNKS)
def test_random_and_truncated_frames_never_crash_or_block_the_reader(chunks: list[bytes]) -> None:
    asyncio.run(asyncio.wait_for(_fuzz(chunks), 10))
