"""apply/unapply: exact, all or nothing, recorded in the tree, one process at a time."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from conftest import Workspace, git, patch_bytes, snapshot, write_tree
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

BASE = {
    "pkg/a.py": b"".join(b"a%d = %d\n" % (i, i) for i in range(40)),
    "pkg/b.py": b"def f():\n    return 1\n",
    "pkg/gone.py": b"old\n",
    "README": b"readme\n",
}
A2 = BASE["pkg/a.py"].replace(b"a5 = 5\n", b"a5 = 50\n")
A3 = A2.replace(b"a30 = 30\n", b"a30 = 300\n")


def three_patches() -> list[tuple[str, bytes]]:
    return [
        ("vllm/0001-one.patch", patch_bytes({"pkg/a.py": (BASE["pkg/a.py"], A2)})),
        (
            "vllm/0002-two.patch",
            patch_bytes(
                {
                    "pkg/new/mod.py": (None, b"x = 1\n"),
                    "pkg/gone.py": (BASE["pkg/gone.py"], None),
                    "pkg/b.py": (BASE["pkg/b.py"], b"def f():\n    return 2\n"),
                }
            ),
        ),
        ("vllm/0003-three.patch", patch_bytes({"pkg/a.py": (A2, A3)})),
    ]


def test_apply_verify_unapply_restores_every_byte(ws: Workspace) -> None:
    ws.setup(BASE, three_patches())
    before = snapshot(ws.tree)
    assert ws.cli("apply") == 0
    assert (ws.tree / "pkg/a.py").read_bytes() == A3
    assert (ws.tree / "pkg/new/mod.py").read_bytes() == b"x = 1\n"
    assert not (ws.tree / "pkg/gone.py").exists()
    assert ws.cli("verify") == 0
    assert ws.cli("unapply") == 0
    assert snapshot(ws.tree) == before


def test_second_apply_does_nothing_and_exits_2(ws: Workspace, capsys) -> None:
    ws.setup(BASE, three_patches())
    assert ws.cli("apply") == 0
    after = snapshot(ws.tree)
    assert ws.cli("apply") == 2
    assert "already applied" in capsys.readouterr().out
    assert snapshot(ws.tree) == after


def test_apply_prints_one_line_per_patch(ws: Workspace, capsys) -> None:
    ws.setup(BASE, three_patches())
    assert ws.cli("apply", "--upto", "vllm/0002-two.patch") == 0
    out = capsys.readouterr().out
    assert "Applying vllm/0001-one.patch (1/3)" in out
    assert "Applying vllm/0002-two.patch (2/3)" in out
    assert ws.cli("apply") == 0
    assert "Applying vllm/0003-three.patch (3/3)" in capsys.readouterr().out


def test_unapply_upto_keeps_that_patch_applied(ws: Workspace) -> None:
    ws.setup(BASE, three_patches())
    assert ws.cli("apply", "--upto", "vllm/0001-one.patch") == 0
    partial = snapshot(ws.tree)
    assert ws.cli("apply") == 0
    assert ws.cli("unapply", "--upto", "vllm/0001-one.patch") == 0
    assert snapshot(ws.tree) == partial
    assert ws.cli("unapply", "--upto", "vllm/0001-one.patch") == 2


def test_rejects_preimage_mismatch_without_touching_tree(ws: Workspace, capsys) -> None:
    ws.setup(BASE, three_patches())
    (ws.tree / "pkg/b.py").write_bytes(b"edited\n")
    (ws.tree / "pkg/new").mkdir()
    (ws.tree / "pkg/new/mod.py").write_bytes(b"in the way\n")
    before = snapshot(ws.tree)
    assert ws.cli("apply") == 1
    err = capsys.readouterr().err
    assert "2 file(s) differ from the preimages" in err
    assert "pkg/b.py: expected" in err and "(preimage of vllm/0002-two.patch)" in err
    assert "pkg/new/mod.py: expected absent" in err
    assert snapshot(ws.tree) == before


def test_broken_patch_in_the_middle_leaves_tree_byte_identical(ws: Workspace, capsys) -> None:
    ws.setup(BASE, three_patches())
    broken = (
        (ws.repo / "patches/vllm/0002-two.patch")
        .read_bytes()
        .replace(b"-    return 1", b"-    return 9")
    )
    (ws.repo / "patches/vllm/0002-two.patch").write_bytes(broken)
    before = snapshot(ws.tree)
    assert ws.cli("apply") == 1
    assert "series.lock is stale" in capsys.readouterr().err
    assert snapshot(ws.tree) == before
    # Even with a lock forced to match the broken patch's digest, nothing is written.
    lock = (ws.repo / "series.lock").read_text()
    from patchset.hashing import sha256_bytes

    old = sha256_bytes((ws.repo / "patches/vllm/0002-two.patch").read_bytes())
    (ws.repo / "series.lock").write_text(lock.replace(_lock_sha(lock, "0002"), old))
    assert ws.cli("apply") == 1
    assert "vllm/0002-two.patch does not apply" in capsys.readouterr().err
    assert snapshot(ws.tree) == before
    assert not (ws.tree / ".patchset").exists()


def _lock_sha(lock_text: str, number: str) -> str:
    import json

    for entry in json.loads(lock_text)["patches"]:
        if number in entry["name"]:
            return entry["sha256"]
    raise AssertionError(number)


def test_failure_while_writing_rolls_back_every_file(ws: Workspace, monkeypatch, capsys) -> None:
    ws.setup(BASE, three_patches())
    before = snapshot(ws.tree)
    for point in (3, 9, 14):
        monkeypatch.setenv("PATCHSET_TEST_CRASH", f"{point}:ENOSPC")
        assert ws.cli("apply") == 1
        assert "No space left on device" in capsys.readouterr().err
        assert snapshot(ws.tree) == before


def test_failure_writing_state_after_partial_apply_keeps_previous_state(ws, monkeypatch) -> None:
    ws.setup(BASE, three_patches())
    assert ws.cli("apply", "--upto", "vllm/0001-one.patch") == 0
    before = snapshot(ws.tree)
    import crashpoints as crashpoint

    labels: list[str] = []
    monkeypatch.setenv("PATCHSET_TEST_CRASH", "999:ENOSPC")
    monkeypatch.setattr(crashpoint, "reached", lambda label: labels.append(label))
    assert ws.cli("apply", "--upto", "vllm/0002-two.patch") == 0
    assert ws.cli("unapply", "--upto", "vllm/0001-one.patch") == 0
    monkeypatch.undo()
    last_move = max(i for i, label in enumerate(labels[: len(labels) // 2]) if "move" in label)
    assert labels[last_move] == "move .patchset/state.json"
    monkeypatch.setenv("PATCHSET_TEST_CRASH", f"{last_move + 1}:ENOSPC")
    assert ws.cli("apply") == 1
    assert snapshot(ws.tree) == before


def test_refuses_patch_through_symlink_in_tree(ws: Workspace, tmp_path: Path, capsys) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "b.py").write_bytes(BASE["pkg/b.py"])
    ws.setup(BASE, three_patches())
    (ws.tree / "pkg/b.py").unlink()
    (ws.tree / "pkg/new").symlink_to(outside)
    before = snapshot(ws.tree)
    assert ws.cli("apply") == 1
    assert "goes through symlink 'pkg/new'" in capsys.readouterr().err
    assert snapshot(ws.tree) == before
    assert sorted(p.name for p in outside.iterdir()) == ["b.py"]


def test_git_checkout_records_head_excludes_state_and_refuses_dirty(ws, capsys) -> None:
    ws.setup(BASE, three_patches())
    git(ws.tree, "init", "-q")
    git(ws.tree, "add", "-A")
    git(ws.tree, "commit", "-qm", "base")
    head = git(ws.tree, "rev-parse", "HEAD").strip()
    os.chmod(ws.tree / "pkg/b.py", 0o755)  # dirty (mode) but same bytes
    git(ws.tree, "config", "core.fileMode", "true")
    assert ws.cli("apply") == 1
    err = capsys.readouterr().err
    assert "dirty in the git checkout" in err and "pkg/b.py" in err
    os.chmod(ws.tree / "pkg/b.py", 0o644)
    assert ws.cli("apply") == 0
    assert f"git checkout at {head}" in capsys.readouterr().out
    assert git(ws.tree, "status", "--porcelain", "--ignored", ".patchset") == "!! .patchset/\n"
    assert ws.cli("unapply") == 0
    assert git(ws.tree, "status", "--porcelain") == ""


def test_missing_tree_is_created_by_unpacking_the_pinned_sdist(ws, monkeypatch) -> None:
    ws.setup(BASE, three_patches())
    import patchset.fetch as fetch

    def fake_unpack(target: str, dest: Path, *, root: Path | None = None, offline=False):
        assert target == "vllm"
        write_tree(dest, BASE)
        return dest

    monkeypatch.setattr(fetch, "unpack_sdist", fake_unpack)
    new_tree = ws.tree.parent / "fresh"
    assert ws.cli("apply", "--tree", str(new_tree)) == 0
    assert (new_tree / "pkg/a.py").read_bytes() == A3


FILES = st.dictionaries(
    st.sampled_from(["a.py", "d/b.py", "d/e/c.txt", "z"]),
    st.lists(st.sampled_from([b"x\n", b"y\n", b"\n", b"q"]), max_size=12).map(b"".join),
    max_size=4,
)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(base=FILES, stages=st.lists(FILES, min_size=1, max_size=3))
def test_apply_then_unapply_is_identity_on_generated_trees(base, stages) -> None:
    """For any generated base tree and series of generated patches, apply then unapply
    restores every file, mode and directory of the tree."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "repo/patches/vllm").mkdir(parents=True)
        ws = Workspace(root / "repo", root / "base", root / "tree")
        ws.base.mkdir()
        current: dict[str, bytes | None] = {
            p: base.get(p) for p in ["a.py", "d/b.py", "d/e/c.txt", "z"]
        }
        patches = []
        for number, stage in enumerate(stages, start=1):
            changes = {}
            for path, pre in current.items():
                post = stage.get(path)
                if post != pre:
                    changes[path] = (pre, post)
                    current[path] = post
            if changes:
                patches.append((f"vllm/{number:04d}-stage.patch", patch_bytes(changes)))
        if not patches:
            return
        ws.setup(base, patches)
        before = snapshot(ws.tree)
        assert ws.cli("apply") == 0
        for path, data in current.items():
            assert (
                (ws.tree / path).read_bytes() == data
                if data is not None
                else not (ws.tree / path).exists()
            )
        assert ws.cli("unapply") == 0
        assert snapshot(ws.tree) == before


def test_unapply_uses_pristine_copies_when_an_applied_patch_changed_on_disk(ws, capsys) -> None:
    ws.setup(BASE, three_patches())
    before = snapshot(ws.tree)
    assert ws.cli("apply") == 0
    changed = ws.repo / "patches/vllm/0002-two.patch"
    changed.write_bytes(changed.read_bytes().replace(b"+x = 1", b"+x = 2"))
    assert ws.cli("apply") == 1
    assert "changed on disk since it was applied" in capsys.readouterr().err
    assert ws.cli("unapply") == 0
    assert "restoring from the pristine copies" in capsys.readouterr().out
    assert snapshot(ws.tree) == before


def test_unapply_refuses_drifted_tree_without_touching_it(ws: Workspace, capsys) -> None:
    ws.setup(BASE, three_patches())
    assert ws.cli("apply") == 0
    (ws.tree / "pkg/b.py").write_bytes(b"hand edit\n")
    before = snapshot(ws.tree)
    assert ws.cli("unapply") == 1
    err = capsys.readouterr().err
    assert "1 file(s) drifted" in err and "(postimage of vllm/0002-two.patch)" in err
    assert snapshot(ws.tree) == before


def test_created_tree_is_removed_again_when_apply_fails(ws, monkeypatch, capsys) -> None:
    ws.setup(BASE, three_patches())
    import patchset.fetch as fetch

    def fake_unpack(target: str, dest: Path, *, root: Path | None = None, offline=False):
        write_tree(dest, {**BASE, "pkg/b.py": b"not the pinned release\n"})
        return dest

    monkeypatch.setattr(fetch, "unpack_sdist", fake_unpack)
    new_tree = ws.tree.parent / "fresh"
    assert ws.cli("apply", "--tree", str(new_tree)) == 1
    assert "differ from the preimages" in capsys.readouterr().err
    assert not new_tree.exists()


def test_refuses_when_a_parent_of_a_touched_path_is_a_file(ws: Workspace, capsys) -> None:
    ws.setup(BASE, three_patches())
    shutil.rmtree(ws.tree / "pkg")
    (ws.tree / "pkg").write_bytes(b"a file where a directory should be\n")
    before = snapshot(ws.tree)
    assert ws.cli("apply") == 1
    assert "needs directory 'pkg', which is a file in the tree" in capsys.readouterr().err
    assert snapshot(ws.tree) == before


def test_refuses_lock_whose_file_list_disagrees_with_the_patch(ws: Workspace, capsys) -> None:
    ws.setup(BASE, three_patches())
    lock_path = ws.repo / "series.lock"
    raw = json.loads(lock_path.read_text())
    raw["patches"][1]["files"].pop()
    lock_path.write_text(json.dumps(raw, sort_keys=True, indent=2) + "\n")
    before = snapshot(ws.tree)
    assert ws.cli("apply") == 1
    assert "series.lock disagrees with the patches" in capsys.readouterr().err
    assert snapshot(ws.tree) == before


def test_failure_while_unapplying_rolls_back_every_file(ws, monkeypatch, capsys) -> None:
    ws.setup(BASE, three_patches())
    assert ws.cli("apply") == 0
    applied = snapshot(ws.tree)
    for point in (2, 7, 12):
        monkeypatch.setenv("PATCHSET_TEST_CRASH", f"{point}:ENOSPC")
        assert ws.cli("unapply") == 1
        assert "No space left on device" in capsys.readouterr().err
        assert snapshot(ws.tree) == applied
    monkeypatch.delenv("PATCHSET_TEST_CRASH")
    assert ws.cli("verify") == 0
