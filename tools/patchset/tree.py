"""Reading the files of a target tree, one relative path at a time.

Only the paths a series touches are ever read or hashed; a path that reaches through a symlink
present in the tree is refused before anything is read. Writes go through ``journal``.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from patchset.errors import TreeStateError


class Tree:
    """A target tree rooted at ``root`` (paths are POSIX, relative, already validated)."""

    def __init__(self, root: Path):
        self.root = root

    def path(self, rel: str) -> Path:
        return self.root / rel

    def symlink_problem(self, rel: str) -> str | None:
        """Why ``rel`` cannot be touched (a symlink, or a file where a directory must be), or
        None."""
        current = self.root
        parts = rel.split("/")
        for depth, part in enumerate(parts, start=1):
            current = current / part
            try:
                info = os.lstat(current)
            except FileNotFoundError:
                return None
            where = current.relative_to(self.root).as_posix()
            if stat.S_ISLNK(info.st_mode):
                return f"path {rel!r} goes through symlink {where!r} in the tree"
            if depth < len(parts) and not stat.S_ISDIR(info.st_mode):
                return f"path {rel!r} needs directory {where!r}, which is a file in the tree"
        return None

    def read(self, rel: str) -> bytes | None:
        """The bytes of ``rel``, or None when it does not exist."""
        try:
            with open(self.path(rel), "rb") as fh:
                return fh.read()
        except FileNotFoundError:
            return None
        except NotADirectoryError:
            raise TreeStateError(
                f"{self.path(rel)}: a parent of this path is a file in the tree"
            ) from None
        except IsADirectoryError:
            raise TreeStateError(
                f"{self.path(rel)}: is a directory, the series wants a file"
            ) from None

    def mode(self, rel: str) -> int | None:
        """The permission bits of ``rel``, or None when it does not exist."""
        try:
            return stat.S_IMODE(os.lstat(self.path(rel)).st_mode)
        except FileNotFoundError:
            return None


def file_mode(git_mode: str) -> int:
    """Permission bits for a git file mode (``100755`` -> 0o755, else 0o644)."""
    return 0o755 if git_mode == "100755" else 0o644
