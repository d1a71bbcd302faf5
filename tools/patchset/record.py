"""A wheel's ``RECORD``, the list of its members with hashes inside the wheel: the model, parsing
and writing (reading the zip is ``wheel``'s job; ``receipt`` is our JSON beside the wheel).

RECORD is CSV (PEP 376 / the binary distribution format spec): ``path,hash,size`` per member,
``hash`` being ``sha256=<urlsafe base64 without padding>``; RECORD's own row has empty hash
and size. Parsing collects every problem and raises one :class:`~patchset.errors.WheelError`.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .errors import WheelError
from .hashing import record_digest

_DIGEST = re.compile(r"sha256=[A-Za-z0-9_-]{43}")


@dataclass(frozen=True)
class RecordEntry:
    """One RECORD row; ``digest`` and ``size`` are None only for RECORD (and signatures)."""

    path: str
    digest: str | None
    size: int | None

    @classmethod
    def of(cls, path: str, data: bytes) -> RecordEntry:
        """The row for a member ``path`` holding ``data``."""
        return cls(path, record_digest(data), len(data))


def parse_record(data: bytes, *, where: str = "RECORD") -> list[RecordEntry]:
    """Parse RECORD bytes; raise one WheelError naming every malformed or duplicate row."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise WheelError(f"{where}: not UTF-8 ({exc})") from None
    entries: list[RecordEntry] = []
    problems: list[str] = []
    seen: set[str] = set()
    for lineno, row in enumerate(csv.reader(io.StringIO(text, newline="")), start=1):
        if not row:
            continue
        if len(row) != 3:
            problems.append(f"{where}:{lineno}: expected 3 fields, found {len(row)}")
            continue
        path, digest, size = row
        if not path:
            problems.append(f"{where}:{lineno}: empty path")
            continue
        if path in seen:
            problems.append(f"{where}:{lineno}: {path}: listed twice")
        seen.add(path)
        if digest == "" and size == "":
            entries.append(RecordEntry(path, None, None))
            continue
        if not _DIGEST.fullmatch(digest):
            problems.append(f"{where}:{lineno}: {path}: hash {digest!r} is not sha256=<base64>")
        if not size.isdigit():
            problems.append(f"{where}:{lineno}: {path}: size {size!r} is not a number")
            continue
        entries.append(RecordEntry(path, digest, int(size)))
    if problems:
        raise WheelError(f"{where}: {len(problems)} malformed row(s)", details=problems)
    return entries


def write_record(entries: Iterable[RecordEntry], record_path: str) -> bytes:
    """RECORD bytes for ``entries`` in the given order, then RECORD's own row (``\\n`` endings)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    for entry in entries:
        if entry.path == record_path:
            continue
        digest = "" if entry.digest is None else entry.digest
        size = "" if entry.size is None else str(entry.size)
        writer.writerow([entry.path, digest, size])
    writer.writerow([record_path, "", ""])
    return out.getvalue().encode("utf-8")


def check_member(entry: RecordEntry | None, path: str, digest: str, size: int) -> str | None:
    """Why member ``path`` (with ``digest``, ``size``) disagrees with its row, or None."""
    if entry is None:
        return f"{path}: not listed in RECORD"
    if entry.digest is None:
        return f"{path}: RECORD lists it without a hash"
    if entry.digest != digest or entry.size != size:
        return (
            f"{path}: RECORD says {entry.digest} ({entry.size} bytes), "
            f"member is {digest} ({size} bytes)"
        )
    return None


def index(entries: Sequence[RecordEntry]) -> dict[str, RecordEntry]:
    """Rows by path."""
    return {entry.path: entry for entry in entries}
