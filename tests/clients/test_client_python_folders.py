"""Folders in one call (Session.upload_dir / download_dir): a tar made and unpacked as the bytes
move, symlinks and modes kept, the round trip exact, the per-file cap said."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from conftest import ServerProcess
from sandboxd_client import ResourceLimits, SandboxClient, errors


def _tree(root: Path) -> dict[str, tuple[str, int, bytes]]:
    out: dict[str, tuple[str, int, bytes]] = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        st = path.lstat()
        if stat.S_ISLNK(st.st_mode):
            out[rel] = ("link", 0, os.readlink(path).encode())
        elif stat.S_ISDIR(st.st_mode):
            out[rel] = ("dir", stat.S_IMODE(st.st_mode), b"")
        else:
            out[rel] = ("file", stat.S_IMODE(st.st_mode), path.read_bytes())
    return out


def _project(root: Path) -> Path:
    (root / "src" / "pkg").mkdir(parents=True)
    (root / "empty").mkdir()
    (root / "src" / "run.sh").write_bytes(b"#!/bin/sh\necho run\n")
    (root / "src" / "run.sh").chmod(0o755)
    (root / "src" / "pkg" / "secret.txt").write_bytes(b"only me")
    (root / "src" / "pkg" / "secret.txt").chmod(0o600)
    (root / "big.bin").write_bytes(os.urandom(3 * 1024 * 1024 + 17))  # several chunks
    (root / "src" / "latest").symlink_to("run.sh")
    return root


async def test_a_folder_goes_up_and_comes_back_exactly(
    server: ServerProcess, tmp_path: Path
) -> None:
    local = _project(tmp_path / "project")
    sent: list[tuple[int, int | None]] = []
    async with SandboxClient(server.address, timeout=60) as client:
        limits = ResourceLimits(file_bytes=4 * 1024 * 1024, workspace_bytes=32 * 1024 * 1024)
        async with await client.create_session(allow_all=True, limits=limits) as session:
            done = await session.upload_dir(
                local, "proj", progress=lambda n, t: sent.append((n, t))
            )
            assert done.files >= 4
            script = "cd proj && sh src/run.sh && readlink src/latest && stat -c %a src/run.sh"
            ran = await session.run(["sh", "-c", script])
            assert ran.stdout == b"run\nrun.sh\n755\n", ran.stderr
            back = tmp_path / "back"
            got: list[int] = []
            size = await session.download_dir("proj", back, progress=lambda n, t: got.append(n))
    assert _tree(back) == _tree(local)
    assert sent and sent[-1][0] >= 3 * 1024 * 1024 and all(t is not None for _, t in sent)
    assert [n for n, _ in sent] == sorted(n for n, _ in sent)
    assert got and got[-1] == size


async def test_a_file_over_the_sessions_cap_is_refused_and_nothing_lands(
    server: ServerProcess, tmp_path: Path
) -> None:
    local = tmp_path / "p"
    local.mkdir()
    (local / "small.txt").write_bytes(b"x")
    (local / "large.bin").write_bytes(b"\0" * (3 * 1024 * 1024))  # past the default 1 MiB cap
    async with SandboxClient(server.address, timeout=60) as client:
        async with await client.create_session(allow_all=True) as session:
            with pytest.raises(errors.SandboxError) as refused:
                await session.upload_dir(local, "p")
            assert refused.value.reason == "FILE_TOO_LARGE"
            listed = await session.run(["ls", "-a", "/workspace"])
            assert b"p" not in listed.stdout.split()
