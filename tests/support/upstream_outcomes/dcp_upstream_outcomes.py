"""pytest plugin (``-p dcp_upstream_outcomes``): stream every test's outcome to a JSON-lines file.

Used by tests/upstream_tests.py on both sides (official wheel, overlay wheel). Active only when
``DCP_UPSTREAM_OUTCOMES`` names the output file. One line per event, flushed at once, so a run
that dies still leaves everything up to the test that killed it:

    {"event": "start", "id": ...}                            a test began
    {"event": "report", "id", "when", "outcome", "reason", "duration"}   setup/call/teardown
    {"event": "collect", "id", "outcome", "reason"}          a file that failed or skipped
    {"event": "finished", "exitstatus": N}                   the session ended

``DCP_UPSTREAM_DONE`` may name a file of test ids (one a line) to deselect: those already
recorded by an earlier, interrupted process of the same run. ``DCP_UPSTREAM_ONLY`` may name a
file of test ids to keep: every other collected test is deselected (the patched side runs only
what passed on stock, the only tests that can regress).
"""

from __future__ import annotations

import json
import os

import pytest

_REASON_CHARS = 600


def _out():
    path = os.environ.get("DCP_UPSTREAM_OUTCOMES")
    return path or None


def _write(record: dict) -> None:
    path = _out()
    if path is None:
        return
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(record, sort_keys=True) + "\n")
        fh.flush()


def _reason(report) -> str:
    longrepr = report.longrepr
    if longrepr is None:
        return ""
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2])
    crash = getattr(longrepr, "reprcrash", None)
    if crash is not None and getattr(crash, "message", None):
        return str(crash.message)
    text = [line for line in str(longrepr).strip().splitlines() if line.strip()]
    errors = [line[1:].strip() for line in text if line.startswith("E ")]
    if errors:
        return errors[-1]
    return text[-1].strip() if text else ""


def _ids(variable: str) -> set[str] | None:
    path = os.environ.get(variable)
    if not path or not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as fh:
        return {line.rstrip("\n") for line in fh if line.strip()}


def pytest_collection_modifyitems(config, items):
    done = _ids("DCP_UPSTREAM_DONE") or set()
    only = _ids("DCP_UPSTREAM_ONLY")
    keep, dropped = [], []
    for item in items:
        wanted = item.nodeid not in done and (only is None or item.nodeid in only)
        (keep if wanted else dropped).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep


def pytest_collectreport(report):
    if report.outcome == "passed":
        return
    _write(
        {
            "event": "collect",
            "id": report.nodeid,
            "outcome": report.outcome,
            "reason": _reason(report)[:_REASON_CHARS],
        }
    )


def pytest_runtest_logstart(nodeid, location):
    _write({"event": "start", "id": nodeid})


def pytest_runtest_logreport(report):
    outcome = report.outcome
    if hasattr(report, "wasxfail"):
        outcome = "xfailed" if report.skipped else "xpassed"
    _write(
        {
            "event": "report",
            "id": report.nodeid,
            "when": report.when,
            "outcome": outcome,
            "reason": _reason(report)[:_REASON_CHARS] if outcome != "passed" else "",
            "duration": round(report.duration, 3),
        }
    )


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus):
    _write({"event": "finished", "exitstatus": int(exitstatus)})
