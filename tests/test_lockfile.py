"""series.lock: canonical, reproducible, and `lock --check` names what went stale."""

from __future__ import annotations

import json
import re

import pytest
from conftest import Workspace, patch_bytes
from patchset.lockfile import lock_from_json, lock_to_json

BASE = {"a.py": b"1\n2\n3\n", "gone.py": b"x\n"}
PATCHES = [
    ("vllm/0001-a.patch", patch_bytes({"a.py": (b"1\n2\n3\n", b"1\ntwo\n3\n")})),
    (
        "vllm/0002-b.patch",
        patch_bytes({"a.py": (b"1\ntwo\n3\n", b"1\ntwo\n3\n4\n"), "gone.py": (b"x\n", None)}),
    ),
]


def test_lock_records_images_per_patch_and_final_state(ws: Workspace) -> None:
    ws.setup(BASE, PATCHES)
    text = (ws.repo / "series.lock").read_text()
    raw = json.loads(text)
    assert text == json.dumps(raw, sort_keys=True, indent=2) + "\n"
    assert raw["schema_version"] == 1 and raw["pins"] == {}
    first, second = raw["patches"]
    assert [f["op"] for f in second["files"]] == ["modify", "delete"]
    assert second["files"][0]["pre"] == first["files"][0]["post"]
    assert second["files"][1]["post"] is None
    assert raw["final"]["vllm"]["gone.py"] == {"mode": "100644", "sha256": None}
    assert raw["final"]["vllm"]["a.py"]["sha256"] == second["files"][0]["post"]
    assert lock_to_json(lock_from_json(text)) == text


def test_lock_is_reproducible_and_check_passes(ws: Workspace, capsys) -> None:
    ws.setup(BASE, PATCHES)
    before = (ws.repo / "series.lock").read_bytes()
    assert ws.cli("lock") == 0
    assert "Unchanged series.lock" in capsys.readouterr().out
    assert (ws.repo / "series.lock").read_bytes() == before
    assert ws.cli("lock", "--check") == 0


def test_check_fails_naming_an_edited_patch(ws: Workspace, capsys) -> None:
    ws.setup(BASE, PATCHES)
    path = ws.repo / "patches/vllm/0002-b.patch"
    path.write_bytes(path.read_bytes().replace(b"+4\n", b"+5\n"))
    assert ws.cli("lock", "--check") == 1
    err = capsys.readouterr().err
    assert "series.lock is stale" in err
    assert "vllm/0002-b.patch: patch sha256" in err


def test_check_fails_naming_a_hand_edited_image(ws: Workspace, capsys) -> None:
    ws.setup(BASE, PATCHES)
    lock_path = ws.repo / "series.lock"
    raw = json.loads(lock_path.read_text())
    raw["patches"][0]["files"][0]["post"] = "0" * 64
    lock_path.write_text(json.dumps(raw, sort_keys=True, indent=2) + "\n")
    assert ws.cli("lock", "--check") == 1
    assert "vllm/0001-a.patch: a.py: modify" in capsys.readouterr().err


def test_check_fails_when_series_gains_a_patch(ws: Workspace, capsys) -> None:
    ws.setup(BASE, PATCHES)
    ws.add_patch("vllm/0003-c.patch", patch_bytes({"new.py": (None, b"n\n")}))
    ws.write_series([n for n, _ in PATCHES] + ["vllm/0003-c.patch"])
    assert ws.cli("lock", "--check") == 1
    assert "vllm/0003-c.patch: in series, not in lock" in capsys.readouterr().err
    assert ws.cli("apply") == 1
    assert "series.lock is stale" in capsys.readouterr().err


def test_lock_records_pins_and_check_notices_a_new_pin(ws: Workspace, capsys) -> None:
    ws.setup(BASE, PATCHES)
    digest = "ab" * 32
    (ws.repo / "pins.toml").write_text(
        'schema_version = 1\n[vllm.sdist]\nrequirement = "vllm==0.26.0"\n'
        f'filename = "vllm-0.26.0.tar.gz"\nsha256 = "{digest}"\ntop_dir = "vllm-0.26.0"\n'
        "pip_args = []\n[vllm.sdist.env]\n"
    )
    assert ws.cli("lock", "--check") == 1
    assert f"pin vllm.sdist: lock has None, pins.toml has {digest}" in capsys.readouterr().err
    assert ws.cli("lock") == 0
    assert json.loads((ws.repo / "series.lock").read_text())["pins"] == {"vllm.sdist": digest}


def test_lock_refuses_a_patch_that_does_not_apply_to_the_base(ws: Workspace, capsys) -> None:
    ws.setup(BASE, PATCHES)
    (ws.base / "a.py").write_bytes(b"other\n")
    assert ws.cli("lock") == 1
    assert "vllm/0001-a.patch does not apply" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda t: t.replace('"schema_version": 1', '"schema_version": true'), "schema_version"),
        (lambda t: t.replace('"pins": {}', '"pins": {},\n  "surprise": 1'), "canonical form"),
        (lambda t: t.replace('"pins": {}', '"pins": {},\n  "pins": {}'), "duplicate key 'pins'"),
        (lambda t: t.replace('"op": "delete"', '"op": "remove"'), "op 'remove'"),
        (lambda t: t.replace('"mode": "100644"', '"mode": "100777"', 1), "'100777'"),
        (lambda t: re.sub(r'"post": "[0-9a-f]{64}"', '"post": "XYZ"', t, count=1), "not sha256"),
        (lambda t: t.replace("\n  ", "\n   ", 1), "canonical form"),
    ],
    ids=["bool-version", "unknown-key", "duplicate-key", "op", "mode", "digest", "layout"],
)
def test_lock_check_refuses_a_lock_patchset_would_not_write(
    ws: Workspace, capsys, edit, message: str
) -> None:
    """`lock --check` (and every command reading the lock) refuses an edited lock, naming what
    is wrong, instead of reading past it."""
    ws.setup(BASE, PATCHES)
    path = ws.repo / "series.lock"
    path.write_text(edit(path.read_text()))
    assert ws.cli("lock", "--check") == 1
    assert message in capsys.readouterr().err
