"""Digests in one place: sha256 hex for locks and pins, RECORD digests for wheels, git blob ids."""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path

_CHUNK = 1 << 20


def sha256_bytes(data: bytes) -> str:
    """sha256 of ``data`` as lowercase hex."""
    return hashlib.sha256(data).hexdigest()


def sha256_of(data: bytes | None) -> str | None:
    """:func:`sha256_bytes` of a file's bytes, None for an absent file (``data`` None)."""
    return None if data is None else sha256_bytes(data)


def short_sha(digest: str | None) -> str:
    """A digest as messages show it: its first 12 hex digits, or ``absent``."""
    return digest[:12] if digest else "absent"


def sha256_file(path: Path) -> str:
    """sha256 of a file's bytes as lowercase hex, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def record_digest(data: bytes) -> str:
    """A wheel RECORD hash field: ``sha256=<urlsafe base64, no padding>``."""
    raw = hashlib.sha256(data).digest()
    return "sha256=" + base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def git_blob_id(data: bytes) -> str:
    """The git blob object id (sha1) of ``data``, as in a patch's ``index`` line."""
    header = b"blob %d\0" % len(data)
    return hashlib.sha1(header + data).hexdigest()
