"""The in-tree state's format: ``.patchset/state.json`` (which patches are applied, from what),
parsed, serialised and checked in memory; ``tree`` reads it, ``journal`` writes it.

``.patchset/`` at the tree root is like quilt's ``.pc/``: ``state.json`` (canonical JSON,
schema_version 1) records the target, the base pin, the git commit if the tree is a checkout,
the applied stack (patch name, patch sha256, per touched file op/pre/post/mode, directories
created) and the sha256 of every pristine file kept under ``.patchset/base/<path>`` (the
preimage before the first applied patch touched it). The directory exists only while at least
one patch is applied.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from patchset.diffparse import path_problem
from patchset.errors import TreeStateError
from patchset.model import AppliedPatch, FileImage, PatchImages, TreeState

STATE_DIR = ".patchset"
STATE_FILE = "state.json"
BASE_DIR = "base"
SCHEMA_VERSION = 1


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


def untrusted_paths(state: TreeState, touched: set[str]) -> list[str]:
    """Why ``state`` (untrusted input) cannot be the series' own, one line per problem: each
    file path relative, normalised, outside ``.git``/``.patchset`` and touched by the target's
    series (``touched``); ``backups`` exactly the applied files; each created directory an
    ancestor of a file its patch touches; each mode key a backup or an ancestor directory of
    one."""
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
    return problems
