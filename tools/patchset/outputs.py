"""Where the tool writes what it makes (exports, records, wheels): never into the series, never
through a link someone planted, and whole or not at all.

* :func:`refuse_inside_series`: an output path that resolves to or under the checkout's
  ``patches/`` is refused before anything is written (a stray file there makes every command
  refuse the series).
* :func:`write_file_atomic`: one file through a temporary sibling made with ``O_EXCL`` under a
  random name (a planted symlink at a fixed name is never followed), renamed over the target.
* :func:`replace_dir`: a directory the tool owns wholly (``dist/export``), built in a fresh
  hidden sibling and swapped in by renames, so a reader sees the old run's files or the new
  run's, never a mix; a killed run's leftovers are removed by the next one.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path

from patchset.errors import PatchsetError


def refuse_inside_series(root: Path, dest: Path, option: str) -> None:
    """Refuse an output path inside the checkout's ``patches/`` (every file there must be a
    listed patch: anything else makes every command refuse the series)."""
    patches = (root / "patches").resolve()
    where = dest.resolve()
    if where == patches or patches in where.parents:
        raise PatchsetError(
            f"{option} {dest} is inside {patches}: files there that are not listed patches make "
            "every command refuse the series; nothing was written",
            hint=f"choose a path outside patches/ with {option} (e.g. under build/ or dist/)",
        )


def write_file_atomic(path: Path, data: bytes) -> None:
    """``path`` holds ``data`` whole or keeps what it held: written to a new temporary sibling
    (``O_EXCL``, a random name), then renamed over ``path``."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def replace_dir(dest: Path, files: Mapping[str, bytes]) -> None:
    """Make ``dest`` a directory holding exactly ``files`` (relative path -> bytes).

    The files are written into a fresh hidden sibling (each with ``O_EXCL``), which then takes
    ``dest``'s place by renames; the old ``dest`` is removed after. ``dest`` must not be a
    symlink. Siblings left by a killed run are removed first.
    """
    if dest.is_symlink():
        raise PatchsetError(f"{dest} is a symlink: the output directory must be a real one")
    dest.parent.mkdir(parents=True, exist_ok=True)
    for stale in dest.parent.glob(f".{dest.name}.staging-*"):
        shutil.rmtree(stale, ignore_errors=True)
    for stale in dest.parent.glob(f".{dest.name}.old-*"):
        shutil.rmtree(stale, ignore_errors=True)
    for rel in files:
        if rel.startswith("/") or ".." in rel.split("/"):
            raise PatchsetError(f"output path {rel!r} leaves {dest}")
    staged = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}.staging-"))
    old: Path | None = None
    try:
        for rel, data in sorted(files.items()):
            path = staged / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "xb") as fh:
                fh.write(data)
        if dest.exists():
            old = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}.old-"))
            os.rename(dest, old / "dir")
        os.rename(staged, dest)
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
