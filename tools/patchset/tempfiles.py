"""Temporary files that a kill cannot leave behind for ever.

The writing process holds an exclusive ``flock`` on its temporary file while it writes; the lock
dies with the process. :func:`remove_stale` deletes the matching files nobody holds (older than
a few seconds, so a file is never taken between its creation and its lock).
"""

from __future__ import annotations

import fcntl
import os
import tempfile
import time
from pathlib import Path

STALE_AFTER_S = 5.0


def locked_temp(directory: Path, prefix: str, suffix: str) -> tuple[int, Path]:
    """A new temporary file in ``directory``, open (the fd) and locked by this process."""
    fd, name = tempfile.mkstemp(dir=directory, prefix=prefix, suffix=suffix)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd, Path(name)


def remove_stale(directory: Path, pattern: str) -> int:
    """Delete files of ``directory`` matching ``pattern`` that no live process holds."""
    removed = 0
    if not directory.is_dir():
        return 0
    for path in sorted(directory.glob(pattern)):
        try:
            if path.is_symlink() or time.time() - path.stat().st_mtime < STALE_AFTER_S:
                continue
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            continue
        else:
            path.unlink(missing_ok=True)
            removed += 1
        finally:
            os.close(fd)
    return removed
