"""The stand-in a snapshot commit is taken from: the image alone (engine/docker_commit.py)."""

from __future__ import annotations

from sandboxd.engine.docker_commit import commit_labels, stand_in_config


def test_an_image_with_a_command_gives_nothing_but_itself() -> None:
    config = {"Cmd": ["/bin/sh"], "Env": ["PATH=/bin"], "User": "app"}
    only = {"Image": "sha256:abc", "Labels": {"io.sandboxd.commit-of": "o"}}
    assert stand_in_config("sha256:abc", config, "o") == only
    assert stand_in_config("sha256:abc", {"Entrypoint": ["/init"]}, "o") == only


def test_an_image_without_a_command_gets_a_placeholder_docker_needs() -> None:
    assert stand_in_config("sha256:abc", {}, "o")["Cmd"] == ["true"]
    assert stand_in_config("sha256:abc", {"Cmd": None, "Entrypoint": []}, "o")["Cmd"] == ["true"]


def test_the_bases_sandboxd_labels_are_blanked_others_kept() -> None:
    base = {
        "io.sandboxd.template.build": "b1",  # would let the template's prune remove it
        "io.sandboxd.snapshot": "snap-old",
        "org.opencontainers.image.title": "kept",
    }
    labels = {"io.sandboxd.owner": "o", "io.sandboxd.snapshot": "snap-new"}
    assert commit_labels(base, labels) == {
        "io.sandboxd.template.build": "",
        "io.sandboxd.commit-of": "",  # the stand-in's own
        "io.sandboxd.owner": "o",
        "io.sandboxd.snapshot": "snap-new",
    }
