"""End to end: the overlay wheel, pip-installed into a fresh venv, is what ``import vllm`` loads.

The venv is made once per ``make test`` run by ``tests/vllm_tree_tests.py venv`` (a fresh
``python -m venv`` + ``pip install dist/<overlay wheel>`` + the pinned b12x wheel, torch 2.14
from the index). It is ``$PATCHSET_TEST_VENV`` or ``build/testenv``. Without it these tests
skip with that reason, except under ``PATCHSET_E2E=require`` (set by ``make test``), where a
missing venv fails.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from patchset.hashing import sha256_file
from patchset.pins import load_pins

REPO = Path(__file__).resolve().parent.parent
MARKER = "dcp-wheel.json"
TREE = Path(os.environ.get("PATCHSET_TEST_TREE", REPO / "build" / "vllm")).resolve()
"""The patched tree the wheel was built from (``make test`` passes ``$(VLLM)``)."""

pytestmark = pytest.mark.slow

PROBE = r"""
import importlib.metadata, importlib.util, json, sys, sysconfig
import vllm
paths = json.loads(sys.argv[1])
origins = {}
for path in paths:
    name = path.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
    spec = importlib.util.find_spec(name)
    origins[path] = spec.origin if spec else None
print(json.dumps({
    "vllm_file": vllm.__file__,
    "purelib": sysconfig.get_paths()["purelib"],
    "platlib": sysconfig.get_paths()["platlib"],
    "version": importlib.metadata.version("vllm"),
    "b12x_version": importlib.metadata.version("b12x"),
    "b12x_found": importlib.util.find_spec("b12x") is not None,
    "origins": origins,
    "sys_path": sys.path,
}))
"""


def _need(reason: str) -> None:
    if os.environ.get("PATCHSET_E2E") == "require":
        pytest.fail(f"{reason} (PATCHSET_E2E=require: end-to-end tests may not skip)")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def testenv() -> Path:
    venv = Path(os.environ.get("PATCHSET_TEST_VENV", REPO / "build" / "testenv"))
    if not (venv / MARKER).is_file():
        _need(f"no test venv with the overlay wheel at {venv}: run `make test`")
    return venv


@pytest.fixture(scope="module")
def receipt(testenv: Path) -> dict[str, Any]:
    marker = json.loads((testenv / MARKER).read_text())
    path = REPO / "dist" / "receipt.json"
    if not path.is_file():
        _need(f"no {path}: run `make wheel`")
    data: dict[str, Any] = json.loads(path.read_text())
    assert data["wheel"]["sha256"] == marker["sha256"], (
        f"{testenv} has {marker['filename']} installed but dist/ holds "
        f"{data['wheel']['filename']}: run `make test` to reinstall"
    )
    return data


@pytest.fixture(scope="module")
def probe(testenv: Path, receipt: dict[str, Any]) -> dict[str, Any]:
    py_files = [
        f["path"]
        for f in receipt["overlay"]
        if f["sha256"] is not None and f["path"].endswith(".py")
    ]
    proc = subprocess.run(
        [str(testenv / "bin" / "python"), "-c", PROBE, json.dumps(py_files)],
        cwd=REPO / "build",  # not the repo root, and never the tree's source directory
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def test_import_vllm_loads_the_installed_wheel(testenv: Path, probe: dict[str, Any]) -> None:
    """`import vllm` in the test venv resolves to its site-packages, not to any source tree."""
    vllm_file = Path(probe["vllm_file"]).resolve()
    site = Path(probe["platlib"]).resolve()
    assert vllm_file == site / "vllm" / "__init__.py"
    assert site.is_relative_to(testenv.resolve()) and "site-packages" in site.parts
    assert not vllm_file.is_relative_to(TREE)


def test_installed_version_carries_the_series_label(
    probe: dict[str, Any], receipt: dict[str, Any]
) -> None:
    """The installed distribution's version is the overlay wheel's <pinned>+dcp.<digest>."""
    pinned = load_pins(REPO / "pins.toml").get("vllm", "wheel").requirement.split("==")[1]
    assert probe["version"] == receipt["wheel"]["version"]
    assert probe["version"] == f"{pinned}+dcp.{receipt['series']['digest'][:12]}"


def test_pinned_b12x_is_installed_next_to_the_overlay_wheel(probe: dict[str, Any]) -> None:
    """pip resolved the overlay wheel together with the pinned b12x (vLLM's `b12x` extra)."""
    pinned = load_pins(REPO / "pins.toml").get("b12x", "wheel").requirement.split("==")[1]
    assert probe["b12x_version"] == pinned
    assert probe["b12x_found"]


def test_installed_files_are_the_overlaid_ones(
    probe: dict[str, Any], receipt: dict[str, Any]
) -> None:
    """Every overlaid file in site-packages has the receipt's sha256, which is also the patched
    tree's; every file the series deletes is absent."""
    assert receipt["overlay"], "the series overlays no file: nothing proves the patch is installed"
    site = Path(probe["platlib"])
    for entry in receipt["overlay"]:
        installed = site / entry["path"]
        if entry["sha256"] is None:
            assert not installed.exists(), entry["path"]
            continue
        assert sha256_file(installed) == entry["sha256"], entry["path"]
        assert sha256_file(TREE / entry["path"]) == entry["sha256"], entry["path"]


def test_import_system_finds_the_patched_modules(
    probe: dict[str, Any], receipt: dict[str, Any]
) -> None:
    """Each overlaid Python module is found by the import system at its site-packages copy."""
    site = Path(probe["platlib"]).resolve()
    assert probe["origins"], "no overlaid Python module to import"
    for path, origin in probe["origins"].items():
        assert origin is not None, f"{path}: not importable"
        assert Path(origin).resolve() == site / path
