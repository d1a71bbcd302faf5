"""A FIFO, device or socket at a path the series touches is refused at once, never opened
for reading (an open would block for ever): apply, verify, status, unapply and refresh."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import Workspace, patch_bytes

TOOLS = str(Path(__file__).resolve().parents[1] / "tools")
BASE = {"pkg/a.py": b"a = 1\n", "pkg/b.py": b"b = 1\n"}
PATCHES = [
    (
        "vllm/0001-x.patch",
        patch_bytes({"pkg/a.py": (b"a = 1\n", b"a = 2\n"), "pkg/n.py": (None, b"n = 1\n")}),
    )
]


def _run(ws: Workspace, *args: str) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "patchset", "-C", str(ws.repo), *args, "--tree", str(ws.tree)]
    if args[0] == "refresh":
        argv += ["--base", f"vllm={ws.base}"]
    env = dict(os.environ, PYTHONPATH=TOOLS)
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize("path", ["pkg/a.py", "pkg/n.py"])
def test_apply_refuses_a_fifo_at_a_touched_or_added_path(ws: Workspace, path: str) -> None:
    ws.setup(BASE, PATCHES)
    target = ws.tree / path
    target.unlink(missing_ok=True)
    os.mkfifo(target)
    result = _run(ws, "apply")
    assert result.returncode == 1, result
    assert "FIFO" in result.stderr and "nothing was changed" in result.stderr, result.stderr
    assert not (ws.tree / ".patchset").exists()


@pytest.mark.parametrize("command", ["verify", "status", "unapply", "refresh"])
def test_commands_on_an_applied_tree_refuse_a_fifo(ws: Workspace, command: str) -> None:
    ws.setup(BASE, PATCHES)
    assert ws.cli("apply") == 0
    (ws.tree / "pkg/a.py").unlink()
    os.mkfifo(ws.tree / "pkg/a.py")
    args = [command, "vllm/0001-x.patch"] if command == "refresh" else [command]
    result = _run(ws, *args)
    assert result.returncode == 1, result
    if command == "status":  # one line per patch: the owner of the FIFO is drifted
        assert "drifted      vllm/0001-x.patch" in result.stdout, result
    else:
        assert "FIFO" in result.stderr, result
    assert "Traceback" not in result.stderr
