"""A target tree on disk: the one module that reads it, locks it, asks git about it and reads
its state file. Every write to it goes through ``journal``; ``newtree`` creates a missing one.

Only the paths a series touches are ever read or hashed; a path that reaches through a symlink
present in the tree is refused before anything is read. A tree counts as a git checkout only
when it has its own ``.git`` (directory or worktree file); a tree inside another repository is a
plain tree, and gitpython is imported only for a checkout.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import stat
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from patchset.errors import ExternalToolError, TreeBusy, TreeStateError
from patchset.model import TreeState
from patchset.release import pinned_release, public
from patchset.state import STATE_DIR, STATE_FILE, state_from_json, untrusted_paths

if TYPE_CHECKING:
    import git

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


# --------------------------------------------------------------------------- the lock


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


# --------------------------------------------------------------------------- git


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


# --------------------------------------------------------------------------- the release it names


_PKG_INFO = re.compile(r"^Version:\s*(\S+)\s*$", re.MULTILINE)
_VERSION_PY = re.compile(r"^__version__\s*=\s*(?:version\s*=\s*)?['\"]([^'\"]+)['\"]", re.MULTILINE)


def tree_release(root: Path, target: str) -> tuple[str, str] | None:
    """(version, where it was read) for the tree at ``root``, or None if it names none.

    A tree's own word for its version comes from, in order: ``PKG-INFO`` (an unpacked sdist),
    the package's generated ``<target>/_version.py`` (an sdist or an installed build), or an
    exact ``v<version>`` tag at the HEAD of a git checkout. A tree that names none is judged by
    its files alone (the preimage hashes of ``series.lock``)."""
    for rel, pattern in (("PKG-INFO", _PKG_INFO), (f"{target}/_version.py", _VERSION_PY)):
        path = root / rel
        if path.is_file() and not path.is_symlink():
            match = pattern.search(path.read_text(encoding="utf-8", errors="replace"))
            if match:
                return match.group(1), rel
    tag = exact_tag(root)
    if tag and re.fullmatch(r"v?\d+(\.\d+)*\S*", tag):
        return tag.removeprefix("v"), f"git tag {tag}"
    return None


def release_problem(root: Path, target: str, requirement: str) -> str | None:
    """Why the tree is not the pinned release (naming both), or None when it may be."""
    pinned = pinned_release(requirement)
    found = tree_release(root, target)
    if pinned is None or found is None:
        return None
    version, where = found
    if public(version) == public(pinned):
        return None
    return f"{root} is {target} {version} ({where}); the series is pinned to {target} {pinned}"


# --------------------------------------------------------------------------- the state file


def read_state(root: Path) -> TreeState | None:
    """The tree's state, or None when no patch is applied (no ``.patchset/state.json``)."""
    directory = root / STATE_DIR
    if directory.is_symlink():
        raise TreeStateError(
            f"{directory} is a symlink; refusing to use it",
            hint="the state must be a real directory of the tree",
        )
    path = directory / STATE_FILE
    data = read_regular(path)
    if data is None:
        if directory.exists() and _holds_files(directory):
            raise TreeStateError(
                f"{directory} exists without {STATE_FILE}",
                hint="an interrupted run? restore the tree from its base",
            )
        return None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TreeStateError(f"{path}: malformed state (not UTF-8: {exc.reason})") from None
    return state_from_json(text, path)


def trusted_state(root: Path, touched: set[str]) -> TreeState | None:
    """:func:`read_state`, refused when :func:`patchset.state.untrusted_paths` finds a path in
    it that the series (``touched``) cannot have written."""
    state = read_state(root)
    if state is None:
        return None
    problems = untrusted_paths(state, touched)
    if problems:
        raise TreeStateError(
            f"{root / STATE_DIR / STATE_FILE}: untrusted state: {len(problems)} problem(s); "
            "nothing was changed",
            hint="the state was edited or damaged; restore the tree from its base",
            details=problems,
        )
    return state


def _holds_files(directory: Path) -> bool:
    """Whether ``.patchset/`` holds files other than a journal's staging (which, without its
    ``journal.json``, means the tree holds none of that run yet)."""
    return any(
        (not p.is_dir() or p.is_symlink()) and p.relative_to(directory).parts[0] != "journal"
        for p in directory.rglob("*")
    )
