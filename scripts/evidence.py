# SPDX-License-Identifier: Apache-2.0
"""What every evidence script records about where its figures come from."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def git_revision(path: Path = REPO) -> str | None:
    """The commit checked out at ``path`` (default: this repository), or None.

    For this repository ``$DCP_GIT_REV`` wins when set: the GPU machine receives a copy of the
    working tree without ``.git``, so the launching session names the commit there.
    """
    if Path(path).resolve() == REPO and os.environ.get("DCP_GIT_REV"):
        return os.environ["DCP_GIT_REV"]
    try:
        out = subprocess.run(
            ["git", "-C", str(path), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return None
    return out.stdout.strip()
