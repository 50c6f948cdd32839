"""The disk tool container (storage/disk_tool.py), the one privileged container the server
starts: what reaches it is the server's fixed script, an operation from a fixed set and
integers; a disk's identity is a server-made id; its profile holds two capabilities and the
loop devices, nothing more. Also the parser of its one result line."""

from __future__ import annotations

import pytest
from sandboxd.errors import Internal
from sandboxd.storage import disk_tool


@pytest.mark.parametrize(
    "disk_id",
    ["", "../etc", "a/b", "A", "ws_1", "-ws", "ws 1", "ws-é", "ws\n1", "x" * 64, "ws-1;rm"],
)
def test_only_server_made_ids_name_a_disk(disk_id: str) -> None:
    with pytest.raises(Internal):
        disk_tool.checked_id(disk_id)


def test_a_server_made_id_passes() -> None:
    assert disk_tool.checked_id("ws-" + "0" * 24) == "ws-" + "0" * 24


@pytest.mark.parametrize("size", [-1, 0, 15 * 1024 * 1024, 16 * 1024**4 + 1, True, 1.5, "64"])
def test_sizes_outside_a_disks_range_are_refused(size: object) -> None:
    with pytest.raises(Internal):
        disk_tool.checked_size(size)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("op", "numbers"),
    [("sh", ()), ("create;id", (1,)), ("create", (-1,)), ("create", (True,)), ("create", ("1",))],
)
def test_the_command_takes_a_known_operation_and_integers_only(
    op: str, numbers: tuple[object, ...]
) -> None:
    with pytest.raises(Internal):
        disk_tool.command(op, *numbers)  # type: ignore[arg-type]


def test_the_script_is_the_constant_and_arguments_follow_it() -> None:
    argv = disk_tool.command("create", 1 << 30, 1900000000, 1900000000)
    assert argv[:3] == ["/bin/sh", "-c", disk_tool.SCRIPT]
    assert argv[3:] == ["disk-tool", "create", str(1 << 30), "1900000000", "1900000000"]


def test_the_tool_container_has_two_capabilities_and_the_loop_devices_only() -> None:
    config = disk_tool.tool_config(
        "sandboxd-disktool:1",
        "attach",
        (),
        disk_volume="sandboxd-disk-ws-1",
        labels={"io.sandboxd.owner": "o"},
        source_volume="sandboxd-disk-ws-2",
    )
    host = config["HostConfig"]
    assert host["Privileged"] is False and host["Runtime"] == "runc"
    assert host["CapDrop"] == ["ALL"] and sorted(host["CapAdd"]) == ["MKNOD", "SYS_ADMIN"]
    assert host["DeviceCgroupRules"] == ["b 7:* rwm"]  # loop block devices
    assert [d["PathOnHost"] for d in host["Devices"]] == ["/dev/loop-control"]
    assert host["ReadonlyRootfs"] and host["NetworkMode"] == "none" and config["NetworkDisabled"]
    assert "no-new-privileges:true" in host["SecurityOpt"]
    # Volumes by name only (no host path), the source of a copy read-only.
    assert host["Binds"] == ["sandboxd-disk-ws-1:/d", "sandboxd-disk-ws-2:/s:ro"]


@pytest.mark.parametrize(
    ("output", "want"),
    [
        (
            "debugfs 1.47\ndisk dev=/dev/loop3 size=1073741824 allocated=4440064\n",
            ("/dev/loop3", 1 << 30, 4440064, False),
        ),
        ("disk dev= size=0 allocated=0", ("", 0, 0, False)),
        ("disk noroom available=123", ("", 0, 0, True)),
    ],
)
def test_the_result_line_is_parsed(output: str, want: tuple[str, int, int, bool]) -> None:
    got = disk_tool.parse_result(output)
    assert (got.device, got.size_bytes, got.allocated_bytes, got.no_room) == want


@pytest.mark.parametrize(
    "output",
    ["", "disk dev=/dev/sda size=1 allocated=1", "disk dev=/dev/loop1 size=-1 allocated=0"],
)
def test_anything_else_is_no_result(output: str) -> None:
    with pytest.raises(Internal):
        disk_tool.parse_result(output)


def test_the_hand_over_changes_links_never_follows_them() -> None:
    config = disk_tool.own_config(
        "sandboxd-disktool:1", "sandboxd-diskmnt-ws-1-loop0-x", 70001, 70001, {}
    )
    script = config["Cmd"][2]
    assert "chown -R -h" in script and "-L" not in script and "-H" not in script
    assert config["Cmd"][3:] == ["own", "70001", "70001"]  # two integers, never shell text
    host = config["HostConfig"]
    assert sorted(host["CapAdd"]) == ["CHOWN", "DAC_READ_SEARCH", "FOWNER"]
    assert "Devices" not in host and "DeviceCgroupRules" not in host  # no loop devices
    assert host["Binds"] == [] and [m["Target"] for m in host["Mounts"]] == ["/w"]
    assert host["ReadonlyRootfs"] and host["NetworkMode"] == "none" and host["Runtime"] == "runc"
    for bad in ((0, 1000), (1000, -1), (True, 1000)):
        with pytest.raises(Internal):
            disk_tool.own_config("i", "v", bad[0], bad[1], {})  # type: ignore[arg-type]


def test_a_reap_reports_the_loops_it_detached_only() -> None:
    output = "disk reaped=/dev/loop0\ndisk unreaped=/dev/loop5\ndisk reaped=/dev/loop12\n"
    assert disk_tool.parse_reaped(output + "disk dev= size=0 allocated=0\n") == [
        "/dev/loop0",
        "/dev/loop12",
    ]
    assert disk_tool.command("reap")[3:] == ["disk-tool", "reap"]


def test_a_reap_detaches_only_deleted_disk_images_on_the_volumes_filesystem() -> None:
    """Another program's loop (another file, another filesystem, a live image) is never
    touched: the script matches the tool's own signature."""
    reap = disk_tool.SCRIPT.split("reap)", 1)[1].split(";;", 1)[0]
    assert '[ "$on" = "$here" ] && [ "$file" = "/disk.img (deleted)" ] || continue' in reap
    assert "stat -c '%Hd:%Ld' /d" in reap
