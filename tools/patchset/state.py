"""The in-tree state: ``.patchset/`` at the tree root, like quilt's ``.pc/``.

``state.json`` (canonical JSON, schema_version 1) records the target, the base pin, the git
commit if the tree is a checkout, the applied stack (patch name, patch sha256, per touched file
op/pre/post/mode, directories created) and the sha256 of every pristine file kept under
``.patchset/base/<path>`` (the preimage before the first applied patch touched it). The
directory exists only while at least one patch is applied.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from patchset.errors import TreeStateError
from patchset.model import AppliedPatch, FileImage, PatchImages, TreeState

STATE_DIR = ".patchset"
STATE_FILE = "state.json"
BASE_DIR = "base"
SCHEMA_VERSION = 1


def state_dir(root: Path) -> Path:
    return root / STATE_DIR


def backup_path(root: Path, rel: str) -> Path:
    """Where the pristine bytes of ``rel`` are kept while patches are applied."""
    return root / STATE_DIR / BASE_DIR / rel


def backup_rel(rel: str) -> str:
    """The tree-relative path of ``rel``'s pristine copy."""
    return f"{STATE_DIR}/{BASE_DIR}/{rel}"


def state_rel() -> str:
    return f"{STATE_DIR}/{STATE_FILE}"


def canonical_json(data: Any) -> str:
    """Sorted keys, 2-space indent, trailing newline: the form every JSON file of patchset has."""
    return json.dumps(data, sort_keys=True, indent=2, ensure_ascii=False) + "\n"


def images_to_json(images: PatchImages) -> dict[str, Any]:
    return {
        "name": images.name,
        "sha256": images.sha256,
        "files": [
            {"path": f.path, "op": f.op, "pre": f.pre, "post": f.post, "mode": f.mode}
            for f in images.files
        ],
    }


def images_from_json(raw: dict[str, Any]) -> PatchImages:
    files = tuple(
        FileImage(f["path"], f["op"], f["pre"], f["post"], f["mode"]) for f in raw["files"]
    )
    return PatchImages(raw["name"], raw["sha256"], files)


def state_to_json(state: TreeState) -> str:
    return canonical_json(
        {
            "schema_version": SCHEMA_VERSION,
            "target": state.target,
            "base_pin": state.base_pin,
            "git_head": state.git_head,
            "applied": [
                images_to_json(a.images) | {"created_dirs": list(a.created_dirs)}
                for a in state.applied
            ],
            "backups": dict(sorted(state.backups.items())),
            "modes": dict(sorted(state.modes.items())),
        }
    )


def state_from_json(text: str, where: Path) -> TreeState:
    try:
        raw = json.loads(text)
        if raw.get("schema_version") != SCHEMA_VERSION:
            raise TreeStateError(
                f"{where}: schema_version {raw.get('schema_version')!r}, "
                f"this patchset reads {SCHEMA_VERSION}"
            )
        applied = tuple(
            AppliedPatch(images_from_json(a), tuple(a.get("created_dirs", ())))
            for a in raw["applied"]
        )
        return TreeState(
            raw["target"],
            raw["base_pin"],
            raw["git_head"],
            applied,
            dict(raw["backups"]),
            dict(raw.get("modes", {})),
        )
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise TreeStateError(
            f"{where}: malformed state ({exc})",
            hint="restore the tree from its base; the state cannot be trusted",
        ) from exc


def read_state(root: Path) -> TreeState | None:
    """The tree's state, or None when no patch is applied (no ``.patchset/state.json``)."""
    if state_dir(root).is_symlink():
        raise TreeStateError(
            f"{state_dir(root)} is a symlink; refusing to use it",
            hint="the state must be a real directory of the tree",
        )
    from patchset.tree import read_regular

    path = state_dir(root) / STATE_FILE
    data = read_regular(path)
    if data is None:
        if state_dir(root).exists() and _holds_files(state_dir(root)):
            raise TreeStateError(
                f"{state_dir(root)} exists without {STATE_FILE}",
                hint="an interrupted run? restore the tree from its base",
            )
        return None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TreeStateError(f"{path}: malformed state (not UTF-8: {exc.reason})") from None
    return state_from_json(text, path)


def trusted_state(root: Path, touched: set[str]) -> TreeState | None:
    """:func:`read_state`, then every path in it checked (untrusted input): each file path
    relative, normalised, outside ``.git``/``.patchset`` and touched by the target's series;
    ``backups`` exactly the applied files; each created directory an ancestor of a file its
    patch touches; each mode key a backup or an ancestor directory of one."""
    from patchset.diffparse import path_problem

    state = read_state(root)
    if state is None:
        return None
    problems: list[str] = []
    files = {i.path for a in state.applied for i in a.images.files}
    ancestors = {"/".join(p.split("/")[:d]) for p in touched for d in range(1, p.count("/") + 1)}
    for path in sorted(files | set(state.backups) | set(state.modes)):
        reason = path_problem(path) if isinstance(path, str) else f"{path!r} is not a path"
        if reason:
            problems.append(reason)
    for path in sorted(files - touched):
        problems.append(f"{path!r} is not a file the series touches")
    for path in sorted(set(state.backups) ^ files):
        problems.append(f"backups entry {path!r} is not a file of the applied stack")
    for path in sorted(set(state.modes) - set(state.backups) - ancestors):
        problems.append(f"modes entry {path!r} is neither a backup nor a directory of one")
    for applied in state.applied:
        mine = {
            "/".join(i.path.split("/")[:d])
            for i in applied.images.files
            for d in range(1, i.path.count("/") + 1)
        }
        for directory in applied.created_dirs:
            if directory not in mine:
                problems.append(
                    f"{applied.name}: created_dirs entry {directory!r} is not a parent of its files"
                )
    if problems:
        raise TreeStateError(
            f"{state_dir(root) / STATE_FILE}: untrusted state: {len(problems)} problem(s); "
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


def write_state(root: Path, state: TreeState) -> None:
    """Write ``state.json`` atomically (temporary file + ``os.replace``)."""
    path = state_dir(root) / STATE_FILE
    tmp = path.with_name(STATE_FILE + ".tmp")
    try:
        tmp.write_text(state_to_json(state), encoding="utf-8")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
