"""Verify a patched tree and report per-patch status, hashing only the files the series touched."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from patchset.errors import DriftError, TreeStateError
from patchset.hashing import sha256_bytes
from patchset.journal import refuse_pending
from patchset.model import Lock, Patch, TreeState
from patchset.tree import Tree, trusted_state

PatchStatus = Literal["applied", "not applied", "drifted"]


@dataclass(frozen=True)
class Drift:
    """A touched file whose bytes are not the postimage its owning (last) patch recorded."""

    path: str
    expected: str | None
    actual: str | None
    owner: str

    def describe(self) -> str:
        if self.actual and len(self.actual) != 64:  # a symlink_problem, not a digest
            return f"{self.path}: {self.actual} (owned by {self.owner})"
        return (
            f"{self.path}: expected {self.expected or 'absent'}, "
            f"found {self.actual or 'absent'} (owned by {self.owner})"
        )


def find_drift(tree: Tree, state: TreeState) -> list[Drift]:
    """Every touched file of the applied stack that differs from its expected postimage."""
    drift = []
    for path, (expected, owner) in sorted(state.expected().items()):
        through = tree.problem(path)
        if through:
            drift.append(Drift(path, expected, through, owner))
            continue
        data = tree.read(path)
        actual = None if data is None else sha256_bytes(data)
        if actual != expected:
            drift.append(Drift(path, expected, actual, owner))
    return drift


def lock_disagreements(state: TreeState, patches: tuple[Patch, ...], lock: Lock) -> list[str]:
    """Applied patches whose file or recorded images differ from the series and the lock now."""
    by_name = {p.name: p for p in patches}
    out = []
    for applied in state.applied:
        patch = by_name.get(applied.name)
        entry = lock.entry(applied.name)
        if patch is None:
            out.append(f"{applied.name}: applied but no longer in series")
        elif patch.sha256 != applied.images.sha256:
            out.append(f"{applied.name}: patch file changed since it was applied")
        elif entry is None or entry.files != applied.images.files:
            out.append(f"{applied.name}: applied images differ from series.lock")
    return out


def verify_tree(tree: Tree, patches: tuple[Patch, ...], lock: Lock) -> TreeState:
    """Check every touched file against its postimage; raise DriftError listing each drift."""
    refuse_pending(tree.root)
    state = trusted_state(tree.root, {p for patch in patches for p in patch.paths})
    if state is None:
        return _verify_pristine(tree, patches, lock)
    problems = [d.describe() for d in find_drift(tree, state)]
    problems += lock_disagreements(state, patches, lock)
    pinned = lock.pins.get(f"{state.target}.sdist")
    if state.base_pin and pinned and state.base_pin != pinned:
        problems.append(
            f"tree was patched from base {state.base_pin[:12]}, series.lock pins {pinned[:12]}"
        )
    if problems:
        raise DriftError(
            f"{tree.root}: {len(problems)} problem(s): the tree is not what the series makes",
            hint="patchset status shows which patch; unapply and apply again, or refresh",
            details=problems,
        )
    return state


def _verify_pristine(tree: Tree, patches: tuple[Patch, ...], lock: Lock) -> TreeState:
    """A tree no patch was applied to verifies when every file the series touches holds the
    lock's preimage of the first patch touching it (the pinned base): the empty stack is what
    the series makes with nothing applied. Returns an empty state; DriftError otherwise."""
    target = patches[0].target if patches else "vllm"
    firsts: dict[str, tuple[str | None, str]] = {}
    for patch in patches:
        entry = lock.entry(patch.name)
        if entry is None:
            raise TreeStateError(
                f"series.lock has no entry for {patch.name}", hint="run patchset lock"
            )
        for image in entry.files:
            firsts.setdefault(image.path, (image.pre, patch.name))
    problems = []
    for path, (pre, name) in sorted(firsts.items()):
        reason = tree.problem(path)
        if reason:
            problems.append(f"{reason} (preimage of {name})")
            continue
        data = tree.read(path)
        found = None if data is None else sha256_bytes(data)
        if found != pre:
            problems.append(
                f"{path}: expected {pre or 'absent'}, found {found or 'absent'} "
                f"(preimage of {name}; no patch is applied)"
            )
    if problems:
        raise DriftError(
            f"{tree.root}: no patch is applied and {len(problems)} touched file(s) are not the "
            "pinned base's",
            hint="start from a fresh tree of the pinned release, then patchset apply",
            details=problems,
        )
    return TreeState(target, None, None)


def tree_status(tree: Tree, patches: tuple[Patch, ...]) -> list[tuple[str, PatchStatus]]:
    """Each patch of the target with its status: applied, not applied, or drifted."""
    refuse_pending(tree.root)
    state = trusted_state(tree.root, {p for patch in patches for p in patch.paths})
    if state is None:
        return [(p.name, "not applied") for p in patches]
    drifted_owners = {d.owner for d in find_drift(tree, state)}
    applied = {a.name: a for a in state.applied}
    out: list[tuple[str, PatchStatus]] = []
    for patch in patches:
        record = applied.get(patch.name)
        if record is None:
            out.append((patch.name, "not applied"))
        elif patch.name in drifted_owners or record.images.sha256 != patch.sha256:
            out.append((patch.name, "drifted"))
        else:
            out.append((patch.name, "applied"))
    return out
