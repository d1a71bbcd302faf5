"""End to end on the real pinned vLLM sdist: lock, apply into a fresh tree, verify, tamper,
unapply, and a broken patch in the middle of a series.

The patches are made by ``git format-patch`` in a small git repository holding pristine copies
of the real vLLM files they touch. The sdist comes through the fetch cache (``$PATCHSET_CACHE``
or the repository's ``.cache/patchset``; downloaded with pip when absent).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest
from conftest import format_patch_head, git, snapshot
from patchset.cli import main
from patchset.fetch import cache_dir, pristine_tree
from patchset.hashing import sha256_bytes

REPO = Path(__file__).resolve().parent.parent
APPLY_VERIFY_BUDGET_S = 2.0
TOUCHED = ("vllm/envs.py", "vllm/transformers_utils/config.py", "vllm/config/model.py")

pytestmark = pytest.mark.slow


def _format_patch(work: Path, message: str) -> bytes:
    git(work, "add", "-A")
    git(work, "commit", "-qs", "-m", message)
    return format_patch_head(work)


def _edit(path: Path, old: bytes, new: bytes) -> None:
    data = path.read_bytes()
    assert data.count(old) >= 1, (path, old)
    path.write_bytes(data.replace(old, new, 1))


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A dcp-series checkout with the real pins and three git-made patches, locked."""
    os.environ.setdefault("PATCHSET_CACHE", str(cache_dir(REPO)))
    root = tmp_path_factory.mktemp("e2e-vllm")
    repo = root / "repo"
    (repo / "patches" / "vllm").mkdir(parents=True)
    shutil.copy(REPO / "pins.toml", repo / "pins.toml")
    base = pristine_tree("vllm", root=repo)
    work = root / "gitwork"
    work.mkdir()
    git(work, "init", "-q")
    for rel in TOUCHED:
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(base / rel, work / rel)
    git(work, "add", "-A")
    git(work, "commit", "-qm", "pristine copies")
    body = "\n\nPurpose.\n\nUpstream-Status: Inappropriate [test fixture]"
    _edit(work / TOUCHED[0], b"import os\n", b"import os  # dcp-series e2e\n")
    (work / "vllm/dcp_e2e").mkdir()
    (work / "vllm/dcp_e2e/__init__.py").write_bytes(b"# SPDX-License-Identifier: Apache-2.0\n")
    first = _format_patch(work, "[Misc] e2e one" + body)
    _edit(work / TOUCHED[1], b"import os\n", b"import os  # e2e two\n")
    second = _format_patch(work, "[Misc] e2e two" + body)
    _edit(work / TOUCHED[2], b"import ", b"import  ")
    _edit(work / TOUCHED[0], b"# dcp-series e2e\n", b"# dcp-series e2e, three\n")
    third = _format_patch(work, "[Misc] e2e three" + body)
    names = []
    for number, data in enumerate((first, second, third), start=1):
        name = f"vllm/{number:04d}-e2e.patch"
        (repo / "patches" / name).write_bytes(data)
        names.append(name)
    (repo / "series").write_text("".join(f"{n}\n" for n in names))
    assert main(["-C", str(repo), "lock"]) == 0
    assert main(["-C", str(repo), "lock", "--check"]) == 0
    return repo


def test_fresh_tree_apply_verify_tamper_unapply(scratch: Path, capsys) -> None:
    """A missing tree is unpacked from the pinned sdist and patched; verify names a one-byte
    tamper with its owner; unapply restores every byte of the unpacked tree."""
    tree = scratch.parent / "tree"
    assert (
        main(["-C", str(scratch), "apply", "--tree", str(tree), "--upto", "vllm/0001-e2e.patch"])
        == 0
    )
    assert main(["-C", str(scratch), "unapply", "--tree", str(tree)]) == 0
    pristine = snapshot(tree)
    capsys.readouterr()
    start = time.monotonic()
    assert main(["-C", str(scratch), "apply", "--tree", str(tree)]) == 0
    assert main(["-C", str(scratch), "verify", "--tree", str(tree)]) == 0
    elapsed = time.monotonic() - start
    assert elapsed <= APPLY_VERIFY_BUDGET_S, f"apply+verify took {elapsed:.2f} s"
    out = capsys.readouterr().out
    assert "Applying vllm/0003-e2e.patch (3/3)" in out
    assert b"# dcp-series e2e, three" in (tree / TOUCHED[0]).read_bytes()

    target = tree / TOUCHED[1]
    original = target.read_bytes()
    target.write_bytes(original[:100] + bytes([original[100] ^ 1]) + original[101:])
    assert main(["-C", str(scratch), "verify", "--tree", str(tree)]) == 1
    err = capsys.readouterr().err
    assert f"{TOUCHED[1]}: expected" in err and "(owned by vllm/0002-e2e.patch)" in err
    target.write_bytes(original)

    assert main(["-C", str(scratch), "apply", "--tree", str(tree)]) == 2
    assert main(["-C", str(scratch), "unapply", "--tree", str(tree)]) == 0
    assert snapshot(tree) == pristine


def test_broken_patch_in_the_middle_leaves_real_tree_untouched(scratch: Path, capsys) -> None:
    """With patch 2 of 3 broken, apply exits 1 (stale lock; and with the lock forced to the
    broken patch's digest, a hunk that does not apply) and the tree stays byte-identical."""
    tree = scratch.parent / "tree-broken"
    assert (
        main(["-C", str(scratch), "apply", "--tree", str(tree), "--upto", "vllm/0001-e2e.patch"])
        == 0
    )
    assert main(["-C", str(scratch), "unapply", "--tree", str(tree)]) == 0
    pristine = snapshot(tree)
    broken_repo = scratch.parent / "broken-repo"
    shutil.copytree(scratch, broken_repo, ignore=shutil.ignore_patterns("build"))
    patch = broken_repo / "patches/vllm/0002-e2e.patch"
    patch.write_bytes(patch.read_bytes().replace(b"-import os\n", b"-import sys\n", 1))
    capsys.readouterr()
    assert main(["-C", str(broken_repo), "apply", "--tree", str(tree)]) == 1
    assert "series.lock is stale" in capsys.readouterr().err
    assert snapshot(tree) == pristine
    lock_path = broken_repo / "series.lock"
    lock = json.loads(lock_path.read_text())
    lock["patches"][1]["sha256"] = sha256_bytes(patch.read_bytes())
    lock_path.write_text(json.dumps(lock, sort_keys=True, indent=2) + "\n")
    assert main(["-C", str(broken_repo), "apply", "--tree", str(tree)]) == 1
    assert "vllm/0002-e2e.patch does not apply" in capsys.readouterr().err
    assert snapshot(tree) == pristine
