"""Test-only fault injection at every write point of the journal (``journal.write_point``).

``PATCHSET_TEST_CRASH="<n>:<action>[,<n>:<action>...]"`` makes the n-th write point of one
``patchset`` invocation (counting from 1) send the process SIGKILL/SIGTERM/SIGHUP
(``KILL``/``TERM``/``HUP``) or raise ENOSPC (``ENOSPC``). Unset, :func:`reached` does nothing.

The shipped tool knows nothing of this: :func:`main` installs the injector into
``patchset.journal`` and runs ``patchset.cli.main``. ``conftest.Workspace.cli`` calls it in the
test process; ``python tests/crashpoints.py ARGS`` (:data:`SCRIPT`) is ``patchset ARGS`` with the
injector, for runs that must really die.
"""

from __future__ import annotations

import errno
import os
import signal
import sys
from collections.abc import Sequence

from patchset import cli, journal

ENV = "PATCHSET_TEST_CRASH"
SCRIPT = os.path.abspath(__file__)
"""Run with ``sys.executable`` (and the tool on ``PYTHONPATH``) in place of ``-m patchset``."""
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


def _write_point(label: str) -> None:
    reached(label)  # looked up at each call: a test may replace ``reached``


def main(argv: Sequence[str] | None = None) -> int:
    """``patchset.cli.main`` with the injector installed and its count reset; the journal's
    own write point is back in place when it returns or raises."""
    shipped = journal.write_point
    journal.write_point = _write_point
    reset()
    try:
        return cli.main(argv)
    finally:
        journal.write_point = shipped


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
