# SPDX-License-Identifier: Apache-2.0
"""Run a probe in the test venv (vLLM, torch, Transformers: ``$PATCHSET_TEST_VENV`` or
``build/testenv``), with evidence/ importable, and read the JSON it prints last. The evidence
tests whose checks need the patched vLLM or torch use it and skip without the venv."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[3]
VENV = Path(os.environ.get("PATCHSET_TEST_VENV", REPO / "build" / "testenv"))
PYTHON = VENV / "bin" / "python"

needs_venv = pytest.mark.skipif(not PYTHON.exists(), reason=f"no test venv at {VENV}")
"""Skips a test when there is no test venv."""


def run_probe(
    code: str, *, timeout: int, cwd: Path | None = None, env: dict[str, str] | None = None
) -> Any:
    """Run ``code`` with the test venv's Python (from ``cwd``, default evidence/; ``env`` added
    to this process's environment, evidence/ on ``PYTHONPATH``); fail the calling test with
    the probe's stderr unless it exits 0; the JSON of its last stdout line."""
    proc = subprocess.run(
        [str(PYTHON), "-c", code],
        cwd=cwd or REPO / "evidence",
        env={**os.environ, **(env or {}), "PYTHONPATH": str(REPO / "evidence")},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])
