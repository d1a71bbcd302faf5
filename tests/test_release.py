"""apply refuses a tree that names another release than the pinned one, before any write."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import Workspace, git, patch_bytes, snapshot
from patchset.release import public
from patchset.tree import release_problem, tree_release

PINS = """schema_version = 1
[vllm.sdist]
requirement = "vllm==0.33.0"
filename = "vllm-0.33.0.tar.gz"
sha256 = "{sha}"
pip_args = []
top_dir = "vllm-0.33.0"

[vllm.sdist.env]
"""
MOD = b"x = 1\n"


def _setup(ws: Workspace, version: str) -> None:
    (ws.repo / "pins.toml").write_text(PINS.format(sha="1" * 64))
    base = {"PKG-INFO": f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n".encode()}
    base["vllm/mod.py"] = MOD
    ws.setup(base, [("vllm/0001-one.patch", patch_bytes({"vllm/mod.py": (MOD, b"x = 2\n")}))])


def test_apply_refuses_a_tree_of_another_release_and_names_both(ws: Workspace, capsys) -> None:
    """A 0.26.0 tree under a series pinned to 0.33.0 is refused with both versions named, and
    not one byte of the tree changes (even though its files would take the patch)."""
    _setup(ws, "0.26.0")
    before = snapshot(ws.tree)
    assert ws.cli("apply") == 1
    err = capsys.readouterr().err
    assert "vllm 0.26.0 (PKG-INFO)" in err and "pinned to vllm 0.33.0" in err
    assert snapshot(ws.tree) == before


def test_apply_takes_a_tree_of_the_pinned_release(ws: Workspace) -> None:
    _setup(ws, "0.33.0")
    assert ws.cli("apply") == 0
    assert (ws.tree / "vllm/mod.py").read_bytes() == b"x = 2\n"


def test_versions_are_read_from_version_py_and_from_an_exact_git_tag(tmp_path: Path) -> None:
    """_version.py (sdist or build) and a v<version> tag at HEAD both name the release; a local
    build label (+cu130) is not a different release."""
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm/_version.py").write_text("__version__ = version = '0.33.0+cu130'\n")
    assert tree_release(tmp_path, "vllm") == ("0.33.0+cu130", "vllm/_version.py")
    assert release_problem(tmp_path, "vllm", "vllm==0.33.0") is None
    assert public("0.33.0+cu130") == public("0.33.0.dev0") == "0.33.0"
    assert public("0.33.1.dev3+gabc") == "0.33.1"

    repo = tmp_path / "co"
    (repo / "vllm").mkdir(parents=True)
    (repo / "vllm/mod.py").write_bytes(MOD)
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "base")
    assert tree_release(repo, "vllm") is None  # an untagged checkout names no release
    git(repo, "tag", "v0.32.1")
    problem = release_problem(repo, "vllm", "vllm==0.33.0")
    assert problem is not None and "vllm 0.32.1 (git tag v0.32.1)" in problem


@pytest.mark.parametrize("requirement", ["vllm>=0.33", "vllm", ""])
def test_a_requirement_that_is_not_an_exact_pin_checks_nothing(
    tmp_path: Path, requirement: str
) -> None:
    (tmp_path / "PKG-INFO").write_text("Version: 0.1\n")
    assert release_problem(tmp_path, "vllm", requirement) is None
