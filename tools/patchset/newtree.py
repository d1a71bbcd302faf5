"""A missing target tree, created once (``tree`` reads one that exists): concurrent first runs
are serialised by an exclusive ``flock`` on the parent directory, and only the process that
unpacked the tree removes it, and only when its own run then failed (``NothingToDo`` is not a
failure)."""

from __future__ import annotations

import fcntl
import os
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from patchset.errors import NothingToDo, TreeBusy

_POLL_S = 0.05


@contextmanager
def _parent_lock(root: Path, timeout: float, log: Callable[[str], None]) -> Iterator[None]:
    parent = root.parent
    parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        deadline = time.monotonic() + timeout
        told = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not told:
                    log(f"waiting for another patchset process creating a tree in {parent}")
                    told = True
                if time.monotonic() >= deadline:
                    raise TreeBusy(
                        f"another patchset process is creating a tree in {parent} "
                        f"(waited {timeout:g} s)",
                        hint="wait for it to finish, or pass a longer --wait",
                    ) from None
                time.sleep(_POLL_S)
        yield
    finally:
        os.close(fd)


@contextmanager
def created_if_missing(
    root: Path, unpack: Callable[[], object], timeout: float, log: Callable[[str], None]
) -> Iterator[bool]:
    """Run the block on tree ``root``, unpacking it first (``unpack()``) if it is missing.

    Yields whether this process created it. The parent lock is held for the whole block when
    the tree was missing, so a second first run waits and then finds a finished tree.
    """
    if root.exists():
        yield False
        return
    with _parent_lock(root, timeout, log):
        if root.exists():
            yield False
            return
        unpack()
        try:
            yield True
        except NothingToDo:
            raise
        except BaseException:
            shutil.rmtree(root, ignore_errors=True)
            raise
