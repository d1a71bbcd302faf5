"""pytest plugin: report upstream tests that need the Hugging Face hub as skipped, with reason.

Active only when ``DCP_HUB_UNREACHABLE=1`` (tests/vllm_tree_tests.py sets it, together with
``HF_HUB_OFFLINE=1``, after a TCP probe of huggingface.co fails). A test whose failure is one of
the hub's own "not available offline" errors (a model id such as ``facebook/opt-125m`` that is
neither cached nor a local directory) is then reported as SKIPPED with the reason and the
error's line that names it, so the summary counts it and ``-rs`` prints it; every other
failure stays a failure. Without the variable the plugin does nothing.
"""

from __future__ import annotations

import os

import pytest

HUB_OFFLINE_MARKERS = (
    "Invalid repository ID or local directory specified",
    "LocalEntryNotFoundError",
    "OfflineModeIsEnabled",
    "outgoing traffic has been disabled",
    "Cannot find an appropriate cached snapshot folder",
)


def _is_hub_offline_error(text: str) -> bool:
    return any(marker in text for marker in HUB_OFFLINE_MARKERS)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    if os.environ.get("DCP_HUB_UNREACHABLE") != "1":
        return
    report = outcome.get_result()
    if not report.failed or call.excinfo is None:
        return
    text = str(call.excinfo.value)
    if not _is_hub_offline_error(f"{call.excinfo.typename}: {text}"):
        return
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    first = next((line for line in lines if _is_hub_offline_error(line)), call.excinfo.typename)
    report.outcome = "skipped"
    report.longrepr = (
        str(item.path),
        item.location[1] or 0,
        f"Skipped: needs huggingface.co, unreachable here (HF_HUB_OFFLINE=1): {first.strip()}",
    )
