"""Edits to series.lock or pins.toml, a wrong preimage on a file's second touch, and a file that
becomes a directory are all refused by `apply` (and `lock`) before anything is written."""

from __future__ import annotations

import json

from conftest import Workspace, patch_bytes, snapshot
from patchset.hashing import sha256_bytes

BASE = {"pkg/a.py": b"".join(b"a%d = %d\n" % (i, i) for i in range(30)), "pkg/b.py": b"b\n"}
A2 = BASE["pkg/a.py"].replace(b"a3 = 3\n", b"a3 = 30\n")
A3 = A2.replace(b"a20 = 20\n", b"a20 = 200\n")
PATCHES = [
    ("vllm/0001-one.patch", patch_bytes({"pkg/a.py": (BASE["pkg/a.py"], A2)})),
    ("vllm/0002-two.patch", patch_bytes({"pkg/a.py": (A2, A3)})),
]
SHA = "ab" * 32


def _pins(ws: Workspace, sha: str) -> None:
    (ws.repo / "pins.toml").write_text(
        "schema_version = 1\n[vllm.sdist]\n"
        'requirement = "vllm==0.0.1"\nfilename = "vllm-0.0.1.tar.gz"\n'
        f'sha256 = "{sha}"\npip_args = []\ntop_dir = "vllm-0.0.1"\n[vllm.sdist.env]\n'
    )


def _edit_lock(ws: Workspace, edit) -> None:
    path = ws.repo / "series.lock"
    raw = json.loads(path.read_text())
    edit(raw)
    path.write_text(json.dumps(raw, indent=2, sort_keys=True) + "\n")


def test_edited_lock_pins_are_refused_before_any_write(ws: Workspace, capsys) -> None:
    _pins(ws, SHA)
    ws.setup(BASE, PATCHES)
    before = snapshot(ws.tree)
    _edit_lock(ws, lambda raw: raw["pins"].update({"vllm.sdist": "cd" * 32}))
    assert ws.cli("apply") == 1
    assert "pin vllm.sdist" in capsys.readouterr().err
    assert snapshot(ws.tree) == before


def test_pins_toml_digest_typo_is_refused_before_any_write(ws: Workspace, capsys) -> None:
    _pins(ws, SHA)
    ws.setup(BASE, PATCHES)
    before = snapshot(ws.tree)
    _pins(ws, "ab" * 31 + "ac")
    assert ws.cli("apply") == 1
    assert "pins.toml has" in capsys.readouterr().err
    assert snapshot(ws.tree) == before


def test_wrong_pre_on_a_second_touch_is_refused(ws: Workspace, capsys) -> None:
    ws.setup(BASE, PATCHES)
    before = snapshot(ws.tree)
    _edit_lock(ws, lambda raw: raw["patches"][1]["files"][0].update({"pre": SHA}))
    assert ws.cli("apply") == 1
    err = capsys.readouterr().err
    assert "vllm/0002-two.patch: pkg/a.py: preimage" in err and "nothing was changed" in err
    assert snapshot(ws.tree) == before


def test_file_that_becomes_a_directory_is_refused_by_lock_and_apply(
    ws: Workspace, monkeypatch, capsys
) -> None:
    patches = [
        ("vllm/0001-add.patch", patch_bytes({"pkg/x": (None, b"x\n")})),
        (
            "vllm/0002-dir.patch",
            patch_bytes({"pkg/x": (b"x\n", None), "pkg/x/y.py": (None, b"y\n")}),
        ),
    ]
    for name, data in patches:
        ws.add_patch(name, data)
    ws.write_series([n for n, _ in patches])
    from conftest import write_tree

    write_tree(ws.base, BASE)
    ws.reset_tree()
    assert ws.cli("lock") == 1
    assert "pkg/x is a file and a directory" in capsys.readouterr().err
    import patchset.lockfile as lockfile

    monkeypatch.setattr(lockfile, "shape_problems", lambda patches: [])
    assert ws.cli("lock") == 0
    monkeypatch.undo()
    before = snapshot(ws.tree)
    assert ws.cli("apply") == 1
    assert "pkg/x is a file and a directory" in capsys.readouterr().err
    assert snapshot(ws.tree) == before
    assert sha256_bytes(b"") != SHA
