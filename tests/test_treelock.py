"""The tree lock (patchset.tree.tree_lock): concurrent runs on one tree never interleave."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from conftest import Workspace, patch_bytes, snapshot
from patchset.tree import tree_lock

BASE = {f"m{i}.py": b"".join(b"v%d = %d\n" % (j, j) for j in range(200)) for i in range(30)}


def _patches() -> list[tuple[str, bytes]]:
    out = []
    for number in range(1, 6):
        changes = {}
        for i in range(30):
            pre = (
                BASE[f"m{i}.py"].replace(b"= 0\n", b"= %d\n" % (number - 1))
                if number > 1
                else BASE[f"m{i}.py"]
            )
            post = BASE[f"m{i}.py"].replace(b"= 0\n", b"= %d\n" % number)
            changes[f"m{i}.py"] = (pre, post)
        out.append((f"vllm/{number:04d}-step.patch", patch_bytes(changes)))
    return out


def _run(ws: Workspace) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1] / "tools"))
    return subprocess.Popen(
        [sys.executable, "-m", "patchset", "-C", str(ws.repo), "apply", "--tree", str(ws.tree)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def test_two_concurrent_applies_never_interleave(ws: Workspace) -> None:
    """Of two simultaneous applies one applies the series and the other finds nothing to do."""
    ws.setup(BASE, _patches())
    for _round in range(3):
        ws.reset_tree()
        first, second = _run(ws), _run(ws)
        codes = sorted([first.wait(60), second.wait(60)])
        assert codes == [0, 2], (first.communicate(), second.communicate())
        assert ws.cli("verify") == 0
        assert (ws.tree / "m0.py").read_bytes().startswith(b"v0 = 5\n")


def test_apply_refuses_with_tree_busy_after_waiting(ws: Workspace, capsys) -> None:
    ws.setup(BASE, _patches())
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, sys, time\n"
            "fd = os.open(sys.argv[1], os.O_RDONLY)\n"
            "fcntl.flock(fd, fcntl.LOCK_EX)\n"
            "print('locked', flush=True)\n"
            "time.sleep(30)\n",
            str(ws.tree),
        ],
        stdout=subprocess.PIPE,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"locked\n"
        before = snapshot(ws.tree)
        started = time.monotonic()
        assert ws.cli("apply", "--wait", "0.3") == 1
        assert time.monotonic() - started >= 0.3
        assert "is locked by another patchset process" in capsys.readouterr().err
        assert snapshot(ws.tree) == before
    finally:
        holder.kill()
        holder.wait()


def _other_process_can_lock(root: Path) -> bool:
    code = (
        "import fcntl, os, sys\n"
        "fd = os.open(sys.argv[1], os.O_RDONLY)\n"
        "try:\n    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)\nexcept BlockingIOError:\n"
        "    sys.exit(1)\n"
    )
    return subprocess.run([sys.executable, "-c", code, str(root)]).returncode == 0


def test_lock_is_reentrant_in_process_and_released_after_the_block(tmp_path: Path) -> None:
    """`wheel` holds the lock around apply: the inner block re-enters it; the lock stays held
    until the outer block ends, then another process can take it."""
    with tree_lock(tmp_path, timeout=0):
        with tree_lock(tmp_path, timeout=0.1):
            assert not _other_process_can_lock(tmp_path)
        assert not _other_process_can_lock(tmp_path)
    assert _other_process_can_lock(tmp_path)
    with tree_lock(tmp_path, timeout=0):
        pass
