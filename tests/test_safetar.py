"""patchset.safetar: the same safe extraction with and without tarfile's ``data`` filter.

The fallback (``use_filter=False``, what Python < 3.11.4 runs) is forced here on any Python;
where this Python has the filter, both paths extract one archive and the results are compared.
"""

from __future__ import annotations

import io
import os
import stat
import tarfile
from pathlib import Path

import pytest
from patchset.safetar import HAS_DATA_FILTER, UnsafeArchive, extract

NO_FILTER = pytest.mark.skipif(not HAS_DATA_FILTER, reason="no PEP 706 data filter")
PATHS = [False, pytest.param(True, marks=NO_FILTER)]


def _add(tar: tarfile.TarFile, name: str, *, data: bytes = b"", **attrs: object) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = 1_700_000_000
    for key, value in attrs.items():
        setattr(info, key, value)
    tar.addfile(info, io.BytesIO(data) if info.isreg() else None)


def _normal_tar() -> bytes:
    """Directories and files with the modes a real sdist has, plus the odd ones the ``data``
    filter rewrites (set-id, group/other writable, executable only by group, unreadable,
    foreign owner)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        _add(tar, "pkg-1.0", type=tarfile.DIRTYPE, mode=0o755)
        _add(tar, "pkg-1.0/pkg", type=tarfile.DIRTYPE, mode=0o775)
        _add(tar, "pkg-1.0/pkg/__init__.py", data=b"X = 1\n", mode=0o644)
        _add(tar, "pkg-1.0/run.sh", data=b"#!/bin/sh\n", mode=0o755)
        _add(tar, "pkg-1.0/setuid", data=b"s", mode=0o4777)
        _add(tar, "pkg-1.0/group-x", data=b"g", mode=0o654)
        _add(tar, "pkg-1.0/unreadable", data=b"u", mode=0o000)
        _add(tar, "pkg-1.0/owned", data=b"o", mode=0o644, uid=4242, gid=4242, uname="x")
        _add(tar, "pkg-1.0/tests", type=tarfile.DIRTYPE, mode=0o700)
        _add(tar, "pkg-1.0/tests/test_x.py", data=b"def test(): pass\n", mode=0o664)
    return buf.getvalue()


def _snapshot(root: Path) -> dict[str, tuple[str, int, bytes | None, int]]:
    out = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(dirpath, name)
            st = path.lstat()
            kind = "dir" if stat.S_ISDIR(st.st_mode) else "file"
            data = path.read_bytes() if kind == "file" else None
            mtime = int(st.st_mtime) if kind == "file" else 0
            out[path.relative_to(root).as_posix()] = (kind, stat.S_IMODE(st.st_mode), data, mtime)
    return out


def _extract_into(archive: bytes, dest: Path, use_filter: bool) -> None:
    dest.mkdir()
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        extract(tar, tar.getmembers(), dest, use_filter=use_filter)


@pytest.mark.parametrize("use_filter", PATHS)
def test_a_normal_archive_extracts_with_the_data_filters_modes(
    tmp_path: Path, use_filter: bool
) -> None:
    """Contents and mtimes kept; modes as the ``data`` filter sets them; no foreign owner."""
    _extract_into(_normal_tar(), tmp_path / "out", use_filter)
    got = _snapshot(tmp_path / "out")
    assert got["pkg-1.0/pkg/__init__.py"] == ("file", 0o644, b"X = 1\n", 1_700_000_000)
    assert got["pkg-1.0/run.sh"][1] == 0o755
    assert got["pkg-1.0/setuid"][1] == 0o755  # no set-id bit, no group/other write
    assert got["pkg-1.0/group-x"][1] == 0o644  # executable only where the owner's bit is
    assert got["pkg-1.0/unreadable"][1] == 0o600  # the owner may always read and write
    umask = os.umask(0o022)
    os.umask(umask)
    assert {got[d][1] for d in ("pkg-1.0", "pkg-1.0/pkg", "pkg-1.0/tests")} == {0o777 & ~umask}
    assert (tmp_path / "out" / "pkg-1.0" / "owned").stat().st_uid == os.geteuid()


@pytest.mark.skipif(not HAS_DATA_FILTER, reason="this Python has no data filter to compare with")
def test_the_fallback_extracts_exactly_what_the_data_filter_extracts(tmp_path: Path) -> None:
    """Same files, bytes, modes and mtimes from both paths."""
    _extract_into(_normal_tar(), tmp_path / "filtered", True)
    _extract_into(_normal_tar(), tmp_path / "fallback", False)
    assert _snapshot(tmp_path / "fallback") == _snapshot(tmp_path / "filtered")


UNSAFE = {
    "absolute": dict(name="/tmp/escape.py", data=b"evil"),
    "dotdot": dict(name="pkg-1.0/../../escape.py", data=b"evil"),
    "backslash": dict(name="pkg-1.0\\..\\escape.py", data=b"evil"),
    "symlink": dict(name="pkg-1.0/link", type=tarfile.SYMTYPE, linkname="/etc/passwd"),
    "symlink-inside": dict(name="pkg-1.0/link", type=tarfile.SYMTYPE, linkname="ok.py"),
    "hardlink": dict(name="pkg-1.0/hard", type=tarfile.LNKTYPE, linkname="pkg-1.0/ok.py"),
    "chardev": dict(name="pkg-1.0/tty", type=tarfile.CHRTYPE, devmajor=5, devminor=0),
    "blockdev": dict(name="pkg-1.0/sda", type=tarfile.BLKTYPE, devmajor=8, devminor=0),
    "fifo": dict(name="pkg-1.0/pipe", type=tarfile.FIFOTYPE),
}


def _unsafe_tar(kind: str) -> bytes:
    spec = dict(UNSAFE[kind])
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        _add(tar, "pkg-1.0/ok.py", data=b"x", mode=0o644)
        name = str(spec.pop("name"))
        data = spec.pop("data", b"")
        _add(tar, name, data=data, **spec)  # type: ignore[arg-type]
    return buf.getvalue()


@pytest.mark.parametrize("use_filter", PATHS)
@pytest.mark.parametrize("kind", sorted(UNSAFE))
def test_each_unsafe_member_kind_refuses_the_whole_archive(
    tmp_path: Path, kind: str, use_filter: bool
) -> None:
    """An absolute path, ``..``, a backslash path, a link (even one pointing inside), a device
    or a FIFO: one UnsafeArchive naming it, and nothing written, not even the safe member."""
    dest = tmp_path / "out"
    with pytest.raises(UnsafeArchive) as info:
        _extract_into(_unsafe_tar(kind), dest, use_filter)
    assert len(info.value.details) == 1
    assert info.value.details[0].startswith(f"{UNSAFE[kind]['name']}: ")
    assert list(dest.iterdir()) == []
    assert not (tmp_path / "escape.py").exists()


def test_every_unsafe_member_is_listed_at_once(tmp_path: Path) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for kind in ("dotdot", "symlink", "fifo"):
            spec = dict(UNSAFE[kind])
            name = str(spec.pop("name"))
            _add(tar, name, data=spec.pop("data", b""), **spec)  # type: ignore[arg-type]
    with pytest.raises(UnsafeArchive, match="3 unsafe member"):
        _extract_into(buf.getvalue(), tmp_path / "out", False)


def test_a_symlinked_destination_component_does_not_let_a_member_out(tmp_path: Path) -> None:
    """A directory member named like an existing symlink in ``dest`` resolves outside it."""
    dest = tmp_path / "out"
    dest.mkdir()
    (dest / "pkg-1.0").symlink_to(tmp_path)
    with tarfile.open(fileobj=io.BytesIO(_unsafe_tar("dotdot"))) as tar:
        members = [m for m in tar.getmembers() if m.name == "pkg-1.0/ok.py"]
        with pytest.raises(UnsafeArchive) as info:
            extract(tar, members, dest, use_filter=False)
    assert info.value.details == ["pkg-1.0/ok.py: resolves outside the destination"]
    assert not (tmp_path / "ok.py").exists()


@pytest.mark.skipif(HAS_DATA_FILTER, reason="this Python has the data filter")
def test_forcing_the_filter_where_it_is_missing_is_refused(tmp_path: Path) -> None:
    from patchset.errors import PinError

    with pytest.raises(PinError, match="no extraction filters"):
        _extract_into(_normal_tar(), tmp_path / "out", True)
