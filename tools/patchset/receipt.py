"""``dist/receipt.json``: what an overlay wheel was built from (pins, patches, overlaid files),
in canonical JSON beside the wheel; the wheel's own file list is its ``record``.

Canonical: keys sorted, two-space indent, ASCII only, one trailing newline, no timestamps, so
the same inputs give the same bytes. ``schema_version`` changes whenever a field's meaning does.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from . import __version__
from .model import BuiltWheel, Patch
from .pins import Pin

SCHEMA_VERSION = 1


def make_receipt(
    built: BuiltWheel,
    *,
    sdist_pin: Pin,
    wheel_pin: Pin,
    patches: tuple[Patch, ...] | list[Patch],
    series_digest: str,
) -> dict[str, Any]:
    """The receipt of ``built`` as plain data."""
    return {
        "schema_version": SCHEMA_VERSION,
        "tool": {"name": "patchset", "version": __version__},
        "base": {
            "sdist": {"filename": sdist_pin.filename, "sha256": sdist_pin.sha256},
            "wheel": {"filename": wheel_pin.filename, "sha256": wheel_pin.sha256},
            "version": built.base_version,
        },
        "series": {
            "digest": series_digest,
            "patches": [{"name": p.name, "sha256": p.sha256} for p in patches],
        },
        "wheel": {
            "filename": built.path.name,
            "sha256": built.sha256,
            "version": built.version,
        },
        "overlay": [
            {"path": f.path, "op": f.op, "sha256": f.sha256, "patches": list(f.patches)}
            for f in built.overlay.files
        ],
        "not_carried": list(built.overlay.not_carried),
    }


def dumps(receipt: dict[str, Any]) -> bytes:
    """Canonical JSON bytes of ``receipt``."""
    return (json.dumps(receipt, sort_keys=True, indent=2, ensure_ascii=True) + "\n").encode()


def write_receipt(receipt: dict[str, Any], path: Path) -> None:
    """Write ``receipt`` to ``path`` atomically (temporary file, then rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".receipt-")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(dumps(receipt))
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_receipt(path: Path) -> dict[str, Any]:
    """Load a receipt written by :func:`write_receipt`."""
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data
