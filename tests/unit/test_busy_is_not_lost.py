"""A container the engine is busy with (paused for a commit, restarting,
an exec that vanished) answers 404/409 like a missing one; it is never marked lost."""

from __future__ import annotations

from pathlib import Path

import pytest
from sandboxd.commands import Plain, Where
from sandboxd.errors import FailedPrecondition, NotFound, Unavailable
from sandboxd.models import SessionState
from sandboxd.reasons import Reason
from sandboxd.sessions import CreateSessionInput
from session_stack import session_stack


@pytest.mark.parametrize(
    "refusal",
    [
        FailedPrecondition("container is paused", reason=Reason.ENGINE_CONFLICT),
        NotFound("no such exec", reason=Reason.ENGINE_OBJECT_NOT_FOUND),
    ],
)
async def test_a_refusal_from_a_running_container_is_busy_not_lost(
    tmp_path: Path, refusal: Exception
) -> None:
    async with session_stack(tmp_path) as st:
        s = await st.sessions.create(CreateSessionInput(session_id="busy"))
        st.engine.fail("exec", refusal)  # type: ignore[arg-type]
        with pytest.raises(Unavailable) as exc:
            async with st.sessions.use("busy") as session:
                where = Where(session.container_id, "1:1")
                async with st.commands.open(where, Plain(("true",))):
                    pass
        assert exc.value.metadata["retry"] == "true"
        stored = await st.store.get("busy")
        assert stored is not None and stored.state is SessionState.RUNNING
        assert stored.container_id == s.container_id in st.engine.sandboxes


async def test_a_failure_seen_on_a_replaced_sandbox_does_not_mark_the_new_one(
    tmp_path: Path,
) -> None:
    """The check cannot race: a call that failed on the old sandbox, after a rebuild put a
    new one in the record, leaves the new one alone."""
    async with session_stack(tmp_path) as st:
        s = await st.sessions.create(CreateSessionInput(session_id="r"))
        old = await st.store.get("r")
        assert old is not None
        s.container_id = "replaced-meanwhile"
        err = await st.sessions.container_lost(s)
        assert isinstance(err, Unavailable)
        stored = await st.store.get("r")
        assert stored is not None and stored.state is SessionState.RUNNING
        assert stored.container_id == old.container_id
