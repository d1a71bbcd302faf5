"""Refresh: rewrite a patch's diff from the tree, keeping its header, deterministically.

The diff is regenerated with difflib (3 lines of context, no autojunk) with git-style headers
and full blob ids, in path order, so the same tree always gives the same bytes. The preimage of
each file comes from the pristine backup under ``.patchset/`` plus the applied patches below,
and is checked against the recorded preimage hash. The result is re-parsed and re-applied with
patchset's own engine before anything is written.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from patchset.apply import stack_reader
from patchset.diffparse import NULL_BLOB, apply_file, split_lines
from patchset.errors import HashMismatch, PatchFormatError, TreeStateError
from patchset.hashing import git_blob_id, sha256_bytes
from patchset.model import FileImage, FileOp, Patch, PatchImages
from patchset.series import parse_patch
from patchset.state import trusted_state, write_state
from patchset.tree import Tree
from patchset.treelock import DEFAULT_TIMEOUT_S, tree_lock

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
    """A refreshed patch: its new bytes, its new images, and whether anything changed."""

    data: bytes
    images: PatchImages
    changed: bool


def refresh_patch(
    tree: Tree,
    patches: tuple[Patch, ...],
    name: str,
    *,
    write_patch: Callable[[bytes], None],
    timeout: float = DEFAULT_TIMEOUT_S,
) -> Refreshed:
    """Regenerate patch ``name`` from ``tree``; write it with ``write_patch``; update the state.

    Allowed only when ``name`` is applied and no later applied patch touches its files.
    """
    with tree_lock(tree.root, timeout):
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
        if patch.sha256 != state.applied[index].images.sha256:
            raise TreeStateError(f"{name} changed on disk since it was applied; cannot refresh")
        later = [
            f"{a.name} also touches {path}"
            for a in state.applied[index + 1 :]
            for path in patch.paths
            if a.images.image(path) is not None
        ]
        if later:
            raise TreeStateError(
                f"{name} is not the topmost applied patch touching its files",
                hint=f"patchset unapply --upto {name}, then refresh",
                details=later,
            )
        read_pre = stack_reader(tree, state, by_name, index)
        diffs: list[bytes] = []
        images: list[FileImage] = []
        checks: list[tuple[str, bytes | None, bytes | None]] = []
        for fp in sorted(patch.files, key=lambda f: f.path):
            pre = read_pre(fp.path)
            recorded = state.applied[index].images.image(fp.path)
            if recorded is None or (None if pre is None else sha256_bytes(pre)) != recorded.pre:
                raise HashMismatch(f"{name}: {fp.path}: preimage does not match the state")
            post = tree.read(fp.path)
            if pre == post:
                continue
            diffs.append(render_file(fp.path, pre, post, fp.mode))
            op: FileOp = "add" if pre is None else "delete" if post is None else "modify"
            images.append(
                FileImage(
                    fp.path,
                    op,
                    recorded.pre,
                    None if post is None else sha256_bytes(post),
                    fp.mode,
                )
            )
            checks.append((fp.path, pre, post))
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
        changed = parsed.sha256 != patch.sha256
        if changed:
            write_patch(data)
            applied = list(state.applied)
            applied[index] = replace(applied[index], images=new_images)
            write_state(tree.root, replace(state, applied=tuple(applied)))
        return Refreshed(data, new_images, changed)


def write_file_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` via a temporary file and ``os.replace``."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
