"""Refresh: rewrite a patch's diff from the tree, keeping its header, deterministically.

The diff is regenerated with difflib (3 lines of context, no autojunk) with git-style headers
and full blob ids, in path order, so the same tree always gives the same bytes. The preimage of
each file comes from the pristine backup under ``.patchset/`` plus the applied patches below,
and is checked against the recorded preimage hash. The result is re-parsed and re-applied with
patchset's own engine before anything is written. A file back at its preimage drops out of the
patch and the state. Nothing is read through a symlink or from a non-regular file. The patch
file and ``series.lock`` (checkout) and the state (tree) are written as one operation through
two journals (see :func:`refresh_patch`).
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from patchset import journal
from patchset.apply import recover_tree
from patchset.diffparse import NULL_BLOB, apply_file, split_lines
from patchset.errors import HashMismatch, PatchFormatError, TreeStateError
from patchset.hashing import git_blob_id, sha256_bytes
from patchset.lockfile import LOCK_FILE, Computed, lock_to_json
from patchset.model import FileImage, FileOp, Patch, PatchImages, TreeState
from patchset.repowrite import commit_repo, repo_lock
from patchset.series import parse_patch
from patchset.state import STATE_DIR, backup_rel, state_rel, state_to_json
from patchset.tree import DEFAULT_TIMEOUT_S, Tree, read_regular, tree_lock, trusted_state
from patchset.unapply import stack_reader

CONTEXT_LINES = 3
NO_NEWLINE = b"\\ No newline at end of file\n"
FUNC_LINE_MAX = 80


def _range(start: int, length: int) -> str:
    first = start + 1
    if length == 1:
        return f"{first}"
    if length == 0:
        first -= 1
    return f"{first},{length}"


def render_file(path: str, pre: bytes | None, post: bytes | None, mode: str) -> bytes:
    """The git-style diff of one file from ``pre`` to ``post`` (None = absent)."""
    old_blob = NULL_BLOB if pre is None else git_blob_id(pre)
    new_blob = NULL_BLOB if post is None else git_blob_id(post)
    out = [f"diff --git a/{path} b/{path}\n".encode()]
    if pre is None:
        out += [f"new file mode {mode}\n".encode(), f"index {old_blob}..{new_blob}\n".encode()]
    elif post is None:
        out += [f"deleted file mode {mode}\n".encode(), f"index {old_blob}..{new_blob}\n".encode()]
    else:
        out.append(f"index {old_blob}..{new_blob} {mode}\n".encode())
    a = split_lines(pre or b"")
    b = split_lines(post or b"")
    if not a and not b:
        return b"".join(out)
    out.append(b"--- /dev/null\n" if pre is None else f"--- a/{path}\n".encode())
    out.append(b"+++ /dev/null\n" if post is None else f"+++ b/{path}\n".encode())
    matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
    for group in matcher.get_grouped_opcodes(CONTEXT_LINES):
        i1, i2, j1, j2 = group[0][1], group[-1][2], group[0][3], group[-1][4]
        header = f"@@ -{_range(i1, i2 - i1)} +{_range(j1, j2 - j1)} @@".encode()
        func = _function_line(a, i1)
        out.append(header + (b" " + func if func else b"") + b"\n")
        for tag, a1, a2, b1, b2 in group:
            if tag == "equal":
                out += [_line(b" ", line) for line in a[a1:a2]]
                continue
            out += [_line(b"-", line) for line in a[a1:a2]]
            out += [_line(b"+", line) for line in b[b1:b2]]
    return b"".join(out)


def _function_line(lines: list[bytes], start: int) -> bytes:
    """git's default hunk-header context: the nearest line above ``start`` that begins with a
    letter, ``_`` or ``$``, cut to 80 bytes, trailing whitespace removed."""
    for line in reversed(lines[:start]):
        first = line[:1]
        if first.isalpha() or first in (b"_", b"$"):
            return line[:FUNC_LINE_MAX].rstrip()
    return b""


def _line(prefix: bytes, line: bytes) -> bytes:
    if line.endswith(b"\n"):
        return prefix + line
    return prefix + line + b"\n" + NO_NEWLINE


@dataclass(frozen=True)
class Refreshed:
    """A refreshed patch: its new bytes, its new images, whether anything changed, the lock's
    warnings and whether ``series.lock`` was rewritten."""

    data: bytes
    images: PatchImages
    changed: bool
    warnings: tuple[str, ...] = ()
    lock_written: bool = False
    dropped: tuple[str, ...] = ()


LockMaker = Callable[[Patch, TreeState], Computed]
"""The lock of the whole series with the refreshed patch in place, given the tree's state (its
pristine copies are this target's base)."""


def refresh_patch(
    tree: Tree,
    patches: tuple[Patch, ...],
    name: str,
    *,
    repo: Path,
    make_lock: LockMaker,
    timeout: float = DEFAULT_TIMEOUT_S,
    log: Callable[[str], None] = lambda _m: None,
) -> Refreshed:
    """Regenerate patch ``name`` from ``tree``; write the patch file and ``series.lock`` (one
    journalled commit in the checkout), then the tree's state (one journalled commit in the
    tree), under the checkout's lock and the tree's lock.

    Allowed only when ``name`` is applied and no later applied patch touches its files. Files
    whose tree bytes equal their preimage drop out of the patch (and out of the state). A run
    killed between the two commits is finished by the next ``refresh``: the patch file then
    holds exactly the bytes a refresh of the tree makes, which is the only change on disk it
    accepts.
    """
    with repo_lock(repo, timeout), tree_lock(tree.root, timeout):
        recover_tree(tree, log)
        state = trusted_state(tree.root, {p for patch in patches for p in patch.paths})
        names = list(state.applied_names) if state else []
        if state is None or name not in names:
            raise TreeStateError(
                f"{name} is not applied to {tree.root}",
                hint=f"patchset apply --tree {tree.root} --upto {name}",
            )
        index = names.index(name)
        by_name = {p.name: p for p in patches}
        patch = by_name[name]
        recorded_images = state.applied[index].images
        if patch.sha256 != recorded_images.sha256:
            raise TreeStateError(
                f"{name} changed on disk since it was applied; cannot refresh",
                hint=f"restore patches/{name} (git checkout), or unapply, edit, apply",
            )
        paths = sorted(i.path for i in recorded_images.files)
        later = [
            f"{a.name} also touches {path}"
            for a in state.applied[index + 1 :]
            for path in paths
            if a.images.image(path) is not None
        ]
        if later:
            raise TreeStateError(
                f"{name} is not the topmost applied patch touching its files",
                hint=f"patchset unapply --upto {name}, then refresh",
                details=later,
            )
        unsafe = [reason for path in paths if (reason := tree.problem(path))]
        if unsafe:
            raise TreeStateError(
                f"{name}: refusing to refresh from paths that are symlinks or not regular "
                "files; nothing was changed",
                hint="a patch may only read and write real files of the tree: restore them",
                details=unsafe,
            )
        read_pre = stack_reader(tree, state, by_name, index)
        diffs: list[bytes] = []
        images: list[FileImage] = []
        checks: list[tuple[str, bytes | None, bytes | None]] = []
        dropped: list[str] = []
        for path in paths:
            pre = read_pre(path)
            recorded = recorded_images.image(path)
            if recorded is None or (None if pre is None else sha256_bytes(pre)) != recorded.pre:
                raise HashMismatch(f"{name}: {path}: preimage does not match the state")
            post = tree.read(path)
            if pre == post:
                dropped.append(path)
                continue
            diffs.append(render_file(path, pre, post, recorded.mode))
            op: FileOp = "add" if pre is None else "delete" if post is None else "modify"
            images.append(
                FileImage(
                    path,
                    op,
                    recorded.pre,
                    None if post is None else sha256_bytes(post),
                    recorded.mode,
                )
            )
            checks.append((path, pre, post))
        if not diffs:
            raise PatchFormatError(
                f"{name}: the tree holds no change for any of its files",
                hint="remove the patch from series instead",
            )
        data = patch.header_text + b"".join(diffs)
        parsed, problems = parse_patch(name, data)
        if parsed is None:
            raise PatchFormatError(f"{name}: refreshed patch does not parse", details=problems)
        for fp, (path, pre, post) in zip(parsed.files, checks, strict=True):
            if fp.path != path or apply_file(pre, fp) != post:
                raise PatchFormatError(f"{name}: refreshed diff of {path} does not re-apply")
        new_images = PatchImages(name, parsed.sha256, tuple(images))
        new_state = _state_after(state, index, new_images, dropped)
        computed = make_lock(parsed, state)
        lock_text = lock_to_json(computed.lock).encode("utf-8")
        old_lock = read_regular(repo / LOCK_FILE)
        repo_files = {f"patches/{name}": data, LOCK_FILE: lock_text}
        state_bytes = state_to_json(new_state).encode("utf-8")
        if state_bytes == read_regular(tree.root / state_rel()):
            commit_repo(repo, "refresh", (name,), repo_files)
        else:
            _commit_both(tree, repo, name, repo_files, state, new_state, state_bytes)
        return Refreshed(
            data,
            new_images,
            parsed.sha256 != recorded_images.sha256,
            computed.warnings,
            old_lock != lock_text,
            tuple(dropped),
        )


def _commit_both(
    tree: Tree,
    repo: Path,
    name: str,
    repo_files: dict[str, bytes],
    state: TreeState,
    new_state: TreeState,
    state_bytes: bytes,
) -> None:
    """The checkout's files, then the tree's state, as one operation: the checkout's journal
    is kept until the tree's commit is done, and its commit point is the tree's new
    ``state.json`` with no tree journal left; a recovery before that point rolls both back,
    one after it drops the checkout's journal (the refresh finished)."""
    point = {
        "path": str(tree.root / state_rel()),
        "sha256": sha256_bytes(state_bytes),
        "pending": str(journal.journal_dir(tree.root) / journal.JOURNAL_FILE),
    }
    commit_repo(repo, "refresh", (name,), repo_files, commit_point=point)
    plan = journal.Plan(
        tree.root, "refresh", (name,), removable=lambda d: d.startswith(STATE_DIR + "/")
    )
    for path in sorted(set(state.backups) - set(new_state.backups)):
        if state.backups[path] is not None:
            plan.delete(backup_rel(path))
    plan.put(state_rel(), state_bytes, 0o644)
    try:
        journal.commit(plan)
    except BaseException:
        with journal.signals_blocked():
            journal.roll_back(repo)
        raise
    journal.finish(repo)


def _state_after(
    state: TreeState, index: int, images: PatchImages, dropped: list[str]
) -> TreeState:
    """The state with patch ``index`` at ``images``; a dropped file no other applied patch
    touches leaves ``backups``/``modes`` (it is back at its pristine bytes), and created
    directories that no longer hold a file of the patch leave ``created_dirs``."""
    others = {i.path for j, a in enumerate(state.applied) if j != index for i in a.images.files}
    gone = {p for p in dropped if p not in others}
    backups = {p: s for p, s in state.backups.items() if p not in gone}
    modes = {
        p: m
        for p, m in state.modes.items()
        if p in backups or any(b.startswith(p + "/") for b in backups)
    }
    parents = {
        "/".join(i.path.split("/")[:d])
        for i in images.files
        for d in range(1, i.path.count("/") + 1)
    }
    applied = list(state.applied)
    applied[index] = replace(
        applied[index],
        images=images,
        created_dirs=tuple(d for d in applied[index].created_dirs if d in parents),
    )
    return replace(state, applied=tuple(applied), backups=backups, modes=modes)
