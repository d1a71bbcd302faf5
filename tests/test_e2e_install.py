"""End to end: the overlay wheel, pip-installed into a fresh venv, is what ``import vllm`` loads.

The venv is made once per ``make test`` run by ``tests/vllm_tree_tests.py venv`` (a fresh
``python -m venv`` + ``pip install dist/<overlay wheel>`` + the b12x wheel, torch 2.14 from the
index, then the b12x wheel alone once more, last). It is ``$PATCHSET_TEST_VENV`` or
``build/testenv``. Without it these tests skip with that reason, except under
``PATCHSET_E2E=require`` (set by ``make test``), where a missing venv fails.
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


B12X_PROBE = r"""
import base64, hashlib, importlib, importlib.metadata as md, json, pathlib, sys
for name in json.loads(sys.argv[1]):
    importlib.import_module(name)
dist = md.distribution("b12x")
site = pathlib.Path(dist.locate_file("")).resolve()
record = {str(f): f.hash.value for f in dist.files or () if f.hash and f.hash.mode == "sha256"}
loaded = {}
for name, module in sorted(sys.modules.items()):
    if name != "b12x" and not name.startswith("b12x."):
        continue
    origin = getattr(module, "__file__", None)
    if origin is None:
        loaded[name] = {"file": None}
        continue
    path = pathlib.Path(origin).resolve()
    digest = hashlib.sha256(path.read_bytes()).digest()
    rel = path.relative_to(site).as_posix() if path.is_relative_to(site) else str(path)
    loaded[name] = {
        "file": rel,
        "sha256": base64.urlsafe_b64encode(digest).rstrip(b"=").decode(),
        "record": record.get(rel),
    }
claims = {}
for other in md.distributions():
    owner = other.metadata["Name"]
    if owner and owner.lower() != "b12x":
        shared = sorted(str(f) for f in other.files or () if str(f) in record)
        if shared:
            claims[owner] = shared
print(json.dumps({
    "version": dist.version,
    "record_rows": len(record),
    "loaded": loaded,
    "other_owners": claims,
}))
"""
B12X_MODULES = ("b12x", "b12x.comm.pcie", "b12x.comm.pcie._twoshot_preparation")
"""Imported by the b12x probe, besides every module the b12x overlay wheel replaces: the
package, the PCIe collectives and the two-shot preparation path."""


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


def b12x_receipt() -> dict[str, Any] | None:
    """``dist/receipt-b12x.json`` when ``make wheel`` built a b12x overlay wheel, else None."""
    path = REPO / "dist" / "receipt-b12x.json"
    data: dict[str, Any] | None = json.loads(path.read_text()) if path.is_file() else None
    return data


def test_pinned_b12x_is_installed_next_to_the_overlay_wheel(probe: dict[str, Any]) -> None:
    """pip resolved the overlay wheel together with the pinned b12x (vLLM's `b12x` extra), or
    with the b12x overlay wheel built from it when the series patches b12x."""
    pinned = load_pins(REPO / "pins.toml").get("b12x", "wheel").requirement.split("==")[1]
    receipt = b12x_receipt()
    assert probe["b12x_version"] == (receipt["wheel"]["version"] if receipt else pinned)
    assert probe["b12x_version"].split("+")[0] == pinned
    assert probe["b12x_found"]


@pytest.fixture(scope="module")
def b12x_probe(testenv: Path) -> dict[str, Any]:
    """What ``import b12x`` loads in the test venv, read against the b12x distribution's RECORD."""
    receipt = b12x_receipt()
    modules = list(B12X_MODULES)
    if receipt is not None:
        marker = json.loads((testenv / MARKER).read_text())
        assert marker.get("b12x", {}).get("sha256") == receipt["wheel"]["sha256"], (
            f"{testenv} does not have {receipt['wheel']['filename']} installed: run `make test`"
        )
        modules += [
            f["path"].removesuffix(".py").removesuffix("/__init__").replace("/", ".")
            for f in receipt["overlay"]
            if f["sha256"] is not None and f["path"].endswith(".py")
        ]
    proc = subprocess.run(
        [str(testenv / "bin" / "python"), "-c", B12X_PROBE, json.dumps(modules)],
        cwd=REPO / "build",
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    result["imported"] = modules
    return result


def test_import_b12x_loads_the_b12x_distributions_own_files(b12x_probe: dict[str, Any]) -> None:
    """Every b12x module ``import b12x`` (and the probed submodules) loaded is a file of the b12x
    distribution's RECORD with the bytes RECORD lists: not flashinfer-python's embedded copy
    (flashinfer/experimental/b12x/), which flashinfer's own ``b12x/__init__.py`` loads when
    flashinfer is installed after b12x."""
    loaded = b12x_probe["loaded"]
    assert set(b12x_probe["imported"]) <= set(loaded), "a probed module is not in sys.modules"
    assert b12x_probe["record_rows"] > 100, "the b12x distribution has no usable RECORD"
    wrong = {
        name: f"{entry['file']} (sha256 {entry.get('sha256')}, RECORD {entry.get('record')})"
        for name, entry in loaded.items()
        if entry["file"] is None or entry.get("record") != entry.get("sha256")
    }
    shared = b12x_probe["other_owners"]
    assert not wrong, (
        f"{len(wrong)} of {len(loaded)} loaded b12x modules are not b12x's installed files "
        f"(other distributions listing b12x paths: {shared}): {wrong}"
    )


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
