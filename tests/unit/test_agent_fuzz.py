"""Random and truncated frames against the agent built with AddressSanitizer and UBSan.

After every example the agent must answer a fresh SYNC + HELLO (resent as the server does), and
at the end no sanitizer report may be on its stderr. Bounded for the unit layer.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent_pipes import AgentProcess, Builds, running_agent  # noqa: E402
from agent_wire import SYNC, encode  # noqa: E402


@pytest.fixture(scope="module")
def asan_agent(
    helper_builds: Builds, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[AgentProcess]:
    """One sanitizer agent for every example; a report on its stderr fails at teardown."""
    with running_agent(helper_builds.get("asan"), tmp_path_factory.mktemp("ws")) as a:
        yield a


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64) | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=12,
)
argvs = st.sampled_from(
    [["/bin/true"], ["/bin/echo", "fuzz"], ["/bin/cat"], ["/nonexistent"], ["rel"], []]
)


@st.composite
def open_payloads(draw: st.DrawFn) -> bytes:
    body: dict[str, object] = {
        "kind": draw(
            st.sampled_from(["exec", "attach", "processes", "forget", "dial", "egress", "??"])
        )
    }
    body.update(
        draw(
            st.dictionaries(
                st.sampled_from(
                    ["argv", "env", "cwd", "stdin", "tty", "detach", "id", "offsets", "port", "x"]
                ),
                json_values,
                max_size=4,
            )
        )
    )
    if body["kind"] == "exec" and draw(st.booleans()):
        body["argv"] = draw(argvs)
        body["env"] = {}
        if body["argv"] != ["/bin/cat"] and draw(st.booleans()):
            body["detach"] = {"id": draw(st.text(max_size=3)), "buffer": draw(st.integers(0, 5000))}
    raw = json.dumps(body).encode()
    if draw(st.booleans()):
        raw = raw[: draw(st.integers(0, len(raw)))]
    return raw


frame_types = st.sampled_from(
    [0, 1, 2, 3, 4, 5, 0x10, 0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18, 0x19, 0x7F, 0xFF]
)
stream_ids = st.one_of(st.integers(0, 9), st.integers(0, 2**32 - 1))


@st.composite
def frames(draw: st.DrawFn) -> bytes:
    ftype = draw(frame_types)
    sid = draw(stream_ids)
    payload = draw(open_payloads()) if ftype == 0x10 else draw(st.binary(max_size=64))
    raw = encode(ftype, sid, payload)
    return raw


chunks = st.one_of(
    frames(),
    frames().flatmap(lambda f: st.integers(0, len(f)).map(lambda n: f[:n])),  # truncated
    st.binary(max_size=200),  # garbage
    st.integers(65537, 2**32 - 1).map(lambda n: n.to_bytes(4, "big") + b"\x12\0\0\0\1"),
    st.just(SYNC),
)


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    derandomize=True,
)
@given(st.lists(chunks, max_size=10))
def test_random_and_truncated_frames_never_break_the_agent(
    asan_agent: AgentProcess, example: list[bytes]
) -> None:
    asan_agent.hello(window=4096)
    for chunk in example:
        asan_agent.send(chunk)
    assert asan_agent.proc.poll() is None
    ok = asan_agent.hello(retry=0.1).json()  # resent until a SYNC lands outside the garbage
    assert ok["version"] == 1
