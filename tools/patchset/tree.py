"""Reading the files of a target tree, one relative path at a time.

Only the paths a series touches are ever read or hashed; a path that reaches through a symlink
present in the tree is refused before anything is read. Writes go through ``journal``.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from patchset.errors import TreeStateError

_KINDS = {
    stat.S_IFIFO: "a FIFO",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
    stat.S_IFDIR: "a directory",
    stat.S_IFLNK: "a symlink",
}


def kind_of(mode: int) -> str:
    """``a FIFO``, ``a directory``, ... for a non-regular ``st_mode``."""
    return _KINDS.get(stat.S_IFMT(mode), "not a regular file")


def read_regular(path: Path) -> bytes | None:
    """The bytes of the regular file ``path``, or None when it does not exist.

    Never follows a symlink in the last component and never opens anything but a regular
    file: a FIFO, device or socket is refused before it is opened (``lstat``), and the open
    itself is non-blocking with ``O_NOFOLLOW`` and re-checked with ``fstat`` (a file swapped
    for a FIFO in between is refused too, never waited on). Raises TreeStateError."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    except NotADirectoryError:
        raise TreeStateError(f"{path}: a parent of this path is a file in the tree") from None
    if not stat.S_ISREG(info.st_mode):
        raise TreeStateError(
            f"{path}: is {kind_of(info.st_mode)}, not a regular file; refusing to read it",
            hint="the series only reads and writes regular files: remove it or restore the file",
        )
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise TreeStateError(f"{path}: became a symlink; refusing to read it") from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise TreeStateError(
                f"{path}: is {kind_of(info.st_mode)}, not a regular file; refusing to read it"
            )
        os.set_blocking(fd, True)
        chunks = []
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


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

    def problem(self, rel: str) -> str | None:
        """:meth:`symlink_problem`, or why ``rel`` is not a regular file (a FIFO, a device, a
        directory), or None."""
        reason = self.symlink_problem(rel)
        if reason:
            return reason
        try:
            info = os.lstat(self.path(rel))
        except FileNotFoundError:
            return None
        if not stat.S_ISREG(info.st_mode):
            return f"path {rel!r} is {kind_of(info.st_mode)} in the tree, not a regular file"
        return None

    def read(self, rel: str) -> bytes | None:
        """The bytes of ``rel``, or None when it does not exist. A path through a symlink (any
        component) or one that is not a regular file is refused (TreeStateError), never read
        through or opened."""
        reason = self.symlink_problem(rel)
        if reason:
            raise TreeStateError(
                f"{self.root}: {reason}; refusing to read through it",
                hint="a patch may only read and write real files of the tree",
            )
        return read_regular(self.path(rel))

    def mode(self, rel: str) -> int | None:
        """The permission bits of ``rel``, or None when it does not exist."""
        try:
            return stat.S_IMODE(os.lstat(self.path(rel)).st_mode)
        except FileNotFoundError:
            return None


def file_mode(git_mode: str) -> int:
    """Permission bits for a git file mode (``100755`` -> 0o755, else 0o644)."""
    return 0o755 if git_mode == "100755" else 0o644
