"""The release rules, pure: which version a requirement pins, and a version's release segment.

``tree.release_problem`` reads what a tree says it is and compares it with the pin by these
rules before any write.
"""

from __future__ import annotations

import re


def pinned_release(requirement: str) -> str | None:
    """``vllm==0.33.0`` -> ``0.33.0``; None for a requirement that is not an exact pin."""
    name, sep, version = requirement.partition("==")
    return version.strip() if sep and name.strip() and version.strip() else None


def public(version: str) -> str:
    """The release segment of a version: ``0.33.0+cu130`` and ``0.33.0.dev0`` -> ``0.33.0``
    (a source tree's generated ``_version.py`` may carry a dev label for the release itself)."""
    match = re.match(r"\d+(?:\.\d+)*", version.removeprefix("v"))
    return match.group(0) if match else version
