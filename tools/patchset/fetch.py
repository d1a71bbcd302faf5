"""Fetch the pinned artefacts into a cache; hand out verified paths and pristine trees.

A pin is downloaded with ``pip download --no-deps`` or, with ``download = "index"``, by name
from the package index (:mod:`patchset.index`: no metadata build of the sdist).

Every use re-hashes the cached file: a file whose sha256 differs from its pin is deleted and
reported (:class:`~patchset.errors.HashMismatch`), never used. Once a file is cached and
verifies, pip is not called again, so everything works offline.

Cache: ``$PATCHSET_CACHE`` or ``<root>/.cache/patchset``, one file per pin, named as pinned.
Pristine trees: ``<root>/build/base/<target>``, the sdist unpacked once, files read-only,
with a stamp ``build/base/<target>.pin`` naming the sdist sha256 it came from.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shlex
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from .errors import ExternalToolError, HashMismatch, PatchsetError, PinError
from .hashing import sha256_bytes, sha256_file
from .index import download_from_index
from .pins import Pin, Pins, find_root, load_pins
from .safetar import extract, member_problems

PipRunner = Callable[[Sequence[str], Mapping[str, str]], None]
"""Runs one ``pip download`` argv (after the pip command itself) under an environment."""

IndexDownloader = Callable[[Pin, Path], None]
"""Downloads a ``download = "index"`` pin's file into a folder, under the pinned file name."""


def download_pin_from_index(pin: Pin, dest: Path) -> None:
    """The index downloader: the pinned file by name, the index's stated hash checked."""
    download_from_index(pin.requirement, pin.filename, dest, sha256=pin.sha256)


def download_pin(pin: Pin, dest: Path, pip: PipRunner, index: IndexDownloader) -> None:
    """Download ``pin``'s file into ``dest``: by name from the package index for a
    ``download = "index"`` pin, else with ``pip download --no-deps`` (its args and env)."""
    if pin.download == "index":
        index(pin, dest)
    else:
        pip(
            ["download", "--no-deps", "--dest", str(dest), *pin.pip_args, pin.requirement],
            pin.env_dict,
        )


FetchAction = Literal["cached", "downloaded", "copied"]


@dataclass(frozen=True)
class Fetched:
    """A pinned file that is in the cache and verified, and how it got there this time."""

    pin: Pin
    path: Path
    action: FetchAction


def cache_dir(root: Path) -> Path:
    """The download cache: ``$PATCHSET_CACHE`` or ``<root>/.cache/patchset``."""
    override = os.environ.get("PATCHSET_CACHE")
    return Path(override).resolve() if override else root / ".cache" / "patchset"


def pip_command() -> list[str]:
    """The pip to run: ``$PATCHSET_PIP`` (split like a shell would) or ``python -m pip``."""
    override = os.environ.get("PATCHSET_PIP")
    return shlex.split(override) if override else [sys.executable, "-m", "pip"]


def run_pip(args: Sequence[str], env: Mapping[str, str]) -> None:
    """Run pip with ``args`` under ``os.environ`` updated with ``env``; raise on failure."""
    argv = [*pip_command(), *args]
    merged = {**os.environ, **env, "PIP_NO_INPUT": "1"}
    proc = subprocess.run(argv, env=merged, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-20:]
        raise ExternalToolError(
            f"pip failed (exit {proc.returncode}): {shlex.join(argv)}",
            details=tail,
            hint="check the network and the index, or seed the cache: patchset fetch --from DIR",
        )


def verify_cached(pin: Pin, path: Path) -> None:
    """Re-hash ``path``; if it is not the pinned file, delete it and raise HashMismatch."""
    actual = sha256_file(path)
    if actual != pin.sha256:
        path.unlink()
        raise HashMismatch(
            f"{pin.key}: {path} has sha256 {actual}, pinned {pin.sha256}; deleted it",
            hint="run `patchset fetch` again to download it afresh",
        )


def fetch_pin(
    pin: Pin,
    cache: Path,
    *,
    offline: bool = False,
    source: Path | None = None,
    pip: PipRunner = run_pip,
    index: IndexDownloader = download_pin_from_index,
) -> Fetched:
    """Make ``pin``'s file present and verified in ``cache``; return where it is.

    A cached file is re-hashed and used as is (pip is not called). Otherwise the file is
    copied from ``source`` (a directory searched two levels deep) when given, else downloaded
    (``pip download --no-deps``, or from the index for ``download = "index"``); either way it
    lands under a temporary name, is hashed, and only a matching file is moved into place.
    """
    target = cache / pin.filename
    if target.is_file():
        verify_cached(pin, target)
        return Fetched(pin, target, "cached")
    if offline and source is None:
        raise PinError(
            f"{pin.key}: {pin.filename} is not in the cache {cache} and --offline forbids pip",
            hint="run `patchset fetch` once with network access, or `patchset fetch --from DIR`",
        )
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache, prefix=".fetch-") as tmp_name:
        tmp = Path(tmp_name)
        if source is not None:
            found = _find_in(source, pin.filename)
            if found is None:
                raise PinError(f"{pin.key}: {pin.filename} not found under {source}")
            staged = tmp / pin.filename
            shutil.copyfile(found, staged)
            action: FetchAction = "copied"
        else:
            download_pin(pin, tmp, pip, index)
            staged = tmp / pin.filename
            if not staged.is_file():
                produced = sorted(p.name for p in tmp.iterdir())
                raise PinError(
                    f"{pin.key}: pip did not produce {pin.filename}",
                    details=[f"pip produced: {', '.join(produced) or 'nothing'}"],
                    hint="the index may serve a different file; check pip_args in pins.toml",
                )
            action = "downloaded"
        actual = sha256_file(staged)
        if actual != pin.sha256:
            staged.unlink()
            raise HashMismatch(
                f"{pin.key}: {action} {pin.filename} has sha256 {actual}, pinned {pin.sha256}; "
                "deleted it",
                hint="the artefact changed upstream or in transit; do not edit pins.toml "
                "without checking why",
            )
        os.replace(staged, target)
    return Fetched(pin, target, action)


def fetch_all(
    pins: Pins,
    cache: Path,
    *,
    offline: bool = False,
    source: Path | None = None,
    pip: PipRunner = run_pip,
    index: IndexDownloader = download_pin_from_index,
) -> list[Fetched]:
    """Fetch every pin; try them all, then raise one error listing every failure.

    The error is a HashMismatch when any file mismatched (exit 1 either way).
    """
    done: list[Fetched] = []
    failures: list[PatchsetError] = []
    for pin in pins:
        try:
            done.append(fetch_pin(pin, cache, offline=offline, source=source, pip=pip, index=index))
        except PatchsetError as exc:
            failures.append(exc)
    if failures:
        if len(failures) == 1:
            raise failures[0]
        cls = HashMismatch if any(isinstance(f, HashMismatch) for f in failures) else PinError
        raise cls(
            f"{len(failures)} of {len(pins.pins)} pinned files could not be fetched",
            details=[f.message for f in failures],
            hint=failures[0].hint,
        )
    return done


def pinned_file(target: str, kind: str, *, root: Path | None = None, offline: bool = False) -> Path:
    """The verified cached file of pin ``[target.kind]``, downloading it if absent."""
    root = root or find_root()
    pin = load_pins(root / "pins.toml").get(target, kind)
    return fetch_pin(pin, cache_dir(root), offline=offline).path


def unpack_sdist(
    target: str, dest: Path, *, root: Path | None = None, offline: bool = False
) -> Path:
    """Unpack the contents of pin ``[target.sdist]``'s top directory into ``dest``.

    ``dest`` may be absent or an empty directory; anything else is refused. Every member must
    be a regular file or directory under the pinned top directory (no absolute paths, no
    ``..``, no links or devices); otherwise nothing is written.
    """
    root = root or find_root()
    pin = load_pins(root / "pins.toml").get(target, "sdist")
    archive = fetch_pin(pin, cache_dir(root), offline=offline).path
    extract_sdist(archive, pin.top_dir or "", dest)
    return dest


def extract_sdist(archive: Path, top_dir: str, dest: Path) -> None:
    """Extract ``archive``'s ``top_dir/`` into ``dest`` (see :func:`unpack_sdist`)."""
    if dest.is_symlink() or (dest.exists() and (not dest.is_dir() or any(dest.iterdir()))):
        raise PatchsetError(
            f"refusing to unpack {archive.name} into {dest}: it exists and is not an empty "
            "directory",
            hint=f"remove {dest} or choose another directory",
        )
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive, "r:*") as tar:
        members = tar.getmembers()
        problems = unsafe_members(members, top_dir)
        if problems:
            raise PinError(
                f"{archive.name}: refusing to unpack: {len(problems)} unsafe member(s)",
                details=problems,
            )
        with tempfile.TemporaryDirectory(dir=dest.parent, prefix=f".{dest.name}.unpack-") as tmp:
            extract(tar, members, Path(tmp))
            unpacked = Path(tmp) / top_dir
            if not unpacked.is_dir():
                raise PinError(f"{archive.name}: no top directory {top_dir!r}")
            if dest.exists():
                dest.rmdir()
            os.replace(unpacked, dest)


def unsafe_members(members: Sequence[tarfile.TarInfo], top_dir: str) -> list[str]:
    """Why each member may not be unpacked (outside ``top_dir/``, or unsafe as
    :func:`patchset.safetar.member_problems` says: absolute, ``..``, a link, a device, not a
    regular file or directory); empty when the archive is safe."""
    problems = []
    for member in members:
        why = member_problems([member], Path("/unpack-root"))
        if why:
            problems.extend(why)
        elif member.name.split("/")[0] != top_dir:
            problems.append(f"{member.name}: outside the top directory {top_dir}/")
    return problems


def pristine_tree(target: str, *, root: Path | None = None, offline: bool = False) -> Path:
    """A read-only unpack of pin ``[target.sdist]`` under ``build/base/``, made once, reused.

    Beside it, ``<target>.files.json`` lists every file's sha256 as unpacked, and the stamp
    ``<target>.pin`` (written last) holds the sdist sha256 and the list's; a tree without a
    matching stamp and list (interrupted unpack, new pin, an edited list) is removed and
    unpacked again. The files themselves are checked where they are read
    (:func:`pristine_manifest`).
    """
    root = root or find_root()
    pin = load_pins(root / "pins.toml").get(target, "sdist")
    base = root / "build" / "base"
    tree = base / target
    stamp = base / f"{target}.pin"
    listing = base / f"{target}.files.json"
    base.mkdir(parents=True, exist_ok=True)
    with file_lock(base / f".{target}.lock"):
        if tree.is_dir() and _stamp_holds(stamp, listing, pin.sha256):
            return tree
        stamp.unlink(missing_ok=True)
        if tree.exists():
            _remove_tree(tree)
        unpack_sdist(target, tree, root=root, offline=offline)
        _make_read_only(tree)
        data = json.dumps(_file_digests(tree), sort_keys=True, indent=0).encode("utf-8")
        listing.write_bytes(data)
        stamp.write_text(f"{pin.sha256} {sha256_bytes(data)}\n")
    return tree


def pristine_manifest(target: str, *, root: Path | None = None) -> dict[str, str]:
    """Path -> sha256 of every file of ``target``'s pristine tree as it was unpacked (the list
    its stamp vouches for). A reader of the tree compares each file it reads with it, so an
    edited ``build/base`` is named instead of trusted."""
    root = root or find_root()
    pin = load_pins(root / "pins.toml").get(target, "sdist")
    base = root / "build" / "base"
    listing = base / f"{target}.files.json"
    if not _stamp_holds(base / f"{target}.pin", listing, pin.sha256):
        raise PinError(
            f"{listing} is not the file list of the pinned {target} sdist",
            hint="remove build/base (make clean) and run again",
        )
    return dict(json.loads(listing.read_text(encoding="utf-8")))


def _stamp_holds(stamp: Path, listing: Path, sdist_sha256: str) -> bool:
    if not stamp.is_file() or not listing.is_file():
        return False
    return stamp.read_text().split() == [sdist_sha256, sha256_bytes(listing.read_bytes())]


def _file_digests(tree: Path) -> dict[str, str]:
    out = {}
    for dirpath, _dirs, files in os.walk(tree):
        for name in files:
            path = Path(dirpath, name)
            out[path.relative_to(tree).as_posix()] = sha256_bytes(path.read_bytes())
    return out


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created if absent) for the block."""
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _make_read_only(tree: Path) -> None:
    """Clear the write bits of every file (directories stay writable so ``rm -r`` works)."""
    for dirpath, _dirs, files in os.walk(tree):
        for name in files:
            path = os.path.join(dirpath, name)
            mode = os.lstat(path).st_mode
            os.chmod(path, stat.S_IMODE(mode) & ~0o222)


def _remove_tree(tree: Path) -> None:
    """Remove a pristine tree; its directories stay writable, so read-only files go too."""
    shutil.rmtree(tree)


def _find_in(directory: Path, filename: str) -> Path | None:
    for candidate in (directory / filename, *directory.glob(f"*/{filename}")):
        if candidate.is_file():
            return candidate
    return None


def pristine_differences(target: str, tree: Path, *, root: Path | None = None) -> list[str]:
    """The files of the unpacked ``tree`` that are not the pinned sdist's (changed, missing,
    or extra), read against the verified archive itself."""
    root = root or find_root()
    pin = load_pins(root / "pins.toml").get(target, "sdist")
    archive = fetch_pin(pin, cache_dir(root), offline=True).path
    prefix = f"{pin.top_dir}/"
    seen: set[str] = set()
    out: list[str] = []
    with tarfile.open(archive, "r:*") as tar:
        for member in tar:
            if not member.isreg() or not member.name.startswith(prefix):
                continue
            rel = member.name[len(prefix) :]
            seen.add(rel)
            source = tar.extractfile(member)
            data = source.read() if source else b""
            path = tree / rel
            if not path.is_file():
                out.append(f"{rel}: missing")
            elif path.read_bytes() != data:
                out.append(f"{rel}: changed")
    for dirpath, _dirs, files in os.walk(tree):
        for name in files:
            rel = os.path.relpath(os.path.join(dirpath, name), tree)
            if rel not in seen:
                out.append(f"{rel}: not in the sdist")
    return sorted(out)
