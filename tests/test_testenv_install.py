"""The test venv's install order (``tests/vllm_tree_tests.py venv``): the b12x wheel goes in last.

flashinfer-python ships its own ``b12x/__init__.py``; the distribution pip writes last owns it
(design/b12x.md). These tests run ``make_venv`` with ``subprocess.run`` recorded instead of
executed and check the pip commands it issues.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
from conftest import load_tree_tests

REPO = Path(__file__).resolve().parent.parent


def _wheel_with_receipt(dist: Path, name: str, receipt: str, version: str) -> Path:
    """A small wheel whose METADATA declares vLLM 0.34.0's flashinfer pin (pins.toml substitutes
    it in the test venv) and one requirement that stays."""
    wheel = dist / name
    project = name.split("-", 1)[0]
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(
            f"{project}-{version}.dist-info/METADATA",
            f"Metadata-Version: 2.1\nName: {project}\nVersion: {version}\n"
            "Requires-Dist: regex\nRequires-Dist: flashinfer-python==0.7.3\n\n",
        )
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    data = {"wheel": {"filename": name, "sha256": digest, "version": version}, "overlay": []}
    (dist / receipt).write_text(json.dumps(data))
    return wheel


@pytest.fixture
def recorded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, list[list[str]]]:
    module = load_tree_tests()
    calls: list[list[str]] = []

    def run(cmd: list[str], **_kwargs: Any) -> subprocess.CompletedProcess[bytes]:
        calls.append([str(c) for c in cmd])
        if cmd[1:3] == ["-m", "venv"]:
            (Path(cmd[3]) / "bin").mkdir(parents=True)
            (Path(cmd[3]) / "bin" / "python").write_text("")
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(module.subprocess, "run", run)
    monkeypatch.setattr(module, "free_gib", lambda _path: 100.0)
    return module, calls


def _dist(tmp_path: Path) -> tuple[Path, Path, Path]:
    dist = tmp_path / "dist"
    dist.mkdir()
    vllm = _wheel_with_receipt(
        dist, "vllm-0.33.0+dcp.aaaaaaaaaaaa-cp38-abi3-x.whl", "receipt.json", "0.33.0+dcp.a"
    )
    b12x = _wheel_with_receipt(
        dist, "b12x-1.5.1+dcp.bbbbbbbbbbbb-py3-none-any.whl", "receipt-b12x.json", "1.5.1+dcp.b"
    )
    return dist, vllm, b12x


def test_fresh_venv_installs_the_b12x_overlay_wheel_last(
    recorded: tuple[Any, list[list[str]]], tmp_path: Path
) -> None:
    """A fresh venv: the vLLM wheel --no-deps, then its requirements (flashinfer 0.7.4 in place
    of the declared 0.7.3, pins.toml) with the b12x wheel, then the b12x overlay wheel alone,
    --no-deps --force-reinstall, as the last pip command; the marker names it."""
    module, calls = recorded
    dist, vllm, b12x = _dist(tmp_path)
    venv = tmp_path / "venv"
    assert module.make_venv(dist / "receipt.json", venv, reuse=False) == 0
    pip_calls = [c for c in calls if "pip" in c]
    assert len(pip_calls) == 3
    assert pip_calls[0][-2:] == ["--no-deps", str(vllm)]
    assert str(b12x) in pip_calls[1] and "regex" in pip_calls[1]
    assert "flashinfer-python==0.7.4" in pip_calls[1]
    assert "flashinfer-python==0.7.3" not in pip_calls[1]
    assert pip_calls[-1][-3:] == ["--no-deps", "--force-reinstall", str(b12x)]
    marker = json.loads((venv / module.MARKER).read_text())
    assert marker["b12x"] == {
        "filename": b12x.name,
        "sha256": hashlib.sha256(b12x.read_bytes()).hexdigest(),
    }


def test_reused_venv_with_a_new_vllm_wheel_reinstalls_b12x_after_it(
    recorded: tuple[Any, list[list[str]]], tmp_path: Path
) -> None:
    """--reuse with another vLLM wheel: vLLM is reinstalled without deps, then b12x, last."""
    module, calls = recorded
    dist, vllm, b12x = _dist(tmp_path)
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("")
    (venv / module.MARKER).write_text(json.dumps({"sha256": "0" * 64, "b12x": {"sha256": "0"}}))
    assert module.make_venv(dist / "receipt.json", venv, reuse=True) == 0
    installs = [c[-1] for c in calls if "--force-reinstall" in c]
    assert installs == [str(vllm), str(b12x)]


def test_reused_venv_with_the_same_wheels_installs_nothing(
    recorded: tuple[Any, list[list[str]]], tmp_path: Path
) -> None:
    module, calls = recorded
    dist, vllm, b12x = _dist(tmp_path)
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("")
    module.write_marker(venv, vllm, hashlib.sha256(vllm.read_bytes()).hexdigest(), "v", b12x)
    assert module.make_venv(dist / "receipt.json", venv, reuse=True) == 0
    assert not [c for c in calls if "--force-reinstall" in c]


def test_a_b12x_wheel_that_is_not_its_receipts_is_refused(
    recorded: tuple[Any, list[list[str]]], tmp_path: Path
) -> None:
    module, calls = recorded
    dist, _vllm, b12x = _dist(tmp_path)
    b12x.write_bytes(b"tampered")
    assert module.make_venv(dist / "receipt.json", tmp_path / "venv", reuse=False) == 1
    assert not calls


def test_a_disk_without_room_for_a_fresh_venv_is_refused_before_pip(
    recorded: tuple[Any, list[list[str]]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """1 GiB free: one line naming the free and needed space and the way out; no venv made,
    no pip run (CI's disk filled mid-install once: pip's OSError after minutes)."""
    module, calls = recorded
    monkeypatch.setattr(module, "free_gib", lambda _path: 1.0)
    dist, _vllm, _b12x = _dist(tmp_path)
    assert module.make_venv(dist / "receipt.json", tmp_path / "venv", reuse=False) == 1
    assert not calls
    out = capsys.readouterr().out
    assert "1.0 GiB free" in out and f"{module.FRESH_VENV_GIB} GiB" in out and "TESTENV=" in out


def test_free_space_is_read_from_the_nearest_existing_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = load_tree_tests()
    asked: list[Path] = []
    real = module.shutil.disk_usage

    def disk_usage(path: Path):  # type: ignore[no-untyped-def]
        asked.append(Path(path))
        return real(path)

    # which folder is asked, not two readings of a disk other suites write to meanwhile
    monkeypatch.setattr(module.shutil, "disk_usage", disk_usage)
    assert module.free_gib(tmp_path / "not" / "yet") > 0
    assert asked == [tmp_path]
    monkeypatch.undo()
    assert module.lacks_space(tmp_path / "venv", need_gib=0) is None
    assert "GiB free" in module.lacks_space(tmp_path / "venv", need_gib=10**9)


def test_the_stock_venv_of_the_upstream_baseline_is_installed_like_the_test_venv(
    recorded: tuple[Any, list[list[str]]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``make upstream-baseline``'s stock venv: the official wheel with the same pins.toml
    substitutes (vLLM 0.34.0's flashinfer 0.7.3 is not on the index: without them pip fails)
    and the same order, b12x last; a pip failure is an error naming the venv."""
    _module, calls = recorded
    monkeypatch.syspath_prepend(str(REPO / "tests"))
    spec = importlib.util.spec_from_file_location(
        "upstream_tests", REPO / "tests/upstream_tests.py"
    )
    assert spec is not None and spec.loader is not None
    upstream = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "upstream_tests", upstream)  # its dataclasses look it up
    spec.loader.exec_module(upstream)
    import patchset.fetch

    _dist_dir, vllm, b12x = _dist(tmp_path)
    wheels = {"vllm": vllm, "b12x": b12x}
    monkeypatch.setattr(patchset.fetch, "pinned_file", lambda target, _kind, **_kw: wheels[target])
    python = upstream.make_stock_venv(tmp_path / "stock")
    assert python == str(tmp_path / "stock" / "bin" / "python")
    pip_calls = [c for c in calls if "pip" in c]
    assert pip_calls[0][-2:] == ["--no-deps", str(vllm)]
    assert "flashinfer-python==0.7.4" in pip_calls[1]
    assert "flashinfer-python==0.7.3" not in pip_calls[1]
    assert pip_calls[-1][-3:] == ["--no-deps", "--force-reinstall", str(b12x)]

    def failing(cmd: list[str], **_kwargs: Any) -> subprocess.CompletedProcess[bytes]:
        if cmd[1:3] == ["-m", "venv"]:
            (Path(cmd[3]) / "bin").mkdir(parents=True, exist_ok=True)
            return subprocess.CompletedProcess(cmd, 0)
        return subprocess.CompletedProcess(cmd, 1)

    monkeypatch.setattr(subprocess, "run", failing)
    with pytest.raises(upstream.UpstreamError, match="stock venv: installing into"):
        upstream.make_stock_venv(tmp_path / "stock2")
