"""The ``patchset`` command line: one small adapter per command; the only place that prints.

Exit codes: 0 ok, 1 error or drift, 2 nothing to do. Errors print ``patchset: error: <what>``,
one indented line per detail, then ``hint: <next step>``.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from patchset import __version__, journal
from patchset.apply import apply_series, recover_tree
from patchset.errors import (
    LockError,
    NothingToDo,
    PatchFormatError,
    PatchsetError,
    PinError,
    TreeStateError,
)
from patchset.hashing import sha256_bytes
from patchset.journal import os_error_text
from patchset.lockfile import (
    BaseReader,
    Computed,
    compute_lock,
    load_lock,
    lock_differences,
    pin_digests,
    series_differences,
    write_lock,
)
from patchset.model import TARGETS, Lock, Patch, TreeState
from patchset.newtree import created_if_missing
from patchset.refresh import refresh_patch
from patchset.repowrite import recover_repo, repo_lock
from patchset.series import for_target, load_series, name_problem
from patchset.tree import DEFAULT_TIMEOUT_S, Tree, read_state, tree_lock
from patchset.unapply import stack_reader, unapply_series
from patchset.verify import tree_status, verify_tree

if TYPE_CHECKING:
    from patchset.precommit import HookConfig


def _info(message: str) -> None:
    print(message, flush=True)


def find_repo(start: Path) -> Path:
    """The nearest directory at or above ``start`` holding a ``series`` file."""
    for candidate in (start, *start.parents):
        if (candidate / "series").is_file():
            return candidate
    raise PatchsetError(
        f"no series file at or above {start}", hint="run inside a dcp-series checkout or pass -C"
    )


def _target(args: argparse.Namespace, patch: str | None = None) -> str:
    if args.target:
        return str(args.target)
    if patch:
        return patch.split("/", 1)[0]
    return "vllm"


def _tree_target(args: argparse.Namespace, repo: Path) -> tuple[Tree, str]:
    """The tree to inspect and its target: ``--target``, else the target its state records."""
    if args.target or not args.tree:
        target = _target(args)
        return _existing_tree(_tree(args, repo, target)), target
    tree = _existing_tree(_tree(args, repo, "vllm"))
    if journal.pending(tree.root):  # the command recovers (or names) it; state is not read yet
        return tree, "vllm"
    state = read_state(tree.root)
    return tree, state.target if state else "vllm"


def _tree(args: argparse.Namespace, repo: Path, target: str) -> Tree:
    from patchset.outputs import refuse_inside_series

    root = Path(args.tree) if args.tree else repo / "build" / target
    refuse_inside_series(repo, root, "--tree")  # apply/unapply/refresh write there
    return Tree(root.resolve())


def _existing_tree(tree: Tree) -> Tree:
    if not tree.root.is_dir():
        raise TreeStateError(f"{tree.root}: no such tree", hint="patchset apply --tree DIR")
    return tree


def _create_tree(tree: Tree, repo: Path, target: str) -> None:
    try:
        from patchset.fetch import unpack_sdist
    except ImportError as exc:
        raise TreeStateError(
            f"{tree.root} does not exist and patchset cannot unpack the pinned sdist ({exc})",
            hint="pass --tree with an unpacked tree of the pinned release",
        ) from exc
    _info(f"Unpacking the pinned {target} sdist into {tree.root}")
    unpack_sdist(target, tree.root, root=repo)


def _base_pin(repo: Path, target: str) -> str | None:
    return pin_digests(repo).get(f"{target}.sdist")


def _release(repo: Path, target: str) -> str | None:
    from patchset.pins import load_pins

    try:
        return load_pins(repo / "pins.toml").get(target, "sdist").requirement
    except PatchsetError:
        return None


def cmd_apply(args: argparse.Namespace, repo: Path) -> int:
    target = _target(args, args.upto)
    tree = _tree(args, repo, target)
    patches = for_target(load_series(repo), target)
    lock = load_lock(repo)
    unpack = lambda: _create_tree(tree, repo, target)  # noqa: E731
    try:
        with created_if_missing(tree.root, unpack, args.wait, _info):
            outcome = apply_series(
                tree,
                patches,
                lock,
                target=target,
                upto=args.upto,
                base_pin=_base_pin(repo, target),
                pins=pin_digests(repo),
                release=_release(repo, target),
                timeout=args.wait,
                log=_info,
            )
    except NothingToDo:
        if args.if_needed:
            _info(f"{tree.root}: the series is already applied and its files verify")
            return 0
        raise
    if outcome.git_head:
        _info(f"git checkout at {outcome.git_head}")
    return 0


def cmd_recover(args: argparse.Namespace, repo: Path) -> int:
    checkout = args.recovered_checkout or recover_repo(repo, _info, args.wait)
    root = _tree(args, repo, _target(args)).root
    in_tree = False
    if root.is_dir():
        with tree_lock(root, args.wait):
            in_tree = recover_tree(Tree(root), _info)
    elif args.tree:
        _existing_tree(Tree(root))
    if not (checkout or in_tree):
        raise NothingToDo(f"{root}: no interrupted run to recover (nor in {repo})")
    return 0


def cmd_unapply(args: argparse.Namespace, repo: Path) -> int:
    if args.upto:
        target = _target(args, args.upto)
        tree = _existing_tree(_tree(args, repo, target))
    else:
        tree, target = _tree_target(args, repo)
    patches = for_target(load_series(repo), target)
    unapply_series(tree, patches, target=target, upto=args.upto, timeout=args.wait, log=_info)
    return 0


def cmd_verify(args: argparse.Namespace, repo: Path) -> int:
    tree, target = _tree_target(args, repo)
    patches = for_target(load_series(repo), target)
    state = verify_tree(tree, patches, load_lock(repo))
    if not state.applied:
        touched = len({path for p in patches for path in p.paths})
        _info(
            f"OK: 0 of {len(patches)} patch(es) applied: {tree.root} is the pinned base "
            f"({touched} touched file(s) at their preimages); patchset apply patches it"
        )
        return 0
    files = len(state.expected())
    _info(f"OK: {len(state.applied)} patch(es), {files} touched file(s) match in {tree.root}")
    return 0


def cmd_status(args: argparse.Namespace, repo: Path) -> int:
    tree, target = _tree_target(args, repo)
    rows = tree_status(tree, for_target(load_series(repo), target))
    if args.json:
        _info(
            json.dumps(
                {"tree": str(tree.root), "target": target, "patches": dict(rows)},
                indent=2,
                sort_keys=True,
            )
        )
    else:
        for name, status in rows:
            _info(f"{status:<12} {name}")
    return 1 if any(status == "drifted" for _, status in rows) else 0


def cmd_refresh(args: argparse.Namespace, repo: Path) -> int:
    target = _target(args, args.patch)
    with repo_lock(repo, args.wait):
        series = load_series(repo)
        patches = for_target(series, target)
        if args.patch not in {p.name for p in patches}:
            raise PatchsetError(f"{args.patch}: not in series", hint="name it as series lists it")
        tree = _existing_tree(_tree(args, repo, target))

        def make_lock(new_patch: Patch, state: TreeState) -> Computed:
            new_series = tuple(new_patch if p.name == new_patch.name else p for p in series)
            view = {target: stack_reader(tree, state, {}, 0)}
            bases = _bases(args, repo, new_series, tree_view=view)
            return compute_lock(new_series, bases, pin_digests(repo))

        result = refresh_patch(
            tree, patches, args.patch, repo=repo, make_lock=make_lock, timeout=args.wait, log=_info
        )
    for warning in result.warnings:
        _info(f"warning: {warning}")
    if result.dropped:
        _info(f"{args.patch}: dropped {', '.join(result.dropped)} (back at their preimages)")
    if not result.changed:
        _info(f"{args.patch}: unchanged")
    else:
        _info(f"Refreshed {args.patch} ({len(result.images.files)} file(s))")
    _info(f"{'Wrote' if result.lock_written else 'Unchanged'} series.lock")
    return 0 if result.changed else 2


def _dir_reader(root: Path, expected: dict[str, str] | None = None) -> BaseReader:
    """Reads paths of the base tree ``root``; with ``expected`` (the pristine tree's file list)
    each file read must be the one unpacked: an edited, added or removed file is an error."""
    tree = Tree(root.resolve())

    def read(path: str) -> bytes | None:
        problem = tree.symlink_problem(path)
        if problem:
            raise PatchsetError(f"base tree {root}: {problem}")
        data = tree.read(path)
        if expected is not None and (
            (data is None) != (path not in expected)
            or (data is not None and sha256_bytes(data) != expected[path])
        ):
            raise PinError(
                f"{root}/{path} is not the pinned sdist's file (the unpacked base was edited)",
                hint="remove build/base (make clean) and run again; the lock is not at fault",
            )
        return data

    return read


def _pristine_reader(target: str, repo: Path, offline: bool = False) -> BaseReader:
    from patchset.fetch import pristine_manifest, pristine_tree

    tree = pristine_tree(target, root=repo, offline=offline)
    return _dir_reader(tree, pristine_manifest(target, root=repo))


def _bases(
    args: argparse.Namespace,
    repo: Path,
    patches: tuple[Patch, ...],
    tree_view: dict[str, BaseReader] | None = None,
) -> dict[str, BaseReader]:
    given: dict[str, Path] = {}
    for spec in getattr(args, "base", None) or []:
        target, sep, directory = spec.rpartition("=")
        given[target if sep else "vllm"] = Path(directory)
    readers: dict[str, BaseReader] = {}
    for target in dict.fromkeys(p.target for p in patches):
        if target in given:
            readers[target] = _dir_reader(given[target])
        elif tree_view and target in tree_view:
            readers[target] = tree_view[target]
        else:
            readers[target] = _pristine_reader(target, repo)
    return readers


def _write_lock(repo: Path, patches: tuple[Patch, ...], bases: dict[str, BaseReader]) -> Lock:
    """Compute and write the lock (the caller holds the checkout's lock: the series it read is
    the one written for)."""
    computed = compute_lock(patches, bases, pin_digests(repo))
    for warning in computed.warnings:
        _info(f"warning: {warning}")
    changed = write_lock(repo, computed.lock)
    _info(f"{'Wrote' if changed else 'Unchanged'} series.lock ({len(patches)} patch(es))")
    return computed.lock


def cmd_import(args: argparse.Namespace, repo: Path) -> int:
    from patchset.importer import git_identity, import_patch

    if args.name is not None and (reason := name_problem(args.name)):
        # before the name picks a target, a base or a path: nothing is read or staged for it
        raise PatchFormatError(f"--name {args.name!r}: {reason}")
    target = args.target or (args.name.split("/", 1)[0] if args.name else "vllm")
    data = sys.stdin.buffer.read() if args.file == "-" else Path(args.file).read_bytes()
    base_dir = _pristine_bases(args, repo, [target])[target]
    series = load_series(repo)
    bases = _bases(args, repo, series)
    given = {t if sep else "vllm" for t, sep, _ in (s.rpartition("=") for s in args.base or [])}
    # a --base tree is the user's; the pristine one is checked file by file as it is read
    bases[target] = _dir_reader(base_dir) if target in given else _pristine_reader(target, repo)
    identity = git_identity(repo)

    def base_mode(path: str) -> str | None:
        found = base_dir / path
        if not found.is_file() or found.is_symlink():
            return None
        return "100755" if found.stat().st_mode & 0o111 else "100644"

    name, _ = import_patch(
        repo,
        data,
        target=target,
        bases=bases,
        base_mode=base_mode,
        identity=identity,
        subject=args.subject,
        name=args.name,
        log=_info,
    )
    _info(f"Imported {name}: patches/{name}, listed in series, series.lock updated")
    return 0


def cmd_lock(args: argparse.Namespace, repo: Path) -> int:
    if not args.check:
        with repo_lock(repo):
            patches = load_series(repo)
            _write_lock(repo, patches, _bases(args, repo, patches))
        return 0
    patches = load_series(repo)
    lock = load_lock(repo)
    stale = series_differences(lock, patches, pin_digests(repo))
    if not stale:
        computed = compute_lock(patches, _bases(args, repo, patches), pin_digests(repo))
        stale = lock_differences(lock, computed.lock)
    if stale:
        raise LockError(
            f"series.lock is stale: {len(stale)} difference(s)",
            hint="run patchset lock and commit series.lock",
            details=stale,
        )
    _info(f"series.lock is current ({len(patches)} patch(es))")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="patchset", description="Apply, verify and lock the dcp-series patch series."
    )
    parser.add_argument("--version", action="version", version=f"patchset {__version__}")
    parser.add_argument("-C", dest="repo", help="the dcp-series checkout (default: search up)")
    sub = parser.add_subparsers(dest="command", required=True)

    def tree_args(p: argparse.ArgumentParser, wait: bool = True) -> None:
        p.add_argument("--tree", help="the target tree (default: build/<target>)")
        p.add_argument("--target", choices=TARGETS, help="default: vllm, or the patch's target")
        if wait:
            p.add_argument(
                "--wait", type=float, default=DEFAULT_TIMEOUT_S, help="seconds to wait for the tree"
            )

    p = sub.add_parser("apply", help="apply the series (all or nothing)")
    tree_args(p)
    p.add_argument("--upto", help="stop after this patch")
    p.add_argument(
        "--if-needed",
        action="store_true",
        help="exit 0 (not 2) when the series is already applied and its files verify",
    )
    p.set_defaults(func=cmd_apply)
    p = sub.add_parser("recover", help="roll back a run that was killed or failed mid-write")
    tree_args(p)
    p.set_defaults(func=cmd_recover)
    p = sub.add_parser("unapply", help="unapply, newest first")
    tree_args(p)
    p.add_argument("--upto", help="keep this patch (and those below) applied")
    p.set_defaults(func=cmd_unapply)
    p = sub.add_parser("verify", help="check every touched file against its postimage")
    tree_args(p, wait=False)
    p.set_defaults(func=cmd_verify)
    p = sub.add_parser("status", help="per patch: applied / not applied / drifted")
    tree_args(p, wait=False)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_status)
    p = sub.add_parser("refresh", help="rewrite a patch's diff from the tree, update the lock")
    tree_args(p)
    p.add_argument("patch")
    p.add_argument("--base", action="append", help="TARGET=DIR base tree for the lock")
    p.set_defaults(func=cmd_refresh)
    p = sub.add_parser("import", help="add a format-patch, git diff or plain diff to the series")
    p.add_argument("file", help="the patch file ('-': stdin)")
    p.add_argument("--subject", help="'[Tag] Title' when the input has none (or to replace it)")
    p.add_argument("--name", help="the series entry (default: <target>/<next NNNN>-<slug>.patch)")
    p.add_argument("--target", choices=TARGETS, help="default: vllm, or --name's target")
    p.add_argument("--base", action="append", help="TARGET=DIR pristine base (default: fetch)")
    p.add_argument("--offline", action="store_true", help="never run pip; use the cache only")
    p.set_defaults(func=cmd_import)
    p = sub.add_parser("lock", help="regenerate series.lock (or --check it)")
    p.add_argument("--check", action="store_true", help="exit 1 if series.lock is stale")
    p.add_argument("--base", action="append", help="TARGET=DIR pristine base (default: fetch)")
    p.set_defaults(func=cmd_lock)
    _add_dist_commands(sub)
    _add_upstream_commands(sub)
    return parser


# ----------------------------------------------------------------------------------------------
# Distribution commands (fetch, wheel): adapters over patchset.fetch and patchset.wheel.


def cmd_fetch(args: argparse.Namespace, repo: Path) -> int:
    from patchset.fetch import cache_dir, fetch_all
    from patchset.pins import load_pins

    cache = cache_dir(repo)
    source = Path(args.source).resolve() if args.source else None
    for got in fetch_all(load_pins(repo / "pins.toml"), cache, offline=args.offline, source=source):
        _info(f"{got.action:<10} {got.pin.key:<18} {got.path}  sha256={got.pin.sha256}")
    return 0


def cmd_wheel(args: argparse.Namespace, repo: Path) -> int:
    from patchset.outputs import refuse_inside_series
    from patchset.series import for_target, load_series
    from patchset.wheel import RECEIPTS, wheel_from_series

    for option, value in (("--out", args.out), ("--tree", args.tree)):
        if value:
            refuse_inside_series(repo, Path(value), option)
    # Without --target: the vLLM wheel (--tree), then the b12x wheel (build/b12x) when the
    # series patches b12x; an unpatched b12x is installed from its pinned wheel as is.
    targets = [args.target] if args.target else ["vllm"]
    if not args.target and for_target(load_series(repo), "b12x"):
        targets.append("b12x")
    elif not args.target:
        # A b12x overlay wheel left by an earlier series must not be installed with this one.
        out = Path(args.out).resolve() if args.out else repo / "dist"
        for stale in [out / RECEIPTS["b12x"], *sorted(out.glob("b12x-*+*dcp.*.whl"))]:
            if stale.is_file():
                _info(f"removing {stale.name}: the series has no b12x patches")
                stale.unlink()
    for target in targets:
        built, receipt = wheel_from_series(
            repo,
            target=target,
            tree=Path(args.tree) if args.tree and target == targets[0] else None,
            out_dir=Path(args.out) if args.out else None,
            offline=args.offline,
            log=_info,
            arch=args.platform,
        )
        _info(f"Built {built.path} ({len(built.overlay.files)} file(s) overlaid)")
        _info(f"sha256 {built.sha256}")
        _info(f"receipt {receipt}")
    return 0


def _add_dist_commands(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("fetch", help="download the pinned bases into the cache and verify them")
    p.add_argument("--offline", action="store_true", help="never run pip; use the cache only")
    p.add_argument("--from", dest="source", help="copy pinned files from DIR instead of pip")
    p.set_defaults(func=cmd_fetch)
    p = sub.add_parser("wheel", help="apply, verify and build the overlay wheel + receipt")
    p.add_argument("--tree", help="the tree of --target, or of vllm (default: build/<target>)")
    p.add_argument(
        "--target",
        choices=("vllm", "b12x"),
        help="build only this target's wheel (default: vllm, then b12x if the series patches it)",
    )
    p.add_argument("--out", help="output directory (default: dist)")
    p.add_argument("--offline", action="store_true", help="never run pip; use the cache only")
    p.add_argument(
        "--platform",
        metavar="ARCH",
        help="overlay the wheel pinned for this CPU (x86_64, aarch64: [vllm.wheel_aarch64]); "
        "default: [vllm.wheel] (x86_64); the b12x wheel is pure Python and serves both",
    )
    p.set_defaults(func=cmd_wheel)


# ----------------------------------------------------------------------------------------------
# Upstream commands (export, lint, rebase): adapters over patchset.export, patchset.lint and
# patchset.rebase. Owned by the upstream-export work; see design/upstreaming.md.


def _pristine_bases(
    args: argparse.Namespace, repo: Path, targets: Sequence[str]
) -> dict[str, Path]:
    given: dict[str, Path] = {}
    for spec in getattr(args, "base", None) or []:
        target, sep, directory = spec.rpartition("=")
        given[target if sep else "vllm"] = Path(directory).resolve()
    bases: dict[str, Path] = {}
    for target in dict.fromkeys(targets):
        if target in given:
            bases[target] = given[target]
        else:
            from patchset.fetch import pristine_tree

            bases[target] = pristine_tree(
                target, root=repo, offline=getattr(args, "offline", False)
            )
    return bases


def _test_env(specs: Sequence[str] | None) -> dict[str, str]:
    env: dict[str, str] = {}
    for spec in specs or []:
        key, sep, value = spec.partition("=")
        if not sep or not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", key):
            raise PatchsetError(f"--test-env {spec!r}: expected KEY=VALUE")
        env[key] = value
    return env


def cmd_export(args: argparse.Namespace, repo: Path) -> int:
    import tempfile
    import time

    from patchset.export import (
        OverlayTestRunner,
        check_record,
        check_standalone,
        checkout_revision,
        export_patches,
        mbox_bytes,
        python_package_version,
        select,
        signer_identity,
        table,
        test_run_record,
    )
    from patchset.outputs import refuse_inside_series, write_file_atomic
    from patchset.pins import load_pins
    from patchset.rebase import pinned_version

    started = time.monotonic()
    dest = Path(args.to).resolve() if args.to else repo / "dist" / "export"
    refuse_inside_series(repo, dest, "--to")  # the arguments first, then the environment
    if args.json:
        refuse_inside_series(repo, Path(args.json), "--json")
    env = _test_env(args.test_env)
    signer = signer_identity(repo)
    with repo_lock(repo):  # the series, its patch files and the mboxes made from them agree
        series = load_series(repo)
        selected = select(series, args.patches)
        exported = export_patches(repo, series, selected, dest, signer=signer)
        patch_bytes = {p.name: (repo / "patches" / p.name).read_bytes() for p in series}
        checkout = checkout_revision(repo)  # the revision these patch files were read at
    _info(f"Signed off by {signer} (git config user.name / user.email)")
    failed = False
    for item in exported:
        _info(f"Exported {item.name} -> {item.mbox.relative_to(dest)}, {item.pr_body.name}")
        for problem in item.problems:
            failed = True
            _info(f"  not submittable: {problem}")
    _info(f"Wrote {len(exported)} mbox(es) and PR bodies to {dest}")
    if not args.check:
        return 1 if failed else 0
    mboxes = {p.name: mbox_bytes(p, patch_bytes[p.name], signer) for p in series}
    targets = list(dict.fromkeys(p.target for p in selected))
    bases = _pristine_bases(args, repo, targets)
    given = {spec.rpartition("=")[0] or "vllm" for spec in args.base or []}
    try:  # what the bases are pinned at, for the record (--base trees need no pins)
        pins = load_pins(repo / "pins.toml")
    except PinError:
        pins = None
    base_info: dict[str, dict[str, object]] = {}
    for target in targets:
        info: dict[str, object] = {"tree": str(bases[target]), "given": target in given}
        if pins is not None and any(p.target == target and p.kind == "sdist" for p in pins):
            pin = pins.get(target, "sdist")
            info.update(version=pinned_version(pin), sdist=pin.filename, sha256=pin.sha256)
        base_info[target] = info
        where = "the tree given with --base" if target in given else "the pinned sdist"
        _info(f"Base of {target}: {info.get('version', '?')} ({where}: {bases[target]})")
    (repo / "build").mkdir(exist_ok=True)
    tests_info: dict[str, object] | None = None
    with tempfile.TemporaryDirectory(dir=repo / "build", prefix="export-check-") as tmp:
        runner = None
        if not args.no_tests:
            python = args.test_python
            if "/" in python:  # a path: the tests run in another directory
                python = str(Path(python).absolute())
            # one runner per target: each overlays the target's own import package
            runner = {
                target: OverlayTestRunner(
                    python=python,
                    workdir=Path(tmp),
                    extra_path=args.test_path or "",
                    timeout_s=args.test_timeout,
                    env=env,
                    package=target,
                )
                for target in targets
            }
            versions = {target: python_package_version(python, target) for target in targets}
            tests_info = {
                "python": python,
                **versions,
                "env": env,
                "timeout_s": args.test_timeout,
            }
            shown = ", ".join(f"{t} {v}" for t, v in versions.items())
            _info(f"Tests: {python} ({shown}), env {env or '{}'}")
        results = check_standalone(
            series,
            selected,
            mboxes,
            bases,
            Path(tmp),
            run_tests=runner,
            require_tests=args.require_tests,
            log=_info,
        )
    for line in table(results):
        _info(line)
    report = {
        r.name: {
            "standalone": r.describe(),
            "verdict": r.verdict,
            "needs": list(r.needs),
            "depends_on": list(r.depends_on),
            "tests": test_run_record(r.tests),
        }
        for r in results
    }
    write_file_atomic(
        dest / "check.json", (json.dumps(report, indent=2, sort_keys=True) + "\n").encode()
    )
    for r in results:
        if r.tests is not None and r.tests.ok is False and args.verbose:
            _info(f"== {r.name}: test output")
            for line in r.tests.output_tail:
                _info(f"   {line}")
    if args.json:
        record = check_record(
            results,
            bases=base_info,
            tests=tests_info,
            require_tests=args.require_tests,
            command=["patchset", *args.argv],
            seconds=time.monotonic() - started,
            patch_sha256={name: sha256_bytes(data) for name, data in patch_bytes.items()},
            checkout=checkout,
        )
        out = Path(args.json)
        out.parent.mkdir(parents=True, exist_ok=True)
        write_file_atomic(out, (json.dumps(record, indent=2, sort_keys=True) + "\n").encode())
        _info(f"Wrote {out}")
    return 1 if failed or not all(r.passed for r in results) else 0


def cmd_lint(args: argparse.Namespace, repo: Path) -> int:
    from patchset.export import select
    from patchset.lint import lint_patches

    series = load_series(repo)
    selected = select(series, args.patches)
    bases = _pristine_bases(args, repo, [p.target for p in selected])
    ruff = [args.ruff] if args.ruff else None
    (repo / "build").mkdir(exist_ok=True)
    reports = lint_patches(
        series,
        selected,
        bases,
        ruff=ruff,
        workdir=repo / "build",
        hooks_python=_hooks_python(args, repo),
    )
    bad = 0
    for report in reports:
        _info(f"{'FAIL' if report.findings else 'OK':<4} {report.patch}")
        for finding in report.findings:
            _info(f"  {finding.describe()}")
        for note in report.notes:
            _info(f"  note: {note}")
        bad += bool(report.findings)
    _info(f"{len(reports) - bad} of {len(reports)} patch(es) lint-clean")
    return 1 if bad else 0


def _hooks_python(args: argparse.Namespace, repo: Path) -> Callable[[HookConfig], str]:
    """--hooks-python, or the cached venv of the base's hook requirements (pip, once)."""
    from patchset.fetch import cache_dir
    from patchset.precommit import hook_env

    if args.hooks_python:
        return lambda _config: str(args.hooks_python)
    return lambda config: hook_env(cache_dir(repo), config.requirements, offline=args.offline)


def cmd_rebase(args: argparse.Namespace, repo: Path) -> int:
    from patchset.outputs import refuse_inside_series, write_file_atomic
    from patchset.rebase import report_json, run_rebase

    if args.json:
        refuse_inside_series(repo, Path(args.json), "--json")
    (repo / "build").mkdir(exist_ok=True)
    with repo_lock(repo):  # reads the series while no import/refresh/lock changes it
        report = run_rebase(
            repo,
            args.onto,
            dry_run=args.dry_run,
            dest=Path(args.to).resolve() if args.to else None,
            sdist=Path(args.sdist).resolve() if args.sdist else None,
            wheel=Path(args.wheel).resolve() if args.wheel else None,
            workdir=repo / "build",
            keep=args.keep,
            workspace=Path(args.workspace) if args.workspace else None,
            test_python=args.test_python,
            log=_info,
        )
    for line in report.table():
        _info(line)
    summary = ", ".join(f"{n} {s}" for s, n in report.summary().items() if n)
    _info(
        f"{report.target} {report.old.version} -> {report.new.version}: {summary or 'no patches'}"
    )
    if args.json:
        out = Path(args.json)
        out.parent.mkdir(parents=True, exist_ok=True)
        write_file_atomic(out, report_json(report).encode("utf-8"))
        _info(f"Wrote {out}")
    if args.dry_run:
        return 0
    return 1 if report.summary()["conflict"] else 0


def _add_upstream_commands(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("export", help="per patch: an upstream mbox and a PR body (--check: apply)")
    p.add_argument("patches", nargs="*", metavar="PATCH", help="default: every patch")
    p.add_argument("--to", help="output directory (default: dist/export)")
    p.add_argument(
        "--check",
        action="store_true",
        help="git am each mbox onto the pinned base + its Depends-on only; run its tests on CPU",
    )
    p.add_argument(
        "--test-python",
        default=sys.executable,
        help="a python with vLLM (and its test deps) installed, and b12x for b12x patches "
        "(default: this one)",
    )
    p.add_argument("--test-path", help="extra PYTHONPATH entries for the tests")
    p.add_argument("--no-tests", action="store_true", help="check application only")
    p.add_argument(
        "--test-env",
        action="append",
        metavar="KEY=VALUE",
        help="environment for the tests (repeatable; e.g. TRITON_INTERPRET=1)",
    )
    p.add_argument(
        "--require-tests",
        action="store_true",
        help="a vllm patch that adds or changes no test module under tests/ fails the check",
    )
    p.add_argument("--json", help="also write the check (bases, python, verdicts) to this file")
    p.add_argument(
        "--test-timeout", type=int, default=1800, help="seconds per patch's tests (default 1800)"
    )
    p.add_argument("--base", action="append", help="TARGET=DIR pristine base (default: fetch)")
    p.add_argument("--offline", action="store_true", help="never run pip; use the cache only")
    p.add_argument("-v", "--verbose", action="store_true", help="show failing test output")
    p.set_defaults(func=cmd_export)
    p = sub.add_parser("lint", help="per patch: ruff (the base's config), SPDX, stray prints")
    p.add_argument("patches", nargs="*", metavar="PATCH", help="default: every patch")
    p.add_argument("--ruff", help="ruff executable (default: $PATCHSET_RUFF, PATH, -m ruff)")
    p.add_argument("--base", action="append", help="TARGET=DIR pristine base (default: fetch)")
    p.add_argument("--offline", action="store_true", help="never run pip; use the cache only")
    p.add_argument(
        "--hooks-python",
        help="run the base's pre-commit hooks with this python (default: a venv in the cache "
        "with the hooks' additional_dependencies, made by pip once)",
    )
    p.set_defaults(func=cmd_lint)
    p = sub.add_parser("rebase", help="replay the series 3-way onto a newer release")
    p.add_argument("--onto", required=True, help="e.g. vllm==0.33.0")
    p.add_argument("--dry-run", action="store_true", help="report only; write nothing")
    p.add_argument("--to", help="new directory for the rebased series (default: build/rebase-*)")
    p.add_argument("--sdist", help="use this sdist file instead of pip (still pinned)")
    p.add_argument("--wheel", help="use this wheel file instead of pip (without --dry-run)")
    p.add_argument("--json", help="also write the report as JSON to this file")
    p.add_argument("--keep", action="store_true", help="keep the scratch git repository")
    p.add_argument(
        "--workspace",
        metavar="DIR",
        help="leave the workspace for the hand work there (also with --dry-run): a git repo "
        "old-base/old/new-base/new, a work tree per conflicting patch with its 3-way conflicts "
        "in place, run-tests and an opt-in make-venv; an existing one made from the same bases "
        "and patch files is verified and reused, anything else refused",
    )
    p.add_argument(
        "--test-python",
        help="a python with the new release installed, for the workspace's run-tests "
        "(checked: its installed version must be the new one)",
    )
    p.set_defaults(func=cmd_rebase)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    try:
        repo = Path(args.repo).resolve() if args.repo else find_repo(Path.cwd().resolve())
        args.recovered_checkout = recover_repo(
            repo, _info, getattr(args, "wait", None) or DEFAULT_TIMEOUT_S
        )
        return int(args.func(args, repo))
    except KeyboardInterrupt:
        # Outside a journal's window (where SIGINT rolls back and says so): nothing half-written
        # by a journalled command; a download or build keeps only its locked temporary files.
        print("patchset: error: interrupted by SIGINT (Ctrl-C)", file=sys.stderr)
        print(
            "hint: run the command again; patchset status shows a tree, patchset recover "
            "rolls back a run a kill interrupted",
            file=sys.stderr,
        )
        return 128 + signal.SIGINT
    except NothingToDo as exc:
        print(f"patchset: nothing to do: {exc.message}")
        if exc.hint:
            print(f"hint: {exc.hint}")
        return exc.exit_code
    except PatchsetError as exc:
        print(f"patchset: error: {exc.message}", file=sys.stderr)
        for line in exc.details:
            print(f"  {line}", file=sys.stderr)
        if exc.hint:
            print(f"hint: {exc.hint}", file=sys.stderr)
        return exc.exit_code
    except OSError as exc:
        print(f"patchset: error: {args.command}: {os_error_text(exc)}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
