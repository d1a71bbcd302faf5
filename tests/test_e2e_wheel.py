"""End to end on the real pinned artefacts: ``patchset fetch`` and ``patchset wheel``.

Uses the repository's pins, series, patches and lock, the download cache (filled by
``make wheel``, or downloaded here), and a fresh vLLM tree under a temporary directory.
"""

from __future__ import annotations

import json
import shutil
import time
import zipfile
from pathlib import Path

import pytest
from patchset.cli import main
from patchset.errors import HashMismatch
from patchset.fetch import cache_dir, fetch_pin
from patchset.hashing import sha256_file
from patchset.lockfile import load_lock
from patchset.pins import load_pins
from patchset.series import for_target, load_series
from patchset.wheel import BuiltWheel, prove_base, wheel_from_series

REPO = Path(__file__).resolve().parent.parent
WHEEL_BUDGET_S = 60.0

pytestmark = pytest.mark.slow

Builds = tuple[Path, list[tuple[BuiltWheel, Path, float]]]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Builds:
    """The overlay wheel built twice from one fresh tree, with each build's wall time."""
    work = tmp_path_factory.mktemp("e2e-wheel")
    runs = []
    for name in ("one", "two"):
        start = time.monotonic()
        wheel, receipt = wheel_from_series(REPO, tree=work / "vllm", out_dir=work / name)
        runs.append((wheel, receipt, time.monotonic() - start))
    return work, runs


def test_real_wheel_rebuild_is_byte_identical(built: Builds) -> None:
    """Two builds from the same pins and series give the same file name, sha256 and receipt."""
    _work, ((one, r1, _), (two, r2, _)) = built
    assert one.path.name == two.path.name
    assert one.sha256 == two.sha256 == sha256_file(two.path)
    assert r1.read_bytes() == r2.read_bytes()


def test_real_wheel_build_is_within_budget(built: Builds) -> None:
    """The second build (tree applied, pristine base unpacked) takes at most 60 s."""
    _work, runs = built
    assert runs[1][2] <= WHEEL_BUDGET_S, f"{runs[1][2]:.1f} s"


def test_real_receipt_matches_lock_and_wheel(built: Builds) -> None:
    """The receipt names the pinned bases, every vllm patch, and for each overlaid file the
    lock's final sha256, which is also the wheel member's."""
    work, ((wheel, receipt_path, _), _) = built
    receipt = json.loads(receipt_path.read_text())
    pins = load_pins(REPO / "pins.toml")
    assert receipt["base"]["sdist"]["sha256"] == pins.get("vllm", "sdist").sha256
    assert receipt["base"]["wheel"]["sha256"] == pins.get("vllm", "wheel").sha256
    patches = for_target(load_series(REPO), "vllm")
    assert [p["name"] for p in receipt["series"]["patches"]] == [p.name for p in patches]
    final = load_lock(REPO).final.get("vllm", {})
    package_paths = sorted(p for p in final if p.startswith("vllm/"))
    assert [f["path"] for f in receipt["overlay"]] == package_paths
    with zipfile.ZipFile(wheel.path) as zf:
        names = set(zf.namelist())
        for entry in receipt["overlay"]:
            assert entry["sha256"] == final[entry["path"]].sha256
            if entry["sha256"] is None:
                assert entry["path"] not in names
            else:
                assert sha256_file(work / "vllm" / entry["path"]) == entry["sha256"]
                assert zf.read(entry["path"]) == (work / "vllm" / entry["path"]).read_bytes()
    assert all(not p.startswith("vllm/") for p in receipt["not_carried"])


def test_real_base_wheel_python_equals_sdist() -> None:
    """The pinned wheel's vllm/**/*.py equal the pinned sdist's, bar the documented files."""
    from patchset.fetch import pristine_tree

    pin = load_pins(REPO / "pins.toml").get("vllm", "wheel")
    base = fetch_pin(pin, cache_dir(REPO)).path
    with zipfile.ZipFile(base) as zf:
        prove_base(zf, pristine_tree("vllm", root=REPO), pin)


def test_tampered_cached_wheel_is_detected_deleted_and_refetched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`patchset fetch --offline` on a cache whose wheel has one flipped byte exits 1 naming it
    and deletes it; `fetch --from` then restores a verified copy."""
    pins = load_pins(REPO / "pins.toml")
    pin = pins.get("vllm", "wheel")
    good = fetch_pin(pin, cache_dir(REPO)).path
    cache = tmp_path / "cache"
    cache.mkdir()
    for other in pins:
        shutil.copyfile(fetch_pin(other, cache_dir(REPO)).path, cache / other.filename)
    copy = cache / pin.filename
    with open(copy, "r+b") as fh:
        fh.seek(12345)
        byte = fh.read(1)
        fh.seek(12345)
        fh.write(bytes([byte[0] ^ 0xFF]))
    monkeypatch.setenv("PATCHSET_CACHE", str(cache))
    assert main(["-C", str(REPO), "fetch", "--offline"]) == 1
    err = capsys.readouterr().err
    assert f"vllm.wheel: {copy} has sha256" in err and "deleted it" in err
    assert not copy.exists()
    copy.write_bytes(b"not a wheel")
    with pytest.raises(HashMismatch):
        fetch_pin(pin, cache, offline=True)
    assert not copy.exists()
    assert main(["-C", str(REPO), "fetch", "--offline", "--from", str(good.parent)]) == 0
    assert sha256_file(copy) == pin.sha256
    capsys.readouterr()
    assert main(["-C", str(REPO), "fetch", "--offline"]) == 0
    lines = capsys.readouterr().out.splitlines()
    pinned = load_pins(REPO / "pins.toml")
    assert [line.split()[0] for line in lines] == ["cached"] * len(pinned.pins)


def test_real_b12x_wheel_is_deterministic_and_carries_the_locked_files(
    tmp_path: Path,
) -> None:
    """The b12x overlay wheel (the series' b12x patches over the pinned b12x wheel), built twice
    from fresh trees, has one name and sha256, passes verification, carries every b12x/ file
    the lock ends with at its final sha256, and names its patches in receipt-b12x.json."""
    from patchset.wheel import verify_wheel

    patches = for_target(load_series(REPO), "b12x")
    if not patches:
        pytest.skip("the series has no b12x patches: no b12x overlay wheel is built")
    builds = [
        wheel_from_series(REPO, target="b12x", tree=tmp_path / f"b12x-{n}", out_dir=tmp_path / n)
        for n in ("one", "two")
    ]
    (one, receipt_one), (two, receipt_two) = builds
    assert one.path.name == two.path.name and one.sha256 == two.sha256 == sha256_file(two.path)
    assert receipt_one.name == "receipt-b12x.json"
    assert receipt_one.read_bytes() == receipt_two.read_bytes()
    verify_wheel(one.path)
    pins = load_pins(REPO / "pins.toml")
    receipt = json.loads(receipt_one.read_text())
    assert receipt["base"]["wheel"]["sha256"] == pins.get("b12x", "wheel").sha256
    assert [p["name"] for p in receipt["series"]["patches"]] == [p.name for p in patches]
    assert one.path.name.startswith(f"b12x-{one.base_version}+dcp.")
    final = load_lock(REPO).final.get("b12x", {})
    package_paths = sorted(p for p in final if p.startswith("b12x/"))
    assert [f["path"] for f in receipt["overlay"]] == package_paths
    with zipfile.ZipFile(one.path) as zf:
        for entry in receipt["overlay"]:
            assert entry["sha256"] == final[entry["path"]].sha256
            if entry["sha256"] is None:
                assert entry["path"] not in zf.namelist()
            else:
                assert (
                    zf.read(entry["path"]) == (tmp_path / "b12x-one" / entry["path"]).read_bytes()
                )
                assert sha256_file(tmp_path / "b12x-one" / entry["path"]) == entry["sha256"]


def test_real_base_b12x_wheel_python_equals_sdist() -> None:
    """The pinned b12x wheel's b12x/**/*.py equal the pinned b12x sdist's, with no exception."""
    from patchset.fetch import pristine_tree

    pin = load_pins(REPO / "pins.toml").get("b12x", "wheel")
    base = fetch_pin(pin, cache_dir(REPO)).path
    with zipfile.ZipFile(base) as zf:
        prove_base(zf, pristine_tree("b12x", root=REPO), pin, "b12x/")
