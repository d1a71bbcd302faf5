"""Move the series to a newer release: pin the new base, replay each patch 3-way, report.

b4-style: everything happens in a scratch git repository under a temporary directory, never in
the user's checkout or the dcp-series files. Its history is the old pinned base, the series on
top of it (branch ``old``), and the new release's tree committed as a child of the old base
(branch ``new``), so every preimage blob a patch names exists and ``git am -3`` can merge.

Per patch, in series order, on top of the patches already replayed:

* ``absorbed``  every file's change is already in the new tree (the patch reverse-applies
  exactly), or the 3-way merge leaves nothing to commit;
* ``clean``     applies exactly at the stated lines;
* ``offsets``   applies exactly after moving hunks (``git apply`` offsets); refreshed;
* ``merged``    does not apply as is but the 3-way merge succeeds without conflicts; refreshed;
* ``conflict``  the 3-way merge leaves conflicts (files, marker regions, failing hunks); the
  replay goes on without it.

The new sdist is pinned first: its sha256 is recorded next to the cached file when it is
downloaded and checked on every later use. ``--dry-run`` only reports. Otherwise the result is
written to a new directory (series, refreshed patches, pins.toml, series.lock, the report, and
``conflicts/`` with the marked files), never over the current series.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from patchset import __version__
from patchset.errors import HashMismatch, PatchDoesNotApply, PatchsetError, PinError
from patchset.fetch import (
    IndexDownloader,
    PipRunner,
    download_pin,
    download_pin_from_index,
    extract_sdist,
    run_pip,
)
from patchset.gitops import UNMERGED_STATES, ScratchRepo
from patchset.hashing import sha256_file
from patchset.model import Patch
from patchset.outputs import refuse_inside_series
from patchset.patchfile import split_patch
from patchset.pins import Pin

Status = Literal["clean", "offsets", "merged", "conflict", "absorbed"]
STATUSES: tuple[Status, ...] = ("clean", "offsets", "merged", "conflict", "absorbed")
SCHEMA_VERSION = 1
OLD_BASE = "old-base"
"""The scratch repository's branch at the old pinned base."""
ADDED_BY_LOST_PATCH = "not in the new base: an earlier patch added it and did not carry over"
_ONTO = re.compile(r"^(?P<target>[a-z][a-z0-9_]*)==(?P<version>[0-9][0-9A-Za-z.+-]*)$")

Log = Callable[[str], None]


def _quiet(_: str) -> None:
    return None


def parse_onto(spec: str) -> tuple[str, str]:
    """``vllm==0.33.0`` -> ("vllm", "0.33.0")."""
    match = _ONTO.match(spec.strip())
    if not match:
        raise PatchsetError(
            f"--onto {spec!r}: expected <target>==<version>", hint="e.g. --onto vllm==0.33.0"
        )
    return match.group("target"), match.group("version")


def pinned_version(pin: Pin) -> str:
    """The version of an ``name==X`` pin requirement."""
    _, sep, version = pin.requirement.partition("==")
    if not sep:
        raise PinError(f"{pin.key}: requirement {pin.requirement!r} is not name==version")
    return version.strip()


def release_pins(old: Pin, version: str) -> Pin:
    """The sdist pin of ``version`` made like ``old`` (sha256 unknown until fetched: empty)."""
    old_version = pinned_version(old)
    env = tuple((key, version if value == old_version else value) for key, value in old.env)
    name = old.requirement.partition("==")[0].strip()
    return Pin(
        target=old.target,
        kind=old.kind,
        requirement=f"{name}=={version}",
        filename=old.filename.replace(old_version, version),
        sha256="",
        pip_args=old.pip_args,
        env=env,
        top_dir=(old.top_dir or "").replace(old_version, version) or None,
        download=old.download,
    )


def fetch_release(
    pin: Pin,
    cache: Path,
    *,
    source: Path | None = None,
    pip: PipRunner = run_pip,
    index: IndexDownloader = download_pin_from_index,
    log: Log = _quiet,
) -> tuple[Path, str]:
    """Download (or copy from ``source``) the release file of ``pin`` into ``cache`` and pin it.

    An sdist is checked before it is cached (:func:`check_sdist`: one top folder, the pin's,
    and a PKG-INFO naming the pin's version). The cache entry records what it was checked
    against (``<file>.check.json``: sha256, version, top folder; a wheel: sha256 only) and
    every later use re-hashes the file and re-checks an entry checked against anything else
    (a mismatching file is deleted). ``source`` is always the file used: a cached entry made
    from another file is replaced, never silently preferred. Returns (path, sha256).
    """
    cache.mkdir(parents=True, exist_ok=True)
    target = cache / pin.filename
    stamp = cache / f"{pin.filename}.check.json"
    legacy = cache / f"{pin.filename}.sha256"
    wanted = _checked_against(pin)
    if source is None and target.is_file() and stamp.is_file():
        recorded = _read_stamp(stamp)
        actual = sha256_file(target)
        if recorded.get("sha256") != actual:
            target.unlink()
            stamp.unlink()
            raise HashMismatch(
                f"{target}: sha256 {actual} is not the {recorded.get('sha256')} pinned when it "
                "was fetched; deleted it",
                hint="run the rebase again to fetch it afresh",
            )
        if {k: v for k, v in recorded.items() if k != "sha256"} == wanted:
            return target, actual
    with tempfile.TemporaryDirectory(dir=cache, prefix=".fetch-") as tmp:
        staged = Path(tmp) / pin.filename
        if source is not None:
            shutil.copyfile(source, staged)
        elif target.is_file():  # cached but checked against something else: check it now
            shutil.copyfile(target, staged)
        else:
            how = "from the package index" if pin.download == "index" else "with pip"
            log(f"Downloading {pin.requirement} ({pin.kind}) {how}")
            download_pin(pin, Path(tmp), pip, index)
        if not staged.is_file():
            produced = sorted(p.name for p in Path(tmp).iterdir())
            raise PinError(
                f"{pin.requirement}: pip did not produce {pin.filename}",
                details=[f"pip produced: {', '.join(produced) or 'nothing'}"],
            )
        if pin.kind == "sdist":
            cached = source is None and target.is_file()
            try:
                check_sdist(staged, wanted["top_dir"], wanted["version"], source or target)
            except PinError as exc:
                if cached:  # a bad file without a stamp: gone, so the next run downloads
                    target.unlink(missing_ok=True)
                    exc.message += f"; deleted the cached {target.name}"
                    exc.hint = "run the rebase again to download it afresh"
                raise
        digest = sha256_file(staged)
        stamp.unlink(missing_ok=True)  # no entry claims a check while the file changes
        os.replace(staged, target)
    legacy.unlink(missing_ok=True)
    _write_stamp(stamp, {"sha256": digest, **wanted})
    return target, digest


def _checked_against(pin: Pin) -> dict[str, str]:
    if pin.kind != "sdist":
        return {}
    top = pin.top_dir or pin.filename.removesuffix(".tar.gz").removesuffix(".zip")
    return {"version": pinned_version(pin), "top_dir": top}


def _read_stamp(stamp: Path) -> dict[str, str]:
    try:
        data = json.loads(stamp.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}


def _write_stamp(stamp: Path, data: dict[str, str]) -> None:
    tmp = stamp.with_name(stamp.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, stamp)


def check_sdist(archive: Path, top_dir: str, version: str, shown: Path | None = None) -> None:
    """Refuse an sdist that is not ``version``: every member must be under the one top folder
    ``top_dir``, whose ``PKG-INFO`` must say ``Version: <version>``, and the archive must be
    one the unpack accepts (no link, device, absolute or ``..`` member), so nothing is cached
    that a later step refuses."""
    import tarfile

    from patchset.fetch import unsafe_members

    name = shown or archive
    try:
        with tarfile.open(archive, "r:*") as tar:
            members = tar.getmembers()
            tops = sorted({m.name.split("/", 1)[0] for m in members})
            if tops != [top_dir]:
                raise PinError(
                    f"{name}: its top folder is {', '.join(tops) or 'missing'}, the "
                    f"{version} sdist's is {top_dir}: not the release asked for",
                    hint=f"pass the sdist of {version} (--sdist), or let pip fetch it",
                )
            unsafe = unsafe_members(members, top_dir)
            if unsafe:
                raise PinError(
                    f"{name}: refusing to unpack: {len(unsafe)} unsafe member(s)", details=unsafe
                )
            info = next((m for m in members if m.name == f"{top_dir}/PKG-INFO"), None)
            handle = tar.extractfile(info) if info is not None and info.isfile() else None
            text = handle.read().decode("utf-8", "replace") if handle else ""
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise PinError(f"{name}: not a readable sdist archive ({exc})") from None
    found = re.search(r"^Version:[ \t]*(\S+)[ \t]*$", text, re.MULTILINE)
    if found is None:
        raise PinError(
            f"{name}: no {top_dir}/PKG-INFO with a Version: line; cannot tell its version",
            hint=f"pass the sdist of {version} as published (it has PKG-INFO)",
        )
    if found.group(1) != version:
        raise PinError(
            f"{name}: PKG-INFO says version {found.group(1)}, not the {version} asked for "
            f"(its top folder {top_dir} was renamed?)",
            hint=f"pass the sdist of {version} (--sdist), or let pip fetch it",
        )


# -- the replay --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Conflict:
    """One file the 3-way merge could not resolve: how (``kind``), how many marked regions,
    and the preimage line of the first hunk ``git apply`` could not place."""

    path: str
    regions: int
    failed_hunks_at: tuple[int, ...]
    kind: str = "both modified"


@dataclass(frozen=True)
class Outcome:
    """What happened to one patch on the new base."""

    name: str
    status: Status
    files: tuple[str, ...]
    offsets: tuple[tuple[str, int, int], ...] = ()
    conflicts: tuple[Conflict, ...] = ()
    absorbed_files: tuple[str, ...] = ()
    detail: tuple[str, ...] = ()
    refreshed: bytes | None = field(default=None, repr=False, compare=False)
    marked: dict[str, bytes] = field(default_factory=dict, repr=False, compare=False)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status,
            "files": list(self.files),
            "offsets": [
                {"path": path, "hunk": hunk, "offset": offset}
                for path, hunk, offset in self.offsets
            ],
            "conflicts": [
                {
                    "path": c.path,
                    "kind": c.kind,
                    "regions": c.regions,
                    "failed_hunks_at": list(c.failed_hunks_at),
                }
                for c in self.conflicts
            ],
            "absorbed_files": list(self.absorbed_files),
            "detail": list(self.detail),
        }


def diff_blocks(data: bytes) -> dict[str, bytes]:
    """The ``diff --git`` block of each file of a patch, by path (a patch per file)."""
    _header, diff = split_patch(data)
    blocks: dict[str, bytes] = {}
    starts = [m.start() for m in re.finditer(rb"^diff --git ", diff, re.MULTILINE)]
    for begin, end in zip(starts, [*starts[1:], len(diff)], strict=True):
        block = diff[begin:end]
        first = block.split(b"\n", 1)[0].decode("latin-1")
        path = first.rsplit(" b/", 1)[-1]
        blocks[path] = block
    return blocks


def replay(
    patches: Sequence[Patch],
    data: dict[str, bytes],
    old_tree: Path,
    new_tree: Path,
    workdir: Path,
    *,
    labels: tuple[str, str] = ("old base", "new base"),
    log: Log = _quiet,
) -> list[Outcome]:
    """Replay ``patches`` (their file bytes in ``data``) from ``old_tree`` onto ``new_tree``."""
    repo = ScratchRepo.create(workdir / "repo")
    old_base = repo.import_tree(old_tree, labels[0])
    repo.branch(OLD_BASE, old_base)
    for patch in patches:
        result = repo.am(data[patch.name])
        if not result.ok:
            repo.abort_am()
            raise PatchDoesNotApply(
                f"{patch.name} does not apply to the current base ({labels[0]})",
                details=result.tail(8),
                hint="the series itself is broken: run patchset apply first",
            )
    repo.branch("old", "HEAD")
    repo.checkout(old_base)
    new_base = repo.import_tree(new_tree, labels[1])
    repo.branch("new-base", new_base)
    outcomes: list[Outcome] = []
    for index, patch in enumerate(patches, start=1):
        log(f"Replaying {patch.name} ({index}/{len(patches)})")
        outcome = _replay_one(repo, patch, data[patch.name])
        lost = [
            o.name for o in outcomes if o.status == "conflict" and o.name in patch.header.depends_on
        ]
        if outcome.status == "conflict" and lost:
            outcome = replace(
                outcome,
                detail=(*(f"depends on {n}, which conflicts" for n in lost), *outcome.detail),
            )
        outcomes.append(outcome)
    repo.branch("new", "HEAD")
    return outcomes


def _replay_one(repo: ScratchRepo, patch: Patch, data: bytes) -> Outcome:
    files = patch.paths
    blocks = diff_blocks(data)
    absorbed = tuple(
        path for path, block in blocks.items() if repo.apply_check(block, reverse=True).ok
    )
    if len(absorbed) == len(blocks):
        return Outcome(
            patch.name,
            "absorbed",
            files,
            absorbed_files=absorbed,
            detail=("every file's change is already in the new base",),
        )
    forward = repo.apply_check(data)
    head = repo.head()
    if forward.ok:
        result = repo.am(data)
        if not result.ok:  # git apply said yes; am must agree
            repo.abort_am()
            raise PatchsetError(
                f"{patch.name}: git am failed where git apply succeeded", details=result.tail(8)
            )
        offsets = tuple((o.path, o.number, o.offset) for o in forward.offsets)
        status: Status = "offsets" if offsets else "clean"
        return Outcome(
            patch.name,
            status,
            files,
            offsets=offsets,
            absorbed_files=absorbed,
            refreshed=repo.format_patch(),
        )
    result = repo.am(data, three_way=True)
    if result.ok:
        if repo.head() == head:
            return Outcome(
                patch.name,
                "absorbed",
                files,
                absorbed_files=absorbed,
                detail=("the 3-way merge left nothing to commit",),
            )
        return Outcome(
            patch.name,
            "merged",
            files,
            absorbed_files=absorbed,
            detail=tuple(_failed_text(forward.failed)),
            refreshed=repo.format_patch(),
        )
    unmerged = repo.unmerged()
    failed_at: dict[str, list[int]] = {}
    for path, line in forward.failed:
        failed_at.setdefault(path, []).append(line)
    conflicts = tuple(
        Conflict(
            path,
            repo.conflict_regions(path),
            tuple(failed_at.get(path, ())),
            ADDED_BY_LOST_PATCH
            if state == "DU" and repo.read(OLD_BASE, path) is None
            else UNMERGED_STATES[state],
        )
        for path, state in sorted(unmerged.items())
    )
    if not conflicts:  # git could not even start the merge (e.g. a preimage file is gone)
        conflicts = tuple(
            Conflict(path, 0, tuple(lines), "does not apply and cannot be merged")
            for path, lines in sorted(failed_at.items())
        )
    marked = {
        c.path: (repo.path / c.path).read_bytes()
        for c in conflicts
        if (repo.path / c.path).is_file() and c.regions
    }
    repo.abort_am()
    repo.checkout(head)
    return Outcome(
        patch.name,
        "conflict",
        files,
        conflicts=conflicts,
        absorbed_files=absorbed,
        detail=tuple(line for line in result.tail(8) if not line.startswith("hint:")),
        marked=marked,
    )


def _failed_text(failed: Sequence[tuple[str, int]]) -> list[str]:
    return [f"hunk at {path}:{line} needed the 3-way merge" for path, line in failed]


# -- report and output -------------------------------------------------------------------------


@dataclass(frozen=True)
class Release:
    """One end of the rebase: a target's version and sdist."""

    version: str
    filename: str
    sha256: str


@dataclass(frozen=True)
class RebaseReport:
    target: str
    old: Release
    new: Release
    outcomes: tuple[Outcome, ...]

    def summary(self) -> dict[str, int]:
        return {s: sum(1 for o in self.outcomes if o.status == s) for s in STATUSES}

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "tool": f"patchset {__version__}",
            "target": self.target,
            "from": vars(self.old),
            "onto": vars(self.new),
            "summary": self.summary(),
            "patches": [o.to_json() for o in self.outcomes],
        }

    def table(self) -> list[str]:
        rows = [("patch", "status", "detail")]
        for o in self.outcomes:
            if o.status == "conflict":
                what = "; ".join(
                    f"{c.path}: {c.kind}, {c.regions} marked region(s)"
                    + (f", hunk at line {c.failed_hunks_at[0]} fails" if c.failed_hunks_at else "")
                    for c in o.conflicts
                )
                what += "".join(f"; {d}" for d in o.detail if d.startswith("depends on"))
            elif o.status == "offsets":
                what = ", ".join(f"{p} hunk {h} {off:+d}" for p, h, off in o.offsets)
            elif o.absorbed_files:
                what = "already upstream: " + ", ".join(o.absorbed_files)
            else:
                what = "; ".join(o.detail)
            rows.append((o.name, o.status, what))
        width = [max(len(r[i]) for r in rows) for i in range(2)]
        return [f"{a:<{width[0]}}  {b:<{width[1]}}  {c}".rstrip() for a, b, c in rows]


def report_json(report: RebaseReport) -> str:
    return json.dumps(report.to_json(), indent=2, sort_keys=True) + "\n"


def rewrite_pins(text: str, target: str, updates: dict[str, dict[str, str]]) -> str:
    """``pins.toml`` text with ``key = "value"`` lines of ``[target.kind]`` tables replaced.

    ``updates`` maps a table name (``sdist``, ``wheel``, ``sdist.env``) to {key: new value};
    comments and every other line are kept. Raises PinError for a key that is not there.
    """
    out = []
    table = None
    seen: set[tuple[str, str]] = set()
    for line in text.split("\n"):
        header = re.match(r"^\[(?P<name>[^\]]+)\]\s*$", line)
        if header:
            name = header.group("name")
            table = name[len(target) + 1 :] if name.startswith(target + ".") else None
        assignment = re.match(r"^(?P<key>[A-Za-z_][A-Za-z0-9_]*)\s*=", line)
        if table in updates and assignment and assignment.group("key") in updates[table]:
            key = assignment.group("key")
            line = f"{key} = {json.dumps(updates[table][key])}"
            seen.add((table, key))
        out.append(line)
    missing = [
        f"[{target}.{t}] {k}" for t, keys in updates.items() for k in keys if (t, k) not in seen
    ]
    if missing:
        raise PinError("cannot rewrite pins.toml: no " + ", ".join(missing))
    return "\n".join(out)


def write_rebased(
    dest: Path,
    report: RebaseReport,
    series_names: Sequence[str],
    patch_bytes: dict[str, bytes],
    pins_text: str,
) -> list[str]:
    """Write the rebased series into the new directory ``dest``; return the series entries.

    Applied patches are written refreshed; absorbed ones are dropped and conflicting ones are
    left out of ``series`` (both listed as comments), their original bytes and marked files
    under ``conflicts/``. Patches of other targets are copied unchanged.
    """
    if dest.exists():
        raise PatchsetError(
            f"refusing to write the rebased series into existing {dest}",
            hint="choose a new directory with --to (the current series is never overwritten)",
        )
    dest.mkdir(parents=True)
    by_name = {o.name: o for o in report.outcomes}
    entries: list[str] = []
    comments: list[str] = [
        f"Rebased by patchset {__version__} from {report.target} {report.old.version} "
        f"onto {report.new.version}; see rebase-report.json."
    ]
    for name in series_names:
        outcome = by_name.get(name)
        out = dest / "patches" / name
        out.parent.mkdir(parents=True, exist_ok=True)
        if outcome is None:
            out.write_bytes(patch_bytes[name])
            entries.append(name)
        elif outcome.status == "absorbed":
            out.unlink(missing_ok=True)
            comments.append(f"absorbed upstream, dropped: {name}")
        elif outcome.status == "conflict":
            where = dest / "conflicts" / name.removesuffix(".patch")
            where.mkdir(parents=True, exist_ok=True)
            (where / "original.patch").write_bytes(patch_bytes[name])
            for path, content in outcome.marked.items():
                marked = where / "files" / path
                marked.parent.mkdir(parents=True, exist_ok=True)
                marked.write_bytes(content)
            rel = where.relative_to(dest).as_posix()
            comments.append(f"conflict, left out: {name} (see {rel}/)")
        else:
            assert outcome.refreshed is not None
            out.write_bytes(outcome.refreshed)
            entries.append(name)
    series = "".join(f"# {c}\n" for c in comments) + "".join(f"{e}\n" for e in entries)
    (dest / "series").write_text(series, encoding="utf-8")
    (dest / "pins.toml").write_text(pins_text, encoding="utf-8")
    (dest / "rebase-report.json").write_text(report_json(report), encoding="utf-8")
    return entries


def _write_staged(dest: Path, write: Callable[[Path], None]) -> None:
    """Write a new directory all or nothing: into a hidden sibling, renamed to ``dest`` last
    (a kill or a full disk leaves no ``dest``; the sibling is deleted on failure)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    staged = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}.partial-"))
    try:
        staged.rmdir()  # write_rebased makes it (it refuses an existing directory)
        write(staged)
        os.rename(staged, dest)
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise


def run_rebase(
    root: Path,
    onto: str,
    *,
    dry_run: bool,
    dest: Path | None = None,
    sdist: Path | None = None,
    wheel: Path | None = None,
    old_tree: Path | None = None,
    workdir: Path | None = None,
    keep: bool = False,
    workspace: Path | None = None,
    test_python: str | None = None,
    pip: PipRunner = run_pip,
    log: Log = _quiet,
) -> RebaseReport:
    """Pin ``onto``'s sdist, replay the target's patches onto it, report; write unless dry-run.

    Reads the series, pins and patches of ``root`` and never writes there (the download cache
    aside). ``sdist``/``wheel`` use local files instead of pip; ``old_tree`` replaces the
    pristine unpack of the current pin; ``keep`` keeps the scratch repository and logs it.
    ``workspace`` (also with ``dry_run``: it is asked for explicitly) leaves the persistent
    workspace of :mod:`patchset.workspace` there, or reuses the one there when it was made
    from the same bases and patch files; ``test_python`` (its installed package must be the
    new release) is the python its ``run-tests`` uses.
    """
    from patchset import workspace as ws
    from patchset.fetch import cache_dir, pristine_tree
    from patchset.pins import load_pins
    from patchset.series import for_target, load_series

    target, version = parse_onto(onto)
    pins = load_pins(root / "pins.toml")
    old_pin = pins.get(target, "sdist")
    old_version = pinned_version(old_pin)
    if version == old_version:
        raise PatchsetError(f"{target} is already pinned at {version}")
    series = load_series(root)
    patches = for_target(series, target)
    data = {p.name: (root / "patches" / p.name).read_bytes() for p in series}
    if not dry_run and dest is None:
        dest = root / "build" / f"rebase-{target}-{version}"
    if dest is not None:
        refuse_inside_series(root, dest, "--to")
    if dest is not None and dest.exists():
        raise PatchsetError(
            f"refusing to write the rebased series into existing {dest}",
            hint="choose a new directory with --to (the current series is never overwritten)",
        )
    revision = None
    if workspace is not None:
        workspace = workspace.absolute()
        refuse_inside_series(root, workspace, "--workspace")
        if workspace.exists() or workspace.is_symlink():
            ws.read_manifest(workspace)  # a directory that is no workspace: refused first
        else:
            revision = ws.refuse_dirty_checkout(root)
        if test_python is not None:
            test_python = ws.test_python_version(test_python, version, target)
    new_pin = release_pins(old_pin, version)
    cache = cache_dir(root) / "rebase"
    archive, digest = fetch_release(new_pin, cache, source=sdist, pip=pip, log=log)
    log(f"Pinned {new_pin.filename} sha256 {digest}")
    base_tree = old_tree or pristine_tree(target, root=root)
    origin = ws.origin_of(
        target,
        (old_version, old_pin.sha256),
        (version, digest),
        data,
        [p.name for p in patches],
    )
    stack = contextlib.ExitStack()
    staged: Path | None = None
    tmp: Path | None = None
    try:
        if workspace is not None:
            stack.enter_context(ws.workspace_lock(workspace))
            for leftover in ws.remove_leftovers(workspace):
                log(f"Removed {leftover}, left by a killed run")
            if workspace.exists():
                ws.check_reusable(workspace, origin)
                log(
                    f"Reusing the workspace {workspace}: made from the same bases and patch "
                    "files, its branches and work trees verified; nothing in it is written"
                )
            else:
                staged = ws.staging_dir(workspace)
        tmp = Path(tempfile.mkdtemp(dir=workdir, prefix=f"rebase-{target}-{version}-"))
        new_tree = tmp / "new-base"
        extract_sdist(archive, new_pin.top_dir or "", new_tree)
        outcomes = replay(
            patches,
            data,
            base_tree,
            new_tree,
            staged or tmp,
            labels=(f"{target} {old_version}", f"{target} {version}"),
            log=log,
        )
        report = RebaseReport(
            target,
            Release(old_version, old_pin.filename, old_pin.sha256),
            Release(version, new_pin.filename, digest),
            tuple(outcomes),
        )
        if not dry_run:
            assert dest is not None
            _write_staged(
                dest,
                lambda out: _write_output(
                    root, out, report, series, data, pins, new_tree, wheel, pip, log
                ),
            )
            log(f"Wrote the rebased series to {dest}")
        if staged is not None and workspace is not None:
            wheel_file = wheel or cache / new_wheel_name(pins, target, old_version, version)
            manifest = ws.finish(
                staged,
                workspace,
                origin=origin,
                outcomes=report.outcomes,
                data=data,
                test_files={p.name: own_tests(p) for p in patches},
                depends={p.name: p.header.depends_on for p in patches},
                revision=revision,
                test_python=test_python,
                wheel=str(wheel_file) if wheel_file.is_file() else None,
                log=log,
            )
            staged = None
            log(f"Made the workspace {workspace}; next:")
            for step in manifest["next_steps"]:
                log(f"  {step}")
    finally:
        if staged is not None:
            shutil.rmtree(staged, ignore_errors=True)
        stack.close()
        if tmp is not None and keep:
            log(f"Kept the scratch repository: git -C {tmp / 'repo'} log --oneline --all")
        elif tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    return report


def own_tests(patch: Patch) -> tuple[str, ...]:
    """The test modules a patch adds or changes under ``tests/``."""
    from patchset.export import test_files

    return test_files(patch)


def new_wheel_name(pins: Any, target: str, old: str, new: str) -> str:
    """The file name the new release's wheel gets in the cache (as :func:`_write_output`)."""
    try:
        return str(pins.get(target, "wheel").filename.replace(old, new))
    except PinError:
        return f"{target}-{new}.whl"


def _write_output(
    root: Path,
    dest: Path,
    report: RebaseReport,
    series: Sequence[Patch],
    data: dict[str, bytes],
    pins: Any,
    new_tree: Path,
    wheel: Path | None,
    pip: PipRunner,
    log: Log,
) -> None:

    from patchset.fetch import cache_dir, pristine_tree
    from patchset.lockfile import compute_lock, pin_digests, write_lock
    from patchset.series import load_series

    target, old, new = report.target, report.old.version, report.new.version
    sdist_pin = pins.get(target, "sdist")
    updates: dict[str, dict[str, str]] = {
        "sdist": {
            "requirement": sdist_pin.requirement.replace(old, new),
            "filename": report.new.filename,
            "sha256": report.new.sha256,
            "top_dir": (sdist_pin.top_dir or "").replace(old, new),
        },
    }
    # [target.wheel] and every [target.wheel_<arch>]: the new release's file for each platform
    # (`--wheel` stands for [target.wheel] only; the others are downloaded).
    for wheel_pin in pins.wheels(target):
        new_wheel_pin = replace(
            wheel_pin,
            requirement=wheel_pin.requirement.replace(old, new),
            filename=wheel_pin.filename.replace(old, new),
            sha256="",
        )
        _, wheel_digest = fetch_release(
            new_wheel_pin,
            cache_dir(root) / "rebase",
            source=wheel if wheel_pin.platform is None else None,
            pip=pip,
            log=log,
        )
        updates[wheel_pin.table] = {
            "requirement": new_wheel_pin.requirement,
            "filename": new_wheel_pin.filename,
            "sha256": wheel_digest,
        }
    env = {key: new for key, value in sdist_pin.env if value == old}
    if env:
        updates["sdist.env"] = env
    pins_text = rewrite_pins((root / "pins.toml").read_text(encoding="utf-8"), target, updates)
    write_rebased(dest, report, [p.name for p in series], data, pins_text)
    rebased = load_series(dest)

    def reader(tree: Path) -> Callable[[str], bytes | None]:
        def read(rel: str) -> bytes | None:
            path = tree / rel
            return path.read_bytes() if path.is_file() else None

        return read

    bases = {
        t: reader(new_tree if t == target else pristine_tree(t, root=root))
        for t in dict.fromkeys(p.target for p in rebased)
    }
    write_lock(dest, compute_lock(rebased, bases, pin_digests(dest)).lock)
