"""verify/status: any change to a touched file is named with both hashes and its owner."""

from __future__ import annotations

import json

import pytest
from conftest import Workspace, patch_bytes
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from patchset.hashing import sha256_bytes
from patchset.state import canonical_json

BASE = {"a.py": b"one\ntwo\nthree\n", "b.py": b"keep\n"}
A1 = b"one\nTWO\nthree\n"
A2 = b"one\nTWO\nthree\nfour\n"
PATCHES = [
    ("vllm/0001-a.patch", patch_bytes({"a.py": (BASE["a.py"], A1), "n.py": (None, b"new\n")})),
    ("vllm/0002-b.patch", patch_bytes({"a.py": (A1, A2)})),
]


@pytest.fixture
def applied(ws: Workspace) -> Workspace:
    ws.setup(BASE, PATCHES)
    assert ws.cli("apply") == 0
    return ws


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_verify_detects_any_single_byte_change_to_a_touched_file(applied: Workspace, data) -> None:
    """Changing any one byte of any touched file makes verify exit 1 naming that file."""
    path = data.draw(st.sampled_from(["a.py", "n.py"]))
    target = applied.tree / path
    original = target.read_bytes()
    at = data.draw(st.integers(0, len(original) - 1))
    value = data.draw(st.integers(0, 255).filter(lambda b: b != original[at]))
    target.write_bytes(original[:at] + bytes([value]) + original[at + 1 :])
    try:
        assert applied.cli("verify") == 1
    finally:
        target.write_bytes(original)
    assert applied.cli("verify") == 0


def test_drift_report_names_file_hashes_and_owning_patch(applied: Workspace, capsys) -> None:
    (applied.tree / "a.py").write_bytes(b"tampered\n")
    (applied.tree / "n.py").unlink()
    capsys.readouterr()
    assert applied.cli("verify") == 1
    err = capsys.readouterr().err
    expected_a, found_a = sha256_bytes(A2), sha256_bytes(b"tampered\n")
    assert f"a.py: expected {expected_a}, found {found_a}" in err
    assert "(owned by vllm/0002-b.patch)" in err
    expected_n = sha256_bytes(b"new\n")
    assert f"n.py: expected {expected_n}, found absent" in err
    assert "(owned by vllm/0001-a.patch)" in err


def test_status_reports_applied_not_applied_and_drifted(ws: Workspace, capsys) -> None:
    ws.setup(BASE, PATCHES)
    assert ws.cli("status") == 0
    assert "not applied  vllm/0001-a.patch" in capsys.readouterr().out
    assert ws.cli("apply", "--upto", "vllm/0001-a.patch") == 0
    (ws.tree / "n.py").write_bytes(b"drift\n")
    capsys.readouterr()
    assert ws.cli("status", "--json") == 1
    import json

    report = json.loads(capsys.readouterr().out)
    assert report["patches"] == {
        "vllm/0001-a.patch": "drifted",
        "vllm/0002-b.patch": "not applied",
    }


def test_verify_on_unpatched_tree_says_nothing_is_applied(ws: Workspace, capsys) -> None:
    """Issue 32: a never-patched tree of the pinned base verifies (exit 0, so `make verify`
    passes on a fresh tree) and says that nothing is applied; an edited one does not."""
    ws.setup(BASE, PATCHES)
    assert ws.cli("verify") == 0
    assert "0 of 2 patch(es) applied" in capsys.readouterr().out
    (ws.tree / sorted(BASE)[0]).write_bytes(b"edited\n")
    assert ws.cli("verify") == 1
    assert "no patch is applied" in capsys.readouterr().err


def test_verify_flags_patch_edited_after_apply(applied: Workspace, capsys) -> None:
    patch = applied.repo / "patches/vllm/0002-b.patch"
    patch.write_bytes(patch.read_bytes().replace(b"Why and what.", b"Why, and what."))
    assert applied.cli("verify") == 1
    assert "vllm/0002-b.patch: patch file changed since it was applied" in capsys.readouterr().err


def test_verify_flags_a_tree_patched_from_another_pinned_base(applied: Workspace, capsys) -> None:
    lock_path = applied.repo / "series.lock"
    state_path = applied.tree / ".patchset/state.json"
    state = json.loads(state_path.read_text())
    state["base_pin"] = "1" * 64
    state_path.write_text(json.dumps(state))
    lock = json.loads(lock_path.read_text())
    lock["pins"] = {"vllm.sdist": "2" * 64}
    lock_path.write_text(canonical_json(lock))  # a lock as patchset writes it, another pin
    assert applied.cli("verify") == 1
    assert "tree was patched from base 111111111111, series.lock pins 222222222222" in (
        capsys.readouterr().err
    )
