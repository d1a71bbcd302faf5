"""Writes to the dcp-series checkout itself (``patches/``, ``series``, ``series.lock``).

``import``, ``lock`` and ``refresh`` change several files of the checkout at once. They do it
through the same journal as apply (:mod:`patchset.journal`, rooted at the checkout:
``<repo>/.patchset/journal/``), under an exclusive lock on the checkout directory
(:func:`patchset.tree.tree_lock`): a kill or a full disk leaves either every file as
before or the command finished, and a second writer waits for the first. Every command first
rolls back a journal a killed writer left (:func:`recover_repo`), so a half-written series
never reaches the parser.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path

from patchset import journal
from patchset.tree import DEFAULT_TIMEOUT_S, tree_lock

Log = Callable[[str], None]


def _quiet(_: str) -> None:
    return None


def repo_lock(repo: Path, timeout: float = DEFAULT_TIMEOUT_S):  # type: ignore[no-untyped-def]
    """Hold the checkout's writer lock (re-entrant within one process)."""
    return tree_lock(repo, timeout)


def recover_repo(repo: Path, log: Log = _quiet, timeout: float = DEFAULT_TIMEOUT_S) -> bool:
    """Roll back a checkout write that was killed; return whether there was one."""
    if not journal.pending(repo):
        return False
    with repo_lock(repo, timeout):
        if not journal.pending(repo):  # the writer we waited for finished it
            return False
        head, _ = journal.describe(repo)
        record = journal.load(repo)
        if record is not None and journal.committed(record):
            journal.roll_back(repo)  # drops the journal: the run had finished
            log(f"{repo}: a {record['op']} killed after it finished; dropped its journal")
            return True
        log(f"{repo}: {head}; rolling it back")
        moved = journal.roll_back(repo)
        log(f"Rolled back {moved} file(s) of the checkout to before that run")
        return True


def commit_repo(
    repo: Path,
    op: str,
    names: tuple[str, ...],
    files: dict[str, bytes],
    *,
    commit_point: dict[str, str] | None = None,
) -> int:
    """Write every ``files`` entry (checkout-relative path -> bytes) all or nothing; return the
    number of files changed. The caller holds :func:`repo_lock`.

    With ``commit_point`` the journal stays (the caller writes a tree next, then calls
    ``journal.finish(repo)``); a recovery before that rolls the checkout back unless the
    tree reached the commit point (see :class:`patchset.journal.Plan`)."""
    plan = journal.Plan(repo, op, names, removable=lambda _d: False, commit_point=commit_point)
    for rel, data in files.items():
        try:
            mode = stat.S_IMODE(os.lstat(repo / rel).st_mode)
        except FileNotFoundError:
            mode = 0o644
        plan.put(rel, data, mode)
    return journal.commit(plan, keep=commit_point is not None)
