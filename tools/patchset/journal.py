"""The write journal: every change to a tree (or the checkout) staged first, then made by
renames only; ``.patchset/journal/`` exists only while a write runs or after a kill, unlike
``state.json`` (``state``), which says what is applied.

``commit`` works in two phases under ``.patchset/journal/``:

1. prepare (the tree is not touched): check free space, write every new file's bytes to
   ``n/<i>`` and an undo copy of every file to be replaced or deleted to ``u/<i>``, then write
   ``journal.json`` (the list of changes with the sha256 and mode before and after) atomically;
2. execute: create missing directories, move each staged file into place (``os.replace``) or
   delete, remove directories the deletions emptied, then delete the journal.

Rollback (after an error in-process, or by ``recover``/the next ``apply``/``unapply`` after a
kill) moves the undo copies back by rename and re-creates removed directories, so it needs no
new space; it checks every path is at its before or after hash first, and at its before hash
at the end. Without ``journal.json`` the tree was not touched and the staging is discarded.
Every path is re-checked for symlinks in each component before it is written or deleted.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from patchset.diffparse import path_problem
from patchset.errors import PatchsetError, TreeStateError
from patchset.hashing import sha256_bytes, short_sha
from patchset.state import STATE_DIR, canonical_json
from patchset.tree import Tree, read_regular

JOURNAL_DIR = "journal"
JOURNAL_FILE = "journal.json"
SCHEMA_VERSION = 1
RESERVE_BYTES = 1 << 20
"""Free space kept beyond what the staged files need."""
RESERVE_INODES = 16
"""Free inodes kept beyond the files and directories a commit creates."""
_BLOCK = 4096


def _no_fault(_label: str) -> None:
    return None


write_point: Callable[[str], None] = _no_fault
"""Called with a label (``stage <path>``, ``move <path>``, ``journal``, ...) before each write of
a commit or a rollback. It does nothing; the tests replace it to crash at a chosen write point
(``tests/crashpoints.py``)."""


class Interrupted(PatchsetError):
    """A signal (SIGTERM, SIGHUP, SIGINT) arrived while the tree was being written."""

    def __init__(self, signum: int):
        name = signal.Signals(signum).name
        super().__init__(
            f"interrupted by {name}; every write was rolled back",
            hint="run the command again",
        )
        self.exit_code = 128 + signum


def free_bytes(path: Path) -> int:
    """Bytes available to this user on the filesystem of ``path``."""
    info = os.statvfs(path)
    return info.f_bavail * info.f_frsize


def free_inodes(path: Path) -> int | None:
    """Inodes (new files) available to this user on the filesystem of ``path``; None when the
    filesystem does not count them (``f_files`` is 0, e.g. btrfs)."""
    info = os.statvfs(path)
    return info.f_favail if info.f_files else None


def recover_command(root: Path) -> str:
    """The command that rolls back an interrupted run in ``root`` (a tree, or the checkout)."""
    if (root / "series").is_file() and not (root / STATE_DIR / "state.json").exists():
        return f"patchset -C {root} recover"
    return f"patchset recover --tree {root}"


def os_error_text(exc: OSError) -> str:
    """``<strerror>: <file>`` for an OSError, with what ENOSPC means (bytes or inodes)."""
    what = exc.strerror or str(exc)
    if exc.errno == errno.ENOSPC:
        what = f"{exc.strerror or 'No space left on device'} (the disk is full or out of inodes)"
    elif exc.errno in (errno.EPERM, errno.EACCES):
        what = f"{what} (an immutable file, or one owned by another user?)"
    where = exc.filename
    return f"{what}: {where}" if where else what


def journal_dir(root: Path) -> Path:
    return root / STATE_DIR / JOURNAL_DIR


def _mode_text(mode: int) -> str:
    return f"{mode:04o}"


@dataclass
class Plan:
    """The changes one command makes to a tree, collected before anything is written.

    ``put``/``delete`` take tree-relative POSIX paths (tree files, ``.patchset/...``);
    ``removable`` says which directories a deletion may remove once it is empty.
    """

    root: Path
    op: str
    patches: tuple[str, ...]
    removable: Callable[[str], bool] = lambda _d: True
    dir_modes: dict[str, int] = field(default_factory=dict)
    changes: list[tuple[str, bytes | None, int | None]] = field(default_factory=list)
    make_dirs: list[str] = field(default_factory=list)
    commit_point: dict[str, str] | None = None
    """For a commit kept open (``commit(plan, keep=True)``) while a second root is written: the
    file (absolute ``path``, ``sha256``) whose new bytes mean the whole operation committed,
    and the second root's journal (``pending``) that must be gone for that to count."""

    def put(self, rel: str, data: bytes, mode: int) -> list[str]:
        """Write ``data`` (permission bits ``mode``) to ``rel``; return the directories made."""
        made = []
        parts = rel.split("/")[:-1]
        for depth in range(1, len(parts) + 1):
            directory = "/".join(parts[:depth])
            if directory in self.make_dirs or directory == STATE_DIR:
                continue
            if not os.path.lexists(self.root / directory):
                self.make_dirs.append(directory)
                made.append(directory)
        self.changes.append((rel, data, mode))
        return made

    def delete(self, rel: str) -> None:
        self.changes.append((rel, None, None))

    def emptied_dirs(self) -> list[str]:
        """Directories (deepest first) left empty by the deletions, that may be removed."""
        deleted = {rel for rel, data, _ in self.changes if data is None}
        written = {rel for rel, data, _ in self.changes if data is not None}
        candidates = sorted(
            {"/".join(rel.split("/")[:d]) for rel in deleted for d in range(1, rel.count("/") + 1)},
            key=lambda d: (-d.count("/"), d),
        )
        gone: set[str] = set()
        out = []
        for directory in candidates:
            if directory in (STATE_DIR,) or not self.removable(directory):
                continue
            path = self.root / directory
            try:
                names = os.listdir(path)
            except (FileNotFoundError, NotADirectoryError):
                continue
            left = [
                n
                for n in names
                if f"{directory}/{n}" not in deleted and f"{directory}/{n}" not in gone
            ]
            if left or any(w.startswith(directory + "/") for w in written):
                continue
            gone.add(directory)
            out.append(directory)
        return out


def _component_problem(root: Path, rel: str) -> str | None:
    """A symlink (or a non-directory parent) in any component of ``rel`` under ``root``."""
    return Tree(root).symlink_problem(rel)


def _check_path(root: Path, rel: str) -> None:
    reason = _component_problem(root, rel)
    if reason:
        raise TreeStateError(
            f"refusing to write through a symlink: {reason}",
            hint="someone changed the tree while patchset ran; inspect it",
        )


def _read(path: Path) -> bytes | None:
    return read_regular(path)


def _sha_of(path: Path) -> str | None:
    data = _read(path)
    return None if data is None else sha256_bytes(data)


def _write_new(path: Path, data: bytes, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.chmod(path, mode)


@contextmanager
def _signals_raise() -> Iterator[None]:
    """Turn SIGTERM/SIGHUP/SIGINT into :class:`Interrupted` for the block (main thread only)."""

    def handler(signum: int, _frame: object) -> None:
        raise Interrupted(signum)

    saved = {}
    try:
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            saved[sig] = signal.signal(sig, handler)
    except ValueError:  # not the main thread: signals keep their default action
        pass
    try:
        yield
    finally:
        for sig, old in saved.items():
            signal.signal(sig, old)


@contextmanager
def signals_blocked() -> Iterator[None]:
    """Hold SIGTERM/SIGHUP/SIGINT back while a rollback runs (they arrive afterwards)."""
    sigs = {signal.SIGTERM, signal.SIGHUP, signal.SIGINT}
    old = signal.pthread_sigmask(signal.SIG_BLOCK, sigs)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def commit(plan: Plan, *, keep: bool = False) -> int:
    """Make every change of ``plan`` all or nothing; return the number of paths changed.

    ``keep`` leaves the journal in place after the changes are made (for an operation that
    writes a second root next): :func:`finish` drops it once that is done, and a recovery in
    between rolls it back unless ``plan.commit_point`` was reached."""
    root = plan.root
    for rel, _data, _mode in plan.changes:
        _check_path(root, rel)
    changes = []
    for rel, data, mode in plan.changes:
        before = _read(root / rel)
        before_mode = stat.S_IMODE(os.lstat(root / rel).st_mode) if before is not None else None
        if before == data and (data is None or before_mode == mode):
            continue
        changes.append((rel, data, mode, before, before_mode))
    if not changes:
        return 0
    remove_dirs = plan.emptied_dirs()
    needed = sum(len(d or b"") + len(b or b"") + 2 * _BLOCK for _, d, _, b, _ in changes)
    free = free_bytes(root)
    if needed + RESERVE_BYTES > free:
        raise TreeStateError(
            f"not enough free space in {root}: the {plan.op} needs about "
            f"{(needed + RESERVE_BYTES) >> 10} KiB, {free >> 10} KiB are free; nothing was changed",
            hint="free some space and run the command again",
        )
    files_needed = 2 * len(changes) + len(plan.make_dirs) + 4 + RESERVE_INODES
    inodes = free_inodes(root)
    if inodes is not None and files_needed > inodes:
        raise TreeStateError(
            f"not enough free inodes in {root}: the {plan.op} creates up to "
            f"{files_needed - RESERVE_INODES} files (plus {RESERVE_INODES} kept free), "
            f"{inodes} inodes are free; nothing was changed",
            hint="delete some files on that filesystem (df -i shows inodes) and run the "
            "command again",
        )
    staging = journal_dir(root)
    entries: list[dict[str, Any]] = []
    with _signals_raise():
        try:
            _check_path(root, f"{STATE_DIR}/{JOURNAL_DIR}/x")
            staging.mkdir(parents=True, exist_ok=False)
            what = f"{plan.op} of {', '.join(plan.patches) or 'no patch'}"
            _write_new(staging / "op", what.encode("utf-8"), 0o600)
            for index, (rel, data, mode, before, before_mode) in enumerate(changes):
                entry: dict[str, Any] = {"path": rel, "before": None, "after": None}
                if before is not None:
                    write_point(f"undo {rel}")
                    _write_new(staging / f"u{index}", before, before_mode or 0o600)
                    entry["before"] = {
                        "sha256": sha256_bytes(before),
                        "mode": _mode_text(before_mode or 0o644),
                    }
                if data is not None:
                    write_point(f"stage {rel}")
                    _write_new(staging / f"n{index}", data, mode or 0o644)
                    entry["after"] = {
                        "sha256": sha256_bytes(data),
                        "mode": _mode_text(mode or 0o644),
                    }
                entries.append(entry)
            record = {
                "schema_version": SCHEMA_VERSION,
                "op": plan.op,
                "patches": list(plan.patches),
                "entries": entries,
                "make_dirs": list(plan.make_dirs),
                "dir_modes": {
                    d: _mode_text(plan.dir_modes[d]) for d in plan.make_dirs if d in plan.dir_modes
                },
                "remove_dirs": [
                    {"path": d, "mode": _mode_text(stat.S_IMODE(os.lstat(root / d).st_mode))}
                    for d in remove_dirs
                ],
            }
            if plan.commit_point is not None:
                record["commit_point"] = dict(plan.commit_point)
            write_point("journal")
            _write_new(staging / (JOURNAL_FILE + ".tmp"), canonical_json(record).encode(), 0o600)
            os.replace(staging / (JOURNAL_FILE + ".tmp"), staging / JOURNAL_FILE)
            _fsync_dir(staging)
            _execute(root, record)
        except BaseException as exc:
            _roll_back_after(root, plan, exc)
            raise
        if keep:
            return len(changes)
        try:
            write_point("drop journal")
            _drop(root)
        except Interrupted:  # every change is made: finish the clean-up, the run succeeded
            with signals_blocked():
                _drop(root)
        except OSError as exc:
            if os.path.lexists(staging / JOURNAL_FILE):  # undecided: make it "before", say so
                _roll_back_after(root, plan, exc)
                raise
            # journal.json is gone: the run is complete; the staging left is discarded by the
            # next run (staging without journal.json never counts as a change)
    return len(changes)


def _roll_back_after(root: Path, plan: Plan, exc: BaseException) -> None:
    """Roll back after ``exc`` stopped a commit; raise what the user must know: an OSError
    becomes a message naming the failed write and the (verified) rollback, and a failed
    rollback says the tree is half-written and names the command that finishes it."""
    what = f"{plan.op} of {', '.join(plan.patches) or 'no patch'}"
    try:
        with signals_blocked():
            roll_back(root)
    except (PatchsetError, OSError) as failed:
        reason = failed.message if isinstance(failed, PatchsetError) else os_error_text(failed)
        cause = os_error_text(exc) if isinstance(exc, OSError) else str(exc) or type(exc).__name__
        raise TreeStateError(
            f"{root}: the {what} failed ({cause}) and rolling it back failed too ({reason}); "
            "the journal is kept",
            hint=f"fix that, then {recover_command(root)}  (rolls back to before that run, "
            "verified)",
            details=getattr(failed, "details", []),
        ) from exc
    if isinstance(exc, OSError):
        raise TreeStateError(
            f"{root}: the {what} failed: {os_error_text(exc)}; every write was rolled back "
            "(verified by hash)",
            hint="fix the cause and run the command again",
        ) from exc


def finish(root: Path) -> None:
    """Drop a journal :func:`commit` kept (``keep=True``): the operation is complete. A failure
    to delete it is not an error: its commit point is reached, so the next command drops it."""
    with signals_blocked():
        try:
            write_point("drop journal")
            _drop(root)
        except OSError:
            pass


def committed(record: dict[str, Any]) -> bool:
    """Whether a kept journal's operation reached its commit point (then it rolls forward)."""
    point = record.get("commit_point")
    if not isinstance(point, dict):
        return False
    try:
        done = _sha_of(Path(point["path"])) == point["sha256"]
    except (PatchsetError, OSError, KeyError, TypeError):
        return False
    return done and not os.path.lexists(Path(point["pending"]))


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _execute(root: Path, record: dict[str, Any]) -> None:
    staging = journal_dir(root)
    for directory in record["make_dirs"]:
        write_point(f"mkdir {directory}")
        _check_path(root, directory)
        os.mkdir(root / directory)
        if directory in record["dir_modes"]:
            os.chmod(root / directory, int(record["dir_modes"][directory], 8))
    for index, entry in enumerate(record["entries"]):
        rel = entry["path"]
        _check_path(root, rel)
        write_point(f"move {rel}")
        if entry["after"] is None:
            (root / rel).unlink()
        else:
            os.replace(staging / f"n{index}", root / rel)
    for item in record["remove_dirs"]:
        write_point(f"rmdir {item['path']}")
        _check_path(root, item["path"])
        (root / item["path"]).rmdir()


def _drop(root: Path) -> None:
    """Delete the journal directory, then a ``.patchset/`` left without state (empty dirs)."""
    staging = journal_dir(root)
    (staging / JOURNAL_FILE).unlink(missing_ok=True)
    if staging.exists():
        shutil.rmtree(staging)
    remove_empty_state_dir(root)


def remove_empty_state_dir(root: Path) -> None:
    """Remove ``.patchset/`` when it holds only empty directories (nothing applied)."""
    top = root / STATE_DIR
    if os.path.islink(top) or not top.is_dir():
        return
    for dirpath, dirs, files in os.walk(top, topdown=False):
        if files:
            return
        for name in dirs:
            try:
                os.rmdir(os.path.join(dirpath, name))
            except OSError:
                return
    os.rmdir(top)


def pending(root: Path) -> bool:
    """Whether an interrupted run left a journal (or its staging) in the tree."""
    return os.path.lexists(journal_dir(root))


def refuse_pending(root: Path) -> None:
    """Raise naming the interrupted run and ``patchset recover`` when a journal is pending.

    Staging without ``journal.json`` is not refused: the tree then holds all of that run or
    none of it, and the next apply/unapply/recover deletes the staging."""
    if not os.path.lexists(journal_dir(root) / JOURNAL_FILE):
        return
    head, lines = describe(root)
    raise TreeStateError(
        f"{root}: {head}",
        hint=f"{recover_command(root)}  (rolls it back to before that run, verified)",
        details=lines,
    )


def _load(root: Path) -> dict[str, Any] | None:
    staging = journal_dir(root)
    if os.path.islink(root / STATE_DIR) or os.path.islink(staging):
        raise TreeStateError(f"{staging} is a symlink; refusing to touch it")
    data = _read(staging / JOURNAL_FILE)
    if data is None:
        return None
    try:
        record = json.loads(data.decode("utf-8"))
        if record.get("schema_version") != SCHEMA_VERSION:
            raise ValueError(f"schema_version {record.get('schema_version')!r}")
        for entry in record["entries"]:
            _valid_rel(entry["path"])
            for side in ("before", "after"):
                if entry[side] is not None:
                    str(entry[side]["sha256"])
                    int(entry[side]["mode"], 8)
        for directory in record["make_dirs"]:
            _valid_rel(directory)
        for mode in record["dir_modes"].values():
            int(mode, 8)
        for item in record["remove_dirs"]:
            _valid_rel(item["path"])
            int(item["mode"], 8)
    except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError) as exc:
        raise TreeStateError(
            f"{staging / JOURNAL_FILE}: malformed journal ({exc})",
            hint="the tree cannot be recovered automatically; restore it from its base",
        ) from exc
    return record


load = _load


def _valid_rel(rel: object) -> None:
    if not isinstance(rel, str):
        raise ValueError(f"path {rel!r} is not a string")
    reason = path_problem(rel)
    if reason and not (
        rel.startswith(STATE_DIR + "/") and path_problem(rel[len(STATE_DIR) + 1 :]) is None
    ):
        raise ValueError(reason)
    if rel.startswith(f"{STATE_DIR}/{JOURNAL_DIR}"):
        raise ValueError(f"path {rel!r} is inside the journal")


def describe(root: Path) -> tuple[str, list[str]]:
    """One line naming the interrupted run and one line per path with where it stands."""
    record = _load(root)
    if record is None:
        what = (_read(journal_dir(root) / "op") or b"run").decode("utf-8", "replace")
        return f"an interrupted {what} staged files but changed nothing in the tree yet", []
    lines = []
    done = 0
    for entry in record["entries"]:
        now = _sha_of(root / entry["path"])
        before = entry["before"] and entry["before"]["sha256"]
        after = entry["after"] and entry["after"]["sha256"]
        where = "before" if now == before else "after" if now == after else "neither"
        done += where == "after"
        lines.append(f"{entry['path']}: {where} ({short_sha(now)})")
    names = ", ".join(record["patches"]) or "no patch"
    head = (
        f"an interrupted {record['op']} of {names} left the tree half-written: "
        f"{done} of {len(record['entries'])} path(s) changed"
    )
    return head, lines


def roll_back(root: Path) -> int:
    """Undo an interrupted ``commit``: every path back at its before hash (checked); return how
    many paths were moved back. Raises TreeStateError, changing nothing, when a path is at
    neither its before nor its after hash or its undo copy is damaged."""
    record = _load(root)
    staging = journal_dir(root)
    if record is None:
        if os.path.lexists(staging):
            write_point("discard staging")
            shutil.rmtree(staging)
        remove_empty_state_dir(root)
        return 0
    if committed(record):  # the second root is written too: the operation finished
        write_point("drop journal")
        _drop(root)
        return 0
    problems = []
    plan = []
    for index, entry in enumerate(record["entries"]):
        rel = entry["path"]
        reason = _component_problem(root, rel)
        if reason:
            problems.append(reason)
            continue
        now = _sha_of(root / rel)
        before, after = entry["before"], entry["after"]
        if before is not None and now == before["sha256"]:
            plan.append((index, rel, "mode", before))
        elif now == (after and after["sha256"]) or (before is None and now is None):
            if before is None:
                plan.append((index, rel, "delete", None))
            elif _sha_of(staging / f"u{index}") != before["sha256"]:
                problems.append(f"{rel}: the undo copy u{index} is missing or damaged")
            else:
                plan.append((index, rel, "restore", before))
        else:
            want = " or ".join(short_sha(x and x["sha256"]) for x in (before, after))
            problems.append(f"{rel}: expected {want}, found {short_sha(now)}")
    if problems:
        raise TreeStateError(
            f"{root}: cannot roll back the interrupted {record['op']}: {len(problems)} path(s) "
            "changed since; nothing was changed",
            hint=f"restore those paths by hand, or the whole tree from its base; {staging} "
            "holds the journal and the undo copies",
            details=problems,
        )
    for item in reversed(record["remove_dirs"]):
        if not os.path.lexists(root / item["path"]):
            write_point(f"undo rmdir {item['path']}")
            _check_path(root, item["path"])
            os.mkdir(root / item["path"], int(item["mode"], 8))
            os.chmod(root / item["path"], int(item["mode"], 8))
    moved = 0
    for index, rel, action, before in reversed(plan):
        _check_path(root, rel)
        if action == "delete":
            if os.path.lexists(root / rel):
                write_point(f"undo delete {rel}")
                (root / rel).unlink()
                moved += 1
        elif action == "restore":
            write_point(f"undo restore {rel}")
            os.replace(staging / f"u{index}", root / rel)
            moved += 1
        if before is not None and os.path.lexists(root / rel):
            mode_wanted = int(before["mode"], 8)
            if stat.S_IMODE(os.lstat(root / rel).st_mode) != mode_wanted:  # never touch unmoved
                os.chmod(root / rel, mode_wanted)
    for directory in reversed(record["make_dirs"]):
        if os.path.isdir(root / directory) and not os.path.islink(root / directory):
            try:
                write_point(f"undo mkdir {directory}")
                os.rmdir(root / directory)
            except OSError:
                pass
    wrong = [
        e["path"]
        for e in record["entries"]
        if _sha_of(root / e["path"]) != (e["before"] and e["before"]["sha256"])
    ]
    if wrong:
        raise TreeStateError(
            f"{root}: rollback left {len(wrong)} path(s) off their before hash",
            details=wrong,
            hint=f"run {recover_command(root)} again",
        )
    write_point("drop journal")
    _drop(root)
    return moved
