"""The persistent rebase workspace: where the hand work of moving the series to a new release
happens (``patchset rebase --workspace DIR``).

The 0.34.0 move was done by hand in exactly this shape (design/upstreaming.md); the tool now
leaves it behind by itself:

* ``DIR/repo``: a git repository with branches ``old-base`` (the pinned base), ``old`` (the
  series on it, one commit per patch, message = the patch header), ``new-base`` (the new
  release's tree, a child of ``old-base``) and ``new`` (``new-base`` plus every patch that carried
  over, one commit each), checked out on ``new``;
* ``DIR/conflicts/<target>/<NNNN-slug>``: per conflicting patch, a linked work tree on branch
  ``conflict/<target>/<NNNN-slug>`` started at ``new`` with ``git am -3`` of the patch stopped
  in it: the conflict markers (and git's unmerged index) in place; resolve, ``git add``,
  ``git am --continue`` gives the patch's commit with its header;
* ``DIR/run-tests WORKTREE [pytest args]``: the worktree's tests against a python that has the
  new release installed (``$TESTPY``, the ``--test-python`` given, or ``DIR/venv``), the work
  tree's changed ``.py`` files laid over the installed package; refuses a work tree with
  unresolved paths and a python whose installed version is not the new release;
* ``DIR/make-venv [pip args]``: opt-in, never run by patchset: ``DIR/venv`` with the new
  release and the test dependencies (extra pip arguments for substitutions the index needs);
* ``DIR/workspace.json``: what it was made from (both bases by sha256, every patch file by
  sha256, the checkout's git revision), each branch's commit, each patch's outcome, work tree
  and test command.

Fail closed: the workspace is built in a hidden sibling and renamed into place last (a killed
run leaves no ``DIR``; its leftovers are removed by the next run, under a lock on the sibling
``.DIR.lock``); an existing ``DIR`` is reused only when it is a workspace made from the same
bases and the same patch files and its branches and work trees are where it recorded them,
and is never written to; anything else is refused before anything is written.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from patchset import __version__
from patchset.errors import PatchsetError
from patchset.gitops import ScratchRepo, series_checkout_state
from patchset.hashing import sha256_bytes

SCHEMA_VERSION = 1
MANIFEST = "workspace.json"
BRANCHES = ("old-base", "old", "new-base", "new")
TOOL_ENTRIES = {"repo", "conflicts", "run-tests", "make-venv", MANIFEST, "venv"}


@dataclass(frozen=True)
class Origin:
    """What a workspace is made from; two runs with equal origins make the same workspace."""

    target: str
    old_version: str
    old_sha256: str
    new_version: str
    new_sha256: str
    patches: tuple[tuple[str, str], ...]
    """(name, sha256 of the patch file) of the target's patches, in series order."""

    def to_json(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "old": {"version": self.old_version, "sha256": self.old_sha256},
            "new": {"version": self.new_version, "sha256": self.new_sha256},
            "patches": [{"name": n, "sha256": d} for n, d in self.patches],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Origin:
        return cls(
            str(data["target"]),
            str(data["old"]["version"]),
            str(data["old"]["sha256"]),
            str(data["new"]["version"]),
            str(data["new"]["sha256"]),
            tuple((str(p["name"]), str(p["sha256"])) for p in data["patches"]),
        )


def origin_of(
    target: str, old: tuple[str, str], new: tuple[str, str], data: dict[str, bytes], names
) -> Origin:
    return Origin(
        target, old[0], old[1], new[0], new[1], tuple((n, sha256_bytes(data[n])) for n in names)
    )


# -- refusals before anything is written -------------------------------------------------------


def refuse_dirty_checkout(root: Path) -> str | None:
    """The checkout's HEAD, after refusing uncommitted changes to what the workspace records
    (``series``, ``pins.toml``, ``patches/``); None when ``root`` is not a git checkout."""
    state = series_checkout_state(root)
    if state is None:
        return None
    head, dirty = state
    if dirty:
        raise PatchsetError(
            f"{root}: the series has uncommitted changes; a workspace records the revision it "
            "was made from, so it is made from a committed series only; nothing was written",
            details=dirty[:20],
            hint="commit (or stash) them, then run the rebase again",
        )
    return head


def read_manifest(workspace: Path) -> dict[str, Any]:
    """The manifest of an existing workspace; refuses a directory that is not one."""
    manifest = workspace / MANIFEST
    if not workspace.is_dir() or workspace.is_symlink() or not manifest.is_file():
        raise PatchsetError(
            f"{workspace} exists and is not a patchset rebase workspace (no {MANIFEST}); "
            "nothing was written",
            hint="choose a new directory with --workspace, or remove this one",
        )
    try:
        data = json.loads(manifest.read_text(encoding="utf-8"))
        Origin.from_json(data["origin"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise PatchsetError(
            f"{manifest}: not a readable workspace manifest ({exc}); nothing was written",
            hint="remove the directory and run the rebase again",
        ) from None
    if data.get("schema_version") != SCHEMA_VERSION:
        raise PatchsetError(
            f"{manifest}: schema_version {data.get('schema_version')!r}, this patchset writes "
            f"{SCHEMA_VERSION}; nothing was written"
        )
    return data


def check_reusable(workspace: Path, origin: Origin) -> dict[str, Any]:
    """Refuse a workspace made from other bases or other patch files, or one whose branches
    and work trees are not where its manifest says; return its manifest."""
    data = read_manifest(workspace)
    made = Origin.from_json(data["origin"])
    if (made.target, made.old_version, made.old_sha256) != (
        origin.target,
        origin.old_version,
        origin.old_sha256,
    ) or (made.new_version, made.new_sha256) != (origin.new_version, origin.new_sha256):
        raise PatchsetError(
            f"{workspace} is a workspace for {made.target} {made.old_version} -> "
            f"{made.new_version}, not {origin.target} {origin.old_version} -> "
            f"{origin.new_version}; nothing was written",
            details=[
                f"its bases: {made.old_version} sha256 {made.old_sha256}, "
                f"{made.new_version} sha256 {made.new_sha256}",
                f"asked for: {origin.old_version} sha256 {origin.old_sha256}, "
                f"{origin.new_version} sha256 {origin.new_sha256}",
            ],
            hint="choose another --workspace directory",
        )
    if made.patches != origin.patches:
        old, new = dict(made.patches), dict(origin.patches)
        changed = [
            f"{name}: {'added' if name not in old else 'removed' if name not in new else 'changed'}"
            for name in sorted(set(old) | set(new))
            if old.get(name) != new.get(name)
        ]
        raise PatchsetError(
            f"{workspace} was made from other patch files than the series now has; its hand "
            "work is kept, nothing was written",
            details=changed or ["the series order differs"],
            hint="make a new workspace with another --workspace directory",
        )
    problems = verify_layout(workspace, data)
    if problems:
        raise PatchsetError(
            f"{workspace}: the workspace is not as its manifest records; nothing was written",
            details=problems,
            hint="inspect it, or remove it and run the rebase again",
        )
    return data


def verify_layout(workspace: Path, data: dict[str, Any]) -> list[str]:
    """Every recorded branch at its commit, every recorded work tree present and linked."""
    problems: list[str] = []
    repo_dir = workspace / "repo"
    if not (repo_dir / ".git").is_dir():
        return [f"{repo_dir}: no git repository"]
    repo = ScratchRepo(repo_dir)
    for branch, commit in data.get("branches", {}).items():
        proc = subprocess.run(
            ["git", "rev-parse", "--verify", "-q", f"refs/heads/{branch}"],
            cwd=repo_dir,
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            problems.append(f"branch {branch}: missing (recorded at {commit})")
        elif branch in BRANCHES and proc.stdout.strip() != commit:
            problems.append(f"branch {branch}: at {proc.stdout.strip()}, recorded {commit}")
    listed = {
        line.split(" ", 1)[1]
        for line in repo.git("worktree", "list", "--porcelain").splitlines()
        if line.startswith("worktree ")
    }
    for patch in data.get("patches", []):
        tree = patch.get("worktree")
        if tree and str((workspace / tree).resolve()) not in listed:
            problems.append(f"{patch['name']}: work tree {tree} is missing or not linked")
    return problems


# -- building ----------------------------------------------------------------------------------


@contextlib.contextmanager
def workspace_lock(workspace: Path) -> Iterator[None]:
    """One run per workspace directory: an exclusive ``flock`` on ``.<name>.lock`` beside it."""
    workspace.parent.mkdir(parents=True, exist_ok=True)
    lock = workspace.parent / f".{workspace.name}.lock"
    with open(lock, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise PatchsetError(
                f"another patchset rebase is making the workspace {workspace}",
                hint="wait for it to finish",
            ) from None
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def remove_leftovers(workspace: Path) -> list[Path]:
    """Delete what killed runs left beside ``workspace`` (``.<name>.partial-*``); call under
    :func:`workspace_lock` only, so no live run's staging is touched."""
    removed = []
    for partial in sorted(workspace.parent.glob(f".{workspace.name}.partial-*")):
        if partial.is_dir() and not partial.is_symlink():
            shutil.rmtree(partial)
            removed.append(partial)
    return removed


def staging_dir(workspace: Path) -> Path:
    return Path(tempfile.mkdtemp(dir=workspace.parent, prefix=f".{workspace.name}.partial-"))


def test_python_version(python: str, version: str, package: str) -> str:
    """Refuse a test python whose installed ``package`` is not ``version``; return its path."""
    from patchset.export import python_package_version

    path = str(Path(python).absolute()) if "/" in python else python
    found = python_package_version(path, package)
    if found != version:
        raise PatchsetError(
            f"--test-python {python}: its installed {package} is "
            f"{found or 'missing'}, the new base is {version}; nothing was written",
            hint=f"give a python with {package}=={version} installed, or run the workspace's "
            "make-venv later",
        )
    return path


def finish(
    staged: Path,
    workspace: Path,
    *,
    origin: Origin,
    outcomes: Sequence[Any],
    data: dict[str, bytes],
    test_files: dict[str, tuple[str, ...]],
    depends: dict[str, tuple[str, ...]],
    revision: str | None,
    test_python: str | None,
    wheel: str | None,
    log,
) -> dict[str, Any]:
    """Turn the replay's repository in ``staged/repo`` into the workspace, rename it into place.

    Called with the replay done (branches ``old-base``, ``old``, ``new-base``, ``new``): checks
    out ``new``, makes a work tree per conflicting patch with its 3-way ``git am`` stopped in
    it, writes the scripts and the manifest (last), renames ``staged`` to ``workspace`` and
    repairs the work trees' links to the new place.
    """
    repo = ScratchRepo(staged / "repo")
    repo.git("config", "merge.renames", "false")  # as the replay merged (gitops.am)
    repo.git("checkout", "-q", "-f", "new")
    for ref in repo.git("for-each-ref", "--format=%(refname:short)", "refs/heads").split():
        if ref not in BRANCHES:  # the scratch repository's initial branch: not one of ours
            repo.git("branch", "-q", "-D", ref)
    branches = {b: repo.git("rev-parse", f"refs/heads/{b}").strip() for b in BRANCHES}
    records: list[dict[str, Any]] = []
    conflicting = {o.name for o in outcomes if o.status == "conflict"}
    for outcome in outcomes:
        record: dict[str, Any] = {
            "name": outcome.name,
            "status": outcome.status,
            "tests": list(test_files.get(outcome.name, ())),
        }
        if outcome.status == "conflict":
            stem = outcome.name.removesuffix(".patch")
            rel = f"conflicts/{stem}"
            branch = f"conflict/{stem}"
            log(f"Work tree for {outcome.name}: {rel} (branch {branch})")
            tree = repo.add_worktree(staged / rel, branch, "new")
            result = tree.am(data[outcome.name], three_way=True)
            unmerged = tree.unmerged() if not result.ok else {}
            record.update(
                worktree=rel,
                branch=branch,
                am="applied at new" if result.ok else "stopped with conflicts",
                unmerged={
                    path: {"state": state, "regions": tree.conflict_regions(path)}
                    for path, state in sorted(unmerged.items())
                },
                depends_on_conflicts=[d for d in depends.get(outcome.name, ()) if d in conflicting],
            )
        records.append(record)
    manifest = {
        "schema_version": SCHEMA_VERSION,
        "tool": f"patchset {__version__}",
        "origin": origin.to_json(),
        "checkout_revision": revision,
        "branches": branches,
        "patches": records,
        "test_python": test_python,
        "wheel": wheel,
    }
    manifest["next_steps"] = next_steps(workspace, manifest)
    _write_script(staged / "run-tests", run_tests_script(origin, test_python))
    _write_script(staged / "make-venv", make_venv_script(origin, wheel))
    (staged / MANIFEST).write_text(
        json.dumps(manifest, indent=2, sort_keys=True) + "\n", encoding="utf-8"
    )
    os.rename(staged, workspace)
    trees = [str(workspace / r["worktree"]) for r in records if r.get("worktree")]
    if trees:
        ScratchRepo(workspace / "repo").git("worktree", "repair", *trees)
    return manifest


def next_steps(workspace: Path, manifest: dict[str, Any]) -> list[str]:
    """The commands that go on from the workspace, in order."""
    ws = shlex.quote(str(workspace))
    steps = [f"git -C {ws}/repo log --oneline new-base..new   # the carried patches"]
    carried_tests = [
        t
        for r in manifest["patches"]
        if r["status"] not in ("conflict", "absorbed")
        for t in r["tests"]
    ]
    if carried_tests:
        steps.append(f"{ws}/run-tests {ws}/repo " + " ".join(carried_tests))
    for r in manifest["patches"]:
        if r["status"] != "conflict":
            continue
        tree = f"{ws}/{r['worktree']}"
        after = (
            ", after " + ", ".join(r["depends_on_conflicts"]) if r["depends_on_conflicts"] else ""
        )
        steps.append(f"# {r['name']}{after}: resolve in {tree}, then")
        steps.append(f"git -C {tree} add -A && git -C {tree} am --continue")
        if r["tests"]:
            steps.append(f"{ws}/run-tests {tree} " + " ".join(r["tests"]))
    resolved = [r["branch"] for r in manifest["patches"] if r["status"] == "conflict"]
    if resolved:
        steps.append(
            f"git -C {ws}/repo checkout -B assembled new && git -C {ws}/repo cherry-pick "
            + " ".join(resolved)
            + "   # series order"
        )
    if not manifest["test_python"]:
        steps.insert(0, f"{ws}/make-venv   # opt-in: a venv with the new base (or set TESTPY)")
    return steps


def _write_script(path: Path, text: str) -> None:
    path.write_text(text, encoding="utf-8")
    path.chmod(0o755)


def run_tests_script(origin: Origin, test_python: str | None) -> str:
    package = origin.target
    default = shlex.quote(test_python) if test_python else '"$HERE/venv/bin/python"'
    return f"""#!/bin/bash
# Made by patchset rebase ({origin.target} {origin.old_version} -> {origin.new_version}).
# Run a work tree's tests against a python with {package} {origin.new_version} installed:
#     run-tests WORKTREE [pytest args...]     (e.g. run-tests conflicts/... tests/x/test_y.py -q)
# The python: $TESTPY, else {"the --test-python given" if test_python else "venv/ (make-venv)"}.
# Every .py file of WORKTREE/{package} that differs from the installed one is laid over a symlink
# copy of the installed package (first on PYTHONPATH); the work tree's tests/ run from a scratch
# copy. TRITON_INTERPRET defaults to 1 (CPU). Refuses unresolved paths and another version.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
WT=$(realpath "${{1:?usage: run-tests WORKTREE [pytest args...]}}"); shift
PY=${{TESTPY:-{default}}}
if [ ! -x "$PY" ] && ! command -v "$PY" >/dev/null; then
  echo "run-tests: no test python $PY: set TESTPY or run $HERE/make-venv" >&2; exit 2
fi
UNRESOLVED=$(git -C "$WT" diff --name-only --diff-filter=U)
if [ -n "$UNRESOLVED" ]; then
  echo "run-tests: $WT has unresolved paths (resolve, then git add):" >&2
  echo "$UNRESOLVED" >&2; exit 2
fi
MARKED=$(git -C "$WT" grep -l -E '^(<<<<<<<|>>>>>>>) ' -- '*.py' || true)
if [ -n "$MARKED" ]; then
  echo "run-tests: conflict markers left in:" >&2; echo "$MARKED" >&2; exit 2
fi
VERSION=$("$PY" -c 'import importlib.metadata as m; print(m.version("{package}"))' \
  2>/dev/null || true)
if [ "$VERSION" != "{origin.new_version}" ]; then
  echo "run-tests: $PY has {package} ${{VERSION:-missing}}," \
    "the workspace's base is {origin.new_version}" >&2
  exit 2
fi
SITE=$("$PY" -c 'import importlib.util as u, sys; s = u.find_spec(sys.argv[1])
print(list(s.submodule_search_locations)[0])' "{package}")
W=$(mktemp -d "${{TMPDIR:-/tmp}}/run-tests-XXXX")
trap 'rm -rf "$W"' EXIT
cp -rs "$SITE" "$W/{package}"
(cd "$WT" && find {package} -name '*.py') | while read -r f; do
  if [ ! -e "$W/$f" ] || ! cmp -s "$WT/$f" "$W/$f"; then
    mkdir -p "$(dirname "$W/$f")"; rm -f "$W/$f"; cp "$WT/$f" "$W/$f"
  fi
done
mkdir -p "$W/run"; cp -r "$WT/tests" "$W/run/tests"
if [ -f "$WT/pyproject.toml" ]; then cp "$WT/pyproject.toml" "$W/run/"; fi
cd "$W/run"
PYTHONPATH="$W${{PYTHONPATH:+:$PYTHONPATH}}" PYTHONDONTWRITEBYTECODE=1 \\
  TRITON_INTERPRET=${{TRITON_INTERPRET:-1}} "$PY" -m pytest -p no:cacheprovider "$@"
"""


def make_venv_script(origin: Origin, wheel: str | None) -> str:
    what = shlex.quote(wheel) if wheel else f"{origin.target}=={origin.new_version}"
    return f"""#!/bin/bash
# Made by patchset rebase ({origin.target} {origin.old_version} -> {origin.new_version}). Opt-in,
# never run by patchset: venv/ beside this script with {origin.target} {origin.new_version} and
# the test dependencies, for run-tests. Extra arguments go to pip (a dependency the package
# index does not serve needs a stated substitution, e.g. a constraints file: -c FILE).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
if [ -e "$HERE/venv" ]; then echo "make-venv: $HERE/venv exists" >&2; exit 2; fi
"${{PYTHON:-python3}}" -m venv "$HERE/venv"
"$HERE/venv/bin/pip" install {what} pytest hypothesis "$@"
"""
