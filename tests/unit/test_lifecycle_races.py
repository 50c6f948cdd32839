"""Nothing of a deleted session outlives it (on the engine fake)."""

from __future__ import annotations

from pathlib import Path

from sandboxd.sessions import CreateSessionInput
from session_stack import session_stack


async def test_session_end_hooks_run_again_once_the_sandbox_is_gone(tmp_path: Path) -> None:
    """A background process registered between the first round of end hooks and the removal
    (StartProcess racing DeleteSession) is forgotten by the round after the removal."""
    async with session_stack(tmp_path) as st:
        s = await st.sessions.create(CreateSessionInput(session_id="raced"))
        seen: list[bool] = []

        async def hook(session_id: str) -> None:
            seen.append(s.container_id in st.engine.sandboxes)

        st.sessions._sandboxes._on_end.append(hook)
        await st.sessions.delete("raced")
        assert seen and seen[-1] is False, f"last end hook ran with the sandbox still there: {seen}"
