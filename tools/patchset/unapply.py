"""Unapply a target's applied stack, newest first, down to a patch or the base: all or nothing.

Every touched file must hold its recorded postimage first; the reversed bytes must hash to the
recorded preimages before anything is written; then one journal commit restores them, removes
the directories the patches created and rewrites (or removes) the state file. A patch file
changed since it was applied is not reversed: the pristine copies under ``.patchset/base/`` are
replayed up to the patches that stay (:func:`stack_reader`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from patchset import journal
from patchset.apply import Log, Outcome, check_stack, recover_tree, touched_paths
from patchset.diffparse import apply_file, reverse
from patchset.errors import (
    DriftError,
    HashMismatch,
    NothingToDo,
    PatchDoesNotApply,
    PatchFormatError,
)
from patchset.hashing import sha256_of, short_sha
from patchset.model import AppliedPatch, Patch, TreeState
from patchset.state import STATE_DIR, backup_rel, state_rel, state_to_json
from patchset.tree import DEFAULT_TIMEOUT_S, Tree, file_mode, tree_lock, trusted_state


def _quiet(_: str) -> None:
    return None


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
            f"{path}: expected {short_sha(expected[path][0])}, "
            f"found {short_sha(sha256_of(current[path]))} (postimage of {expected[path][1]})"
            for path in touched
            if sha256_of(current[path]) != expected[path][0]
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
            f"{path}: restored {short_sha(sha256_of(contents[path]))}, recorded preimage "
            f"{short_sha(firsts[path])}"
            for path in touched
            if sha256_of(contents[path]) != firsts[path]
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
        if image is None or sha256_of(pre) != image.pre:
            raise HashMismatch(
                f"{patch.name}: {fp.path}: reversed to {short_sha(sha256_of(pre))}, not the "
                f"recorded preimage {short_sha(image.pre if image else None)}; nothing was changed"
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
        if sha256_of(data) != recorded:
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
