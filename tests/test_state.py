"""state: `.patchset/state.json` round-trips canonically; a damaged state is refused."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import Workspace, patch_bytes, snapshot
from hypothesis import given
from hypothesis import strategies as st
from patchset.errors import TreeStateError
from patchset.model import AppliedPatch, FileImage, PatchImages, TreeState
from patchset.state import state_from_json, state_to_json
from patchset.tree import read_state

SHA = st.text(alphabet="0123456789abcdef", min_size=64, max_size=64)
PATH = st.from_regex(r"[a-z]{1,5}(/[a-z_]{1,5}){0,2}\.py", fullmatch=True)
IMAGE = st.builds(
    FileImage,
    path=PATH,
    op=st.sampled_from(["modify", "add", "delete"]),
    pre=st.none() | SHA,
    post=st.none() | SHA,
    mode=st.sampled_from(["100644", "100755"]),
)
APPLIED = st.builds(
    AppliedPatch,
    images=st.builds(
        PatchImages,
        name=st.from_regex(r"vllm/\d{4}-[a-z]{1,8}\.patch", fullmatch=True),
        sha256=SHA,
        files=st.lists(IMAGE, max_size=3).map(tuple),
    ),
    created_dirs=st.lists(PATH, max_size=2).map(tuple),
)
STATES = st.builds(
    TreeState,
    target=st.sampled_from(["vllm", "b12x"]),
    base_pin=st.none() | SHA,
    git_head=st.none() | st.text(alphabet="0123456789abcdef", min_size=40, max_size=40),
    applied=st.lists(APPLIED, max_size=3).map(tuple),
    backups=st.dictionaries(PATH, st.none() | SHA, max_size=3),
)


@given(STATES)
def test_state_round_trips_through_canonical_json(state: TreeState) -> None:
    """Serialising then parsing a state gives it back, and serialising again is a fixed point."""
    text = state_to_json(state)
    parsed = state_from_json(text, Path("state.json"))
    assert parsed == state
    assert state_to_json(parsed) == text


def test_malformed_or_future_state_is_refused(tmp_path: Path) -> None:
    (tmp_path / ".patchset").mkdir()
    state = tmp_path / ".patchset/state.json"
    state.write_text("{not json")
    with pytest.raises(TreeStateError, match="malformed state"):
        read_state(tmp_path)
    state.write_text('{"schema_version": 2}')
    with pytest.raises(TreeStateError, match="schema_version 2"):
        read_state(tmp_path)
    state.unlink()
    (tmp_path / ".patchset/base").mkdir()
    assert read_state(tmp_path) is None  # only empty directories: what a finished unapply leaves
    (tmp_path / ".patchset/base/a.py").write_bytes(b"a\n")
    with pytest.raises(TreeStateError, match="exists without state.json"):
        read_state(tmp_path)


def test_apply_refuses_a_tree_with_damaged_state(ws: Workspace, capsys) -> None:
    ws.setup({"a.py": b"a\n"}, [("vllm/0001-a.patch", patch_bytes({"a.py": (b"a\n", b"b\n")}))])
    (ws.tree / ".patchset/base").mkdir(parents=True)
    (ws.tree / ".patchset/base/a.py").write_bytes(b"a\n")
    before = snapshot(ws.tree)
    assert ws.cli("apply") == 1
    err = capsys.readouterr().err
    assert "exists without state.json" in err and "hint: " in err
    assert snapshot(ws.tree) == before
