"""The ``series`` file and the ``patches/`` directory: parse, serialise, validate, load.

``series`` holds one ``<target>/NNNN-slug.patch`` per line (order = apply order), ``#``
comments and blank lines. Loading validates the whole series and every patch file and raises
one SeriesError listing every problem, each naming the patch and the reason.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from patchset.diffparse import parse_diff
from patchset.errors import PatchFormatError, PatchsetError, SeriesError
from patchset.hashing import sha256_bytes
from patchset.model import TARGETS, Patch
from patchset.patchfile import header_problems, parse_header, split_patch

NAME_RE = re.compile(
    r"\A(?P<target>[a-z0-9]+)/(?P<number>[0-9]{4})-(?P<slug>[a-z0-9]+(?:-[a-z0-9]+)*)\.patch\Z"
)
"""A series entry: ASCII only, the whole string (``\\Z``: no trailing newline, which ``$``
would let through; ``[0-9]``: no other script's digits, which ``\\d`` would)."""
IGNORED_FILES = frozenset({".gitkeep"})


@dataclass(frozen=True)
class SeriesEntry:
    """One patch line of ``series`` and where it was (1-based line number)."""

    name: str
    line: int


def parse_series(text: str) -> tuple[SeriesEntry, ...]:
    """The patch entries of a series file, in order (comments and blank lines dropped)."""
    entries = []
    for number, raw in enumerate(text.split("\n"), start=1):
        line = raw.split("#", 1)[0].strip()
        if line:
            entries.append(SeriesEntry(line, number))
    return tuple(entries)


def serialise_series(names: list[str] | tuple[str, ...], comment: str = "") -> str:
    """A series file listing ``names`` in order, after an optional ``#`` comment block."""
    head = "".join(f"# {line}".rstrip() + "\n" for line in comment.splitlines())
    return head + "".join(f"{name}\n" for name in names)


def name_problem(name: str) -> str | None:
    """Why ``name`` is not a valid series entry, or None. Every name the tool writes or reads
    passes here first, so no entry can name a path outside ``patches/<target>/``."""
    match = NAME_RE.match(name)
    if not match:
        return "bad name: want <target>/NNNN-slug.patch (lowercase slug, 4-digit number)"
    if match.group("target") not in TARGETS:
        return f"bad name: target {match.group('target')!r} is not one of {', '.join(TARGETS)}"
    return None


def entry_problems(entries: tuple[SeriesEntry, ...], patches_dir: Path) -> list[str]:
    """Every problem of the entries against the patch directory (names, duplicates, files)."""
    problems: list[str] = []
    seen: dict[str, int] = {}
    numbers: dict[tuple[str, str], str] = {}
    for entry in entries:
        where = f"{entry.name} (series line {entry.line})"
        if entry.name in seen:
            problems.append(f"{where}: duplicate entry (first on line {seen[entry.name]})")
            continue
        seen[entry.name] = entry.line
        reason = name_problem(entry.name)
        if reason:
            problems.append(f"{where}: {reason}")
            continue
        match = NAME_RE.match(entry.name)
        assert match is not None  # checked by name_problem
        key = (match.group("target"), match.group("number"))
        if key in numbers:
            problems.append(f"{where}: number {key[1]} already used by {numbers[key]}")
        numbers[key] = entry.name
        if not (patches_dir / entry.name).is_file():
            problems.append(f"{where}: listed but missing (no patches/{entry.name})")
    if patches_dir.is_dir():
        for path in sorted(patches_dir.rglob("*")):
            if path.is_dir() or path.name in IGNORED_FILES:
                continue
            rel = path.relative_to(patches_dir).as_posix()
            if rel not in seen:
                problems.append(f"{rel}: present under patches/ but not listed in series")
    return problems


_CRLF = re.compile(rb"^(?:From |diff --git |--- |\+\+\+ |@@ ).*\r$", re.MULTILINE)
_PLAIN_DIFF = re.compile(rb"^--- .*\n\+\+\+ .*\n@@ ", re.MULTILINE)


def crlf_problem(data: bytes) -> str | None:
    """One line when the patch's header or diff lines end in CRLF."""
    if _CRLF.search(data):
        return (
            "the patch file has CRLF line endings (an editor or git's core.autocrlf converted "
            "it); convert it back to LF or export it again"
        )
    return None


def form_problem(data: bytes) -> str | None:
    """One line when the file is not a format-patch at all (CRLF, plain diff, bare git diff)."""
    crlf = crlf_problem(data)
    if crlf:
        return crlf
    if not data.startswith(b"diff --git ") and b"\ndiff --git " not in data:
        if _PLAIN_DIFF.search(data):
            return (
                "a plain unified diff (no 'diff --git' lines, index lines or mail header): "
                "make it a series patch with `patchset import FILE`"
            )
    elif data.startswith(b"diff --git "):
        return (
            "a git diff without a format-patch header (Subject, Upstream-Status, "
            "Signed-off-by): make it a series patch with `patchset import FILE`"
        )
    return None


def parse_patch(name: str, data: bytes) -> tuple[Patch | None, list[str]]:
    """Parse one patch file; return (patch or None, every problem found)."""
    form = form_problem(data)
    if form:
        return None, [form]
    header_text, diff = split_patch(data)
    problems: list[str] = []
    header = None
    try:
        header = parse_header(header_text)
    except PatchFormatError as exc:
        problems.append(exc.message)
    else:
        problems += header_problems(header)
    files, diff_problems = parse_diff(diff)
    problems += diff_problems
    if header is None or problems:
        return None, problems
    return Patch(name, sha256_bytes(data), header, header_text, tuple(files)), []


def decode_utf8(data: bytes, where: str, error: type[PatchsetError], hint: str) -> str:
    """``data`` as UTF-8, or ``error`` naming the file, line and byte that are not."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise error(
            f"{where}: not UTF-8 (byte 0x{data[exc.start]:02x} on line {line})",
            hint=hint,
        ) from None


def load_series(repo: Path) -> tuple[Patch, ...]:
    """Read ``series`` and every listed patch; raise one SeriesError listing every problem."""
    series_file = repo / "series"
    if not series_file.is_file():
        raise SeriesError(f"no series file at {series_file}", hint="create it (it may be empty)")
    entries = parse_series(
        decode_utf8(series_file.read_bytes(), "series", SeriesError, "re-save series as UTF-8")
    )
    patches_dir = repo / "patches"
    problems = entry_problems(entries, patches_dir)
    patches: list[Patch] = []
    names: list[str] = []
    for entry in entries:
        path = patches_dir / entry.name
        if name_problem(entry.name) or not path.is_file() or entry.name in names:
            continue
        names.append(entry.name)
        patch, patch_problems = parse_patch(entry.name, path.read_bytes())
        problems += [f"{entry.name}: {reason}" for reason in patch_problems]
        if patch is None:
            continue
        for dep in patch.header.depends_on:
            if dep not in names[:-1]:
                problems.append(f"{entry.name}: Depends-on {dep} is not listed earlier in series")
        patches.append(patch)
    if problems:
        raise SeriesError(
            f"series refused: {len(problems)} problem(s)",
            hint="fix each listed patch or series line, then run again",
            details=problems,
        )
    return tuple(patches)


def for_target(patches: tuple[Patch, ...], target: str) -> tuple[Patch, ...]:
    """The patches of one target tree, in series order."""
    return tuple(p for p in patches if p.target == target)
