"""Apply a target's series to a tree, all or nothing; :func:`apply_series` reads top to bottom.

Plan first, in memory: check every touched file against its preimage hash in the lock (all
mismatches reported at once), apply every hunk with zero fuzz, check every postimage. Only then
write, in one :func:`patchset.journal.commit`: pristine backups, each file by temporary file +
``os.replace``, the state file last. If anything fails while writing, every file written so far
is restored and a ``.patchset/`` that did not exist is removed, so the tree is byte-identical
to before. The tree is read only through :mod:`patchset.tree`. The shared pieces of a run
(:func:`recover_tree`, :func:`check_stack`, :class:`Outcome`) serve :mod:`patchset.unapply` and
``refresh`` too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import NoReturn

from patchset import journal, lockfile
from patchset.diffparse import apply_file
from patchset.errors import (
    DriftError,
    HashMismatch,
    LockError,
    NothingToDo,
    PatchDoesNotApply,
    PatchFormatError,
    TreeStateError,
)
from patchset.hashing import sha256_of, short_sha
from patchset.lockfile import series_differences
from patchset.model import AppliedPatch, Lock, Patch, PatchImages, TreeState
from patchset.state import STATE_DIR, backup_rel, state_rel, state_to_json
from patchset.tree import (
    DEFAULT_TIMEOUT_S,
    Tree,
    dirty_paths,
    exclude_state_dir,
    file_mode,
    head_commit,
    read_state,
    release_problem,
    tree_lock,
    trusted_state,
)

Log = Callable[[str], None]


def _quiet(_: str) -> None:
    return None


@dataclass(frozen=True)
class Outcome:
    """What an apply or unapply did: the patches moved and the files written."""

    patches: tuple[str, ...]
    files_written: int
    git_head: str | None


def check_stack(
    state: TreeState | None, patches: tuple[Patch, ...], target: str, upto: int | None = None
) -> None:
    """Refuse a tree whose applied stack (its first ``upto`` entries) is not a prefix of the
    target's current series, patch files unchanged."""
    if state is None:
        return
    if state.target != target:
        raise TreeStateError(
            f"tree holds {state.target} patches, not {target}", hint=f"pass --target {state.target}"
        )
    names = [p.name for p in patches]
    for index, applied in enumerate(state.applied[:upto]):
        if index >= len(names) or names[index] != applied.name:
            raise TreeStateError(
                f"applied patch {applied.name} is not number {index + 1} of the series any more",
                hint="unapply with the series it was applied from, then apply again",
            )
        if patches[index].sha256 != applied.images.sha256:
            raise TreeStateError(
                f"applied patch {applied.name} changed on disk since it was applied",
                hint="restore the patch file, or run patchset refresh if you edited the tree",
            )


def touched_paths(patches: tuple[Patch, ...]) -> set[str]:
    """Every path the patches touch (what the in-tree state may name)."""
    return {path for patch in patches for path in patch.paths}


def select_upto(patches: tuple[Patch, ...], upto: str | None) -> tuple[Patch, ...]:
    """``patches`` up to and including ``upto`` (all when None)."""
    if upto is None:
        return patches
    names = [p.name for p in patches]
    if upto not in names:
        raise PatchFormatError(
            f"--upto {upto}: not a patch of this target's series",
            hint="use a name exactly as written in series",
        )
    return patches[: names.index(upto) + 1]


def _lock_entries(
    lock: Lock, patches: tuple[Patch, ...], pins: dict[str, str], series: tuple[Patch, ...]
) -> dict[str, PatchImages]:
    shapes = lockfile.shape_problems(series)
    if shapes:
        raise PatchDoesNotApply(
            "the series changes a file into a directory; nothing was changed",
            hint="split the change: git cannot express it without a rename either",
            details=shapes,
        )
    stale = series_differences(
        Lock(lock.pins, tuple(e for e in lock.patches if e.name in {p.name for p in patches}), {}),
        patches,
        pins,
    )
    if stale:
        raise LockError(
            "series.lock is stale for the patches to apply",
            hint="run patchset lock (and commit series.lock)",
            details=stale,
        )
    entries = {p.name: lock.entry(p.name) for p in patches}
    mismatched = [
        f"{p.name}: lock lists {[f.path for f in entry.files]}, the patch touches {list(p.paths)}"
        for p in patches
        if (entry := entries[p.name]) is not None and [f.path for f in entry.files] != list(p.paths)
    ]
    if mismatched:
        raise LockError(
            "series.lock disagrees with the patches about the files they touch",
            hint="run patchset lock",
            details=mismatched,
        )
    return entries  # type: ignore[return-value]


def apply_series(
    tree: Tree,
    patches: tuple[Patch, ...],
    lock: Lock,
    *,
    target: str,
    upto: str | None = None,
    base_pin: str | None = None,
    pins: dict[str, str] | None = None,
    release: str | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
    log: Log = _quiet,
) -> Outcome:
    """Apply the target's ``patches`` (series order) not yet applied, up to ``upto``.

    ``pins`` (``pins.toml``'s digests) must equal the lock's; None trusts the lock's own.
    ``release`` (the sdist pin's requirement, e.g. ``vllm==0.33.0``) is checked against the
    version the tree names for itself (:func:`patchset.tree.release_problem`) before anything
    is written. The tree is read through :mod:`patchset.tree` and written through one
    :func:`patchset.journal.commit`, all or nothing.
    """
    selected = select_upto(patches, upto)
    with tree_lock(tree.root, timeout):
        recover_tree(tree, log)
        state = trusted_state(tree.root, touched_paths(patches))
        check_stack(state, patches, target)
        applied = state.applied if state else ()
        todo = selected[len(applied) :]
        if not todo:
            _refuse_nothing_to_apply(tree, state, target, upto, len(patches))
        pinned = dict(lock.pins) if pins is None else pins
        entries = _lock_entries(lock, todo, pinned, patches)
        _refuse_other_base(tree, state, pinned.get(f"{target}.sdist"), target, release)
        head = head_commit(tree.root)
        if head:
            log(f"{tree.root} is a git checkout at {head}")
        originals = _read_preimages(tree, todo, entries, release)
        owned = set(state.expected()) if state else set()
        dirty = dirty_paths(tree.root, [p for p in originals if p not in owned])
        if dirty:
            raise TreeStateError(
                f"{len(dirty)} touched file(s) are dirty in the git checkout; nothing was changed",
                hint="commit or stash them (git status), then apply again",
                details=dirty,
            )
        contents = _apply_in_memory(todo, entries, originals, len(applied), len(patches), log)
        plan = _apply_plan(tree, todo, entries, state, originals, contents, target, base_pin, head)
        exclude_state_dir(tree.root)
        journal.commit(plan)
        count = sum(1 for path in contents if contents[path] != originals[path])
        log(f"Applied {len(todo)} patch(es) to {tree.root}: {count} file(s) written")
        return Outcome(tuple(p.name for p in todo), count, head)


def _refuse_nothing_to_apply(
    tree: Tree, state: TreeState | None, target: str, upto: str | None, total: int
) -> NoReturn:
    """Raise: a drifted 'applied' tree is an error (:func:`_refuse_drift`), else NothingToDo."""
    if state is not None:
        _refuse_drift(tree, state)
    where = f"up to {upto}" if upto else f"all {total}"
    raise NothingToDo(
        f"{tree.root}: {where} patch(es) of {target} already applied "
        f"({len(state.applied) if state else 0} applied)",
        hint="patchset verify checks them; patchset unapply --upto goes back",
    )


def _refuse_other_base(
    tree: Tree, state: TreeState | None, wanted: str | None, target: str, release: str | None
) -> None:
    """Refuse a tree patched from another base pin, or (nothing applied yet) one that names
    another release than the pinned ``release``."""
    if state and state.base_pin and wanted and state.base_pin != wanted:
        raise TreeStateError(
            f"{tree.root} was patched from base {state.base_pin[:12]}, the pins say "
            f"{wanted[:12]}; nothing was changed",
            hint="unapply, start from a tree of the pinned release, apply again",
        )
    other = release_problem(tree.root, target, release) if release and not state else None
    if other:
        raise TreeStateError(
            f"{other}; nothing was changed",
            hint=f"apply to a tree of the pinned release ({release})",
        )


def _read_preimages(
    tree: Tree,
    todo: tuple[Patch, ...],
    entries: dict[str, PatchImages],
    release: str | None,
) -> dict[str, bytes | None]:
    """The bytes of every path ``todo`` touches, each checked against the lock's preimage of
    the first patch touching it; a path through a symlink or not a regular file is refused
    before any is read."""
    touched: dict[str, tuple[str | None, str]] = {}
    refusals: list[str] = []
    for patch in todo:
        for image in entries[patch.name].files:
            if image.path not in touched:
                touched[image.path] = (image.pre, patch.name)
                reason = tree.problem(image.path)
                if reason:
                    refusals.append(f"{patch.name}: {reason}")
    if refusals:
        raise PatchFormatError(
            "patch paths go through a symlink or a file in the tree, or are not regular "
            "files; nothing was changed",
            hint="a patch may only write real directories of the tree",
            details=refusals,
        )
    originals = {path: tree.read(path) for path in touched}
    mismatches = [
        f"{path}: expected {short_sha(pre)}, found {short_sha(sha256_of(originals[path]))} "
        f"(preimage of {name})"
        for path, (pre, name) in touched.items()
        if sha256_of(originals[path]) != pre
    ]
    if mismatches:
        raise HashMismatch(
            f"{len(mismatches)} file(s) differ from the preimages in series.lock; "
            "nothing was changed",
            hint=(
                f"the tree is not the pinned base{f' ({release})' if release else ''} "
                "or was edited: start from a fresh tree of it"
            ),
            details=mismatches,
        )
    return originals


def _apply_in_memory(
    todo: tuple[Patch, ...],
    entries: dict[str, PatchImages],
    originals: dict[str, bytes | None],
    first: int,
    total: int,
    log: Log,
) -> dict[str, bytes | None]:
    """Every touched path after ``todo``, hunks applied with zero fuzz, each preimage and
    postimage checked against the lock."""
    contents = dict(originals)
    for offset, patch in enumerate(todo):
        log(f"Applying {patch.name} ({first + offset + 1}/{total})")
        images = entries[patch.name]
        for fp in patch.files:
            expected = images.image(fp.path)
            have = sha256_of(contents[fp.path])
            if expected is None or have != expected.pre:
                raise HashMismatch(
                    f"{patch.name}: {fp.path}: preimage {short_sha(have)} is not the lock's "
                    f"{short_sha(expected.pre if expected else None)}; nothing was changed",
                    hint="series.lock was edited or is stale: run patchset lock --check",
                )
            try:
                post = apply_file(contents[fp.path], fp)
            except PatchDoesNotApply as exc:
                raise PatchDoesNotApply(
                    f"{patch.name} does not apply: {exc.message}; nothing was changed",
                    hint="the lock's preimages matched, so the patch itself is broken",
                ) from None
            got = sha256_of(post)
            if expected is None or got != expected.post:
                raise HashMismatch(
                    f"{patch.name}: {fp.path}: postimage {short_sha(got)} is not the lock's "
                    f"{short_sha(expected.post if expected else None)}; nothing was changed",
                    hint="run patchset lock --check",
                )
            contents[fp.path] = post
    return contents


def _apply_plan(
    tree: Tree,
    todo: tuple[Patch, ...],
    entries: dict[str, PatchImages],
    state: TreeState | None,
    originals: dict[str, bytes | None],
    contents: dict[str, bytes | None],
    target: str,
    base_pin: str | None,
    head: str | None,
) -> journal.Plan:
    """The journal plan of the apply: pristine copies of the files touched for the first time,
    the new bytes, and the new state file last."""
    applied = state.applied if state else ()
    backups = dict(state.backups) if state else {}
    new_applied = [*applied, *(AppliedPatch(entries[p.name]) for p in todo)]
    plan = journal.Plan(tree.root, "apply", tuple(p.name for p in todo))
    modes = dict(state.modes) if state else {}
    for path, data in originals.items():
        if path not in backups:
            backups[path] = sha256_of(data)
            if data is not None:
                plan.put(backup_rel(path), data, 0o644)
                modes[path] = f"{tree.mode(path):04o}"
    mode_of = {fp.path: fp.mode for patch in todo for fp in patch.files}
    created: dict[str, list[str]] = {}
    for path, data in contents.items():
        if data == originals[path]:
            continue
        if data is None:
            plan.delete(path)
            continue
        owner = next(p.name for p in todo if path in p.paths)
        keep = tree.mode(path)
        mode = keep if keep is not None else file_mode(mode_of[path])
        created.setdefault(owner, []).extend(plan.put(path, data, mode))
    for directory in plan.emptied_dirs():
        modes[directory] = f"{tree.mode(directory):04o}"
    for index, item in enumerate(new_applied):
        dirs = created.get(item.name)
        if dirs:
            new_applied[index] = replace(item, created_dirs=tuple(dirs))
    new_state = TreeState(
        target,
        state.base_pin if state else base_pin,
        state.git_head if state else head,
        tuple(new_applied),
        backups,
        modes,
    )
    plan.put(state_rel(), state_to_json(new_state).encode("utf-8"), 0o644)
    return plan


def recover_tree(tree: Tree, log: Log = _quiet) -> bool:
    """Roll back a run that was killed or failed mid-write (caller holds the tree lock).

    Returns whether there was anything to recover.
    """
    if not journal.pending(tree.root):
        top = tree.root / STATE_DIR
        if top.is_dir() and not top.is_symlink() and read_state(tree.root) is None:
            journal.remove_empty_state_dir(tree.root)  # a killed run's last clean-up step
            if not top.exists():
                log(f"{tree.root}: removed the empty {STATE_DIR}/ a killed run left")
                return True
        return False
    head, _ = journal.describe(tree.root)
    log(f"{tree.root}: {head}; rolling it back")
    moved = journal.roll_back(tree.root)
    log(f"Rolled back {moved} path(s); every journalled path is back at its hash from before")
    return True


def _refuse_drift(tree: Tree, state: TreeState) -> None:
    """An 'applied' tree whose files are off their postimages is an error, not nothing to do."""
    drift = [
        f"{path}: expected {short_sha(sha)}, found {short_sha(sha256_of(tree.read(path)))} "
        f"(owned by {owner})"
        for path, (sha, owner) in sorted(state.expected().items())
        if sha256_of(tree.read(path)) != sha
    ]
    if drift:
        raise DriftError(
            f"{tree.root}: the state says the series is applied but {len(drift)} file(s) "
            "drifted from their postimages",
            hint="restore them, or patchset unapply and apply again",
            details=drift,
        )
