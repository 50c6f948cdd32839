"""The grpcurl cookbook of docs/grpcurl.md (the `cookbook` walkthrough block), run for real."""

from __future__ import annotations

import base64
import re
import secrets
from pathlib import Path

from conftest import remove_owned_containers, start_server
from test_readme import _json_objects, documented_walkthroughs, run_walkthrough


def test_readme_cookbook(tmp_path: Path) -> None:
    script = documented_walkthroughs()["cookbook"]
    owner = "cookbook" + secrets.token_hex(3)
    server = start_server(tmp_path / "data", owner)  # its own: the fixed id collides with no one
    try:
        lines = run_walkthrough(script, server.address, tmp_path)
    finally:
        server.stop()
        remove_owned_containers(owner)
    output = "\n".join(text for _, text in lines)
    objects = _json_objects(output)

    assert "service SessionService {" in output and "message ExecRequest {" in output

    info = next(o for o in objects if "security_defaults" in o)
    assert info["version"] and info["limits_max"], output

    sessions = [o["session"] for o in objects if isinstance(o.get("session"), dict)]
    created, got, renewed = sessions[0], sessions[1], sessions[2]
    assert created["session_id"] == got["session_id"] == "cookbook"  # type: ignore[index]
    assert created["labels"] == {"team": "docs", "purpose": "cookbook"}  # type: ignore[index]
    assert created["limits"]["command_timeout"] == "5s"  # type: ignore[index]
    assert renewed["lease_expires_at"] > created["lease_expires_at"]  # type: ignore[index,operator]

    listed = next(o for o in objects if "sessions" in o)
    assert [s["session_id"] for s in listed["sessions"]] == ["cookbook"]  # type: ignore[attr-defined,index]

    run = next(o for o in objects if "stdout" in o)
    assert base64.b64decode(str(run["stdout"])).split() == [b"6", b"hi"], output
    text = next(o for o in objects if "stdout_text" in o)
    assert text["stdout_text"] == "héllo\n", output

    infos = [o["info"] for o in objects if isinstance(o.get("info"), dict)]
    assert [i["path"] for i in infos] == ["src/pkg", "src/pkg/main.sh", "src/pkg/main.sh"]  # type: ignore[index]
    assert infos[2]["mode"] == 0o755  # type: ignore[index]
    entries = next(o for o in objects if "entries" in o)["entries"]
    assert [e["path"] for e in entries] == ["src/pkg", "src/pkg/main.sh"]  # type: ignore[attr-defined,index]

    # -format-error: the status as JSON with the ErrorInfo detail, and exit status 64+5
    error = next(o for o in objects if "details" in o)
    assert error["code"] == 5, output
    assert re.search(r'"reason": ?"FILE_NOT_FOUND"', output), output
    assert "grpcurl exit status 69" in output

    assert {"status": "SERVING"} in objects
    # two deletes, both succeed; the first says it removed the session
    assert objects[-2:] == [{"existed": True}, {}], output
