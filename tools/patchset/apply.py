"""Apply and unapply a target's series on a tree, all or nothing.

Plan first, in memory: check every touched file against its preimage hash in the lock (all
mismatches reported at once), apply every hunk with zero fuzz, check every postimage. Only then
write: pristine backups, each file by temporary file + ``os.replace``, the state file last. If
anything fails while writing, every file written so far is restored and a ``.patchset/`` that
did not exist is removed, so the tree is byte-identical to before.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from patchset import gittree, journal, lockfile
from patchset.diffparse import apply_file, reverse
from patchset.errors import (
    DriftError,
    HashMismatch,
    LockError,
    NothingToDo,
    PatchDoesNotApply,
    PatchFormatError,
    TreeStateError,
)
from patchset.hashing import sha256_bytes
from patchset.lockfile import series_differences
from patchset.model import AppliedPatch, Lock, Patch, PatchImages, TreeState
from patchset.release import release_problem
from patchset.state import (
    STATE_DIR,
    backup_rel,
    read_state,
    state_rel,
    state_to_json,
    trusted_state,
)
from patchset.tree import Tree, file_mode
from patchset.treelock import DEFAULT_TIMEOUT_S, tree_lock

Log = Callable[[str], None]


def _quiet(_: str) -> None:
    return None


@dataclass(frozen=True)
class Outcome:
    """What an apply or unapply did: the patches moved and the files written."""

    patches: tuple[str, ...]
    files_written: int
    git_head: str | None


def _sha(data: bytes | None) -> str | None:
    return None if data is None else sha256_bytes(data)


def _short(digest: str | None) -> str:
    return digest[:12] if digest else "absent"


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
    version the tree names for itself (:mod:`patchset.release`) before anything is written.
    """
    selected = select_upto(patches, upto)
    with tree_lock(tree.root, timeout):
        recover_tree(tree, log)
        state = trusted_state(tree.root, touched_paths(patches))
        check_stack(state, patches, target)
        applied = state.applied if state else ()
        todo = selected[len(applied) :]
        if not todo:
            if state is not None:
                _refuse_drift(tree, state)
            where = f"up to {upto}" if upto else f"all {len(patches)}"
            raise NothingToDo(
                f"{tree.root}: {where} patch(es) of {target} already applied "
                f"({len(applied)} applied)",
                hint="patchset verify checks them; patchset unapply --upto goes back",
            )
        pinned = dict(lock.pins) if pins is None else pins
        entries = _lock_entries(lock, todo, pinned, patches)
        wanted = pinned.get(f"{target}.sdist")
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
        head = gittree.head_commit(tree.root)
        if head:
            log(f"{tree.root} is a git checkout at {head}")
        backups = dict(state.backups) if state else {}
        owned = set(state.expected()) if state else set()

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
            f"{path}: expected {_short(pre)}, found {_short(_sha(originals[path]))} "
            f"(preimage of {name})"
            for path, (pre, name) in touched.items()
            if _sha(originals[path]) != pre
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
        dirty = gittree.dirty_paths(tree.root, [p for p in touched if p not in owned])
        if dirty:
            raise TreeStateError(
                f"{len(dirty)} touched file(s) are dirty in the git checkout; nothing was changed",
                hint="commit or stash them (git status), then apply again",
                details=dirty,
            )

        contents = dict(originals)
        first = len(applied)
        total = len(patches)
        for offset, patch in enumerate(todo):
            log(f"Applying {patch.name} ({first + offset + 1}/{total})")
            images = entries[patch.name]
            for fp in patch.files:
                expected = images.image(fp.path)
                have = _sha(contents[fp.path])
                if expected is None or have != expected.pre:
                    raise HashMismatch(
                        f"{patch.name}: {fp.path}: preimage {_short(have)} is not the lock's "
                        f"{_short(expected.pre if expected else None)}; nothing was changed",
                        hint="series.lock was edited or is stale: run patchset lock --check",
                    )
                try:
                    post = apply_file(contents[fp.path], fp)
                except PatchDoesNotApply as exc:
                    raise PatchDoesNotApply(
                        f"{patch.name} does not apply: {exc.message}; nothing was changed",
                        hint="the lock's preimages matched, so the patch itself is broken",
                    ) from None
                got = _sha(post)
                if expected is None or got != expected.post:
                    raise HashMismatch(
                        f"{patch.name}: {fp.path}: postimage {_short(got)} is not the lock's "
                        f"{_short(expected.post if expected else None)}; nothing was changed",
                        hint="run patchset lock --check",
                    )
                contents[fp.path] = post

        new_applied = [*applied, *(AppliedPatch(entries[p.name]) for p in todo)]
        plan = journal.Plan(tree.root, "apply", tuple(p.name for p in todo))
        modes = dict(state.modes) if state else {}
        for path, data in originals.items():
            if path not in backups:
                backups[path] = _sha(data)
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
        gittree.exclude_state_dir(tree.root)
        journal.commit(plan)
        count = sum(1 for path in contents if contents[path] != originals[path])
        log(f"Applied {len(todo)} patch(es) to {tree.root}: {count} file(s) written")
        return Outcome(tuple(p.name for p in todo), count, head)


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


def unapply_series(
    tree: Tree,
    patches: tuple[Patch, ...],
    *,
    target: str,
    upto: str | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
    log: Log = _quiet,
) -> Outcome:
    """Unapply, newest first, every applied patch above ``upto`` (all when None).

    Each touched file must hold its recorded postimage first (else DriftError), and after the
    reversal each file must hash to its recorded preimage (else HashMismatch).
    """
    with tree_lock(tree.root, timeout):
        recover_tree(tree, log)
        state = trusted_state(tree.root, touched_paths(patches))
        if state is None:
            raise NothingToDo(f"{tree.root}: no patch is applied", hint="patchset apply")
        names = list(state.applied_names)
        keep = 0
        if upto is not None:
            if upto not in names:
                raise NothingToDo(
                    f"--upto {upto}: not applied to {tree.root}",
                    hint="patchset status lists what is applied",
                )
            keep = names.index(upto) + 1
        check_stack(state, patches, target, upto=keep)
        removing = state.applied[keep:]
        if not removing:
            raise NothingToDo(f"{tree.root}: nothing above {upto} is applied")
        by_name = {p.name: p for p in patches}
        expected = state.expected()
        touched = list(dict.fromkeys(i.path for a in removing for i in a.images.files))
        through = [reason for path in touched if (reason := tree.problem(path))] + [
            reason
            for path in (d for a in removing for d in a.created_dirs)
            if (reason := tree.symlink_problem(path))
        ]
        if through:
            raise PatchFormatError(
                "the tree's paths go through a symlink or a file, or are not regular files; "
                "nothing was changed",
                hint="something was planted after apply (a symlink, a FIFO): remove it and "
                "restore the file or directory",
                details=through,
            )
        current = {path: tree.read(path) for path in touched}
        drift = [
            f"{path}: expected {_short(expected[path][0])}, found {_short(_sha(current[path]))} "
            f"(postimage of {expected[path][1]})"
            for path in touched
            if _sha(current[path]) != expected[path][0]
        ]
        if drift:
            raise DriftError(
                f"{len(drift)} file(s) drifted from their postimages; nothing was changed",
                hint="restore them, or record the edits with patchset refresh",
                details=drift,
            )
        changed = [
            a.name
            for a in removing
            if a.name not in by_name or by_name[a.name].sha256 != a.images.sha256
        ]
        total = len(state.applied)
        if changed:
            log(
                f"{', '.join(changed)} changed on disk since applied: "
                "restoring from the pristine copies in .patchset/base"
            )
            for index in range(total - 1, keep - 1, -1):
                log(f"Unapplying {state.applied[index].name} ({index + 1}/{total})")
            read = stack_reader(tree, state, by_name, keep)
            contents = {path: read(path) for path in touched}
        else:
            contents = dict(current)
            for index in range(total - 1, keep - 1, -1):
                applied = state.applied[index]
                log(f"Unapplying {applied.name} ({index + 1}/{total})")
                contents = _reverse_one(by_name[applied.name], applied, contents)
        firsts: dict[str, str | None] = {}
        for applied in removing:
            for image in applied.images.files:
                firsts.setdefault(image.path, image.pre)
        wrong = [
            f"{path}: restored {_short(_sha(contents[path]))}, recorded preimage "
            f"{_short(firsts[path])}"
            for path in touched
            if _sha(contents[path]) != firsts[path]
        ]
        if wrong:
            raise HashMismatch(
                f"{len(wrong)} file(s) would not be back at their preimages; nothing was changed",
                details=wrong,
            )
        remaining = state.applied[:keep]
        still = {i.path for a in remaining for i in a.images.files}
        made = {d for a in removing for d in a.created_dirs}
        plan = journal.Plan(
            tree.root,
            "unapply",
            tuple(a.name for a in reversed(removing)),
            removable=lambda d: d in made or d.startswith(STATE_DIR + "/"),
            dir_modes={d: int(m, 8) for d, m in state.modes.items() if d not in state.backups},
        )
        for path, data in contents.items():
            if data == current[path]:
                continue
            if data is None:
                plan.delete(path)
                continue
            mode = tree.mode(path)
            if mode is None and path in state.modes:
                mode = int(state.modes[path], 8)
            if mode is None:
                mode = file_mode(
                    next(i.mode for a in removing for i in a.images.files if i.path == path)
                )
            plan.put(path, data, mode)
        for path in sorted(set(state.backups) - still):
            if state.backups[path] is not None:
                plan.delete(backup_rel(path))
        if not remaining:
            plan.delete(state_rel())
        else:
            kept_modes = {
                p: m
                for p, m in state.modes.items()
                if p in still or any(s.startswith(p + "/") for s in still)
            }
            backups = {p: s for p, s in state.backups.items() if p in still}
            new_state = replace(state, applied=remaining, backups=backups, modes=kept_modes)
            plan.put(state_rel(), state_to_json(new_state).encode("utf-8"), 0o644)
        count = journal.commit(plan)
        files = sum(1 for p in contents if contents[p] != current[p])
        log(f"Unapplied {len(removing)} patch(es) from {tree.root}: {files} file(s) written")
        return Outcome(tuple(a.name for a in reversed(removing)), count, state.git_head)


def _refuse_drift(tree: Tree, state: TreeState) -> None:
    """An 'applied' tree whose files are off their postimages is an error, not nothing to do."""
    drift = [
        f"{path}: expected {_short(sha)}, found {_short(_sha(tree.read(path)))} (owned by {owner})"
        for path, (sha, owner) in sorted(state.expected().items())
        if _sha(tree.read(path)) != sha
    ]
    if drift:
        raise DriftError(
            f"{tree.root}: the state says the series is applied but {len(drift)} file(s) "
            "drifted from their postimages",
            hint="restore them, or patchset unapply and apply again",
            details=drift,
        )


def _reverse_one(
    patch: Patch, applied: AppliedPatch, contents: dict[str, bytes | None]
) -> dict[str, bytes | None]:
    out = dict(contents)
    for fp in reversed(patch.files):
        try:
            pre = apply_file(out[fp.path], reverse(fp))
        except PatchDoesNotApply as exc:
            raise PatchDoesNotApply(
                f"{patch.name} does not reverse: {exc.message}; nothing was changed"
            ) from None
        image = applied.images.image(fp.path)
        if image is None or _sha(pre) != image.pre:
            raise HashMismatch(
                f"{patch.name}: {fp.path}: reversed to {_short(_sha(pre))}, not the "
                f"recorded preimage {_short(image.pre if image else None)}; nothing was changed"
            )
        out[fp.path] = pre
    return out


def stack_reader(
    tree: Tree, state: TreeState, patches: dict[str, Patch], upto: int
) -> Callable[[str], bytes | None]:
    """Reads a path as it was with only the first ``upto`` applied patches applied.

    Starts from the pristine copy under ``.patchset/base/`` (checked against its recorded hash)
    or, for a path no applied patch touched, the tree's own file.
    """

    def read(path: str) -> bytes | None:
        if path not in state.backups:
            return tree.read(path)
        recorded = state.backups[path]
        data = tree.read(backup_rel(path)) if recorded else None
        if _sha(data) != recorded:
            raise HashMismatch(
                f".patchset/base/{path}: pristine copy does not match its recorded hash",
                hint="the state cannot be trusted; restore the tree from its base",
            )
        for applied in state.applied[:upto]:
            for fp in patches[applied.name].files:
                if fp.path == path:
                    data = apply_file(data, fp)
        return data

    return read
