"""A target tree that is a git checkout: its commit, dirty files, and excluding ``.patchset/``.

The only gitpython user of the apply path. A tree counts as a checkout only when it has its own
``.git`` (directory or worktree file); a tree inside another repository is a plain tree.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from patchset.errors import ExternalToolError

if TYPE_CHECKING:
    import git

STATE_EXCLUDE = "/.patchset/"


def is_checkout(root: Path) -> bool:
    return (root / ".git").exists()


def _repo(root: Path) -> git.Repo:
    import git  # imported lazily: gitpython is slow to import, plain trees never need it

    try:
        return git.Repo(root)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError) as exc:
        raise ExternalToolError(
            f"{root}: has .git but is not a usable git checkout: {exc}"
        ) from exc


def head_commit(root: Path) -> str | None:
    """The checkout's HEAD commit id, or None for a tree that is not a checkout (or unborn)."""
    if not is_checkout(root):
        return None
    repo = _repo(root)
    try:
        return str(repo.head.commit.hexsha)
    except ValueError:
        return None


def exact_tag(root: Path) -> str | None:
    """The tag naming the checkout's HEAD exactly (``git describe --exact-match``), or None."""
    if not is_checkout(root):
        return None
    import git

    try:
        return str(_repo(root).git.describe("--tags", "--exact-match", "HEAD")).strip() or None
    except git.GitCommandError:
        return None


def dirty_paths(root: Path, paths: list[str]) -> list[str]:
    """The paths among ``paths`` that ``git status`` reports (modified, staged or untracked)."""
    if not paths or not is_checkout(root):
        return []
    import git

    repo = _repo(root)
    try:
        out = repo.git.status("--porcelain=v1", "-z", "--untracked-files=all", "--", *paths)
    except git.GitCommandError as exc:
        raise ExternalToolError(f"git status failed in {root}: {exc}") from exc
    dirty = []
    entries = out.split("\0")
    skip = False
    for entry in entries:
        if skip:
            skip = False
            continue
        if len(entry) < 4:
            continue
        dirty.append(entry[3:])
        skip = entry[0] in "RC"
    return sorted(set(dirty) & set(paths))


def exclude_state_dir(root: Path) -> None:
    """Add ``/.patchset/`` to the checkout's ``info/exclude`` (once)."""
    if not is_checkout(root):
        return
    repo = _repo(root)
    exclude = Path(repo.common_dir) / "info" / "exclude"
    text = exclude.read_text(encoding="utf-8") if exclude.exists() else ""
    if STATE_EXCLUDE in text.splitlines():
        return
    exclude.parent.mkdir(parents=True, exist_ok=True)
    prefix = "" if not text or text.endswith("\n") else "\n"
    exclude.write_text(text + prefix + STATE_EXCLUDE + "\n", encoding="utf-8")
