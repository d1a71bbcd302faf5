"""One patchset process per tree: an exclusive ``flock`` on the tree's root directory.

Locking the directory itself (not a file inside it) means a refused or failed run leaves no
lock file behind. A second process polls until ``timeout`` seconds pass, then raises TreeBusy;
the lock dies with its process, so a crashed run never leaves the tree locked.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from patchset.errors import TreeBusy, TreeStateError

DEFAULT_TIMEOUT_S = 30.0
_POLL_S = 0.05


def _same_directory(fd: int, root: Path) -> bool:
    try:
        now = os.stat(root)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (held.st_dev, held.st_ino) == (now.st_dev, now.st_ino)


_held: dict[Path, int] = {}
"""Trees this process holds, with the nesting depth (``wheel`` holds the lock around apply)."""


@contextmanager
def tree_lock(root: Path, timeout: float = DEFAULT_TIMEOUT_S) -> Iterator[None]:
    """Hold the exclusive lock of tree ``root`` for the duration of the block (re-entrant within
    one process)."""
    key = root.resolve()
    if key in _held:
        _held[key] += 1
        try:
            yield
        finally:
            _held[key] -= 1
        return
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise TreeBusy(
                        f"tree {root} is locked by another patchset process (waited {timeout:g} s)",
                        hint="wait for it to finish, or pass a longer --wait",
                    ) from None
                time.sleep(_POLL_S)
        if not _same_directory(fd, root):
            raise TreeStateError(
                f"tree {root} was removed while this process waited for it",
                hint="the process that created it failed; run the command again",
            )
        _held[key] = 1
        try:
            yield
        finally:
            del _held[key]
    finally:
        os.close(fd)
