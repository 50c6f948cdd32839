"""The stand-in a snapshot commit is taken from: the image alone (DockerEngine.commit_sandbox)."""

from __future__ import annotations

from sandboxd.engine.docker import commit_stand_in


def test_an_image_with_a_command_gives_nothing_but_itself() -> None:
    config = {"Cmd": ["/bin/sh"], "Env": ["PATH=/bin"], "User": "app"}
    assert commit_stand_in("sha256:abc", config) == {"Image": "sha256:abc"}
    assert commit_stand_in("sha256:abc", {"Entrypoint": ["/init"]}) == {"Image": "sha256:abc"}


def test_an_image_without_a_command_gets_a_placeholder_docker_needs() -> None:
    assert commit_stand_in("sha256:abc", {}) == {"Image": "sha256:abc", "Cmd": ["true"]}
    assert commit_stand_in("sha256:abc", {"Cmd": None, "Entrypoint": []})["Cmd"] == ["true"]
