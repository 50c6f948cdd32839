"""The pure parts of taking back background processes after a restart (process_adoption.py):
the detach id, and a spec read back from the `sbx run` supervisor's command line."""

from __future__ import annotations

from sandboxd.process_adoption import (
    UNKNOWN_TIMEOUT_S,
    detach_id,
    parse_detach_id,
    spec_from_cmdline,
)


def test_detach_ids_round_trip_and_foreign_ones_are_ignored() -> None:
    assert detach_id("bg-1", "bg-1") == "bg-1"
    assert parse_detach_id("bg-1") == ("bg-1", "bg-1")
    for foreign in ("", "Upper", "a/b", "x:y", "-lead", "a" * 64):
        assert parse_detach_id(foreign) is None


def test_a_spec_from_the_supervisors_command_line() -> None:
    cmdline = b"\0".join(
        [
            b"/.sandboxd/sbx",
            b"run",
            b"--id",
            b"p-1",
            b"--timeout-ms",
            b"65000",
            b"--cwd",
            b"/workspace/sub",
            b"--",
            b"sh",
            b"-c",
            b"echo a -- b",
            b"",
        ]
    )
    spec = spec_from_cmdline(cmdline, 4096)
    assert spec.argv == ["sh", "-c", "echo a -- b"]
    assert spec.cwd == "/workspace/sub" and spec.timeout_s == 65.0
    assert spec.max_output_bytes == 4096 and spec.env == {} and spec.stdin == b""


def test_an_unreadable_command_line_gives_an_empty_spec() -> None:
    for junk in (b"", b"garbage", b"/.sandboxd/sbx\0run\0--timeout-ms\0x\0--\0"):
        spec = spec_from_cmdline(junk, 1)
        assert spec.timeout_s in (UNKNOWN_TIMEOUT_S,) and spec.cwd == "/workspace"
    assert spec_from_cmdline(b"garbage", 1).argv == []


def test_a_range_lost_on_the_way_is_a_gap_in_the_servers_ring() -> None:
    from sandboxd.output_ring import OutputBuffer

    buf = OutputBuffer(16)
    buf.append(b"abcdef", 1, merge=False)
    buf.skip(100)
    assert (buf.start, buf.end) == (106, 106)
    assert buf.read(106) is None  # nothing held: a reader at 0..105 is told of a gap
    buf.append(b"xyz", 2, merge=True)
    assert buf.read(106) == (2, b"xyz") and buf.end == 109
