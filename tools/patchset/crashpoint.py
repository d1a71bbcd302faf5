"""A test-only fault injector at every write point of the journal.

``PATCHSET_TEST_CRASH="<n>:<action>[,<n>:<action>...]"`` makes the n-th write point of the
process (counting from 1) send itself SIGKILL/SIGTERM/SIGHUP (``KILL``/``TERM``/``HUP``) or
raise ENOSPC (``ENOSPC``). Unset, :func:`reached` only counts. Nothing but the tests sets it.
"""

from __future__ import annotations

import errno
import os
import signal

ENV = "PATCHSET_TEST_CRASH"
_SIGNALS = {"KILL": signal.SIGKILL, "TERM": signal.SIGTERM, "HUP": signal.SIGHUP}
_count = 0


def reset() -> None:
    """Start counting again (one CLI invocation = one count)."""
    global _count
    _count = 0


def reached(label: str) -> None:
    """Count one write point; crash here when the test spec says so."""
    global _count
    spec = os.environ.get(ENV)
    if not spec:
        return
    _count += 1
    for item in spec.split(","):
        number, _, action = item.partition(":")
        if int(number) != _count:
            continue
        if action == "ENOSPC":
            raise OSError(errno.ENOSPC, f"No space left on device (injected at {label})")
        os.kill(os.getpid(), _SIGNALS[action])
