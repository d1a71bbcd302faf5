"""``patchset import``: a third-party patch -> a series patch, listed and locked.

Takes default ``git format-patch`` output (abbreviated ``index`` lines, ``[PATCH]`` subject,
diffstat, signature), a ``git diff``, or a plain unified diff (``diff -u``, ``a/``/``b/``
prefixes optional, timestamps ignored). Produces the series' layout: each file's block with the
full ``index`` line computed from the blobs of the base as the series so far leaves it, the
hunks kept verbatim, a header with ``Subject: [Tag] Title``, the description and trailers kept,
``Upstream-Status: Pending`` and ``Signed-off-by`` (git config) added when missing. The patch is
parsed with the series' own rules and locked with the rest before anything is written; then
the patch file, the series entry and ``series.lock`` are written.
"""

from __future__ import annotations

import email.parser
import email.policy
import email.utils
import re
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from patchset.diffparse import NULL_BLOB, _side_path, apply_file, parse_diff, path_problem
from patchset.errors import PatchDoesNotApply, PatchFormatError
from patchset.hashing import git_blob_id
from patchset.lockfile import LOCK_FILE, BaseReader, compute_lock, lock_to_json, pin_digests
from patchset.model import Patch, PatchHeader
from patchset.patchfile import _split_trailers, git_am_patch_break, has_control, serialise_header
from patchset.repowrite import commit_repo, repo_lock
from patchset.series import (
    NAME_RE,
    crlf_problem,
    load_series,
    name_problem,
    parse_patch,
    parse_series,
)

BaseMode = Callable[[str], str | None]
"""The git mode (``100644``/``100755``) of a path in the target's pristine base, or None."""

_MBOX_FROM = re.compile(rb"^From [0-9a-f]{40} Mon Sep 17 00:00:00 2001$", re.MULTILINE)
_SUBJECT_PREFIX = re.compile(r"^\[PATCH[^\]]*\]\s*")
_TAGGED = re.compile(r"^\[[A-Za-z0-9][^\]]*\] \S")
_INDEX = re.compile(r"^index [0-9a-f]+\.\.[0-9a-f]+(?P<mode> \d+)?$")
_PLACEHOLDER = "1" * 40
SLUG_MAX = 48


@dataclass(frozen=True)
class Incoming:
    """What the input says: mail fields (None when absent), description, trailers, the diff."""

    subject: str | None
    author: str | None
    date: str | None
    description: str
    trailers: tuple[tuple[str, str], ...]
    diff: str  # latin-1 text of the diff bytes


def read_incoming(data: bytes) -> Incoming:
    """Split the input into its mail part and its diff (see the module doc)."""
    crlf = crlf_problem(data)
    if crlf:
        raise PatchFormatError(crlf)
    mails = len(_MBOX_FROM.findall(data))
    if mails > 1:
        raise PatchFormatError(f"the input holds {mails} patches; import them one at a time")
    text = data.decode("latin-1")
    start = _diff_start(text)
    if start is None:
        raise PatchFormatError("the input holds no diff ('diff --git' or '---'/'+++' lines)")
    message, diff = text[:start], _strip_signature(text[start:])
    subject = author = date = None
    body = message
    if mails == 1 and message.startswith("From "):
        head, _, body = message.partition("\n\n")
        fields = email.parser.BytesHeaderParser(policy=email.policy.default).parsebytes(
            head.split("\n", 1)[1].encode("latin-1") + b"\n\n"
        )
        subject = _SUBJECT_PREFIX.sub("", str(fields.get("Subject", ""))).strip() or None
        author = str(fields.get("From", "")).strip() or None
        raw = email.parser.BytesHeaderParser(policy=email.policy.compat32).parsebytes(
            head.split("\n", 1)[1].encode("latin-1") + b"\n\n"
        )
        date = str(raw.get("Date", "")).strip() or None  # verbatim, as git wrote it
    try:
        body = body.encode("latin-1").decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PatchFormatError(f"the description is not UTF-8 ({exc.reason})") from None
    lines = body.split("\n")
    for cut, line in enumerate(lines):
        if line == "---":
            lines = lines[:cut]
            break
    description, trailers = _split_trailers(lines)
    return Incoming(subject, author, date, description.strip(), trailers, diff)


def _diff_start(text: str) -> int | None:
    git = re.search(r"^diff --git ", text, re.MULTILINE)
    if git:
        return git.start()
    plain = re.search(r"^--- .*\n\+\+\+ .*\n", text, re.MULTILINE)
    if plain is None:
        return None
    # what precedes the first file diff belongs to the diff from where git mailinfo would cut
    # (diff's own `diff -ruN a b` / `Index:` lines) or diff(1) notes a change (`Only in ...`)
    at = 0
    for line in text[: plain.start()].splitlines(keepends=True):
        if git_am_patch_break(line.rstrip("\n")) or any(r.match(line) for r, _ in _DIFF_NOTICES):
            return at
        at += len(line)
    return plain.start()


def _strip_signature(diff: str) -> str:
    """Drop format-patch's ``-- `` signature block (``-- \\n<git version>``) at the end. A
    ``-- `` line that the last hunk's line counts still claim (a removed ``- `` line) is diff,
    not a signature."""
    at = diff.rfind("\n-- \n")
    if at >= 0 and diff[at + 5 :].strip().count("\n") <= 1 and not _in_hunk(diff, at + 1):
        return diff[: at + 1]
    return diff


_HUNK_HEAD = re.compile(r"^@@ -\d+(?:,(?P<old>\d+))? \+\d+(?:,(?P<new>\d+))? @@", re.MULTILINE)


def _in_hunk(diff: str, pos: int) -> bool:
    """Whether the line starting at ``pos`` is still part of the hunk before it (by the hunk
    header's line counts)."""
    heads = [m for m in _HUNK_HEAD.finditer(diff, 0, pos)]
    if not heads:
        return False
    head = heads[-1]
    old = int(head.group("old") or 1)
    new = int(head.group("new") or 1)
    at = diff.index("\n", head.end()) + 1
    while at < pos:
        end = diff.find("\n", at)
        kind = diff[at : at + 1]
        if kind == " ":
            old, new = old - 1, new - 1
        elif kind == "-":
            old -= 1
        elif kind == "+":
            new -= 1
        elif kind != "\\":
            return False
        if old <= 0 and new <= 0:
            return False
        at = end + 1 if end >= 0 else len(diff)
    return old > 0


def _blocks(diff: str, base_mode: BaseMode) -> tuple[list[str], list[str]]:
    """The diff as ``diff --git`` blocks with a placeholder full index, and the problems."""
    lines = diff.rstrip("\n").split("\n")
    if lines[0].startswith("diff --git "):
        return _git_blocks(lines), []
    return _plain_blocks(lines, base_mode)


def _git_blocks(lines: list[str]) -> list[str]:
    out: list[str] = []
    in_header = False
    for line in lines:
        if line.startswith("diff --git "):
            in_header = True
        elif line.startswith(("--- ", "@@")):
            in_header = False
        match = _INDEX.match(line) if in_header else None
        if match:
            new_file = out and any(x.startswith("new file mode") for x in _last_block(out))
            gone = out and any(x.startswith("deleted file mode") for x in _last_block(out))
            old = NULL_BLOB if new_file else _PLACEHOLDER
            new = NULL_BLOB if gone else _PLACEHOLDER
            line = f"index {old}..{new}{match.group('mode') or ''}"
        out.append(line)
    return ["\n".join(out) + "\n"]


def _last_block(out: list[str]) -> list[str]:
    for at in range(len(out) - 1, -1, -1):
        if out[at].startswith("diff --git "):
            return out[at:]
    return out


def _plain_blocks(lines: list[str], base_mode: BaseMode) -> tuple[list[str], list[str]]:
    blocks: list[str] = []
    problems: list[str] = []
    at = 0
    while at < len(lines):
        if not (
            lines[at].startswith("--- ")
            and at + 1 < len(lines)
            and lines[at + 1].startswith("+++ ")
        ):
            unsaid = next((why for rule, why in _DIFF_NOTICES if rule.match(lines[at])), None)
            if unsaid:
                shown = lines[at].encode("latin-1").decode("utf-8", "replace")
                problems.append(f"{shown!r}: {unsaid}")
            at += 1
            continue
        try:
            old, new = (
                _side_path(lines[at].split("\t")[0]),
                _side_path(lines[at + 1].split("\t")[0]),
            )
        except ValueError as exc:
            problems.append(str(exc))
            at += 2
            continue
        old, new = _strip_prefix(old, new)
        if _EPOCH.search(lines[at]):  # diff -N: the side that did not exist
            old = "/dev/null"
        if _EPOCH.search(lines[at + 1]):
            new = "/dev/null"
        path = old if new == "/dev/null" else new
        reason = path_problem(path)
        if reason:
            problems.append(reason)
        end = at + 2
        while end < len(lines) and (
            lines[end][:1] in ("@", " ", "+", "-", "\\") or lines[end] == ""
        ):
            if (
                lines[end].startswith("--- ")
                and end + 1 < len(lines)
                and lines[end + 1].startswith("+++ ")
            ):
                break
            end += 1
        hunks = "\n".join(lines[at + 2 : end]).rstrip("\n")
        mode = base_mode(path) or "100644"
        if old == "/dev/null":
            head = [
                f"new file mode 100644\nindex {NULL_BLOB}..{_PLACEHOLDER}",
                "/dev/null",
                f"b/{path}",
            ]
        elif new == "/dev/null":
            head = [
                f"deleted file mode {mode}\nindex {_PLACEHOLDER}..{NULL_BLOB}",
                f"a/{path}",
                "/dev/null",
            ]
        else:
            head = [f"index {_PLACEHOLDER}..{_PLACEHOLDER} {mode}", f"a/{path}", f"b/{path}"]
        head = f"{head[0]}\n--- {head[1]}\n+++ {head[2]}"
        blocks.append(f"diff --git a/{path} b/{path}\n{head}\n{hunks}\n")
        at = end
    if not blocks and not problems:
        problems.append("no file diffs found")
    return blocks, problems


_DIFF_NOTICES = (
    (re.compile(r"^Binary files .* differ$"), "a binary change, which a patch cannot carry"),
    (re.compile(r"^Files .* and .* differ$"), "a change diff -q left out (diff -ruN, not -q)"),
    (re.compile(r"^Only in .*: "), "a file only one side has, left out (diff -ruN adds it)"),
    (re.compile(r"^File .* is a .* while file .* is a "), "a file type change"),
    (re.compile(r"^Common subdirectories: "), "directories diff did not compare (diff -ruN)"),
)
"""diff(1)'s notices of a difference its output does not carry: each one refuses the import
(the diff would be applied as if that change did not exist)."""

_EPOCH = re.compile(r"\t(?:1970-01-01|1969-12-31)[ T]00?:?")
"""The timestamp ``diff -N`` writes for the absent side of an added or deleted file."""


def _strip_prefix(old: str, new: str) -> tuple[str, str]:
    """Drop the leading directory of both sides (like ``patch -p1``) when they name the same
    path below it (``a/x b/x``, ``old/x new/x`` of ``diff -ruN old new``); one side
    ``/dev/null``: drop ``a/``/``b/`` or the directory the other files of the diff share."""
    if old != "/dev/null" and new != "/dev/null":
        o, n = old.split("/", 1), new.split("/", 1)
        if len(o) == 2 and len(n) == 2 and o[1] == n[1] and o[0] != n[0]:
            return o[1], n[1]
        return old, new
    side = new if old == "/dev/null" else old
    if side.startswith(("a/", "b/")):
        side = side[2:]
    return (side, new) if new == "/dev/null" else (old, side)


def _with_full_index(block_text: str, pre: bytes | None, post: bytes | None) -> str:
    old = NULL_BLOB if pre is None else git_blob_id(pre)
    new = NULL_BLOB if post is None else git_blob_id(post)
    return re.sub(
        r"^index [0-9a-f]{40}\.\.[0-9a-f]{40}",
        f"index {old}..{new}",
        block_text,
        count=1,
        flags=re.MULTILINE,
    )


def git_identity(cwd: Path) -> str:
    """``Name <email>`` from git config, for Signed-off-by."""
    values = []
    for key in ("user.name", "user.email"):
        proc = subprocess.run(
            ["git", "config", "--get", key], cwd=cwd, capture_output=True, text=True, check=False
        )
        values.append(proc.stdout.strip())
    if not all(values):
        raise PatchFormatError(
            "git config user.name and user.email are not set; Signed-off-by needs them",
            hint="git config --global user.name 'Name'; git config --global user.email you@host",
        )
    return f"{values[0]} <{values[1]}>"


def _slug(title: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")
    while len(slug) > SLUG_MAX and "-" in slug:
        slug = slug.rsplit("-", 1)[0]
    return slug[:SLUG_MAX] or "patch"


def refuse_bad_name(name: str, target: str, listed: Sequence[str]) -> None:
    """Refuse a new entry's name before anything is staged: the series' own name rules, the
    target, and a number or a name the target's entries already use."""
    reason = name_problem(name)
    if reason:
        raise PatchFormatError(
            f"--name {name!r}: {reason}", hint=f"e.g. --name {target}/0001-short-title.patch"
        )
    match = NAME_RE.match(name)
    assert match is not None  # name_problem passed
    if match.group("target") != target:
        raise PatchFormatError(f"--name {name} is not a {target} patch")
    if name in listed:
        raise PatchFormatError(f"{name} already exists", hint="pass another --name")
    for other in listed:
        found = NAME_RE.match(other)
        if found and found.group("target") == target and found["number"] == match["number"]:
            raise PatchFormatError(
                f"--name {name}: number {match['number']} is already {other}'s",
                hint="pass another number (or leave out --name: the next free one is used)",
            )


def _next_name(series: tuple[Patch, ...], listed: list[str], target: str, subject: str) -> str:
    numbers = [
        int(m.group("number"))
        for n in listed
        if (m := NAME_RE.match(n)) and m.group("target") == target
    ]
    title = subject.split("] ", 1)[1]
    return f"{target}/{max(numbers, default=0) + 1:04d}-{_slug(title)}.patch"


def import_patch(
    repo: Path,
    data: bytes,
    *,
    target: str,
    bases: dict[str, BaseReader],
    base_mode: BaseMode,
    identity: str,
    subject: str | None = None,
    name: str | None = None,
    now: str | None = None,
    log: Callable[[str], None] = lambda _m: None,
) -> tuple[str, bytes]:
    """Normalise ``data`` into a series patch of ``target`` and add it (see the module doc).

    ``bases`` has a reader per target of the series (the lock is recomputed for all of them).
    Returns the new entry's name and bytes. Every refusal happens before anything is written;
    the patch file, ``series`` and ``series.lock`` are written in one journalled commit under
    the checkout's lock (a second import waits and takes the next number).
    """
    with repo_lock(repo):
        return _import_locked(
            repo, data, target, bases, base_mode, identity, subject, name, now, log
        )


def _import_locked(
    repo: Path,
    data: bytes,
    target: str,
    bases: dict[str, BaseReader],
    base_mode: BaseMode,
    identity: str,
    subject: str | None,
    name: str | None,
    now: str | None,
    log: Callable[[str], None],
) -> tuple[str, bytes]:
    base = bases[target]
    incoming = read_incoming(data)
    subject = subject or incoming.subject
    if not subject:
        raise PatchFormatError("the input has no Subject", hint="pass --subject '[Tag] Title'")
    if has_control(subject):
        raise PatchFormatError(
            f"subject {subject!r} holds a control character or a line break: the mail header "
            "would get lines you did not write",
            hint="pass --subject '[Tag] Title' on one line",
        )
    if not _TAGGED.match(subject):
        raise PatchFormatError(
            f"subject {subject!r} is not of the form '[Tag] Title'",
            hint="pass --subject '[Tag] Title'",
        )
    series = load_series(repo)
    listed = [e.name for e in parse_series((repo / "series").read_text(encoding="utf-8"))]
    name = name or _next_name(series, listed, target, subject)
    refuse_bad_name(name, target, listed)
    if (repo / "patches" / name).exists():
        raise PatchFormatError(f"{name} already exists", hint="pass another --name")
    mine = [p for p in series if p.target == target]
    last_mode = {fp.path: fp.mode for p in mine for fp in p.files}

    def mode_now(path: str) -> str | None:
        return last_mode.get(path) or base_mode(path)

    blocks, problems = _blocks(incoming.diff, mode_now)
    if problems:
        raise PatchFormatError(f"{name}: refused: {len(problems)} problem(s)", details=problems)
    files, problems = parse_diff("".join(blocks).encode("latin-1"))
    if problems:
        raise PatchFormatError(f"{name}: refused: {len(problems)} problem(s)", details=problems)
    normalised = []
    for block, fp in zip(_split_git_blocks("".join(blocks)), files, strict=True):
        pre = _series_view(mine, base, fp.path)
        try:
            post = apply_file(pre, fp)
        except PatchDoesNotApply as exc:
            if pre is None and fp.op != "add":
                hint = (
                    f"{fp.path} is not a file of the {target} base (nor added by the series): "
                    "check the diff's paths (import drops one leading directory, like patch "
                    "-p1, only when both sides share the rest: a/x b/x, old/x new/x)"
                )
            else:
                hint = "make the patch against the tree the series produces (patchset apply)"
            raise PatchDoesNotApply(
                f"{name} does not apply to the series so far: {exc.message}; nothing was written",
                hint=hint,
            ) from None
        normalised.append(_with_full_index(block, pre, post))
    header = _header(incoming, subject, identity, now)
    patch_data = serialise_header(header) + "".join(normalised).encode("latin-1")
    patch, problems = parse_patch(name, patch_data)
    if patch is None:
        raise PatchFormatError(f"{name}: refused: {len(problems)} problem(s)", details=problems)
    new_series = (*series, patch)
    computed = compute_lock(new_series, bases, pin_digests(repo))
    for warning in computed.warnings:
        log(f"warning: {warning}")
    series_text = (repo / "series").read_text(encoding="utf-8")
    sep = "" if not series_text or series_text.endswith("\n") else "\n"
    commit_repo(
        repo,
        "import",
        (name,),
        {
            f"patches/{name}": patch_data,
            "series": (series_text + sep + name + "\n").encode("utf-8"),
            LOCK_FILE: lock_to_json(computed.lock).encode("utf-8"),
        },
    )
    return name, patch_data


def _split_git_blocks(text: str) -> list[str]:
    parts = re.split(r"(?m)^(?=diff --git )", text)
    return [p for p in parts if p]


def _series_view(patches: list[Patch], base: BaseReader, path: str) -> bytes | None:
    data = base(path)
    for patch in patches:
        for fp in patch.files:
            if fp.path == path:
                data = apply_file(data, fp)
    return data


def _header(incoming: Incoming, subject: str, identity: str, now: str | None) -> PatchHeader:
    trailers = list(incoming.trailers)
    signed = [t for t in trailers if t[0].lower() == "signed-off-by"]
    others = [t for t in trailers if t[0].lower() != "signed-off-by"]
    if not any(k.lower() == "upstream-status" for k, _ in others):
        others.append(("Upstream-Status", "Pending"))
    if ("Signed-off-by", identity) not in signed:
        signed.append(("Signed-off-by", identity))
    return PatchHeader(
        commit="0" * 40,
        author=incoming.author or identity,
        date=incoming.date or now or email.utils.formatdate(localtime=False),
        subject=subject,
        description=incoming.description,
        trailers=tuple(others + signed),
    )
