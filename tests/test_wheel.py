"""The overlay wheel on a tiny fixture wheel: overlay, refusals, label, determinism, RECORD."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Mapping
from pathlib import Path

import pytest
from conftest import Workspace, patch_bytes, snapshot
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from patchset.cli import main
from patchset.errors import NativeSourceError, WheelError
from patchset.hashing import sha256_bytes, sha256_file
from patchset.model import FileOp, FilePatch, Patch, PatchHeader
from patchset.pins import Pin
from patchset.record import RecordEntry, parse_record, write_record
from patchset.wheel import (
    BuiltWheel,
    build_wheel,
    local_version,
    native_reason,
    prove_base,
    refuse_native,
    series_digest,
    verify_wheel,
)

BASE_NAME = "vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl"
PRISTINE: dict[str, bytes] = {
    "vllm/__init__.py": b"from vllm.a import A\n",
    "vllm/a.py": b"A = 1\n",
    "vllm/gone.py": b"GONE = True\n",
    "vllm/_version.py": b"__version__ = '0.26.0.dev0'\n",
    "vllm/configs/x.json": b"{}\n",
    "tests/test_a.py": b"def test_a():\n    pass\n",
    "csrc/k.cu": b"// kernel\n",
    "setup.py": b"import setuptools\n",
}
WHEEL_ONLY: dict[str, bytes] = {
    "vllm/_version.py": b"__version__ = '0.26.0'\n",
    "vllm/_C.abi3.so": bytes(range(256)) * 64,
    "vllm/vendored/lib.py": b"VENDORED = 1\n",
    "vllm/bin/tool": b"#!/bin/sh\n",
}
WHEEL_PIN = Pin(
    target="vllm",
    kind="wheel",
    requirement="vllm==0.26.0",
    filename=BASE_NAME,
    sha256="0" * 64,
    differs_from_sdist=("vllm/_version.py",),
    build_only_py=("vllm/vendored/",),
)


def make_base_wheel(path: Path, extra: Mapping[str, bytes] | None = None) -> Path:
    """A small wheel shaped like vLLM's: package files, a .so, an executable, dist-info."""
    files = {k: v for k, v in PRISTINE.items() if k.startswith("vllm/")}
    files.update(WHEEL_ONLY)
    files.update(extra or {})
    dist = "vllm-0.26.0.dist-info"
    files[f"{dist}/METADATA"] = b"Metadata-Version: 2.4\nName: vllm\nVersion: 0.26.0\n\nA body.\n"
    files[f"{dist}/WHEEL"] = b"Wheel-Version: 1.0\nRoot-Is-Purelib: false\nTag: cp38-abi3-any\n"
    rows = [RecordEntry.of(name, data) for name, data in files.items()]
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for i, (name, data) in enumerate(reversed(list(files.items()))):
            info = zipfile.ZipInfo(name, date_time=(2026, 7, 25, 2, i % 60, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = (0o100775 if name.endswith("tool") else 0o100664) << 16
            zf.writestr(info, data)
        zf.writestr(f"{dist}/RECORD", write_record(rows, f"{dist}/RECORD"))
    return path


def write_tree(root: Path, files: Mapping[str, bytes]) -> Path:
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root


def make_patch(name: str, ops: Mapping[str, FileOp]) -> Patch:
    """A Patch touching ``ops`` (path -> op); the wheel only reads names, hashes and paths."""
    header = PatchHeader("0" * 40, "dcp-series", "date", "[Test] x", "desc", ())
    files = tuple(FilePatch(path, op, "100644", None, None, ()) for path, op in ops.items())
    return Patch(name, sha256_bytes(name.encode() + repr(ops).encode()), header, b"", files)


class Fixture:
    def __init__(self, tmp: Path, new_a: bytes = b"A = 2\n", new_file: bytes = b"NEW = 1\n"):
        self.base = make_base_wheel(tmp / BASE_NAME)
        self.pristine = write_tree(tmp / "pristine", PRISTINE)
        patched = dict(PRISTINE)
        patched["vllm/a.py"] = new_a
        del patched["vllm/gone.py"]
        patched["vllm/new.py"] = new_file
        patched["tests/test_new.py"] = b"def test_new():\n    pass\n"
        self.tree = write_tree(tmp / "tree", patched)
        self.patches = [
            make_patch("vllm/0001-a.patch", {"vllm/a.py": "modify", "tests/test_new.py": "add"}),
            make_patch("vllm/0002-b.patch", {"vllm/gone.py": "delete", "vllm/new.py": "add"}),
        ]

    def build(self, out: Path, patches: list[Patch] | None = None) -> BuiltWheel:
        return build_wheel(
            base_wheel=self.base,
            wheel_pin=WHEEL_PIN,
            pristine=self.pristine,
            tree=self.tree,
            patches=self.patches if patches is None else patches,
            out_dir=out,
        )


@pytest.fixture
def fx(tmp_path: Path) -> Fixture:
    return Fixture(tmp_path)


def test_overlay_replaces_adds_and_removes_package_files(fx: Fixture, tmp_path: Path) -> None:
    """Changed and new vllm/ files are laid over, deleted ones removed, tests/ not carried."""
    built = fx.build(tmp_path / "dist")
    digest = series_digest(fx.patches)
    assert built.version == f"0.26.0+dcp.{digest[:12]}"
    assert built.path.name == f"vllm-{built.version}-cp38-abi3-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(built.path) as zf:
        names = zf.namelist()
        assert zf.read("vllm/a.py") == b"A = 2\n"
        assert zf.read("vllm/new.py") == b"NEW = 1\n"
        assert zf.read("vllm/_C.abi3.so") == WHEEL_ONLY["vllm/_C.abi3.so"]
        meta = zf.read(f"vllm-{built.version}.dist-info/METADATA")
    assert "vllm/gone.py" not in names
    assert not any(n.startswith(("tests/", "vllm-0.26.0.dist-info/")) for n in names)
    assert b"\nVersion: " + built.version.encode() + b"\n" in meta and meta.endswith(b"A body.\n")
    assert {(f.path, f.op) for f in built.overlay.files} == {
        ("vllm/a.py", "modify"),
        ("vllm/gone.py", "delete"),
        ("vllm/new.py", "add"),
    }
    assert built.overlay.not_carried == ("tests/test_new.py",)
    assert built.sha256 == sha256_file(built.path)


def test_members_are_canonical(fx: Fixture, tmp_path: Path) -> None:
    """Members sorted, .dist-info last, RECORD last, date 1980-01-01, modes 0o644/0o755 only."""
    built = fx.build(tmp_path / "dist")
    with zipfile.ZipFile(built.path) as zf:
        infos = zf.infolist()
    names = [i.filename for i in infos]
    split = next(i for i, n in enumerate(names) if ".dist-info/" in n)
    assert names[:split] == sorted(names[:split])
    assert all(".dist-info/" in n for n in names[split:])
    assert names[-1] == f"vllm-{built.version}.dist-info/RECORD"
    assert {i.date_time for i in infos} == {(1980, 1, 1, 0, 0, 0)}
    modes = {i.filename: (i.external_attr >> 16) for i in infos}
    assert modes["vllm/bin/tool"] == 0o100755
    assert set(modes.values()) == {0o100644, 0o100755}
    assert {i.compress_type for i in infos} == {zipfile.ZIP_DEFLATED}


def test_record_is_regenerated_and_matches_every_member(fx: Fixture, tmp_path: Path) -> None:
    """RECORD lists every member but itself with its sha256 and size, and nothing else."""
    built = fx.build(tmp_path / "dist")
    with zipfile.ZipFile(built.path) as zf:
        record = f"vllm-{built.version}.dist-info/RECORD"
        rows = parse_record(zf.read(record))
        expected = [RecordEntry.of(n, zf.read(n)) for n in zf.namelist() if n != record]
    assert rows == [*expected, RecordEntry(record, None, None)]


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(new_a=st.binary(max_size=2000), new_file=st.binary(max_size=2000))
def test_rebuild_is_byte_identical(tmp_path: Path, new_a: bytes, new_file: bytes) -> None:
    """Same inputs give the same wheel sha256, whatever the file times and umask of the inputs."""
    work = tmp_path / sha256_bytes(new_a + b"|" + new_file)[:16]
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    fixture = Fixture(work, new_a, new_file)
    first = fixture.build(work / "one")
    for path in (fixture.tree / "vllm").iterdir():
        os.utime(path, (1_000_000_000, 1_000_000_000))
    old = os.umask(0o077)
    try:
        second = fixture.build(work / "two")
    finally:
        os.umask(old)
    assert first.path.name == second.path.name
    assert first.sha256 == second.sha256
    assert first.path.read_bytes() == second.path.read_bytes()


def test_version_label_follows_the_series(fx: Fixture, tmp_path: Path) -> None:
    """A different patch list (content or order) gives a different local label."""
    one = fx.build(tmp_path / "a")
    reordered = fx.build(tmp_path / "b", list(reversed(fx.patches)))
    assert one.version != reordered.version
    assert series_digest(fx.patches) != series_digest(fx.patches[:1])


def test_local_version() -> None:
    """The dcp label is appended to any existing local label; a second one is refused."""
    digest = "0123456789abcdef" * 4
    assert local_version("0.26.0", digest) == "0.26.0+dcp.0123456789ab"
    assert local_version("0.26.0+cu130", digest) == "0.26.0+cu130.dcp.0123456789ab"
    with pytest.raises(WheelError, match="already carries"):
        local_version("0.26.0+dcp.0123456789ab", digest)
    with pytest.raises(WheelError, match="PEP 440"):
        local_version("0.26.0+CU 130", digest)
    with pytest.raises(WheelError, match="not hex"):
        local_version("0.26.0", "xyz")


@pytest.mark.parametrize(
    "path",
    [
        "csrc/attention/mla.cu",
        "CMakeLists.txt",
        "cmake/utils.cmake",
        "setup.py",
        "vllm/ops/kernel.cpp",
        "vllm/ops/kernel.c",
        "csrc/ops.h",
        "vllm/kernels/x.cuh",
    ],
)
def test_refuses_native_sources_naming_patch_and_file(
    fx: Fixture, tmp_path: Path, path: str
) -> None:
    """A patch touching a native source is refused with the patch and file named; no output."""
    patches = [*fx.patches, make_patch("vllm/0003-native.patch", {path: "modify"})]
    with pytest.raises(NativeSourceError) as err:
        fx.build(tmp_path / "dist", patches)
    assert err.value.details[0].startswith(f"vllm/0003-native.patch: {path}: ")
    assert not (tmp_path / "dist").exists()


def test_native_refusal_lists_every_offender() -> None:
    """All native files of all patches are listed in one error."""
    patches = [
        make_patch("vllm/0001-a.patch", {"csrc/a.cu": "modify", "vllm/a.py": "modify"}),
        make_patch("vllm/0002-b.patch", {"setup.py": "modify"}),
    ]
    with pytest.raises(NativeSourceError) as err:
        refuse_native(patches)
    assert len(err.value.details) == 2


@pytest.mark.parametrize(
    "path", ["vllm/config/model.py", "tests/test_cmake_utils.py", "docs/setup.md", "vllm/x.json"]
)
def test_python_and_data_files_are_not_native(path: str) -> None:
    """Python, docs and package data are not native sources."""
    assert native_reason(path) is None


def test_proof_allows_only_documented_differences(fx: Fixture) -> None:
    """_version.py may differ and vendored files may be wheel-only; nothing else may."""
    with zipfile.ZipFile(fx.base) as zf:
        prove_base(zf, fx.pristine, WHEEL_PIN)


@pytest.mark.parametrize(
    ("extra", "pristine_change", "message"),
    [
        ({"vllm/a.py": b"A = 99\n"}, {}, "vllm/a.py: wheel and sdist differ"),
        ({"vllm/extra.py": b""}, {}, "vllm/extra.py: in the wheel but not in the sdist"),
        ({}, {"vllm/only_sdist.py": b""}, "vllm/only_sdist.py: in the sdist but not in the wheel"),
    ],
)
def test_proof_refuses_any_other_difference(
    tmp_path: Path, extra: dict[str, bytes], pristine_change: dict[str, bytes], message: str
) -> None:
    """A .py that differs, or exists on one side only outside the documented sets, is refused."""
    fx = Fixture(tmp_path)
    make_base_wheel(fx.base, extra)
    write_tree(fx.pristine, pristine_change)
    with pytest.raises(WheelError) as err:
        fx.build(tmp_path / "dist")
    assert message in err.value.details
    assert not (tmp_path / "dist").exists()


def test_overlay_must_fit_the_base_wheel(tmp_path: Path) -> None:
    """Adding a file the wheel already has, or changing one whose wheel copy is not the
    preimage, is refused."""
    fx = Fixture(tmp_path)
    write_tree(fx.tree, {"vllm/configs/x.json": b"{1}\n", "vllm/_version.py": b"v = 2\n"})
    patches = [
        make_patch("vllm/0001-a.patch", {"vllm/configs/x.json": "modify"}),
        make_patch("vllm/0002-b.patch", {"vllm/_version.py": "modify"}),
    ]
    make_base_wheel(fx.base, {"vllm/configs/x.json": b"[]\n"})
    with pytest.raises(WheelError) as err:
        fx.build(tmp_path / "dist", patches)
    assert any(
        "vllm/configs/x.json: the wheel's copy is not the sdist's" in d for d in err.value.details
    )
    assert any("vllm/_version.py: the wheel's copy" in d for d in err.value.details)


def test_verify_detects_a_member_that_disagrees_with_record(fx: Fixture, tmp_path: Path) -> None:
    """Re-opening a wheel whose member bytes changed after RECORD was written fails, naming it."""
    built = fx.build(tmp_path / "dist")
    tampered = tmp_path / "tampered.whl"
    with zipfile.ZipFile(built.path) as src, zipfile.ZipFile(tampered, "w") as dst:
        for info in src.infolist():
            data = src.read(info)
            if info.filename == "vllm/a.py":
                data = b"A = 3\n"
            dst.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED)
    verify_wheel(built.path)
    with pytest.raises(WheelError) as err:
        verify_wheel(tampered)
    assert len(err.value.details) == 1 and err.value.details[0].startswith("vllm/a.py: RECORD says")


def test_verify_detects_non_canonical_archives(fx: Fixture, tmp_path: Path) -> None:
    """Wrong order, dates or modes are each reported."""
    built = fx.build(tmp_path / "dist")
    odd = tmp_path / "odd.whl"
    with zipfile.ZipFile(built.path) as src, zipfile.ZipFile(odd, "w") as dst:
        infos = src.infolist()
        for info in [infos[1], infos[0], *infos[2:]]:
            copy = zipfile.ZipInfo(info.filename, date_time=info.date_time)
            copy.external_attr = info.external_attr
            if info.filename == "vllm/a.py":
                copy.date_time = (2020, 1, 1, 0, 0, 0)
                copy.external_attr = 0o100600 << 16
            dst.writestr(copy, src.read(info), compress_type=zipfile.ZIP_DEFLATED)
    with pytest.raises(WheelError) as err:
        verify_wheel(odd)
    text = "\n".join(err.value.details)
    assert "not in canonical order" in text
    assert "vllm/a.py: date" in text and "vllm/a.py: mode" in text


def test_tiny_overlay_wheel_installs_with_pip(fx: Fixture, tmp_path: Path) -> None:
    """pip accepts the renamed wheel (file name, .dist-info and METADATA versions agree)."""
    built = fx.build(tmp_path / "dist")
    target = tmp_path / "site"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--no-index",
            "--target",
            str(target),
            "--no-compile",
            "--disable-pip-version-check",
            str(built.path),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (target / "vllm" / "new.py").read_bytes() == b"NEW = 1\n"
    assert (target / f"vllm-{built.version}.dist-info" / "METADATA").is_file()


# ----------------------------------------------------------------------------- the CLI command


def _tiny_sdist(files: Mapping[str, bytes]) -> bytes:
    import io
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for rel, data in sorted(files.items()):
            info = tarfile.TarInfo(f"vllm-0.26.0/{rel}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@pytest.fixture
def wheel_ws(ws: Workspace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Workspace:
    """A workspace whose pins are a tiny vLLM-shaped sdist and wheel, already in the cache."""
    cache = tmp_path / "cache"
    cache.mkdir()
    sdist = _tiny_sdist(PRISTINE)
    (cache / "vllm-0.26.0.tar.gz").write_bytes(sdist)
    wheel = make_base_wheel(cache / BASE_NAME)
    (ws.repo / "pins.toml").write_text(
        "schema_version = 1\n"
        "[vllm.sdist]\n"
        'requirement = "vllm==0.26.0"\nfilename = "vllm-0.26.0.tar.gz"\n'
        f'sha256 = "{sha256_bytes(sdist)}"\npip_args = []\ntop_dir = "vllm-0.26.0"\n'
        "[vllm.sdist.env]\n"
        "[vllm.wheel]\n"
        f'requirement = "vllm==0.26.0"\nfilename = "{BASE_NAME}"\n'
        f'sha256 = "{sha256_file(wheel)}"\npip_args = []\n'
        'differs_from_sdist = ["vllm/_version.py"]\nbuild_only_py = ["vllm/vendored/"]\n'
        "[vllm.wheel.env]\n"
    )
    monkeypatch.setenv("PATCHSET_CACHE", str(cache))
    return ws


def test_cli_wheel_applies_verifies_and_writes_receipt(
    wheel_ws: Workspace, capsys: pytest.CaptureFixture[str]
) -> None:
    """`patchset wheel` applies the series, builds the wheel and receipt; a rerun is identical."""
    from patchset.receipt import read_receipt

    change = {"vllm/a.py": (PRISTINE["vllm/a.py"], b"A = 42\n"), "tests/test_b.py": (None, b"")}
    wheel_ws.setup(PRISTINE, [("vllm/0001-a.patch", patch_bytes(change))])
    out = wheel_ws.repo / "dist"
    argv = ["-C", str(wheel_ws.repo), "wheel", "--tree", str(wheel_ws.tree)]
    assert main(argv) == 0
    receipt = read_receipt(out / "receipt.json")
    assert [(f["path"], f["op"]) for f in receipt["overlay"]] == [("vllm/a.py", "modify")]
    assert receipt["not_carried"] == ["tests/test_b.py"]
    first = (out / receipt["wheel"]["filename"]).read_bytes()
    with zipfile.ZipFile(out / receipt["wheel"]["filename"]) as zf:
        assert zf.read("vllm/a.py") == b"A = 42\n"
    assert main(argv) == 0  # already applied: still builds, same bytes
    assert (out / receipt["wheel"]["filename"]).read_bytes() == first
    assert "Built " in capsys.readouterr().out


def test_cli_wheel_refuses_native_patch_before_applying(
    wheel_ws: Workspace, capsys: pytest.CaptureFixture[str]
) -> None:
    """A series with a csrc/ change exits 1 naming patch and file; the tree is not touched."""

    good = {"vllm/a.py": (PRISTINE["vllm/a.py"], b"A = 42\n")}
    native = {"csrc/k.cu": (PRISTINE["csrc/k.cu"], b"// faster kernel\n")}
    wheel_ws.setup(
        PRISTINE,
        [("vllm/0001-a.patch", patch_bytes(good)), ("vllm/0002-k.patch", patch_bytes(native))],
    )
    before = snapshot(wheel_ws.tree)
    assert main(["-C", str(wheel_ws.repo), "wheel", "--tree", str(wheel_ws.tree)]) == 1
    err = capsys.readouterr().err
    assert "patchset: error: the overlay wheel cannot carry native changes" in err
    assert "vllm/0002-k.patch: csrc/k.cu: csrc/ is compiled" in err
    assert snapshot(wheel_ws.tree) == before
    assert not (wheel_ws.repo / "dist").exists()


def test_cli_wheel_holds_the_tree_lock_and_packs_only_locked_bytes(
    wheel_ws: Workspace, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """While `wheel` builds, an `unapply` of the same tree is refused (TreeBusy); a file changed
    behind the lock's back is not packed: wheel exits 1 and writes neither wheel nor receipt."""
    import subprocess
    import sys

    import patchset.wheel as wheel_module

    change = {"vllm/a.py": (PRISTINE["vllm/a.py"], b"A = 42\n")}
    wheel_ws.setup(PRISTINE, [("vllm/0001-a.patch", patch_bytes(change))])
    real_prove = wheel_module.prove_base
    seen: dict[str, subprocess.CompletedProcess] = {}

    def prove_then_race(*args, **kwargs):
        real_prove(*args, **kwargs)
        seen["unapply"] = subprocess.run(
            [sys.executable, "-m", "patchset", "-C", str(wheel_ws.repo), "unapply"]
            + ["--tree", str(wheel_ws.tree), "--wait", "0.3"],
            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "tools")},
            capture_output=True,
            text=True,
        )
        (wheel_ws.tree / "vllm/a.py").write_bytes(b"A = 1  # edited behind the lock\n")

    monkeypatch.setattr(wheel_module, "prove_base", prove_then_race)
    argv = ["-C", str(wheel_ws.repo), "wheel", "--tree", str(wheel_ws.tree)]
    assert main(argv) == 1
    assert seen["unapply"].returncode == 1
    assert "locked by another patchset process" in seen["unapply"].stderr
    err = capsys.readouterr().err
    assert "vllm/a.py" in err and "not the postimage in series.lock" in err
    out = wheel_ws.repo / "dist"
    assert not out.exists() or not [p for p in out.iterdir() if p.suffix in (".whl", ".json")]


def test_cli_wheel_removes_temp_files_of_killed_runs_only(
    wheel_ws: Workspace, capsys: pytest.CaptureFixture[str]
) -> None:
    """A `.wheel-*.tmp` left by a killed run is removed by the next build; one that a live
    build holds (flock) is left alone."""
    change = {"vllm/a.py": (PRISTINE["vllm/a.py"], b"A = 42\n")}
    wheel_ws.setup(PRISTINE, [("vllm/0001-a.patch", patch_bytes(change))])
    out = wheel_ws.repo / "dist"
    out.mkdir()
    stale = out / ".wheel-killed.tmp"
    stale.write_bytes(b"x" * 1000)
    live = out / ".wheel-live.tmp"
    live.write_bytes(b"y")
    for path in (stale, live):
        os.utime(path, (1, 1))
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, sys, time\nf = open(sys.argv[1], 'rb+')\n"
            "fcntl.flock(f, fcntl.LOCK_EX)\nprint('locked', flush=True)\ntime.sleep(60)\n",
            str(live),
        ],
        stdout=subprocess.PIPE,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"locked\n"
        assert main(["-C", str(wheel_ws.repo), "wheel", "--tree", str(wheel_ws.tree)]) == 0
        assert not stale.exists() and live.exists()
        assert "removed 1 temporary file(s) of killed wheel runs" in capsys.readouterr().out
    finally:
        holder.kill()
        holder.wait()


def test_cli_wheel_blames_a_corrupted_build_base_not_the_pins(
    wheel_ws: Workspace, capsys: pytest.CaptureFixture[str]
) -> None:
    change = {"vllm/a.py": (PRISTINE["vllm/a.py"], b"A = 42\n")}
    wheel_ws.setup(PRISTINE, [("vllm/0001-a.patch", patch_bytes(change))])
    argv = ["-C", str(wheel_ws.repo), "wheel", "--tree", str(wheel_ws.tree)]
    assert main(argv) == 0
    damaged = wheel_ws.repo / "build/base/vllm/vllm/gone.py"
    os.chmod(damaged, 0o644)
    damaged.write_bytes(b"tampered\n")
    capsys.readouterr()
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "build/base/vllm" in err and "vllm/gone.py" in err and "pinned sdist" in err
    assert "pins.toml" not in err


B12X_PRISTINE: dict[str, bytes] = {
    "b12x/__init__.py": b"from b12x.comm import pcie\n",
    "b12x/comm/pcie.py": b"def launcher():\n    return 'bare'\n",
    "b12x/loader/k.c": b"/* runtime-compiled package data */\n",
    "tests/test_pcie.py": b"def test_pcie():\n    pass\n",
}
B12X_WHEEL_PIN = Pin(
    target="b12x",
    kind="wheel",
    requirement="b12x==1.5.1",
    filename="b12x-1.5.1-py3-none-any.whl",
    sha256="0" * 64,
)


def make_b12x_wheel(path: Path) -> Path:
    """A small wheel shaped like b12x's: a pure-Python package with package data."""
    files = {k: v for k, v in B12X_PRISTINE.items() if k.startswith("b12x/")}
    dist = "b12x-1.5.1.dist-info"
    files[f"{dist}/METADATA"] = b"Metadata-Version: 2.4\nName: b12x\nVersion: 1.5.1\n\nb12x.\n"
    files[f"{dist}/WHEEL"] = b"Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    rows = [RecordEntry.of(name, data) for name, data in files.items()]
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in files.items():
            zf.writestr(zipfile.ZipInfo(name, date_time=(2026, 5, 1, 0, 0, 0)), data)
        zf.writestr(f"{dist}/RECORD", write_record(rows, f"{dist}/RECORD"))
    return path


def test_b12x_overlay_wheel_carries_only_the_b12x_package(tmp_path: Path) -> None:
    """With package_dir b12x/, the overlay lays b12x/ files over the b12x wheel, leaves tests/
    out, labels the version 1.5.1+dcp.<digest>, verifies, and rebuilds byte for byte."""
    base = make_b12x_wheel(tmp_path / "b12x-1.5.1-py3-none-any.whl")
    pristine = write_tree(tmp_path / "pristine", B12X_PRISTINE)
    patched = dict(B12X_PRISTINE)
    patched["b12x/comm/pcie.py"] = b"def launcher():\n    return 'attached'\n"
    patched["tests/test_launcher.py"] = b"def test_launcher():\n    pass\n"
    tree = write_tree(tmp_path / "tree", patched)
    patches = [
        make_patch(
            "b12x/0001-a.patch", {"b12x/comm/pcie.py": "modify", "tests/test_launcher.py": "add"}
        )
    ]
    builds = [
        build_wheel(
            base_wheel=base,
            wheel_pin=B12X_WHEEL_PIN,
            pristine=pristine,
            tree=tree,
            patches=patches,
            out_dir=tmp_path / out,
            package_dir="b12x/",
        )
        for out in ("one", "two")
    ]
    one, two = builds
    assert one.version == f"1.5.1+dcp.{series_digest(patches)[:12]}"
    assert one.path.name == f"b12x-{one.version}-py3-none-any.whl"
    assert one.path.read_bytes() == two.path.read_bytes()
    assert [(f.path, f.op) for f in one.overlay.files] == [("b12x/comm/pcie.py", "modify")]
    assert one.overlay.not_carried == ("tests/test_launcher.py",)
    verify_wheel(one.path)
    with zipfile.ZipFile(one.path) as zf:
        assert zf.read("b12x/comm/pcie.py") == patched["b12x/comm/pcie.py"]
        assert zf.read("b12x/loader/k.c") == B12X_PRISTINE["b12x/loader/k.c"]
        assert not any(n.startswith("tests/") for n in zf.namelist())


def test_b12x_base_proof_reads_the_b12x_package(tmp_path: Path) -> None:
    """prove_base with package_dir b12x/ compares b12x/**/*.py and names a differing file."""
    base = make_b12x_wheel(tmp_path / "b12x-1.5.1-py3-none-any.whl")
    pristine = write_tree(tmp_path / "pristine", B12X_PRISTINE)
    with zipfile.ZipFile(base) as zf:
        prove_base(zf, pristine, B12X_WHEEL_PIN, "b12x/")
    (pristine / "b12x/comm/pcie.py").write_bytes(b"changed = 1\n")
    with zipfile.ZipFile(base) as zf, pytest.raises(WheelError) as exc:
        prove_base(zf, pristine, B12X_WHEEL_PIN, "b12x/")
    assert exc.value.details == ["b12x/comm/pcie.py: wheel and sdist differ"]


def test_cli_wheel_without_b12x_patches_removes_a_stale_b12x_overlay(
    wheel_ws: Workspace, capsys: pytest.CaptureFixture[str]
) -> None:
    """`patchset wheel` on a series without b12x patches builds only the vLLM wheel and removes
    a b12x overlay wheel and receipt an earlier series left in dist/ (the test venv would
    otherwise install them)."""
    change = {"vllm/a.py": (PRISTINE["vllm/a.py"], b"A = 42\n")}
    wheel_ws.setup(PRISTINE, [("vllm/0001-a.patch", patch_bytes(change))])
    out = wheel_ws.repo / "dist"
    out.mkdir()
    stale = [out / "receipt-b12x.json", out / "b12x-1.5.1+dcp.0123456789ab-py3-none-any.whl"]
    for path in stale:
        path.write_bytes(b"old")
    keep = out / "b12x-1.5.1-py3-none-any.whl"
    keep.write_bytes(b"not an overlay")
    assert main(["-C", str(wheel_ws.repo), "wheel", "--tree", str(wheel_ws.tree)]) == 0
    assert not any(path.exists() for path in stale)
    assert keep.exists() and (out / "receipt.json").is_file()
    assert "removing receipt-b12x.json: the series has no b12x patches" in capsys.readouterr().out


def test_a_full_disk_at_the_receipt_leaves_the_old_wheel_and_receipt(
    wheel_ws: Workspace, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 32: the receipt is written last; when that fails the new wheel is removed, so the
    receipt and the wheels beside it still agree."""
    import errno

    import patchset.receipt as receipt_module

    first = {"vllm/a.py": (PRISTINE["vllm/a.py"], b"A = 42\n")}
    wheel_ws.setup(PRISTINE, [("vllm/0001-a.patch", patch_bytes(first))])
    out = wheel_ws.repo / "dist"
    argv = ["-C", str(wheel_ws.repo), "wheel", "--tree", str(wheel_ws.tree)]
    assert main(argv) == 0
    before = snapshot(out)
    second = {"vllm/a.py": (b"A = 42\n", b"A = 43\n")}
    wheel_ws.add_patch("vllm/0002-b.patch", patch_bytes(second, subject="[Test] B"))
    wheel_ws.write_series(["vllm/0001-a.patch", "vllm/0002-b.patch"])
    assert wheel_ws.cli("lock") == 0

    def full(*_args: object, **_kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", str(out / "receipt.json"))

    monkeypatch.setattr(receipt_module, "write_receipt", full)
    capsys.readouterr()
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "No space left on device" in err and "roll" not in err, err
    assert snapshot(out) == before


def test_cli_wheel_platform_builds_beside_the_default_and_keeps_it(
    wheel_ws: Workspace, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--platform aarch64` overlays the [vllm.wheel_aarch64] base and writes
    receipt-aarch64.json; the x86_64 overlay and receipt.json stay; an arch without a pin
    exits 1 naming the pinned ones."""
    from patchset.receipt import read_receipt

    cache = Path(os.environ["PATCHSET_CACHE"])
    arm_name = BASE_NAME.replace("x86_64", "aarch64")
    arm = make_base_wheel(cache / arm_name)
    with (wheel_ws.repo / "pins.toml").open("a") as fh:
        fh.write(
            "[vllm.wheel_aarch64]\n"
            f'requirement = "vllm==0.26.0"\nfilename = "{arm_name}"\n'
            f'sha256 = "{sha256_file(arm)}"\npip_args = []\n'
            'differs_from_sdist = ["vllm/_version.py"]\nbuild_only_py = ["vllm/vendored/"]\n'
            "[vllm.wheel_aarch64.env]\n"
        )
    change = {"vllm/a.py": (PRISTINE["vllm/a.py"], b"A = 42\n")}
    wheel_ws.setup(PRISTINE, [("vllm/0001-a.patch", patch_bytes(change))])
    out = wheel_ws.repo / "dist"
    argv = ["-C", str(wheel_ws.repo), "wheel", "--tree", str(wheel_ws.tree)]
    assert main(argv) == 0
    assert main([*argv, "--platform", "aarch64"]) == 0
    x86, arm_receipt = (
        read_receipt(out / "receipt.json"),
        read_receipt(out / "receipt-aarch64.json"),
    )
    assert x86["base"]["wheel"]["filename"] == BASE_NAME
    assert arm_receipt["base"]["wheel"]["filename"] == arm_name
    assert arm_receipt["wheel"]["filename"] == x86["wheel"]["filename"].replace("x86_64", "aarch64")
    assert sorted(p.name for p in out.glob("*.whl")) == sorted(
        [x86["wheel"]["filename"], arm_receipt["wheel"]["filename"]]
    )
    capsys.readouterr()
    assert main([*argv, "--platform", "ppc64le"]) == 1
    err = capsys.readouterr().err
    assert "no vllm wheel pinned for ppc64le" in err and "aarch64 [vllm.wheel_aarch64]" in err
