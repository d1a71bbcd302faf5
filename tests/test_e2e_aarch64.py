"""End to end on the real pinned artefacts: the aarch64 overlay wheel (DGX Spark, GB10).

From one fresh vLLM tree with the series applied, ``patchset wheel`` builds the x86_64 overlay
(``[vllm.wheel]``) and the aarch64 one (``[vllm.wheel_aarch64]``). Checked here: the aarch64
base wheel carries the sdist's Python files with the same documented exceptions as the x86_64
one; both overlays carry the same Python files byte for byte; the aarch64 overlay's RECORD
verifies; and pip resolves the whole install for a DGX Spark (aarch64, CPython 3.12, glibc
>= 2.34: see ``GLIBC_MINOR``) as the README gives it: the wheel ``--no-deps``, its requirements
with the pins.toml substitutes (flashinfer-python 0.7.4 for 0.7.3) and the b12x wheel, then
the b12x wheel alone, last. The resolution reads the package index (about 4 GB of wheels
fetched and dropped, ``--no-cache-dir``: the index serves no separate metadata files).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from patchset.fetch import cache_dir, fetch_pin, pinned_file, pristine_tree
from patchset.installreqs import install_requirements, requirement_name
from patchset.lockfile import load_lock
from patchset.pins import load_pins, wheel_arch
from patchset.record import RecordEntry, index, parse_record
from patchset.series import for_target, load_series
from patchset.wheel import BuiltWheel, prove_base, verify_wheel, wheel_from_series

REPO = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.slow

Pair = tuple[Path, BuiltWheel, Path, BuiltWheel, Path]
"""(tree, x86_64 wheel, its receipt, aarch64 wheel, its receipt), both wheels in one folder."""


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Pair:
    work = tmp_path_factory.mktemp("e2e-aarch64")
    tree, out = work / "vllm", work / "dist"
    x86, x86_receipt = wheel_from_series(REPO, tree=tree, out_dir=out)
    arm, arm_receipt = wheel_from_series(REPO, tree=tree, out_dir=out, arch="aarch64")
    return tree, x86, x86_receipt, arm, arm_receipt


def _python_files(wheel: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(wheel) as zf:
        return {n: zf.read(n) for n in zf.namelist() if n.startswith("vllm/") and n.endswith(".py")}


def test_aarch64_base_wheel_python_equals_sdist_with_the_x86_64_exceptions() -> None:
    """The pinned aarch64 wheel's vllm/**/*.py equal the sdist's bar ``differs_from_sdist``
    and ``build_only_py``, and it vendors the same build-only files as the x86_64 wheel (each
    documented prefix matches a file in both; the wheel-only file sets are equal)."""
    pins = load_pins(REPO / "pins.toml")
    pristine = pristine_tree("vllm", root=REPO)
    wheel_only = {}
    for pin in (pins.wheel("vllm"), pins.wheel("vllm", "aarch64")):
        base = fetch_pin(pin, cache_dir(REPO)).path
        with zipfile.ZipFile(base) as zf:
            prove_base(zf, pristine, pin)
            names = [n for n in zf.namelist() if n.startswith("vllm/") and n.endswith(".py")]
        wheel_only[pin.arch] = {n for n in names if not (pristine / n).is_file()}
        for prefix in pin.build_only_py:
            assert any(n.startswith(prefix) for n in wheel_only[pin.arch]), (pin.key, prefix)
    assert wheel_only["aarch64"] == wheel_only["x86_64"]


def test_aarch64_overlay_sits_beside_the_x86_64_one(pair: Pair, tmp_path: Path) -> None:
    """Same version and overlay, another platform tag, its own receipt naming the aarch64
    base; building it keeps the x86_64 wheel and receipt; a rebuild is byte-identical."""
    _tree, x86, x86_receipt, arm, arm_receipt = pair
    assert x86.path.is_file() and x86_receipt.name == "receipt.json"
    assert arm.path.parent == x86.path.parent and arm_receipt.name == "receipt-aarch64.json"
    assert arm.version == x86.version
    assert arm.path.name == x86.path.name.replace("_x86_64.whl", "_aarch64.whl")
    assert arm.path.name.endswith("-cp38-abi3-manylinux_2_28_aarch64.whl")
    one, two = json.loads(x86_receipt.read_text()), json.loads(arm_receipt.read_text())
    pin = load_pins(REPO / "pins.toml").wheel("vllm", "aarch64")
    assert two["base"]["wheel"] == {"filename": pin.filename, "sha256": pin.sha256}
    assert two["wheel"] == {"filename": arm.path.name, "sha256": arm.sha256, "version": arm.version}
    for key in ("overlay", "not_carried", "series"):
        assert two[key] == one[key], key
    again, _ = wheel_from_series(REPO, tree=pair[0], out_dir=tmp_path, arch="aarch64")
    assert again.path.name == arm.path.name and again.sha256 == arm.sha256


def test_aarch64_overlay_python_files_equal_the_x86_64_overlays(pair: Pair) -> None:
    """Every vllm/**/*.py of the two overlay wheels is byte-identical, the patched ones (at
    the lock's final sha256) included."""
    tree, x86, _, arm, arm_receipt = pair
    x86_files, arm_files = _python_files(x86.path), _python_files(arm.path)
    assert sorted(arm_files) == sorted(x86_files)
    assert [n for n in arm_files if arm_files[n] != x86_files[n]] == []
    final = load_lock(REPO).final["vllm"]
    overlay = json.loads(arm_receipt.read_text())["overlay"]
    assert overlay, "the series overlays no vllm/ file"
    for entry in overlay:
        assert entry["sha256"] == final[entry["path"]].sha256
        if entry["sha256"] is not None:
            assert arm_files[entry["path"]] == (tree / entry["path"]).read_bytes()


def test_aarch64_overlay_record_verifies(pair: Pair) -> None:
    """Every member's sha256 and size match RECORD (verify_wheel re-reads each one); RECORD's
    rows of the overlaid files are the patched bytes'; every other member keeps the official
    aarch64 wheel's RECORD row."""
    tree, _, _, arm, arm_receipt = pair
    verify_wheel(arm.path)
    base = pinned_file("vllm", "wheel_aarch64", root=REPO)
    with zipfile.ZipFile(arm.path) as zf, zipfile.ZipFile(base) as bz:
        rows = index(parse_record(zf.read(f"vllm-{arm.version}.dist-info/RECORD"), where="new"))
        base_rows = index(parse_record(bz.read("vllm-0.34.0.dist-info/RECORD"), where="base"))
    overlaid = {e["path"] for e in json.loads(arm_receipt.read_text())["overlay"]}
    for path in sorted(overlaid):
        if (tree / path).is_file():
            assert rows[path] == RecordEntry.of(path, (tree / path).read_bytes()), path
        else:
            assert path not in rows
    kept = [n for n in rows if n.startswith("vllm/") and n not in overlaid]
    assert kept and all(rows[n] == base_rows[n] for n in kept)


# ----------------------------------------------------------------------------- pip, for aarch64

TARGET_MARKERS = {
    "platform_machine": "aarch64",
    "platform_system": "Linux",
    "sys_platform": "linux",
    "os_name": "posix",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "python_version": "3.12",
    "python_full_version": "3.12.3",
}
"""Environment markers of a DGX Spark's Python (DGX OS 7 = Ubuntu 24.04: CPython 3.12.3)."""

GLIBC_MINOR = 34
"""pip is given the platform tags of an aarch64 machine with glibc 2.34, the oldest the set
resolves on (DGX OS 7 = Ubuntu 24.04 has 2.39). Not 2.28, the vLLM wheel's own tag: measured,
tilelang 0.1.12 (a vLLM pin) ships a manylinux_2_34 aarch64 wheel only, and llguidance 1.7.x
(vLLM's `llguidance<1.8,>=1.7`) manylinux_2_31 ones; everything else resolves at 2.28."""

PLATFORMS = [f"manylinux_2_{m}_aarch64" for m in range(GLIBC_MINOR, 16, -1)]
PLATFORMS.append("manylinux2014_aarch64")

PIP_WITH_TARGET_MARKERS = """\
import json, os, sys
from pip._vendor.packaging import markers
_host, _target = markers.default_environment, json.loads(os.environ["DCP_TARGET_MARKERS"])
markers.default_environment = lambda: {**_host(), **_target}
from pip._internal.cli.main import main
sys.exit(main())
"""
"""pip with environment markers evaluated for the target: ``--platform`` and
``--python-version`` choose wheels but leave markers on the host's values, so a marker such as
``python_version > "3.11"`` (vLLM's setuptools and six pins) would be judged for this Python."""


def _pip_dry_run(args: list[str], target: Path, report: Path) -> dict[str, object]:
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    cmd = [
        sys.executable,
        "-c",
        PIP_WITH_TARGET_MARKERS,
        "install",
        "--dry-run",
        "--no-cache-dir",
        "--progress-bar",
        "off",
        "--report",
        str(report),
        "--target",
        str(target),
        "--only-binary=:all:",
        "--python-version",
        "3.12",
        *platforms,
        *args,
    ]
    env = {**os.environ, "DCP_TARGET_MARKERS": json.dumps(TARGET_MARKERS), "PIP_NO_INPUT": "1"}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-25:])
    assert proc.returncode == 0, f"pip could not resolve for aarch64 / 3.12:\n{tail}"
    data: dict[str, object] = json.loads(report.read_text())
    return data


def test_pip_resolves_the_aarch64_install_for_python_3_12(pair: Pair, tmp_path: Path) -> None:
    """The README's three pip steps, as ``pip install --dry-run --platform ... --python-version
    3.12 --only-binary=:all: --target``: every requirement resolves to a wheel for aarch64 (or
    pure Python), flashinfer-python at the substituted 0.7.4, b12x at the series' wheel."""
    _tree, _, _, arm, _ = pair
    pin = load_pins(REPO / "pins.toml").wheel("vllm", "aarch64")
    requirements, replaced = install_requirements(arm.path, pin.install_substitutes)
    assert replaced == [("flashinfer-python==0.7.3", "flashinfer-python==0.7.4")]
    if for_target(load_series(REPO), "b12x"):
        b12x, _ = wheel_from_series(REPO, target="b12x", tree=tmp_path / "b12x", out_dir=tmp_path)
        b12x_wheel = b12x.path
    else:
        b12x_wheel = pinned_file("b12x", "wheel", root=REPO)
    reports = tmp_path / "reports"
    reports.mkdir()
    steps = {
        "wheel": ["--no-deps", str(arm.path)],
        "requirements": [*requirements, str(b12x_wheel)],
        "b12x-last": ["--no-deps", "--force-reinstall", str(b12x_wheel)],
    }
    installs: dict[str, dict[str, str]] = {}
    for name, args in steps.items():
        report = _pip_dry_run(args, tmp_path / f"target-{name}", reports / f"{name}.json")
        env = report["environment"]
        assert isinstance(env, dict) and env["platform_machine"] == "aarch64", env
        items = report["install"]
        assert isinstance(items, list)
        installs[name] = {
            requirement_name(item["metadata"]["name"]): item["metadata"]["version"]
            for item in items
        }
        files = {
            requirement_name(item["metadata"]["name"]): item["download_info"]["url"].rsplit("/", 1)[
                -1
            ]
            for item in items
        }
        wrong = {n: f for n, f in files.items() if wheel_arch(f) not in ("aarch64", "any")}
        assert wrong == {}, f"{name}: not for aarch64: {wrong}"
    assert installs["wheel"] == {"vllm": arm.version}
    assert installs["b12x-last"] == {"b12x": installs["requirements"]["b12x"]}
    deps = installs["requirements"]
    assert deps["flashinfer-python"] == "0.7.4"
    declared = {requirement_name(r) for r in requirements if ";" not in r}
    assert declared <= set(deps), sorted(declared - set(deps))
    # markers judged for CPython 3.12: vLLM's `setuptools<81; python_version > "3.11"` holds
    setuptools = tuple(int(x) for x in deps["setuptools"].split(".")[:2])
    assert (78, 1) <= setuptools < (81, 0), deps["setuptools"]
    assert "six" in deps
    assert not any(p.exists() and any(p.iterdir()) for p in tmp_path.glob("target-*"))
