"""The overlay wheels: each pinned official wheel with the series' Python files laid over it.

One overlay wheel per target the series patches: ``vllm`` (the pinned official vLLM wheel) and
``b12x`` (the pinned b12x wheel, vLLM's ``b12x`` extra). A wheel carries one distribution, and
the two are separate distributions with their own versions and RECORDs, so they are two wheels
built by the same code, with the same proofs and the same determinism.

Order of work (each step refuses before anything is written):

1. refuse any patch touching native sources (:func:`refuse_native`): the wheel's compiled
   extensions come from upstream and cannot change;
2. prove the base wheel carries the sdist's Python sources unchanged (:func:`prove_base`);
3. plan the overlay from the patched tree: every touched file under ``vllm/`` is added,
   replaced or removed; files outside the package (``tests/``, ``docs/``) are not carried;
4. write a new zip deterministically: members sorted, ``.dist-info`` last, RECORD last,
   date 1980-01-01, modes 0o644/0o755, unchanged members copied as their compressed bytes,
   new ones deflated at a fixed level; version ``<base>+dcp.<12 hex of the series digest>``;
5. re-open the result and check every member against the regenerated RECORD
   (:func:`verify_wheel`); only then move it into place.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import struct
import zipfile
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from .errors import NativeSourceError, WheelError
from .hashing import sha256_bytes, sha256_file, short_sha
from .model import BuiltWheel, FileOp, Overlay, OverlayFile, Patch
from .pins import Pin, wheel_arch
from .record import RecordEntry, check_member, index, parse_record, write_record
from .tempfiles import locked_temp, remove_stale

PACKAGE_DIR = "vllm/"
"""Only files under this directory of the tree are part of the (vLLM) wheel."""

PACKAGE_DIRS: dict[str, str] = {"vllm": "vllm/", "b12x": "b12x/"}
"""Per target: the import package the wheel carries (files outside it are not carried)."""

RECEIPTS: dict[str, str] = {"vllm": "receipt.json", "b12x": "receipt-b12x.json"}
"""Per target: the receipt's file name in the output directory (of its ``[target.wheel]``)."""


def receipt_name(target: str, platform: str | None = None) -> str:
    """The receipt's file name for ``target``'s wheel pin of ``platform`` (a
    ``[target.wheel_<platform>]`` table): ``receipt-aarch64.json``; None: ``RECEIPTS[target]``."""
    name = RECEIPTS[target]
    return f"{name.removesuffix('.json')}-{platform}.json" if platform else name


LABEL = "dcp"
DIGEST_CHARS = 12
DEFLATE_LEVEL = 6
ZIP_DATE = (1980, 1, 1, 0, 0, 0)
MODES = (0o644, 0o755)

_NATIVE_DIRS = ("csrc/", "cmake/", "rust/")
_NATIVE_SUFFIXES = (".cu", ".cuh", ".cpp", ".cc", ".cxx", ".c", ".h", ".hpp", ".hh", ".rs")
_CHUNK = 1 << 20
_DOS_TIME = 0
_DOS_DATE = ((ZIP_DATE[0] - 1980) << 9) | (ZIP_DATE[1] << 5) | ZIP_DATE[2]
_VERSION_MADE_BY = (3 << 8) | 20  # unix, zip spec 2.0
_VERSION_NEEDED = 20
_UTF8_FLAG = 0x800
_ZIP32_MAX = 0xFFFFFFFF


# --------------------------------------------------------------------------- refusals


def native_reason(path: str) -> str | None:
    """Why ``path`` (relative to the tree) is a native source the wheel cannot carry, or None."""
    name = path.rsplit("/", 1)[-1]
    if path.startswith(_NATIVE_DIRS):
        return f"{path.split('/', 1)[0]}/ is compiled into the wheel's extensions"
    if name.startswith("CMake") or name.endswith(".cmake"):
        return "CMake build files drive the native build"
    if path == "setup.py":
        return "setup.py builds the native extensions"
    if name.endswith(_NATIVE_SUFFIXES):
        return f"{name.rsplit('.', 1)[-1]} files are native sources"
    return None


def refuse_native(patches: Sequence[Patch]) -> None:
    """Raise one NativeSourceError naming every (patch, file) that touches native sources."""
    problems = [
        f"{patch.name}: {f.path}: {reason}"
        for patch in patches
        for f in patch.files
        if (reason := native_reason(f.path)) is not None
    ]
    if problems:
        raise NativeSourceError(
            f"the overlay wheel cannot carry native changes: {len(problems)} file(s)",
            details=problems,
            hint="keep native changes out of the series (Python only), or build vLLM from source",
        )


def series_digest(patches: Sequence[Patch]) -> str:
    """sha256 over the ordered (name, sha256) of the patches the wheel carries."""
    text = "".join(f"{patch.name} {patch.sha256}\n" for patch in patches)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def local_version(base: str, digest: str) -> str:
    """``base`` with ``dcp.<12 hex>`` appended to its PEP 440 local label.

    ``0.26.0`` -> ``0.26.0+dcp.0123456789ab``; ``0.26.0+cu130`` -> ``0.26.0+cu130.dcp.…``.
    """
    if not re.fullmatch(r"[0-9]+(\.[0-9]+)*([a-z0-9.]*)(\+[a-z0-9]+(\.[a-z0-9]+)*)?", base):
        raise WheelError(f"base version {base!r} is not a normalised PEP 440 version")
    public, _, label = base.partition("+")
    if LABEL in label.split("."):
        raise WheelError(f"base version {base} already carries a {LABEL} label")
    if len(digest) < DIGEST_CHARS or not re.fullmatch(r"[0-9a-f]+", digest):
        raise WheelError(f"series digest {digest!r} is not hex")
    segment = f"{LABEL}.{digest[:DIGEST_CHARS]}"
    return f"{public}+{label}.{segment}" if label else f"{public}+{segment}"


# --------------------------------------------------------------------------- planning


def packed_bytes(tree: Path, path: str, postimages: Mapping[str, str | None] | None) -> bytes:
    """The bytes of ``tree/path`` to pack, re-hashed against the lock's final postimage."""
    data = (tree / path).read_bytes()
    if postimages is not None and (got := sha256_bytes(data)) != postimages.get(path):
        raise WheelError(
            f"{path}: the tree's bytes are not the postimage in series.lock "
            f"({short_sha(got)}, want {short_sha(postimages.get(path))}); "
            "nothing was written",
            hint="the tree changed while the wheel was built; patchset verify shows it",
        )
    return data


def plan_overlay(
    patches: Sequence[Patch],
    pristine: Path,
    tree: Path,
    postimages: Mapping[str, str | None] | None = None,
    package_dir: str = PACKAGE_DIR,
) -> Overlay:
    """The overlay for ``patches`` applied to ``tree`` (already verified) over ``pristine``.

    A touched path's final operation follows from whether it exists before and after the
    series, so a file added and later modified is an add, one modified then deleted a delete.
    """
    owners: dict[str, list[str]] = {}
    for patch in patches:
        for f in patch.files:
            owners.setdefault(f.path, []).append(patch.name)
    files: list[OverlayFile] = []
    not_carried: list[str] = []
    for path in sorted(owners):
        if not path.startswith(package_dir):
            not_carried.append(path)
            continue
        before = (pristine / path).is_file()
        after = (tree / path).is_file()
        if not before and not after:
            continue
        op: FileOp = "modify" if before and after else ("add" if after else "delete")
        if postimages is not None and not after and postimages.get(path) is not None:
            raise WheelError(
                f"{path}: missing from the tree, series.lock has it; nothing was written"
            )
        digest = hashlib.sha256(packed_bytes(tree, path, postimages)).hexdigest() if after else None
        files.append(OverlayFile(path, op, digest, tuple(owners[path])))
    return Overlay(tuple(files), tuple(not_carried))


def prove_base(
    zf: zipfile.ZipFile, pristine: Path, pin: Pin, package_dir: str = PACKAGE_DIR
) -> None:
    """Prove the base wheel's ``<package>/**/*.py`` equal the sdist's; raise listing every
    difference.

    Allowed: the files in ``pin.differs_from_sdist`` (generated by the build) and wheel-only
    files under ``pin.build_only_py`` (vendored by the build). Everything else must match byte
    for byte, and every sdist Python file must be in the wheel.
    """
    problems: list[str] = []
    in_wheel: set[str] = set()
    for info in zf.infolist():
        name = info.filename
        if not (name.startswith(package_dir) and name.endswith(".py")):
            continue
        in_wheel.add(name)
        if name in pin.differs_from_sdist:
            continue
        source = pristine / name
        if not source.is_file():
            if not name.startswith(pin.build_only_py):
                problems.append(f"{name}: in the wheel but not in the sdist")
            continue
        if source.stat().st_size != info.file_size or source.read_bytes() != zf.read(info):
            problems.append(f"{name}: wheel and sdist differ")
    for dirpath, _dirs, names in os.walk(pristine / package_dir):
        for filename in names:
            if filename.endswith(".py"):
                rel = os.path.relpath(os.path.join(dirpath, filename), pristine)
                if rel not in in_wheel:
                    problems.append(f"{rel}: in the sdist but not in the wheel")
    if problems:
        raise WheelError(
            f"the base wheel's Python files are not the sdist's: {len(problems)} difference(s)",
            details=sorted(problems),
            hint="the pins do not describe one release; fix pins.toml (differs_from_sdist, "
            "build_only_py) only if the difference is a documented build artefact",
        )


def _check_overlay_against_base(
    overlay: Overlay, members: dict[str, zipfile.ZipInfo], zf: zipfile.ZipFile, pristine: Path
) -> None:
    problems: list[str] = []
    for f in overlay.files:
        info = members.get(f.path)
        if f.op == "add" and info is not None:
            problems.append(f"{f.path}: added by {f.patches[0]} but the wheel already has it")
        elif f.op != "add" and info is None:
            problems.append(f"{f.path}: {f.op} by {f.patches[0]} but the wheel lacks it")
        elif f.op != "add" and info is not None:
            if zf.read(info) != (pristine / f.path).read_bytes():
                problems.append(f"{f.path}: the wheel's copy is not the sdist's (the preimage)")
    if problems:
        raise WheelError(
            f"the overlay does not fit the base wheel: {len(problems)} problem(s)",
            details=problems,
        )


# --------------------------------------------------------------------------- building


@dataclass(frozen=True)
class _Member:
    name: str
    mode: int
    source: zipfile.ZipInfo | None  # copied raw from the base wheel
    data: bytes | None  # or written from these bytes
    record: RecordEntry


def build_wheel(
    *,
    base_wheel: Path,
    wheel_pin: Pin,
    pristine: Path,
    tree: Path,
    patches: Sequence[Patch],
    out_dir: Path,
    log: Callable[[str], None] = lambda _msg: None,
    postimages: Mapping[str, str | None] | None = None,
    package_dir: str = PACKAGE_DIR,
) -> BuiltWheel:
    """Build, verify and move into ``out_dir`` the overlay wheel of ``patches`` (see module doc).

    ``tree`` must already hold the verified series; ``pristine`` is the unpacked pinned sdist;
    ``package_dir`` is the import package the wheel carries (``vllm/``, ``b12x/``).
    """
    refuse_native(patches)
    digest = series_digest(patches)
    with zipfile.ZipFile(base_wheel) as zf:
        infos = zf.infolist()
        members = {info.filename: info for info in infos}
        if len(members) != len(infos):
            raise WheelError(f"{base_wheel.name}: duplicate member names")
        dist_info = _dist_info_dir(members, base_wheel)
        dist, base_version = dist_info.removesuffix(".dist-info").split("-", 1)
        log(f"proving {base_wheel.name}'s Python files equal the sdist's")
        prove_base(zf, pristine, wheel_pin, package_dir)
        overlay = plan_overlay(patches, pristine, tree, postimages, package_dir)
        _check_overlay_against_base(overlay, members, zf, pristine)
        version = local_version(base_version, digest)
        prefix = f"{dist}-{base_version}-"
        if not base_wheel.name.startswith(prefix):
            raise WheelError(f"{base_wheel.name}: file name does not start with {prefix}")
        wheel_name = f"{dist}-{version}-{base_wheel.name.removeprefix(prefix)}"
        new_dist_info = f"{dist}-{version}.dist-info"
        record_name = f"{new_dist_info}/RECORD"
        base_record = index(parse_record(zf.read(f"{dist_info}/RECORD"), where="base RECORD"))
        plan = _plan_members(
            zf,
            infos,
            base_record,
            overlay,
            tree,
            dist_info,
            new_dist_info,
            base_version,
            version,
            postimages,
        )
        record = write_record([m.record for m in plan], record_name)
        out_dir.mkdir(parents=True, exist_ok=True)
        log(f"writing {wheel_name} ({len(plan) + 1} members, {len(overlay.files)} overlaid)")
        stale = remove_stale(out_dir, ".wheel-*.tmp")
        if stale:
            log(f"removed {stale} temporary file(s) of killed wheel runs in {out_dir}")
        fd, tmp = locked_temp(out_dir, ".wheel-", ".tmp")
        try:
            with os.fdopen(fd, "wb") as out, open(base_wheel, "rb") as src:
                writer = _ZipWriter(out)
                for member in plan:
                    if member.source is not None:
                        writer.add_raw(member.name, member.source, member.mode, src)
                    else:
                        writer.add_bytes(member.name, member.data or b"", member.mode)
                writer.add_bytes(record_name, record, 0o644)
                writer.close()
            log("re-opening the wheel and checking every member against RECORD")
            verify_wheel(tmp)
            final = out_dir / wheel_name
            os.chmod(tmp, 0o644)
            os.replace(tmp, final)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
    return BuiltWheel(final, sha256_file(final), version, base_version, overlay)


def _dist_info_dir(members: dict[str, zipfile.ZipInfo], wheel: Path) -> str:
    dirs = sorted(
        {n.split("/", 1)[0] for n in members if n.split("/", 1)[0].endswith(".dist-info")}
    )
    if len(dirs) != 1 or f"{dirs[0]}/METADATA" not in members or f"{dirs[0]}/RECORD" not in members:
        raise WheelError(f"{wheel.name}: expected one .dist-info with METADATA and RECORD: {dirs}")
    if dirs[0].removesuffix(".dist-info").count("-") != 1:
        raise WheelError(f"{wheel.name}: unexpected .dist-info name {dirs[0]}")
    return dirs[0]


def _plan_members(
    zf: zipfile.ZipFile,
    infos: Iterable[zipfile.ZipInfo],
    base_record: dict[str, RecordEntry],
    overlay: Overlay,
    tree: Path,
    dist_info: str,
    new_dist_info: str,
    base_version: str,
    version: str,
    postimages: Mapping[str, str | None] | None = None,
) -> list[_Member]:
    by_path = {f.path: f for f in overlay.files}
    plan: list[_Member] = []
    problems: list[str] = []
    for info in infos:
        name = info.filename
        if info.is_dir() or name == f"{dist_info}/RECORD":
            continue
        mode = 0o755 if (info.external_attr >> 16) & 0o111 else 0o644
        new_name = (
            new_dist_info + name.removeprefix(dist_info)
            if name.startswith(f"{dist_info}/")
            else name
        )
        change = by_path.get(name)
        if change is not None:
            if change.op == "delete":
                continue
            data = packed_bytes(tree, name, postimages)
            plan.append(_Member(new_name, mode, None, data, RecordEntry.of(new_name, data)))
        elif name == f"{dist_info}/METADATA":
            data = _set_metadata_version(zf.read(info), base_version, version)
            plan.append(_Member(new_name, mode, None, data, RecordEntry.of(new_name, data)))
        else:
            row = base_record.get(name)
            if row is None or row.digest is None or row.size != info.file_size:
                problems.append(f"{name}: base RECORD lacks it or disagrees on its size")
                continue
            if info.flag_bits & 0x1 or info.compress_type not in (
                zipfile.ZIP_STORED,
                zipfile.ZIP_DEFLATED,
            ):
                problems.append(f"{name}: encrypted or compressed with method {info.compress_type}")
                continue
            plan.append(
                _Member(new_name, mode, info, None, RecordEntry(new_name, row.digest, row.size))
            )
    for f in overlay.files:
        if f.op == "add":
            path = tree / f.path
            data = packed_bytes(tree, f.path, postimages)
            mode = 0o755 if path.stat().st_mode & 0o111 else 0o644
            plan.append(_Member(f.path, mode, None, data, RecordEntry.of(f.path, data)))
    if problems:
        raise WheelError(f"base wheel: {len(problems)} unusable member(s)", details=problems)
    plan.sort(key=lambda m: _member_order(m.name))
    return plan


def _member_order(name: str) -> tuple[bool, bool, str]:
    top = name.split("/", 1)[0]
    return (top.endswith(".dist-info"), name == f"{top}/RECORD", name)


def _set_metadata_version(metadata: bytes, old: str, new: str) -> bytes:
    head, sep, body = metadata.partition(b"\n\n")
    lines = head.split(b"\n")
    hits = [i for i, line in enumerate(lines) if line.rstrip(b"\r") == f"Version: {old}".encode()]
    if len(hits) != 1:
        raise WheelError(f"METADATA: expected one 'Version: {old}' header, found {len(hits)}")
    ending = b"\r" if lines[hits[0]].endswith(b"\r") else b""
    lines[hits[0]] = f"Version: {new}".encode() + ending
    return b"\n".join(lines) + sep + body


# --------------------------------------------------------------------------- zip writing


class _ZipWriter:
    """A minimal deterministic zip writer (no zip64, no extra fields, fixed date and modes).

    ``add_raw`` copies a member's compressed bytes from another zip unchanged (its CRC and sizes
    come from that zip's directory; :func:`verify_wheel` re-checks them all).
    """

    def __init__(self, out: BinaryIO):
        self._out = out
        self._offset = 0
        self._central: list[bytes] = []

    def _write(self, data: bytes) -> None:
        self._out.write(data)
        self._offset += len(data)

    def _entry(self, name: str, method: int, crc: int, csize: int, usize: int, mode: int) -> None:
        if mode not in MODES:
            raise WheelError(f"{name}: mode {oct(mode)} is not one of 0o644, 0o755")
        if max(csize, usize, self._offset) >= _ZIP32_MAX or len(self._central) >= 0xFFFF:
            raise WheelError(f"{name}: the wheel would need zip64, which this writer refuses")
        raw_name = name.encode("utf-8")
        flags = 0 if name.isascii() else _UTF8_FLAG
        fields = (_VERSION_NEEDED, flags, method, _DOS_TIME, _DOS_DATE, crc, csize, usize)
        self._central.append(
            struct.pack("<4s2H", b"PK\x01\x02", _VERSION_MADE_BY, _VERSION_NEEDED)
            + struct.pack("<2H2H3I", *fields[1:])
            + struct.pack("<5H2I", len(raw_name), 0, 0, 0, 0, (0o100000 | mode) << 16, self._offset)
            + raw_name
        )
        self._write(struct.pack("<4s5H3I2H", b"PK\x03\x04", *fields, len(raw_name), 0) + raw_name)

    def add_raw(self, name: str, info: zipfile.ZipInfo, mode: int, src: BinaryIO) -> None:
        src.seek(info.header_offset)
        header = src.read(30)
        if header[:4] != b"PK\x03\x04":
            raise WheelError(f"{info.filename}: no local header at offset {info.header_offset}")
        name_len, extra_len = struct.unpack("<2H", header[26:30])
        src.seek(info.header_offset + 30 + name_len + extra_len)
        self._entry(name, info.compress_type, info.CRC, info.compress_size, info.file_size, mode)
        left = info.compress_size
        while left:
            chunk = src.read(min(left, _CHUNK))
            if not chunk:
                raise WheelError(f"{info.filename}: base wheel truncated")
            self._write(chunk)
            left -= len(chunk)

    def add_bytes(self, name: str, data: bytes, mode: int) -> None:
        compressor = zlib.compressobj(DEFLATE_LEVEL, zlib.DEFLATED, -15)
        packed = compressor.compress(data) + compressor.flush()
        self._entry(name, zipfile.ZIP_DEFLATED, zlib.crc32(data), len(packed), len(data), mode)
        self._write(packed)

    def close(self) -> None:
        start = self._offset
        for entry in self._central:
            self._write(entry)
        size = self._offset - start
        count = len(self._central)
        self._write(struct.pack("<4s4H2IH", b"PK\x05\x06", 0, 0, count, count, size, start, 0))


# --------------------------------------------------------------------------- verification


def verify_wheel(path: Path) -> None:
    """Re-open a built wheel; raise one WheelError listing every way it breaks the rules.

    Checks: unique names, order (sorted, ``.dist-info`` last, RECORD last), date 1980-01-01,
    mode 0o644/0o755 on regular files, deflate or stored, and every member's sha256 and size
    against RECORD (and every RECORD row against a member); zipfile checks each CRC on read.
    """
    problems: list[str] = []
    with zipfile.ZipFile(path) as zf:
        infos = zf.infolist()
        names = [info.filename for info in infos]
        if len(set(names)) != len(names):
            problems.append("duplicate member names")
        if names != sorted(names, key=_member_order):
            problems.append("members are not in canonical order")
        records = [n for n in names if n.endswith(".dist-info/RECORD") and n.count("/") == 1]
        if len(records) != 1 or names[-1] != records[0]:
            problems.append(f"expected exactly one .dist-info/RECORD, last; found {records}")
            raise WheelError(f"{path.name} fails verification", details=problems)
        rows = index(parse_record(zf.read(records[0]), where=f"{path.name} RECORD"))
        for info in infos:
            name = info.filename
            if info.date_time != ZIP_DATE:
                problems.append(f"{name}: date {info.date_time}, expected {ZIP_DATE}")
            mode = info.external_attr >> 16
            if mode & 0o170000 != 0o100000 or mode & 0o7777 not in MODES:
                problems.append(f"{name}: mode {oct(mode)}, expected a 0o644/0o755 regular file")
            if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
                problems.append(f"{name}: compression method {info.compress_type}")
            if name == records[0]:
                continue
            digest, size = _digest_member(zf, info)
            if (why := check_member(rows.get(name), name, digest, size)) is not None:
                problems.append(why)
        for name in sorted(set(rows) - set(names)):
            problems.append(f"{name}: listed in RECORD but not in the wheel")
    if problems:
        raise WheelError(
            f"{path.name} fails verification: {len(problems)} problem(s)", details=problems
        )


def _digest_member(zf: zipfile.ZipFile, info: zipfile.ZipInfo) -> tuple[str, int]:
    digest = hashlib.sha256()
    size = 0
    with zf.open(info) as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return _record_form(digest.digest()), size


def _record_form(raw_sha256: bytes) -> str:
    """RECORD's ``sha256=<urlsafe base64, no padding>`` for a finished digest."""
    return "sha256=" + base64.urlsafe_b64encode(raw_sha256).rstrip(b"=").decode("ascii")


# --------------------------------------------------------------------------- orchestration


def _build_blaming_base(
    root: Path, pristine: Path, target: str = "vllm", **kwargs: object
) -> BuiltWheel:
    """:func:`build_wheel`; a failed base proof caused by a modified ``build/base`` tree says
    so (and names the files) instead of blaming pins.toml."""
    from .fetch import pristine_differences

    try:
        return build_wheel(pristine=pristine, **kwargs)  # type: ignore[arg-type]
    except WheelError as exc:
        if "not the sdist's" not in exc.message:
            raise
        changed = pristine_differences(target, pristine, root=root)
        if not changed:
            raise
        raise WheelError(
            f"{pristine} differs from the pinned sdist in {len(changed)} file(s): the unpacked "
            "base was modified",
            details=changed,
            hint=f"remove {pristine} (make clean) and run again; the pins are not at fault",
        ) from exc


def wheel_from_series(
    root: Path,
    *,
    target: str = "vllm",
    tree: Path | None = None,
    out_dir: Path | None = None,
    offline: bool = False,
    log: Callable[[str], None] = lambda _msg: None,
    arch: str | None = None,
) -> tuple[BuiltWheel, Path]:
    """``patchset wheel``: apply ``target``'s series to ``tree``, verify, build, write the receipt.

    ``tree`` defaults to ``build/<target>`` (unpacked from the pinned sdist when absent),
    ``out_dir`` to ``dist``; ``arch`` picks the base wheel (:meth:`Pins.wheel`: None is
    ``[target.wheel]``, ``aarch64`` is ``[target.wheel_aarch64]``; a pure-Python wheel serves
    every ``arch``). The receipt is :func:`receipt_name` there. Native-source patches are
    refused before anything is applied. Older overlay wheels of the same distribution and
    platform in ``out_dir`` are removed once the new one is verified (those of other platforms
    stay). Returns the wheel and the receipt path.
    """
    from .apply import apply_series
    from .errors import NothingToDo, PatchsetError, TreeStateError
    from .fetch import cache_dir, fetch_pin, pristine_tree, unpack_sdist
    from .lockfile import load_lock
    from .newtree import created_if_missing
    from .pins import load_pins
    from .receipt import make_receipt, read_receipt, write_receipt
    from .series import for_target, load_series
    from .tree import DEFAULT_TIMEOUT_S, Tree, tree_lock
    from .verify import verify_tree

    if target not in PACKAGE_DIRS:
        raise WheelError(f"no overlay wheel for target {target!r}: one of {sorted(PACKAGE_DIRS)}")
    pins = load_pins(root / "pins.toml")
    sdist_pin, wheel_pin = pins.get(target, "sdist"), pins.wheel(target, arch)
    patches = for_target(load_series(root), target)
    refuse_native(patches)
    lock = load_lock(root)
    tree = (tree or root / "build" / target).resolve()
    out_dir = (out_dir or root / "dist").resolve()

    def unpack() -> None:
        log(f"unpacking {sdist_pin.filename} into {tree}")
        unpack_sdist(target, tree, root=root, offline=offline)

    with created_if_missing(tree, unpack, DEFAULT_TIMEOUT_S, log), tree_lock(tree):
        if patches:
            try:
                apply_series(
                    Tree(tree),
                    patches,
                    lock,
                    target=target,
                    base_pin=sdist_pin.sha256,
                    pins={pin.key: pin.sha256 for pin in pins},
                    release=sdist_pin.requirement,
                    log=log,
                )
            except NothingToDo:
                log(f"{tree}: the series is already applied")
            state = verify_tree(Tree(tree), patches, lock)
            missing = [p.name for p in patches if p.name not in state.applied_names]
            if missing:
                raise TreeStateError(
                    f"{tree}: {len(missing)} patch(es) of the series are not applied",
                    details=missing,
                    hint=f"patchset apply --tree {tree}",
                )
            log(f"verified {len(patches)} patch(es) on {tree}")
        pristine = pristine_tree(target, root=root, offline=offline)
        base_wheel = fetch_pin(wheel_pin, cache_dir(root), offline=offline).path
        built = _build_blaming_base(
            root,
            pristine,
            target,
            base_wheel=base_wheel,
            wheel_pin=wheel_pin,
            tree=tree,
            patches=patches,
            out_dir=out_dir,
            log=log,
            postimages={p: f.sha256 for p, f in lock.final.get(target, {}).items()},
            package_dir=PACKAGE_DIRS[target],
        )
    receipt = make_receipt(
        built,
        sdist_pin=sdist_pin,
        wheel_pin=wheel_pin,
        patches=patches,
        series_digest=series_digest(patches),
    )
    receipt_path = out_dir / receipt_name(target, wheel_pin.platform)
    try:
        kept = read_receipt(receipt_path)["wheel"]["filename"] if receipt_path.is_file() else None
    except (PatchsetError, OSError, ValueError, KeyError, TypeError):
        kept = None
    try:
        write_receipt(receipt, receipt_path)
    except BaseException:
        # the old receipt stays: remove the new wheel it does not name, so they still agree
        if built.path.name != kept:
            built.path.unlink(missing_ok=True)
        raise
    dist = built.path.name.split("-", 1)[0]
    for stale in sorted(out_dir.glob(f"{dist}-*+*{LABEL}.*.whl")):
        if stale != built.path and wheel_arch(stale.name) == wheel_arch(built.path.name):
            log(f"removing the older overlay wheel {stale.name}")
            stale.unlink()
    return built, receipt_path


__all__ = [
    "PACKAGE_DIRS",
    "RECEIPTS",
    "BuiltWheel",
    "Overlay",
    "OverlayFile",
    "build_wheel",
    "local_version",
    "native_reason",
    "plan_overlay",
    "prove_base",
    "receipt_name",
    "refuse_native",
    "series_digest",
    "verify_wheel",
    "wheel_from_series",
]
