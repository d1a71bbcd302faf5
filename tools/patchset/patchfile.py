"""A patch file: split it into header and diff, parse and serialise the header.

The header is what ``git format-patch --full-index --no-signature --zero-commit -N --no-stat``
writes before the first ``diff --git`` line: an mbox ``From <40 hex> Mon Sep 17 00:00:00 2001``
line, ``From:``/``Date:``/``Subject:`` fields (the subject may be folded), a blank line, the
description, and a final paragraph of trailers (``Upstream-Status:``, ``Depends-on:``,
``Signed-off-by:``). An optional ``---`` line (and diffstat) may end the header.
"""

from __future__ import annotations

import re

from patchset.errors import PatchFormatError
from patchset.model import UPSTREAM_STATUSES, PatchHeader

MBOX_DATE = "Mon Sep 17 00:00:00 2001"
_FROM_LINE = re.compile(r"^From ([0-9a-f]{40}) " + re.escape(MBOX_DATE) + r"$")
_TRAILER = re.compile(r"^([A-Za-z][A-Za-z0-9-]*): (\S.*)$")
_STATUS = re.compile(r"^(?P<kind>[A-Za-z]+)(?: \[(?P<arg>[^\]]+)\])?$")
_DIFF_START = b"diff --git "


def split_patch(data: bytes) -> tuple[bytes, bytes]:
    """Split a patch file into (header bytes, diff bytes) at the first ``diff --git`` line."""
    if data.startswith(_DIFF_START):
        return b"", data
    at = data.find(b"\n" + _DIFF_START)
    if at < 0:
        return data, b""
    return data[: at + 1], data[at + 1 :]


def parse_header(text: bytes) -> PatchHeader:
    """Parse the header bytes of a patch file; raises PatchFormatError naming the first problem."""
    try:
        decoded = text.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PatchFormatError(f"header is not UTF-8 ({exc.reason} at byte {exc.start})") from exc
    lines = decoded.split("\n")
    if not lines or not _FROM_LINE.match(lines[0]):
        raise PatchFormatError(
            f"first line is not 'From <40 hex> {MBOX_DATE}' (not a git format-patch file)"
        )
    fields: dict[str, str] = {}
    last: str | None = None
    index = 1
    while index < len(lines) and lines[index] != "":
        line = lines[index]
        if line[:1] in (" ", "\t") and last is not None:
            fields[last] += " " + line.strip()
        else:
            key, sep, value = line.partition(":")
            if not sep:
                raise PatchFormatError(f"malformed mail header line {index + 1}: {line!r}")
            last = key.strip().lower()
            fields[last] = value.strip()
        index += 1
    for key in ("from", "date", "subject"):
        if not fields.get(key):
            raise PatchFormatError(f"mail header has no {key.capitalize()}: field")
    body = lines[index + 1 :]
    for cut, line in enumerate(body):
        if line == "---":
            body = body[:cut]
            break
    description, trailers = _split_trailers(body)
    return PatchHeader(
        commit=_FROM_LINE.match(lines[0]).group(1),  # type: ignore[union-attr]
        author=fields["from"],
        date=fields["date"],
        subject=fields["subject"],
        description=description,
        trailers=trailers,
    )


def _split_trailers(body: list[str]) -> tuple[str, tuple[tuple[str, str], ...]]:
    while body and body[-1].strip() == "":
        body = body[:-1]
    while body and body[0].strip() == "":
        body = body[1:]
    start = len(body)
    while start > 0 and body[start - 1] != "":
        start -= 1
    paragraph = body[start:]
    matches = [_TRAILER.match(line) for line in paragraph]
    if not paragraph or not all(matches):
        return "\n".join(body), ()
    trailers = tuple((m.group(1), m.group(2)) for m in matches if m)
    rest = body[:start]
    while rest and rest[-1].strip() == "":
        rest = rest[:-1]
    return "\n".join(rest), trailers


def serialise_header(header: PatchHeader) -> bytes:
    """The canonical header bytes for ``header`` (subject unfolded), ending in a blank line."""
    out = [
        f"From {header.commit} {MBOX_DATE}",
        f"From: {header.author}",
        f"Date: {header.date}",
        f"Subject: {header.subject}",
        "",
    ]
    if header.description:
        out += [header.description, ""]
    out += [f"{key}: {value}" for key, value in header.trailers]
    return ("\n".join(out) + "\n\n").encode("utf-8")


def header_problems(header: PatchHeader) -> list[str]:
    """Every reason the series refuses this header (empty when it is acceptable)."""
    problems: list[str] = []
    statuses = header.trailer_values("Upstream-Status")
    if not statuses:
        problems.append(
            "header has no 'Upstream-Status:' trailer "
            "(Pending | Submitted [url] | Backport [url] | Inappropriate [reason])"
        )
    elif len(statuses) > 1:
        problems.append(f"header has {len(statuses)} 'Upstream-Status:' trailers (want one)")
    else:
        reason = upstream_status_problem(statuses[0])
        if reason:
            problems.append(reason)
    if not header.trailer_values("Signed-off-by"):
        problems.append("header has no 'Signed-off-by:' trailer")
    if has_control(header.subject):
        problems.append(f"subject {header.subject!r} holds a control character (one line only)")
    for number, line in enumerate(header.description.split("\n"), start=1):
        if git_am_patch_break(line):
            problems.append(
                f"description line {number} {line!r}: git am would take it for the start of "
                "the diff and drop the rest of the message (indent it)"
            )
        elif git_mailsplit_from_line(line):
            problems.append(
                f"description line {number} {line!r}: git am would take it for the start of "
                "another mail (indent it)"
            )
    return problems


def has_control(text: str) -> bool:
    """Whether ``text`` holds a control character or a line break of any kind (a mail header
    field written from it would become several lines)."""
    return any(ord(c) < 0x20 or ord(c) == 0x7F or c in "\x85\u2028\u2029" for c in text)


def git_am_patch_break(line: str) -> bool:
    """Whether ``git mailinfo`` ends the commit message at ``line`` (its ``patchbreak``):
    ``diff -``, ``Index: ``, ``--- <name>``, or ``---`` followed only by whitespace."""
    if line.startswith(("diff -", "Index: ")):
        return True
    if not line.startswith("---"):
        return False
    rest = line[3:]
    if rest[:1] == " " and rest[1:2] and not rest[1:2].isspace():
        return True
    return rest.strip() == ""


def git_mailsplit_from_line(line: str) -> bool:
    """Whether ``git mailsplit`` starts a new mail at ``line`` (its ``is_from_line``): ``From ``,
    at least 20 characters, and a ``hh:mm:ss year`` (year > 90) around its last colon."""
    if len(line) + 1 < 20 or not line.startswith("From "):
        return False
    colon = line.rfind(":", 5, len(line) - 1)  # git searches back from the second-last char
    if colon < 5 or colon + 2 >= len(line):
        return False
    digits = (line[colon - 4], line[colon - 2], line[colon - 1], line[colon + 1], line[colon + 2])
    if not all(d.isdigit() and d.isascii() for d in digits):
        return False
    year = re.match(r"\s*([+-]?\d+)", line[colon + 3 :])
    return bool(year) and int(year.group(1)) > 90  # type: ignore[union-attr]


def upstream_status_problem(value: str) -> str | None:
    """Why ``value`` is not a valid Upstream-Status, or None when it is."""
    match = _STATUS.match(value)
    valid = "Pending | Submitted [url] | Backport [url] | Inappropriate [reason]"
    if not match or match.group("kind") not in UPSTREAM_STATUSES:
        return f"Upstream-Status {value!r} is not one of {valid}"
    kind, arg = match.group("kind"), match.group("arg")
    if kind == "Pending" and arg:
        return f"Upstream-Status {value!r}: Pending takes no argument"
    if kind == "Inappropriate" and not arg:
        return f"Upstream-Status {value!r}: Inappropriate needs a [reason]"
    return None
