"""Diffs, exactly: the diff part of a patch -> touched files -> postimage bytes.

The only module that uses unidiff. Each ``diff --git`` block's extended header is read here
(refusing renames, copies, mode changes, binary hunks, paths outside the tree); unidiff parses
its hunks. Content is handled as bytes: the diff is decoded as latin-1, a bijection, so every
byte of a hunk line survives. Hunks apply with exact context and zero fuzz: at the stated line,
or else at the nearest offset where every context and removed line matches byte for byte.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from unidiff.errors import UnidiffParseError
from unidiff.patch import PatchSet

from patchset.errors import PatchDoesNotApply
from patchset.model import FILE_MODES, FileOp, FilePatch, Hunk

NULL_BLOB = "0" * 40
_ESCAPES = {"a": 7, "b": 8, "t": 9, "n": 10, "v": 11, "f": 12, "r": 13, '"': 34, "\\": 92}
_INDEX = re.compile(r"^index (?P<old>[0-9a-f]+)\.\.(?P<new>[0-9a-f]+)(?: (?P<mode>\d+))?$")
_REFUSED_HEADERS = {
    "similarity index": "rename or copy (export with --no-renames)",
    "dissimilarity index": "rename or copy (export with --no-renames)",
    "rename from": "rename (export with --no-renames)",
    "rename to": "rename (export with --no-renames)",
    "copy from": "copy (export with --no-renames)",
    "copy to": "copy (export with --no-renames)",
    "GIT binary patch": "binary hunk",
    "Binary files": "binary hunk",
}
_RESERVED_TOP = (".patchset", ".git")


def path_problem(path: str) -> str | None:
    """Why ``path`` may not be touched by a patch (outside the tree, reserved), or None."""
    if path.startswith("/"):
        return f"absolute path {path!r} is outside the tree"
    parts = path.split("/")
    if any(part in ("", ".", "..") for part in parts):
        return f"path {path!r} is outside the tree or not normalised ('..', '.', '//')"
    if "\\" in path or "\0" in path:
        return f"path {path!r} contains a backslash or NUL"
    if parts[0] in _RESERVED_TOP:
        return f"path {path!r} is inside reserved directory {parts[0]}/"
    return None


def unquote(token: str) -> str:
    """A path as git writes it (C-quoted when ``core.quotePath`` asks, else raw bytes; the diff
    is decoded as latin-1) -> the UTF-8 path. Raises ValueError when it is not UTF-8."""
    if len(token) >= 2 and token[0] == token[-1] == '"':
        out = bytearray()
        body = token[1:-1]
        at = 0
        while at < len(body):
            char = body[at]
            if char != "\\":
                out += char.encode("latin-1")
                at += 1
            elif body[at + 1 : at + 2] in _ESCAPES:
                out.append(_ESCAPES[body[at + 1]])
                at += 2
            elif re.fullmatch(r"[0-7]{3}", body[at + 1 : at + 4]):
                out.append(int(body[at + 1 : at + 4], 8))
                at += 4
            else:
                raise ValueError(f"bad escape in quoted path {token!r}")
        raw = bytes(out)
    else:
        raw = token.encode("latin-1")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"path {raw!r} is not UTF-8") from exc


def _header_paths(line: str) -> tuple[str, str] | None:
    """The (old, new) paths of a ``diff --git`` line, ``a/``/``b/`` prefixes removed."""
    rest = line[len("diff --git ") :]
    quoted = re.fullmatch(r'("(?:[^"\\]|\\.)*"|\S+) ("(?:[^"\\]|\\.)*"|\S+)', rest)
    if quoted and ('"' in rest):
        old, new = unquote(quoted.group(1)), unquote(quoted.group(2))
    elif len(rest) % 2 == 1 and rest[: len(rest) // 2][2:] == rest[len(rest) // 2 + 1 :][2:]:
        half = len(rest) // 2  # unquoted and the same path twice: may contain spaces
        old, new = unquote(rest[:half]), unquote(rest[half + 1 :])
    elif quoted:
        old, new = unquote(quoted.group(1)), unquote(quoted.group(2))
    else:
        return None
    if not (old.startswith("a/") and new.startswith("b/")):
        return None
    return old[2:], new[2:]


def _side_path(line: str) -> str:
    """The path of a ``---``/``+++`` line (quoting undone, git's trailing tab dropped)."""
    token = line[4:].removesuffix("\t")
    return token if token == "/dev/null" else unquote(token)


def split_lines(data: bytes) -> list[bytes]:
    """``data`` as lines, each keeping its ``\\n``; only ``\\n`` ends a line."""
    parts = data.split(b"\n")
    lines = [part + b"\n" for part in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines


def _blocks(text: str) -> Iterable[list[str]]:
    block: list[str] = []
    for line in text.split("\n"):
        if line.startswith("diff --git ") and block:
            yield block
            block = []
        block.append(line)
    if block:
        yield block


def parse_diff(diff: bytes) -> tuple[list[FilePatch], list[str]]:
    """Parse every ``diff --git`` block; return (file patches, every problem found)."""
    text = diff.decode("latin-1")
    files: list[FilePatch] = []
    problems: list[str] = []
    if not text.strip():
        return files, ["patch contains no diff"]
    if not text.startswith("diff --git "):
        return files, ["diff does not start with 'diff --git'"]
    seen: set[str] = set()
    for block in _blocks(text.rstrip("\n")):
        parsed, block_problems = _parse_block(block)
        problems += block_problems
        if parsed is not None:
            if parsed.path in seen:
                problems.append(f"{parsed.path}: appears twice in one patch")
            seen.add(parsed.path)
            files.append(parsed)
    return files, problems


def _parse_block(block: list[str]) -> tuple[FilePatch | None, list[str]]:
    try:
        names = _header_paths(block[0])
    except ValueError as exc:
        return None, [f"{block[0].encode('latin-1').decode('utf-8', 'replace')}: {exc}"]
    if names is None:
        return None, [f"unsupported diff header {block[0]!r}"]
    old_path, path = names
    problems: list[str] = []
    if old_path != path:
        problems.append(f"{path}: rename from {old_path} (export with --no-renames)")
    for candidate in {old_path, path}:
        reason = path_problem(candidate)
        if reason:
            problems.append(reason)
    op: FileOp = "modify"
    mode: str | None = None
    old_blob = new_blob = None
    mode_change: dict[str, str] = {}
    body_at = len(block)
    for at, line in enumerate(block[1:], start=1):
        if line.startswith("--- ") or line.startswith("@@"):
            body_at = at
            break
        refused = next((why for key, why in _REFUSED_HEADERS.items() if line.startswith(key)), None)
        if refused:
            problems.append(f"{path}: {refused} ({line.strip()!r})")
            if refused == "binary hunk":
                break  # the rest of the block is binary data, not header lines
        elif line.startswith(("old mode ", "new mode ")):
            mode_change[line.split()[0]] = line.split()[-1]
        elif line.startswith("new file mode "):
            op, mode = "add", line.split()[-1]
        elif line.startswith("deleted file mode "):
            op, mode = "delete", line.split()[-1]
        elif index := _INDEX.match(line):
            old_blob, new_blob = index.group("old"), index.group("new")
            mode = index.group("mode") or mode
        elif line.strip():
            problems.append(f"{path}: unexpected diff header line {line!r}")
    if mode_change:
        change = f"{mode_change.get('old', '?')} -> {mode_change.get('new', '?')}"
        problems.append(f"{path}: mode change ({change}); patches may not change modes")
    if problems:
        return None, problems
    if old_blob is None or new_blob is None:
        return None, [f"{path}: no 'index' line"]
    if len(old_blob) != 40 or len(new_blob) != 40:
        return None, [f"{path}: abbreviated index line (export with --full-index)"]
    if mode not in FILE_MODES:
        return None, [f"{path}: file mode {mode} is not a regular file mode {FILE_MODES}"]
    hunks, hunk_problems = _parse_hunks(path, block[body_at:], op)
    if hunk_problems:
        return None, hunk_problems
    if op == "modify" and not hunks:
        return None, [f"{path}: diff has no hunks"]
    if op == "add" and old_blob != NULL_BLOB or op == "delete" and new_blob != NULL_BLOB:
        return None, [f"{path}: index line does not match a {op}"]
    return FilePatch(path, op, mode, old_blob, new_blob, tuple(hunks)), []


def _parse_hunks(path: str, body: list[str], op: FileOp) -> tuple[list[Hunk], list[str]]:
    if not body:
        return [], []
    expect_old = "/dev/null" if op == "add" else f"a/{path}"
    expect_new = "/dev/null" if op == "delete" else f"b/{path}"
    try:
        sides = [_side_path(line) for line in body[:2]]
    except ValueError as exc:
        return [], [f"{path}: {exc}"]
    if (
        len(body) < 2
        or not body[0].startswith("--- ")
        or not body[1].startswith("+++ ")
        or sides != [expect_old, expect_new]
    ):
        return [], [f"{path}: '---'/'+++' lines are not '{expect_old}'/'{expect_new}'"]
    try:
        patch_set = PatchSet([line + "\n" for line in body])
    except UnidiffParseError as exc:
        return [], [f"{path}: malformed hunk ({exc})"]
    if len(patch_set) != 1:
        return [], [f"{path}: expected one file diff, found {len(patch_set)}"]
    hunks: list[Hunk] = []
    problems: list[str] = []
    for raw in patch_set[0]:
        lines: list[tuple[str, bytes]] = []
        for line in raw:
            if line.line_type == "\\":
                if not lines or not lines[-1][1].endswith(b"\n"):
                    problems.append(f"{path}: misplaced '\\ No newline at end of file'")
                    continue
                kind, data = lines[-1]
                lines[-1] = (kind, data[:-1])
            else:
                lines.append((line.line_type, line.value.encode("latin-1")))
        hunk = Hunk(
            raw.source_start, raw.source_length, raw.target_start, raw.target_length, tuple(lines)
        )
        if len(hunk.old_lines) != hunk.old_len or len(hunk.new_lines) != hunk.new_len:
            problems.append(f"{path}: hunk @@ -{hunk.old_start} line counts do not match")
        hunks.append(hunk)
    return hunks, problems


def reverse(patch: FilePatch) -> FilePatch:
    """The file patch that undoes ``patch``."""
    flip = {"+": "-", "-": "+", " ": " "}
    op: FileOp = {"add": "delete", "delete": "add", "modify": "modify"}[patch.op]  # type: ignore[assignment]
    hunks = tuple(
        Hunk(
            h.new_start,
            h.new_len,
            h.old_start,
            h.old_len,
            tuple((flip[kind], text) for kind, text in h.lines),
        )
        for h in patch.hunks
    )
    return FilePatch(patch.path, op, patch.mode, patch.new_blob, patch.old_blob, hunks)


def apply_file(pre: bytes | None, patch: FilePatch) -> bytes | None:
    """The postimage of ``pre`` under ``patch`` (None = the file is absent).

    Raises PatchDoesNotApply when the file's presence is wrong or a hunk's context or removed
    lines do not match byte for byte anywhere at or after the previous hunk.
    """
    if patch.op == "add":
        if pre is not None:
            raise PatchDoesNotApply(f"{patch.path}: patch adds the file but it already exists")
        return b"".join(line for h in patch.hunks for line in h.new_lines)
    if pre is None:
        verb = {"modify": "modifies", "delete": "deletes"}[patch.op]
        raise PatchDoesNotApply(f"{patch.path}: patch {verb} the file but it does not exist")
    lines = split_lines(pre)
    out: list[bytes] = []
    cursor = 0
    for hunk in patch.hunks:
        old = hunk.old_lines
        stated = hunk.old_start - 1 if hunk.old_len else hunk.old_start
        where = f"{patch.path}: hunk @@ -{hunk.old_start},{hunk.old_len}"
        context = any(kind == " " for kind, _ in hunk.lines)
        anchor = _anchor(hunk, len(lines)) if context else None
        if anchor is not None:
            anchored, side = anchor
            fits = cursor <= anchored and anchored + len(old) <= len(lines)
            if not (fits and lines[anchored : anchored + len(old)] == old):
                found = _find(lines, old, stated, 0)
                seen = f"; its lines occur at line {found + 1}" if found is not None else ""
                raise PatchDoesNotApply(
                    f"{where} has context on one side only, so it must match at the {side} "
                    f"(as git apply requires), and does not{seen}"
                )
            at: int | None = anchored
        else:
            at = _find(lines, old, stated, cursor)
        if at is None:
            if _find(lines, old, stated, 0) is not None:
                raise PatchDoesNotApply(
                    f"{where} matches only before the previous hunk: the hunks are out of "
                    "order (each must follow the one before it)"
                )
            raise PatchDoesNotApply(f"{where} does not match (exact context, zero fuzz)")
        if patch.op == "modify" and not context:
            if at != 0 and at + len(old) != len(lines):
                raise PatchDoesNotApply(
                    f"{patch.path}: hunk @@ -{hunk.old_start},{hunk.old_len} has no context "
                    "lines (made with -U0?); refused except at the start or end of a file"
                )
        out += lines[cursor:at]
        out += hunk.new_lines
        cursor = at + len(old)
    out += lines[cursor:]
    post = b"".join(out)
    if patch.op == "delete":
        if post:
            raise PatchDoesNotApply(f"{patch.path}: patch deletes the file but content remains")
        return None
    return post


def _anchor(hunk: Hunk, length: int) -> tuple[int, str] | None:
    """Where git's anchoring rules pin a hunk that has context lines, or None when it may
    move. As ``git apply`` (apply.c, without --unidiff-zero): a hunk whose old range starts at
    line 0 or 1 must match at the start of the file; a hunk without trailing context lines
    must match at its end (both: the whole file)."""
    kinds = [kind for kind, _ in hunk.lines]
    trailing = len(kinds) - len("".join(kinds).rstrip(" "))
    begin = hunk.old_start <= 1
    end = trailing == 0
    if begin and end:  # the hunk's old lines must be the whole file
        return (0 if hunk.old_len == length else -1), "start and the end of the file"
    if begin:
        return 0, "start of the file"
    if end:
        return length - hunk.old_len, "end of the file"
    return None


def _find(lines: list[bytes], old: list[bytes], stated: int, floor: int) -> int | None:
    """The start nearest to ``stated`` (not before ``floor``) where ``old`` matches exactly."""
    last = len(lines) - len(old)
    if last < floor:
        return None
    stated = min(max(stated, floor), last)
    for distance in range(max(stated - floor, last - stated) + 1):
        for at in (stated - distance, stated + distance):
            if floor <= at <= last and lines[at : at + len(old)] == old:
                return at
    return None
