"""What an older or dead server left (session networks, commit stand-ins): removed at
reconcile when ours and unused, and counted by Sweep, on the fake."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from sandboxd.errors import EngineUnavailable, FailedPrecondition
from sandboxd.sessions import CreateSessionInput
from sandboxd.snapshots import KIND_IMAGE
from sandboxd.sweeper import Sweeper
from session_stack import OWNER, session_stack

OWN = "sandboxd-net-" + OWNER


async def test_only_this_owners_unused_session_networks_go(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with session_stack(tmp_path) as st:
        ours = {"io.sandboxd.owner": OWNER, "io.sandboxd.session": "s1"}
        st.engine.networks = {
            "n1": (f"{OWN}-s1", ours, 0),
            "n2": (f"{OWN}-s2", ours, 1),  # a sandbox of the older server still on it
            "n3": ("sandboxd-net-other-s1", {"io.sandboxd.owner": "other"}, 0),
            "n4": ("sandboxd-net-unlabelled", {}, 0),
            "n5": ("an-operators-net", {"io.sandboxd.owner": OWNER}, 0),  # not one we named
        }
        with caplog.at_level(logging.INFO, logger="sandboxd.sessions.leftovers"):
            await st.sessions.reconcile()
        assert set(st.engine.networks) == {"n2", "n3", "n4", "n5"}
        assert f"removed leftover network {OWN}-s1" in caplog.text
        # The one still in use is tried again at the next reconcile, once its sandbox is gone.
        name, labels, _ = st.engine.networks["n2"]
        st.engine.networks["n2"] = (name, labels, 0)
        await st.sessions.reconcile()
        assert set(st.engine.networks) == {"n3", "n4", "n5"}
        st.engine.calls.clear()
        await st.sessions.reconcile()
        assert "list_networks" not in st.engine.calls  # nothing left: not asked again


async def test_a_failed_removal_is_tried_again(tmp_path: Path) -> None:
    async with session_stack(tmp_path) as st:
        st.engine.networks = {"n1": (f"{OWN}-s1", {"io.sandboxd.owner": OWNER}, 0)}
        st.engine.fail("remove_network", EngineUnavailable("engine went away"))
        await st.sessions.reconcile()
        assert "n1" in st.engine.networks
        await st.sessions.reconcile()
        assert st.engine.networks == {}


async def test_a_failed_stand_in_cleanup_is_tried_again(tmp_path: Path) -> None:
    async with session_stack(tmp_path) as st:
        st.engine.fail("remove_work_leftovers", EngineUnavailable("engine went away"))
        await st.sessions.reconcile()
        st.engine.calls.clear()
        await st.sessions.reconcile()
        assert "remove_work_leftovers" in st.engine.calls
        st.engine.calls.clear()
        await st.sessions.reconcile()
        assert "remove_work_leftovers" not in st.engine.calls


async def test_sweep_reports_the_networks_it_removed(tmp_path: Path) -> None:
    """Sweep's `removed_networks` counts the leftover networks its reconcile removed: one
    freed only after start (its older sandbox gone) is counted by the sweep that removed it."""
    async with session_stack(tmp_path) as st:
        sweeper = Sweeper(st.sessions, st.engine, OWNER, st.snapshots)
        ours = {"io.sandboxd.owner": OWNER}
        st.engine.networks = {
            "n1": (f"{OWN}-s1", ours, 0),
            "n2": (f"{OWN}-s2", ours, 1),  # still in use
            "n3": (f"{OWN}-s3", ours, 0),
            "n4": ("sandboxd-net-other-s1", {"io.sandboxd.owner": "other"}, 0),
        }
        assert (await sweeper.sweep()).removed_networks == 2
        assert (await sweeper.sweep()).removed_networks == 0  # n2 still in use
        name, labels, _ = st.engine.networks["n2"]
        st.engine.networks["n2"] = (name, labels, 0)
        assert (await sweeper.sweep()).removed_networks == 1
        assert set(st.engine.networks) == {"n4"}
        assert (await sweeper.sweep()).removed_networks == 0


async def test_sweep_counts_no_network_it_failed_to_remove(tmp_path: Path) -> None:
    async with session_stack(tmp_path) as st:
        sweeper = Sweeper(st.sessions, st.engine, OWNER, st.snapshots)
        st.engine.networks = {"n1": (f"{OWN}-s1", {"io.sandboxd.owner": OWNER}, 0)}
        st.engine.fail("remove_network", EngineUnavailable("engine went away"))
        assert (await sweeper.sweep()).removed_networks == 0
        assert (await sweeper.sweep()).removed_networks == 1
        assert st.engine.networks == {}


async def test_sweep_counts_the_image_whose_refused_removal_it_retried(tmp_path: Path) -> None:
    """The count the integration twin cannot check (the server's periodic sweep may retry
    first there): an image snapshot whose removal Docker refused is removed, and counted,
    by the next sweep, and by that one only."""
    async with session_stack(tmp_path) as st:
        sweeper = Sweeper(st.sessions, st.engine, OWNER, st.snapshots)
        await st.sessions.create(CreateSessionInput(session_id="s"))
        snap = await st.snapshots.create("s", {}, KIND_IMAGE)
        st.engine.fail("remove_image", FailedPrecondition("image is being used by a container"))
        await st.snapshots.delete(snap.snapshot_id)
        assert snap.image in st.engine.images  # refused: remembered, not forgotten
        assert (await sweeper.sweep()).removed_images == 1
        assert snap.image not in st.engine.images
        assert (await sweeper.sweep()).removed_images == 0


async def test_sweep_counts_the_unclaimed_containers_it_removed(tmp_path: Path) -> None:
    async with session_stack(tmp_path) as st:
        sweeper = Sweeper(st.sessions, st.engine, OWNER, st.snapshots)
        await st.sessions.create(CreateSessionInput(session_id="kept"))
        await st.sessions.create(CreateSessionInput(session_id="gone"))
        gone = await st.store.get("gone")
        assert gone is not None
        await st.store.delete("gone")  # its record lost: the container is nobody's now
        assert (await sweeper.sweep()).removed_containers == 1
        assert gone.container_id not in st.engine.sandboxes
        assert len(st.engine.sandboxes) == 1
        assert (await sweeper.sweep()).removed_containers == 0
