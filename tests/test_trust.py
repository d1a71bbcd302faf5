"""In-tree state is untrusted: its paths are checked against the series and the tree root, and
no write, delete or verification goes through a symlink planted in the tree."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from conftest import Workspace, patch_bytes, snapshot

BASE = {"vllm/config/a.py": b"a = 1\n", "vllm/b.py": b"b = 1\n"}
PATCHES = [
    ("vllm/0001-a.patch", patch_bytes({"vllm/config/a.py": (b"a = 1\n", b"a = 2\n")})),
    ("vllm/0002-b.patch", patch_bytes({"vllm/b.py": (b"b = 1\n", b"b = 2\n")})),
]


def _edit_state(ws: Workspace, edit) -> None:
    path = ws.tree / ".patchset/state.json"
    raw = json.loads(path.read_text())
    edit(raw)
    path.write_text(json.dumps(raw, indent=2, sort_keys=True) + "\n")


def test_state_path_outside_the_tree_is_refused(ws: Workspace, tmp_path: Path, capsys) -> None:
    ws.setup(BASE, PATCHES)
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"precious\n")
    assert ws.cli("apply") == 0
    _edit_state(ws, lambda raw: raw["backups"].update({"../../../victim.txt": None}))
    before = snapshot(ws.tree)
    for command in (("unapply", "--upto", "vllm/0001-a.patch"), ("unapply",), ("verify",)):
        assert ws.cli(*command) == 1
        err = capsys.readouterr().err
        assert "state" in err and "victim.txt" in err
    assert victim.read_bytes() == b"precious\n"
    assert snapshot(ws.tree) == before


def test_state_path_not_touched_by_the_series_is_refused(ws: Workspace, capsys) -> None:
    ws.setup(BASE, PATCHES)
    assert ws.cli("apply") == 0
    _edit_state(ws, lambda raw: raw["applied"][1]["files"][0].update({"path": "vllm/other.py"}))
    assert ws.cli("unapply") == 1
    assert "vllm/other.py" in capsys.readouterr().err
    _edit_state(ws, lambda raw: raw["applied"][1]["files"][0].update({"path": "vllm/b.py"}))
    _edit_state(ws, lambda raw: raw["applied"][0].update({"created_dirs": ["/etc"]}))
    assert ws.cli("unapply") == 1
    assert "/etc" in capsys.readouterr().err


def test_unapply_refuses_a_symlink_planted_after_apply(
    ws: Workspace, tmp_path: Path, capsys
) -> None:
    ws.setup(BASE, PATCHES)
    assert ws.cli("apply") == 0
    outside = tmp_path / "outside"
    shutil.copytree(ws.tree / "vllm/config", outside)
    shutil.rmtree(ws.tree / "vllm/config")
    (ws.tree / "vllm/config").symlink_to(outside)
    outside_before = snapshot(outside)
    before = snapshot(ws.tree)
    assert ws.cli("verify") == 1
    assert "symlink 'vllm/config'" in capsys.readouterr().err
    assert ws.cli("status") == 1
    assert ws.cli("unapply") == 1
    assert "symlink 'vllm/config'" in capsys.readouterr().err
    assert snapshot(outside) == outside_before
    assert snapshot(ws.tree) == before


def test_state_directory_that_is_a_symlink_is_refused(
    ws: Workspace, tmp_path: Path, capsys
) -> None:
    ws.setup(BASE, PATCHES)
    assert ws.cli("apply") == 0
    moved = tmp_path / "elsewhere"
    shutil.move(ws.tree / ".patchset", moved)
    (ws.tree / ".patchset").symlink_to(moved)
    assert ws.cli("unapply") == 1
    assert ".patchset is a symlink" in capsys.readouterr().err
    assert (moved / "state.json").is_file()
