"""Built-in templates on the engine fake: `python` and `busybox` resolve to their images and are
echoed; an unknown name, or a template with an image, is refused before anything is made."""

from __future__ import annotations

from pathlib import Path

import pytest
from fakes import FakeEngine
from sandboxd.errors import InvalidArgument, NotFound
from sandboxd.reasons import Reason
from sandboxd.sessions import CreateSessionInput
from session_stack import session_stack

PYTHON = "sandboxd-runtime:python"


async def test_builtin_templates_resolve_to_their_images(tmp_path: Path) -> None:
    engine = FakeEngine(images=("sandboxd-runtime:busybox", PYTHON))
    async with session_stack(tmp_path, engine=engine) as st:
        py = await st.sessions.create(CreateSessionInput(session_id="py", template="python"))
        assert (py.spec.image, py.spec.template) == (PYTHON, "python")
        assert st.engine.sandboxes[py.container_id].request.spec.image == PYTHON
        bb = await st.sessions.create(CreateSessionInput(session_id="bb", template="busybox"))
        plain = await st.sessions.create(CreateSessionInput(session_id="plain"))
        assert bb.spec.image == plain.spec.image == "sandboxd-runtime:busybox"
        # Same container, but the template is part of what the caller asked: its own fingerprint.
        assert bb.fingerprint != plain.fingerprint
        assert (await st.sessions.get("py")).spec.template == "python"


@pytest.mark.parametrize(
    ("fields", "error", "reason"),
    [
        ({"template": "nope"}, NotFound, Reason.TEMPLATE_NOT_FOUND),
        ({"template": "../python"}, NotFound, Reason.TEMPLATE_NOT_FOUND),
        ({"template": "python", "image": PYTHON}, InvalidArgument, Reason.TEMPLATE_WITH_IMAGE),
    ],
)
async def test_bad_templates_are_refused(
    tmp_path: Path, fields: dict[str, str], error: type[Exception], reason: str
) -> None:
    engine = FakeEngine(images=("sandboxd-runtime:busybox", PYTHON))
    async with session_stack(tmp_path, engine=engine) as st:
        with pytest.raises(error) as refused:
            await st.sessions.create(CreateSessionInput(session_id="t", **fields))  # type: ignore[arg-type]
        assert getattr(refused.value, "reason", None) == reason
        assert "create_sandbox" not in st.engine.calls
