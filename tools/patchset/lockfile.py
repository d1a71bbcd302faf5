"""``series.lock``: what every patch does to every file it touches, by hash.

Computed by applying the series in memory to the pristine base of each target (only touched
files are read). Canonical JSON (sorted keys, 2-space indent, trailing newline)::

    {"schema_version": 1,
     "pins": {"vllm.sdist": "<sha256>", ...},          # from pins.toml, {} without it
     "patches": [{"name": "vllm/0001-x.patch", "sha256": "...",
                  "files": [{"path": "...", "op": "modify|add|delete",
                             "pre": "<sha256>|null", "post": "<sha256>|null",
                             "mode": "100644|100755"}]}],
     "final": {"vllm": {"<path>": {"sha256": "<sha256>|null", "mode": "100644"}}}}
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from patchset.diffparse import apply_file
from patchset.errors import LockError, PatchDoesNotApply
from patchset.hashing import git_blob_id, sha256_bytes, short_sha
from patchset.model import FileImage, FinalImage, Lock, Patch, PatchImages
from patchset.state import canonical_json, images_from_json, images_to_json

SCHEMA_VERSION = 1
LOCK_FILE = "series.lock"

BaseReader = Callable[[str], bytes | None]
"""Reads one path of a target's pristine base: its bytes, or None when it does not exist."""


@dataclass(frozen=True)
class Computed:
    """A freshly computed lock, plus warnings (index blob ids that disagree with the images)."""

    lock: Lock
    warnings: tuple[str, ...]


def pin_digests(repo: Path) -> dict[str, str]:
    """``{"<target>.<kind>": sha256}`` from ``pins.toml``; empty when there is none."""
    if not (repo / "pins.toml").is_file():
        return {}
    from patchset.pins import load_pins

    return {pin.key: pin.sha256 for pin in load_pins(repo / "pins.toml")}


def shape_problems(patches: tuple[Patch, ...]) -> list[str]:
    """Paths of one target that the series uses both as a file and as a directory (a file that
    becomes a directory, or the reverse): refused, like git refuses them without a rename."""
    out = []
    for target in dict.fromkeys(p.target for p in patches):
        paths: dict[str, list[str]] = {}
        for p in patches:
            if p.target == target:
                for path in p.paths:
                    paths.setdefault(path, []).append(p.name)
        for path, names in sorted(paths.items()):
            parts = path.split("/")
            for depth in range(1, len(parts)):
                parent = "/".join(parts[:depth])
                if parent in paths:
                    out.append(
                        f"{parent} is a file and a directory in the series "
                        f"({_who(paths[parent])} {parent}, {_who(names)} {path})"
                    )
    return out


def _who(names: list[str]) -> str:
    """``a touches`` / ``a, b touch``: every patch touching a path, in series order."""
    return f"{', '.join(names)} {'touches' if len(names) == 1 else 'touch'}"


def compute_lock(
    patches: tuple[Patch, ...], bases: dict[str, BaseReader], pins: dict[str, str]
) -> Computed:
    """Apply ``patches`` in memory to ``bases`` (one reader per target) and record every image."""
    shapes = shape_problems(patches)
    if shapes:
        raise PatchDoesNotApply(
            f"the series changes a file into a directory: {len(shapes)} path(s)",
            hint="split the change: git cannot express it without a rename either",
            details=shapes,
        )
    contents: dict[str, dict[str, bytes | None]] = {}
    modes: dict[str, dict[str, str]] = {}
    entries: list[PatchImages] = []
    warnings: list[str] = []
    for patch in patches:
        current = contents.setdefault(patch.target, {})
        target_modes = modes.setdefault(patch.target, {})
        images = []
        for fp in patch.files:
            if fp.path not in current:
                current[fp.path] = bases[patch.target](fp.path)
            pre = current[fp.path]
            try:
                post = apply_file(pre, fp)
            except PatchDoesNotApply as exc:
                raise PatchDoesNotApply(
                    f"{patch.name} does not apply to the series so far: {exc.message}",
                    hint="refresh the patch against the tree the series before it produces",
                ) from None
            for side, data, blob in (("pre", pre, fp.old_blob), ("post", post, fp.new_blob)):
                if data is not None and git_blob_id(data) != blob:
                    warnings.append(
                        f"{patch.name}: {fp.path}: index line {side} blob {blob[:12]} is not "
                        f"the {side}image's {git_blob_id(data)[:12]} (run patchset refresh)"
                    )
            current[fp.path] = post
            target_modes[fp.path] = fp.mode
            images.append(
                FileImage(
                    fp.path,
                    fp.op,
                    None if pre is None else sha256_bytes(pre),
                    None if post is None else sha256_bytes(post),
                    fp.mode,
                )
            )
        entries.append(PatchImages(patch.name, patch.sha256, tuple(images)))
    final = {
        target: {
            path: FinalImage(None if data is None else sha256_bytes(data), modes[target][path])
            for path, data in files.items()
        }
        for target, files in contents.items()
    }
    return Computed(Lock(dict(pins), tuple(entries), final), tuple(warnings))


def lock_to_json(lock: Lock) -> str:
    return canonical_json(
        {
            "schema_version": SCHEMA_VERSION,
            "pins": lock.pins,
            "patches": [images_to_json(entry) for entry in lock.patches],
            "final": {
                target: {
                    path: {"sha256": image.sha256, "mode": image.mode}
                    for path, image in files.items()
                }
                for target, files in lock.final.items()
            },
        }
    )


_SHA256 = re.compile(r"[0-9a-f]{64}")
_OPS = ("modify", "add", "delete")
_MODES = ("100644", "100755")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: set[str] = set()
    for key, _value in pairs:
        if key in seen:
            raise LockError(f"duplicate key {key!r}")
        seen.add(key)
    return dict(pairs)


def lock_from_json(text: str, where: str = LOCK_FILE) -> Lock:
    """Read a lock, strictly: the text must be exactly what :func:`lock_to_json` writes for
    the lock it holds (so no unknown key, no duplicate key, no ``true`` for ``1``, no other
    layout), and every digest, operation and mode must be one patchset writes."""
    try:
        raw = json.loads(text, object_pairs_hook=_unique_keys)
        version = raw.get("schema_version")
        if type(version) is not int or version != SCHEMA_VERSION:
            raise LockError(f"{where}: schema_version {version!r}, want 1")
        final = {
            target: {p: FinalImage(v["sha256"], v["mode"]) for p, v in files.items()}
            for target, files in raw["final"].items()
        }
        patches = tuple(images_from_json(entry) for entry in raw["patches"])
        lock = Lock(dict(raw["pins"]), patches, final)
    except LockError as exc:
        if exc.message.startswith(where):
            raise
        raise LockError(f"{where}: malformed ({exc.message})", hint="run patchset lock") from exc
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise LockError(f"{where}: malformed ({exc})", hint="run patchset lock") from exc
    problems = _lock_problems(lock)
    if problems:
        raise LockError(f"{where}: malformed", details=problems, hint="run patchset lock")
    if lock_to_json(lock) != text:
        raise LockError(
            f"{where}: not the canonical form patchset writes (an unknown or misplaced key, or "
            "an edited layout)",
            hint="run patchset lock",
        )
    return lock


def _lock_problems(lock: Lock) -> list[str]:
    """Values no lock patchset writes holds: digests that are not sha256 hex, unknown
    operations or modes, non-string names and paths."""

    def digest(value: object, nullable: bool) -> bool:
        return (nullable and value is None) or (
            isinstance(value, str) and bool(_SHA256.fullmatch(value))
        )

    out = [f"pin {k}: {v!r} is not a sha256" for k, v in lock.pins.items() if not digest(v, False)]
    for entry in lock.patches:
        if not isinstance(entry.name, str) or not digest(entry.sha256, False):
            out.append(f"patch {entry.name!r}: name or sha256 {entry.sha256!r} not valid")
        for image in entry.files:
            where = f"{entry.name}: {image.path!r}"
            if not isinstance(image.path, str):
                out.append(f"{where}: the path is not a string")
            if image.op not in _OPS:
                out.append(f"{where}: op {image.op!r} is not one of {', '.join(_OPS)}")
            if image.mode not in _MODES:
                out.append(f"{where}: mode {image.mode!r} is not one of {', '.join(_MODES)}")
            if not digest(image.pre, True) or not digest(image.post, True):
                out.append(f"{where}: pre/post {image.pre!r}/{image.post!r} not sha256 or null")
    for target, files in lock.final.items():
        for path, final in files.items():
            if not digest(final.sha256, True) or final.mode not in _MODES:
                out.append(f"final {target} {path!r}: {final.sha256!r} {final.mode!r} not valid")
    return out


def load_lock(repo: Path) -> Lock:
    path = repo / LOCK_FILE
    from patchset.tree import read_regular

    data = read_regular(path)  # never a symlink's target or a FIFO
    if data is None:
        raise LockError(f"no {LOCK_FILE} in {repo}", hint="run patchset lock")
    from patchset.series import decode_utf8

    text = decode_utf8(data, LOCK_FILE, LockError, "run patchset lock")
    return lock_from_json(text, str(path))


def write_lock(repo: Path, lock: Lock) -> bool:
    """Write ``series.lock``; return whether its bytes changed."""
    path = repo / LOCK_FILE
    text = lock_to_json(lock)
    if path.is_file() and path.read_bytes() == text.encode("utf-8"):
        return False
    from patchset.repowrite import commit_repo, repo_lock

    with repo_lock(repo):
        commit_repo(repo, "lock", (), {LOCK_FILE: text.encode("utf-8")})
    return True


def series_differences(lock: Lock, patches: tuple[Patch, ...], pins: dict[str, str]) -> list[str]:
    """How ``lock`` disagrees with the series files and pins (cheap: no base tree needed)."""
    out = [
        f"pin {key}: lock has {lock.pins.get(key)}, pins.toml has {pins.get(key)}"
        for key in sorted(set(lock.pins) | set(pins))
        if lock.pins.get(key) != pins.get(key)
    ]
    names = [p.name for p in patches]
    locked = [e.name for e in lock.patches]
    for name in names:
        if name not in locked:
            out.append(f"{name}: in series, not in lock")
    for name in locked:
        if name not in names:
            out.append(f"{name}: in lock, not in series")
    if not out and names != locked:
        out.append("series order differs from the lock's order")
    for patch in patches:
        entry = lock.entry(patch.name)
        if entry is not None and entry.sha256 != patch.sha256:
            out.append(
                f"{patch.name}: patch sha256 {patch.sha256[:12]} differs from the lock's "
                f"{entry.sha256[:12]}"
            )
    return out


def lock_differences(old: Lock, new: Lock) -> list[str]:
    """Every difference between two locks, one line each, naming patch and file."""
    out: list[str] = []
    for key in sorted(set(old.pins) | set(new.pins)):
        if old.pins.get(key) != new.pins.get(key):
            out.append(f"pin {key}: {old.pins.get(key)} -> {new.pins.get(key)}")
    old_names = [e.name for e in old.patches]
    new_names = [e.name for e in new.patches]
    for name in new_names:
        if name not in old_names:
            out.append(f"{name}: not in lock")
    for name in old_names:
        if name not in new_names:
            out.append(f"{name}: in lock but not in series")
    if [n for n in old_names if n in new_names] != [n for n in new_names if n in old_names]:
        out.append("patch order differs")
    for entry in new.patches:
        before = old.entry(entry.name)
        if before is None:
            continue
        if before.sha256 != entry.sha256:
            out.append(f"{entry.name}: sha256 {before.sha256[:12]} -> {entry.sha256[:12]}")
        paths = dict.fromkeys([f.path for f in before.files] + [f.path for f in entry.files])
        for path in paths:
            a, b = before.image(path), entry.image(path)
            if a != b:
                out.append(f"{entry.name}: {path}: {_image_text(a)} -> {_image_text(b)}")
    for target in sorted(set(old.final) | set(new.final)):
        a_files, b_files = old.final.get(target, {}), new.final.get(target, {})
        for path in sorted(set(a_files) | set(b_files)):
            if a_files.get(path) != b_files.get(path):
                out.append(f"final {target}/{path}: {a_files.get(path)} -> {b_files.get(path)}")
    return out


def _image_text(image: FileImage | None) -> str:
    if image is None:
        return "untouched"
    return f"{image.op} {short_sha(image.pre)}..{short_sha(image.post)} {image.mode}"
