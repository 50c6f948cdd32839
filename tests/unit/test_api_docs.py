"""docs/api.md is exactly what `make docs` renders from the protos' comments."""

from __future__ import annotations

from sandboxd.tools.gendocs import API_DOC, descriptor_set, render


def test_committed_api_reference_matches_the_protos() -> None:
    assert API_DOC.read_text() == render(descriptor_set()), (
        "docs/api.md differs from proto/sandboxd/v1: run `make docs`"
    )


def test_the_reference_names_every_rpc_and_message_with_its_comment() -> None:
    fds = descriptor_set()
    text = render(fds)
    for file in fds.file:
        if file.package != "sandboxd.v1":
            continue
        for service in file.service:
            assert f"### {service.name}\n" in text
            for method in service.method:
                assert f"| `{method.name}` |" in text
        for msg in file.message_type:
            assert f"### {msg.name}\n" in text
    # a comment reaches its row: CreateSession's own words from session.proto
    assert "Creates a session, or returns the existing one" in text


def test_the_check_fails_on_a_changed_comment() -> None:
    fds = descriptor_set()
    before = render(fds)
    session = next(f for f in fds.file if f.name == "sandboxd/v1/session.proto")
    loc = next(loc for loc in session.source_code_info.location if loc.leading_comments)
    loc.leading_comments += " changed"
    assert render(fds) != before
