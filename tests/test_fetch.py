"""fetch: pip download into a verified cache, offline reuse, tamper detection, safe unpacking."""

from __future__ import annotations

import io
import json
import os
import stat
import tarfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest
from patchset.errors import HashMismatch, PatchsetError, PinError
from patchset.fetch import (
    cache_dir,
    extract_sdist,
    fetch_all,
    fetch_pin,
    pinned_file,
    pristine_manifest,
    pristine_tree,
    unpack_sdist,
)
from patchset.hashing import sha256_bytes
from patchset.pins import Pin, Pins


def make_sdist(files: Mapping[str, bytes], top: str = "pkg-1.0") -> bytes:
    """A .tar.gz whose members are ``top/<path>`` for each file (directories implied)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        root = tarfile.TarInfo(top)
        root.type = tarfile.DIRTYPE
        tar.addfile(root)
        for path, data in files.items():
            info = tarfile.TarInfo(f"{top}/{path}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


SDIST = make_sdist({"pkg/__init__.py": b"X = 1\n", "tests/test_pkg.py": b"def test(): pass\n"})


def sdist_pin(data: bytes = SDIST) -> Pin:
    return Pin(
        target="pkg",
        kind="sdist",
        requirement="pkg==1.0",
        filename="pkg-1.0.tar.gz",
        sha256=sha256_bytes(data),
        pip_args=("--no-binary", "pkg"),
        env=(("PKG_MODE", "empty"),),
        top_dir="pkg-1.0",
    )


class StubPip:
    """Stands in for ``pip download``: records each call and writes ``files`` into --dest."""

    def __init__(self, files: Mapping[str, bytes]):
        self.files = files
        self.calls: list[tuple[list[str], dict[str, str]]] = []

    def __call__(self, args: Sequence[str], env: Mapping[str, str]) -> None:
        self.calls.append((list(args), dict(env)))
        dest = Path(args[args.index("--dest") + 1])
        for name, data in self.files.items():
            (dest / name).write_bytes(data)


def test_downloads_with_pip_no_deps_and_pin_env(tmp_path: Path) -> None:
    """A missing file is fetched with `pip download --no-deps` under the pin's env, then cached."""
    pip = StubPip({"pkg-1.0.tar.gz": SDIST})
    got = fetch_pin(sdist_pin(), tmp_path, pip=pip)
    assert got.action == "downloaded"
    assert got.path == tmp_path / "pkg-1.0.tar.gz" and got.path.read_bytes() == SDIST
    ((args, env),) = pip.calls
    assert args[:2] == ["download", "--no-deps"]
    assert args[-3:] == ["--no-binary", "pkg", "pkg==1.0"]
    assert env == {"PKG_MODE": "empty"}
    assert [p.name for p in tmp_path.iterdir()] == ["pkg-1.0.tar.gz"]


def test_cached_file_is_rehashed_and_pip_not_called(tmp_path: Path) -> None:
    """Once cached, fetching (online or offline) verifies the file and never runs pip."""
    fetch_pin(sdist_pin(), tmp_path, pip=StubPip({"pkg-1.0.tar.gz": SDIST}))
    pip = StubPip({})
    assert fetch_pin(sdist_pin(), tmp_path, pip=pip).action == "cached"
    assert fetch_pin(sdist_pin(), tmp_path, offline=True, pip=pip).action == "cached"
    assert pip.calls == []


def test_offline_without_cache_refuses_without_pip(tmp_path: Path) -> None:
    """--offline with an empty cache is a PinError and pip is not called."""
    pip = StubPip({"pkg-1.0.tar.gz": SDIST})
    with pytest.raises(PinError, match="not in the cache"):
        fetch_pin(sdist_pin(), tmp_path, offline=True, pip=pip)
    assert pip.calls == []


def test_tampered_cache_file_is_detected_deleted_and_reported(tmp_path: Path) -> None:
    """A cached file with one byte changed raises HashMismatch naming it, and is deleted."""
    cached = fetch_pin(sdist_pin(), tmp_path, pip=StubPip({"pkg-1.0.tar.gz": SDIST})).path
    data = bytearray(cached.read_bytes())
    data[100] ^= 0x01
    cached.write_bytes(bytes(data))
    with pytest.raises(HashMismatch) as err:
        fetch_pin(sdist_pin(), tmp_path, offline=True, pip=StubPip({}))
    assert str(cached) in err.value.message and "deleted" in err.value.message
    assert err.value.exit_code == 1
    assert not cached.exists()
    # the next (online) fetch downloads it afresh
    assert fetch_pin(sdist_pin(), tmp_path, pip=StubPip({"pkg-1.0.tar.gz": SDIST})).path.is_file()


def test_download_with_wrong_hash_is_not_kept(tmp_path: Path) -> None:
    """pip returning different bytes under the pinned name is a HashMismatch; cache stays empty."""
    with pytest.raises(HashMismatch, match="pkg.sdist: downloaded pkg-1.0.tar.gz has sha256"):
        fetch_pin(sdist_pin(), tmp_path, pip=StubPip({"pkg-1.0.tar.gz": SDIST + b"\0"}))
    assert list(tmp_path.iterdir()) == []


def test_download_of_another_file_name_is_refused(tmp_path: Path) -> None:
    """pip producing some other file (another build, another version) is a PinError naming it."""
    with pytest.raises(PinError) as err:
        fetch_pin(sdist_pin(), tmp_path, pip=StubPip({"pkg-1.1.tar.gz": SDIST}))
    assert "pkg-1.1.tar.gz" in err.value.details[0]
    assert list(tmp_path.iterdir()) == []


def test_fetch_all_tries_every_pin_and_reports_all(tmp_path: Path) -> None:
    """Every pin is attempted; the error lists each failure and is a HashMismatch if any was."""
    good = sdist_pin()
    other = Pin("oth", "sdist", "oth==1", "oth-1.tar.gz", "0" * 64, top_dir="oth-1")
    missing = Pin("mis", "sdist", "mis==1", "mis-1.tar.gz", "1" * 64, top_dir="mis-1")
    pins = Pins(tmp_path / "pins.toml", (other, good, missing))
    pip = StubPip({"pkg-1.0.tar.gz": SDIST, "oth-1.tar.gz": b"not it"})
    with pytest.raises(HashMismatch) as err:
        fetch_all(pins, tmp_path / "c", pip=pip)
    assert len(err.value.details) == 2
    assert "oth.sdist" in err.value.details[0] and "mis.sdist" in err.value.details[1]
    assert (tmp_path / "c" / "pkg-1.0.tar.gz").is_file()


def test_seed_from_directory_is_verified(tmp_path: Path) -> None:
    """--from DIR copies the pinned file from DIR (or a subdirectory), verified, without pip."""
    source = tmp_path / "dl" / "sdist"
    source.mkdir(parents=True)
    (source / "pkg-1.0.tar.gz").write_bytes(SDIST)
    pip = StubPip({})
    got = fetch_pin(sdist_pin(), tmp_path / "c", offline=True, source=tmp_path / "dl", pip=pip)
    assert got.action == "copied" and pip.calls == []
    (source / "pkg-1.0.tar.gz").write_bytes(SDIST[:-1])
    with pytest.raises(HashMismatch):
        fetch_pin(sdist_pin(), tmp_path / "d", source=tmp_path / "dl", pip=pip)


def test_cache_dir_honours_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """PATCHSET_CACHE overrides <root>/.cache/patchset."""
    monkeypatch.delenv("PATCHSET_CACHE", raising=False)
    assert cache_dir(tmp_path) == tmp_path / ".cache" / "patchset"
    monkeypatch.setenv("PATCHSET_CACHE", str(tmp_path / "elsewhere"))
    assert cache_dir(tmp_path) == (tmp_path / "elsewhere").resolve()


# ----------------------------------------------------------------------------- unpacking


def test_unpack_writes_top_dir_contents(tmp_path: Path) -> None:
    """The sdist's top directory's contents land directly in dest."""
    archive = tmp_path / "pkg-1.0.tar.gz"
    archive.write_bytes(SDIST)
    extract_sdist(archive, "pkg-1.0", tmp_path / "tree")
    assert (tmp_path / "tree" / "pkg" / "__init__.py").read_bytes() == b"X = 1\n"
    assert sorted(p.name for p in (tmp_path / "tree").iterdir()) == ["pkg", "tests"]


def test_unpack_refuses_non_empty_destination(tmp_path: Path) -> None:
    """An existing non-empty directory (or a file) is never unpacked into; an empty one is."""
    archive = tmp_path / "pkg-1.0.tar.gz"
    archive.write_bytes(SDIST)
    dest = tmp_path / "tree"
    dest.mkdir()
    (dest / "mine.txt").write_text("keep")
    with pytest.raises(PatchsetError, match="not an empty directory"):
        extract_sdist(archive, "pkg-1.0", dest)
    assert [p.name for p in dest.iterdir()] == ["mine.txt"]
    (tmp_path / "empty").mkdir()
    extract_sdist(archive, "pkg-1.0", tmp_path / "empty")
    assert (tmp_path / "empty" / "pkg").is_dir()


def _evil_tar(kind: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        ok = tarfile.TarInfo("pkg-1.0/ok.py")
        ok.size = 1
        tar.addfile(ok, io.BytesIO(b"x"))
        if kind == "dotdot":
            bad = tarfile.TarInfo("pkg-1.0/../../escape.py")
        elif kind == "absolute":
            bad = tarfile.TarInfo("/tmp/escape.py")
        elif kind == "outside":
            bad = tarfile.TarInfo("other/escape.py")
        elif kind == "symlink":
            bad = tarfile.TarInfo("pkg-1.0/link")
            bad.type = tarfile.SYMTYPE
            bad.linkname = "/etc/passwd"
        else:
            bad = tarfile.TarInfo("pkg-1.0/hard")
            bad.type = tarfile.LNKTYPE
            bad.linkname = "pkg-1.0/ok.py"
        data = b"" if bad.type in (tarfile.SYMTYPE, tarfile.LNKTYPE) else b"evil"
        bad.size = len(data)
        tar.addfile(bad, io.BytesIO(data))
    return buf.getvalue()


@pytest.mark.parametrize("kind", ["dotdot", "absolute", "outside", "symlink", "hardlink"])
def test_unpack_refuses_path_escapes_and_links(tmp_path: Path, kind: str) -> None:
    """A member escaping the top directory, or a link, refuses the whole unpack: nothing written."""
    archive = tmp_path / "pkg-1.0.tar.gz"
    archive.write_bytes(_evil_tar(kind))
    work = tmp_path / "work"
    work.mkdir()
    with pytest.raises(PinError, match="unsafe member"):
        extract_sdist(archive, "pkg-1.0", work / "tree")
    assert list(work.iterdir()) == []
    assert not (tmp_path / "escape.py").exists()


# ----------------------------------------------------------------------------- repo-level helpers


def make_repo(tmp_path: Path, data: bytes = SDIST) -> Path:
    """A repository root whose pins.toml pins ``data`` as [pkg.sdist], seeded into its cache."""
    root = tmp_path / "repo"
    root.mkdir()
    (root / "pins.toml").write_text(
        "schema_version = 1\n[pkg.sdist]\n"
        'requirement = "pkg==1.0"\nfilename = "pkg-1.0.tar.gz"\n'
        f'sha256 = "{sha256_bytes(data)}"\npip_args = []\ntop_dir = "pkg-1.0"\n'
        "[pkg.sdist.env]\n"
    )
    cache = root / ".cache" / "patchset"
    cache.mkdir(parents=True)
    (cache / "pkg-1.0.tar.gz").write_bytes(data)
    return root


def test_pinned_file_and_unpack_use_the_repo_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pinned_file returns the verified cached path; unpack_sdist unpacks it into dest."""
    monkeypatch.delenv("PATCHSET_CACHE", raising=False)
    root = make_repo(tmp_path)
    assert pinned_file("pkg", "sdist", root=root, offline=True).read_bytes() == SDIST
    unpack_sdist("pkg", tmp_path / "t", root=root, offline=True)
    assert (tmp_path / "t" / "tests" / "test_pkg.py").is_file()


def test_pristine_tree_is_read_only_and_reused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pristine tree is unpacked once with read-only files, then returned as is."""
    monkeypatch.delenv("PATCHSET_CACHE", raising=False)
    root = make_repo(tmp_path)
    tree = pristine_tree("pkg", root=root, offline=True)
    assert tree == root / "build" / "base" / "pkg"
    init = tree / "pkg" / "__init__.py"
    assert stat.S_IMODE(init.stat().st_mode) & 0o222 == 0
    marker = tree / "marker"
    marker.write_text("second call must not re-unpack")
    assert pristine_tree("pkg", root=root, offline=True) == tree
    assert marker.is_file()
    # an interrupted unpack (no stamp) is redone from scratch
    (root / "build" / "base" / "pkg.pin").unlink()
    assert pristine_tree("pkg", root=root, offline=True) == tree
    assert not marker.exists() and init.read_bytes() == b"X = 1\n"
    os.chmod(init, 0o644)


def test_an_edited_pristine_list_is_unpacked_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stamp vouches for the file list too: an edited list is a stale unpack, made again."""
    monkeypatch.delenv("PATCHSET_CACHE", raising=False)
    root = make_repo(tmp_path)
    tree = pristine_tree("pkg", root=root, offline=True)
    listing = root / "build" / "base" / "pkg.files.json"
    good = pristine_manifest("pkg", root=root)
    assert good["pkg/__init__.py"] == sha256_bytes(b"X = 1\n")
    listing.write_text(listing.read_text().replace(good["pkg/__init__.py"], "0" * 64))
    with pytest.raises(PinError, match="is not the file list"):
        pristine_manifest("pkg", root=root)
    assert pristine_tree("pkg", root=root, offline=True) == tree
    assert pristine_manifest("pkg", root=root) == good


def test_lock_names_an_edited_pristine_file_instead_of_trusting_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`lock` and `lock --check` read the pristine base file by file against its unpacked
    list: an edited build/base file is named and series.lock is not rewritten (issue 48, N7;
    before, the lock was recomputed from the edited file with exit 0)."""
    from conftest import patch_bytes
    from patchset.cli import main

    monkeypatch.delenv("PATCHSET_CACHE", raising=False)
    source = b"".join(b"x%d = %d\n" % (i, i) for i in range(8))
    data = make_sdist({"pkg/mod.py": source}, top="vllm-1.0")
    root = tmp_path / "repo"
    (root / ".cache" / "patchset").mkdir(parents=True)
    (root / ".cache" / "patchset" / "vllm-1.0.tar.gz").write_bytes(data)
    (root / "pins.toml").write_text(
        "schema_version = 1\n[vllm.sdist]\n"
        'requirement = "vllm==1.0"\nfilename = "vllm-1.0.tar.gz"\n'
        f'sha256 = "{sha256_bytes(data)}"\npip_args = []\ntop_dir = "vllm-1.0"\n'
        "[vllm.sdist.env]\n"
    )
    (root / "patches" / "vllm").mkdir(parents=True)
    changed = source.replace(b"x3 = 3\n", b"x3 = 30\n")
    name = "vllm/0001-three.patch"
    (root / "patches" / name).write_bytes(patch_bytes({"pkg/mod.py": (source, changed)}))
    (root / "series").write_text(name + "\n")
    assert main(["-C", str(root), "lock"]) == 0
    lock = (root / "series.lock").read_bytes()
    edited = root / "build" / "base" / "vllm" / "pkg" / "mod.py"
    os.chmod(edited, 0o644)
    edited.write_bytes(source.replace(b"x0 = 0\n", b"x0 = 'edited'\n"))
    capsys.readouterr()
    assert main(["-C", str(root), "lock"]) == 1
    assert main(["-C", str(root), "lock", "--check"]) == 1
    err = capsys.readouterr().err
    assert f"{edited.relative_to(root / 'build' / 'base' / 'vllm')}" in err
    assert "the unpacked base was edited" in err
    assert (root / "series.lock").read_bytes() == lock


# ----------------------------------------------------------------------------- the real pip runner

FAKE_PIP = """\
import json, os, sys
from pathlib import Path
args = sys.argv[1:]
Path(os.environ["FAKE_PIP_LOG"]).write_text(json.dumps({"args": args, "env": dict(os.environ)}))
if os.environ.get("FAKE_PIP_FAIL"):
    print("ERROR: No matching distribution found", file=sys.stderr)
    sys.exit(3)
dest = Path(args[args.index("--dest") + 1])
(dest / "pkg-1.0.tar.gz").write_bytes(Path(os.environ["FAKE_PIP_SOURCE"]).read_bytes())
"""


@pytest.fixture
def fake_pip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """$PATCHSET_PIP pointing at a script that logs its argv/env and 'downloads' SDIST."""
    import sys

    script = tmp_path / "fake_pip.py"
    script.write_text(FAKE_PIP)
    source = tmp_path / "served.tar.gz"
    source.write_bytes(SDIST)
    log = tmp_path / "pip.json"
    monkeypatch.setenv("PATCHSET_PIP", f"{sys.executable} {script}")
    monkeypatch.setenv("FAKE_PIP_LOG", str(log))
    monkeypatch.setenv("FAKE_PIP_SOURCE", str(source))
    return log


def test_cli_fetch_runs_pip_download_then_works_offline(
    tmp_path: Path,
    fake_pip: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`patchset fetch` runs `pip download --no-deps --dest <tmp> <pip_args> <requirement>` with
    the pin's env; afterwards `fetch --offline` verifies the cache without running pip."""
    from patchset.cli import main

    root = make_repo(tmp_path)
    (root / ".cache" / "patchset" / "pkg-1.0.tar.gz").unlink()
    (root / "series").write_text("")
    text = (
        (root / "pins.toml")
        .read_text()
        .replace("pip_args = []", 'pip_args = ["--no-binary", "pkg"]')
    )
    (root / "pins.toml").write_text(
        text.replace("[pkg.sdist.env]\n", '[pkg.sdist.env]\nPKG_X = "1"\n')
    )
    monkeypatch.delenv("PATCHSET_CACHE", raising=False)
    assert main(["-C", str(root), "fetch"]) == 0
    call = json.loads(fake_pip.read_text())
    dest = call["args"][call["args"].index("--dest") + 1]
    assert call["args"] == [
        "download",
        "--no-deps",
        "--dest",
        dest,
        "--no-binary",
        "pkg",
        "pkg==1.0",
    ]
    assert call["env"]["PKG_X"] == "1" and call["env"]["PIP_NO_INPUT"] == "1"
    assert "downloaded" in capsys.readouterr().out
    fake_pip.unlink()
    assert main(["-C", str(root), "fetch", "--offline"]) == 0
    assert not fake_pip.exists()  # pip was not run
    assert capsys.readouterr().out.startswith("cached")


def test_cli_fetch_reports_a_failing_pip(
    tmp_path: Path,
    fake_pip: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A pip that fails exits 1 with the pip command and its last output lines."""
    from patchset.cli import main

    root = make_repo(tmp_path)
    (root / ".cache" / "patchset" / "pkg-1.0.tar.gz").unlink()
    (root / "series").write_text("")
    monkeypatch.delenv("PATCHSET_CACHE", raising=False)
    monkeypatch.setenv("FAKE_PIP_FAIL", "1")
    assert main(["-C", str(root), "fetch"]) == 1
    err = capsys.readouterr().err
    assert "patchset: error: pip failed (exit 3)" in err
    assert "No matching distribution found" in err
    assert list((root / ".cache" / "patchset").iterdir()) == []
