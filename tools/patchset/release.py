"""Which release a source tree says it is, checked against the pinned one before any write.

A tree's own word for its version comes from, in order: ``PKG-INFO`` (an unpacked sdist), the
package's generated ``<target>/_version.py`` (an sdist or an installed build), or an exact
``v<version>`` tag at the HEAD of a git checkout. A tree that names none is judged by its
files alone (the preimage hashes of ``series.lock``).
"""

from __future__ import annotations

import re
from pathlib import Path

from . import gittree

_PKG_INFO = re.compile(r"^Version:\s*(\S+)\s*$", re.MULTILINE)
_VERSION_PY = re.compile(r"^__version__\s*=\s*(?:version\s*=\s*)?['\"]([^'\"]+)['\"]", re.MULTILINE)


def pinned_release(requirement: str) -> str | None:
    """``vllm==0.33.0`` -> ``0.33.0``; None for a requirement that is not an exact pin."""
    name, sep, version = requirement.partition("==")
    return version.strip() if sep and name.strip() and version.strip() else None


def public(version: str) -> str:
    """The release segment of a version: ``0.33.0+cu130`` and ``0.33.0.dev0`` -> ``0.33.0``
    (a source tree's generated ``_version.py`` may carry a dev label for the release itself)."""
    match = re.match(r"\d+(?:\.\d+)*", version.removeprefix("v"))
    return match.group(0) if match else version


def tree_release(root: Path, target: str) -> tuple[str, str] | None:
    """(version, where it was read) for the tree at ``root``, or None if it names none."""
    for rel, pattern in (("PKG-INFO", _PKG_INFO), (f"{target}/_version.py", _VERSION_PY)):
        path = root / rel
        if path.is_file() and not path.is_symlink():
            match = pattern.search(path.read_text(encoding="utf-8", errors="replace"))
            if match:
                return match.group(1), rel
    tag = gittree.exact_tag(root)
    if tag and re.fullmatch(r"v?\d+(\.\d+)*\S*", tag):
        return tag.removeprefix("v"), f"git tag {tag}"
    return None


def release_problem(root: Path, target: str, requirement: str) -> str | None:
    """Why the tree is not the pinned release (naming both), or None when it may be."""
    pinned = pinned_release(requirement)
    found = tree_release(root, target)
    if pinned is None or found is None:
        return None
    version, where = found
    if public(version) == public(pinned):
        return None
    return f"{root} is {target} {version} ({where}); the series is pinned to {target} {pinned}"
