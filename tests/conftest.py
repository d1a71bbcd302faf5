"""Builders for the patchset tests: generated trees, patches made with difflib, a workspace.

A :class:`Workspace` is a throw-away dcp-series checkout (``series``, ``patches/``) with a
pristine base tree and a lock made against it; :func:`snapshot` captures every file, its mode
and every directory of a tree, so tests can prove a failed run changed nothing.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest
from crashpoints import main
from patchset.model import PatchHeader
from patchset.patchfile import serialise_header
from patchset.refresh import render_file

SIGNED = "dcp-series <dcp-series@example.invalid>"
TESTS = Path(__file__).resolve().parent


def load_tree_tests(name: str = "vllm_tree_tests") -> ModuleType:
    """``tests/vllm_tree_tests.py`` (a script, not a package module), loaded as a new module."""
    spec = importlib.util.spec_from_file_location(name, TESTS / "vllm_tree_tests.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CONTRIBUTOR = "Ada Lovelace <ada@example.org>"
"""The git identity of the ``git_user`` fixture (a contributor's, not the placeholder)."""


def _git_config(tmp_path_factory: pytest.TempPathFactory, text: str) -> Path:
    cfg = tmp_path_factory.mktemp("gitcfg") / "config"
    cfg.write_text(text)
    return cfg


@pytest.fixture(autouse=True)
def hermetic_git_config(tmp_path_factory, monkeypatch) -> None:
    """No test reads the runner's git configuration: an empty global config and no system
    one, so a machine with no git identity (CI's) and a contributor's laptop see the same.
    A test that needs an identity asks for ``git_user``."""
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(_git_config(tmp_path_factory, "")))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    for name in ("AUTHOR", "COMMITTER"):
        for part in ("NAME", "EMAIL"):
            monkeypatch.delenv(f"GIT_{name}_{part}", raising=False)
    monkeypatch.delenv("EMAIL", raising=False)


@pytest.fixture
def git_user(tmp_path_factory, monkeypatch) -> str:
    """A global git config naming CONTRIBUTOR, as a contributor has."""
    name, email = CONTRIBUTOR[:-1].split(" <")
    text = f"[user]\n\tname = {name}\n\temail = {email}\n"
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(_git_config(tmp_path_factory, text)))
    return CONTRIBUTOR


Change = tuple[bytes | None, bytes | None]


def header_bytes(
    subject: str = "[Test] A change",
    *,
    status: str | None = "Pending",
    signed: bool = True,
    depends: tuple[str, ...] = (),
    description: str = "Why and what.\n\nTest Plan: pytest\nTest Result: green",
) -> bytes:
    """A format-patch header with the given trailers."""
    trailers: list[tuple[str, str]] = []
    if status is not None:
        trailers.append(("Upstream-Status", status))
    trailers += [("Depends-on", dep) for dep in depends]
    if signed:
        trailers.append(("Signed-off-by", SIGNED))
    header = PatchHeader(
        commit="0" * 40,
        author=SIGNED,
        date="Sun, 29 Nov 2026 00:00:00 +0000",
        subject=subject,
        description=description,
        trailers=tuple(trailers),
    )
    return serialise_header(header)


def patch_bytes(changes: dict[str, Change], *, mode: str = "100644", **header: object) -> bytes:
    """A patch file turning each path's first bytes into its second (None = absent)."""
    diff = b"".join(render_file(p, pre, post, mode) for p, (pre, post) in sorted(changes.items()))
    return header_bytes(**header) + diff  # type: ignore[arg-type]


def write_tree(root: Path, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def snapshot(root: Path) -> dict[str, tuple[str, bytes | None, int]]:
    """Every entry under ``root``: kind (file/dir/link), bytes for files, permission bits."""
    out: dict[str, tuple[str, bytes | None, int]] = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(dirpath) / name
            info = os.lstat(path)
            rel = path.relative_to(root).as_posix()
            if stat.S_ISLNK(info.st_mode):
                out[rel] = ("link", os.readlink(path).encode(), 0)
            elif stat.S_ISDIR(info.st_mode):
                out[rel] = ("dir", None, stat.S_IMODE(info.st_mode))
            else:
                out[rel] = ("file", path.read_bytes(), stat.S_IMODE(info.st_mode))
    return out


@dataclass
class Workspace:
    """A dcp-series checkout under ``repo`` with a pristine ``base`` and a work ``tree``."""

    repo: Path
    base: Path
    tree: Path

    def add_patch(self, name: str, data: bytes) -> Path:
        path = self.repo / "patches" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        return path

    def write_series(self, names: list[str]) -> None:
        (self.repo / "series").write_text("# test series\n" + "".join(f"{n}\n" for n in names))

    def setup(self, base: dict[str, bytes], patches: list[tuple[str, bytes]]) -> None:
        """Write the base (and a copy as the work tree), the patches, the series, the lock."""
        write_tree(self.base, base)
        for name, data in patches:
            self.add_patch(name, data)
        self.write_series([name for name, _ in patches])
        self.reset_tree()
        assert self.cli("lock") == 0

    def reset_tree(self) -> None:
        if self.tree.exists():
            shutil.rmtree(self.tree)
        shutil.copytree(self.base, self.tree, symlinks=True)

    def cli(self, *args: str) -> int:
        """Run ``patchset`` on this workspace (tree and base filled in where they apply)."""
        argv = ["-C", str(self.repo), *args]
        command = args[0]
        if command in ("apply", "unapply", "verify", "status", "refresh") and "--tree" not in args:
            argv += ["--tree", str(self.tree)]
        if command in ("lock", "refresh", "import") and "--base" not in args:
            argv += ["--base", f"vllm={self.base}"]
        return main(argv)


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    repo = tmp_path / "repo"
    (repo / "patches" / "vllm").mkdir(parents=True)
    (repo / "series").write_text("")
    base = tmp_path / "base"
    base.mkdir()
    return Workspace(repo, base, tmp_path / "tree")


def git(cwd: Path, *args: str) -> str:
    """Run git in ``cwd`` with a fixed identity; return stdout."""
    env = dict(
        os.environ,
        GIT_AUTHOR_NAME="dcp-series",
        GIT_AUTHOR_EMAIL="dcp-series@example.invalid",
        GIT_COMMITTER_NAME="dcp-series",
        GIT_COMMITTER_EMAIL="dcp-series@example.invalid",
        GIT_CONFIG_GLOBAL="/dev/null",
    )
    result = subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True)
    return result.stdout.decode()


FORMAT_PATCH_ARGS = ("--full-index", "--no-signature", "--zero-commit", "-N", "--no-stat")
"""How CONTRIBUTING.md exports a patch with git (the series' layout)."""


def format_patch_head(cwd: Path) -> bytes:
    """``git format-patch`` of HEAD in ``cwd``, in the series' layout, as bytes."""
    return git(cwd, "format-patch", *FORMAT_PATCH_ARGS, "-1", "--stdout").encode()
