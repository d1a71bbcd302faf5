"""vLLM's own tests of every module the series touches, stock against patched, per test id.

The selection is computed from the touched paths of a lock (``series.lock``, or a lock-like
JSON with ``pins`` and ``patches[].files[].path``) and the pristine base tree; nothing is a
hand list. A base test file ``tests/**/test_*.py`` is selected when (each reason is recorded):

``edited``   the series modifies or deletes it (its PRISTINE version runs);
``imports``  one of its imports names a touched module, directly (``import a.b``,
             ``from a.b import x``, ``from a import b``, relative forms) or through a package
             ``__init__`` that re-exports the imported name from the touched module;
``name``     it is named ``test_<stem>.py`` / ``test_<stem>_*.py`` for a touched module
             ``<stem>.py``, inside the test directory that mirrors the module's package
             (``vllm/a/b/m.py`` -> ``tests/a/b/``, or its deepest existing ancestor);
``dir``      it sits directly in the exact mirror directory of a touched module's package
             (``vllm/a/b/m.py`` -> ``tests/a/b/*``; not for modules at the package root).

Touched modules are the touched ``vllm/**/*.py`` and ``tests/**`` helper files that exist in the
base (an added file has no upstream test). The tests always come from the pristine tree, copied
to a scratch directory, so the tree's ``vllm/`` is never importable; they run with one pytest
process over all selected files (a crashed process resumes after the test that killed it), a
per-test timeout, and the recorder plugin ``tests/support/upstream_outcomes``.

Subcommands: ``select`` (print the files and why), ``baseline`` (run on the OFFICIAL wheel,
write ``results/upstream-baseline-<version>.json``), ``check`` (run on the overlay wheel or an
overlay tree, compare with the baseline per test id, write ``results/upstream-tests-<version>
.json``; a test that passes on stock and does not pass on patched fails the run),
``lock-like`` (a lock-like touched list from git trees, for development).
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SUPPORT = REPO / "tests" / "support"
RECORDER_DIR = SUPPORT / "upstream_outcomes"
RECORDER = "dcp_upstream_outcomes"
HUB_FIXTURE = SUPPORT / "hub_fixture"

SCHEMA_VERSION = 1
TEST_TIMEOUT_S = 300
"""Per-test limit (pytest-timeout): a hung or CPU-slow test fails on both sides, never stalls."""
RUN_LIMIT_S = 50 * 60
"""Wall limit of one side's whole run; what did not run is recorded as ``not-run``."""
MAX_RESTARTS = 8
"""How often a run that died (segfault, OOM kill) resumes after the test that killed it."""

HUB_REEXPORT_LIMIT = 30
"""A touched module that more test files reach only through a package re-export is a hub (the
config classes every test builds: ``from vllm.config import VllmConfig`` is in 236 files of
0.33.0): its re-export reach is not used, its direct importers, name and dir rules still are.
Recorded per module in the selection's ``bounds``; measured reason in design/upstream-tests.md."""

DESELECTED: dict[str, str] = {}
"""Test ids (or files) never run, each with the reason (recorded in the baseline and report)."""

OUTCOMES = ("passed", "failed", "error", "skipped", "hub-skip", "xfailed", "xpassed", "not-run")
HUB_SKIP_PREFIX = "needs huggingface.co"
"""How dcp_ci_support.hub_offline words a skip that is only the hub's offline error."""
NOT_RUN_REASON = (
    "not run on patched: it did not pass on stock, so it cannot regress (--all runs it)"
)
"""The patched side runs only the ids that passed on stock, unless ``check --all``."""
NOT_PASSED_ON_PATCHED = frozenset({"failed", "error", "not-run", "skipped", "hub-skip", "missing"})
"""Patched outcomes that, after ``passed`` on stock, are a regression."""


# -- the touched set ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Touched:
    """What a lock says the series touches in the vllm target: path -> op."""

    ops: Mapping[str, str]
    pins: Mapping[str, str]
    source: str

    @property
    def paths(self) -> list[str]:
        return sorted(self.ops)

    def digest(self) -> str:
        """sha256 of the sorted touched paths, one per line."""
        return hashlib.sha256("".join(f"{p}\n" for p in self.paths).encode()).hexdigest()


def load_touched(lock_path: Path, target: str = "vllm") -> Touched:
    """The touched paths of ``target`` in a ``series.lock`` (or lock-like JSON), with the pins.

    A path's op is its last patch's op, except that a path the series first adds stays ``add``.
    The pins are the ones the stock baseline runs on: ``target``'s sdist and ``[target.wheel]``.
    """
    data = json.loads(lock_path.read_text())
    ops: dict[str, str] = {}
    for patch in data.get("patches", []):
        name = patch.get("name", "")
        if "/" in name and name.split("/", 1)[0] != target:
            continue
        for f in patch.get("files", []):
            first = ops.get(f["path"])
            ops[f["path"]] = "add" if first == "add" else f.get("op", "modify")
    # the pins the stock baseline runs on: the source and the wheel its stock venv installs
    # (``[target.wheel]``); another platform's wheel pin (``wheel_aarch64``) never runs here
    used = (f"{target}.sdist", f"{target}.wheel")
    pins = {k: v for k, v in data.get("pins", {}).items() if k in used}
    return Touched(ops, pins, str(lock_path))


# -- selection ---------------------------------------------------------------------------------


def module_name(path: str) -> str:
    """``vllm/a/b.py`` -> ``vllm.a.b``; ``vllm/a/__init__.py`` -> ``vllm.a``."""
    parts = path[: -len(".py")].split("/")
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _package_of(rel: str) -> str:
    """The dotted package a tree-relative ``.py`` file belongs to."""
    parts = rel[: -len(".py")].split("/")
    return ".".join(parts[:-1] if parts[-1] != "__init__" else parts[:-1])


def _resolve_relative(package: str, level: int, module: str | None, is_init: bool) -> str:
    base = package.split(".") if package else []
    up = level - 1
    if up:
        base = base[:-up] if up <= len(base) else []
    return ".".join([*base, *([module] if module else [])])


def imported_names(source: str, rel: str) -> set[tuple[str, str | None]]:
    """Every import of a file as ``(module, name)``: ``name`` is None for ``import a.b``."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    package = _package_of(rel)
    is_init = rel.endswith("__init__.py")
    found: set[tuple[str, str | None]] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.add((alias.name, None))
        elif isinstance(node, ast.ImportFrom):
            mod = node.module
            if node.level:
                mod = _resolve_relative(package, node.level, node.module, is_init)
            if not mod:
                continue
            for alias in node.names:
                found.add((mod, alias.name))
    return found


def reexports(tree: Path, package: str) -> dict[str, str]:
    """Names a package's ``__init__.py`` imports from its own submodules: name -> module."""
    init = tree / package.replace(".", "/") / "__init__.py"
    if not init.is_file():
        return {}
    rel = init.relative_to(tree).as_posix()
    out: dict[str, str] = {}
    for mod, name in imported_names(init.read_text(errors="replace"), rel):
        if name and name != "*" and mod.startswith(package + "."):
            out[name] = mod
    return out


def reaches(
    imports: Iterable[tuple[str, str | None]],
    module: str,
    tree: Path,
    cache: dict[str, dict[str, str]] | None = None,
) -> str | None:
    """How ``imports`` reach ``module``: ``"direct"``, ``"reexport"`` (a package ``__init__``
    re-exports the imported name from it), or None."""
    cache = {} if cache is None else cache
    via = None
    for mod, name in imports:
        if mod == module or mod.startswith(module + "."):
            return "direct"
        if name is None:
            continue
        if f"{mod}.{name}" == module:
            return "direct"
        if module.startswith(mod + "."):
            if mod not in cache:
                cache[mod] = reexports(tree, mod)
            if cache[mod].get(name) == module:
                via = "reexport"
    return via


def mirror_dir(path: str) -> str:
    """``vllm/a/b/m.py`` -> ``tests/a/b``; ``tests/x/utils.py`` -> ``tests/x``."""
    parts = path.split("/")[:-1]
    if parts and parts[0] == "vllm":
        parts = parts[1:]
    elif parts and parts[0] == "tests":
        parts = parts[1:]
    return "/".join(["tests", *parts])


def is_test_file(rel: str) -> bool:
    name = rel.rsplit("/", 1)[-1]
    return rel.startswith("tests/") and name.startswith("test_") and name.endswith(".py")


def base_test_files(tree: Path) -> list[str]:
    """Every ``tests/**/test_*.py`` of the base tree, sorted."""
    return sorted(
        p.relative_to(tree).as_posix()
        for p in (tree / "tests").rglob("test_*.py")
        if p.is_file() and "__pycache__" not in p.parts
    )


@dataclass
class Selection:
    """Selected test files -> the reasons (``rule:touched path``), plus the touched modules."""

    files: dict[str, list[str]] = field(default_factory=dict)
    modules: list[str] = field(default_factory=list)
    bounds: dict[str, str] = field(default_factory=dict)

    def add(self, rel: str, reason: str) -> None:
        reasons = self.files.setdefault(rel, [])
        if reason not in reasons:
            reasons.append(reason)


def select(touched: Touched, tree: Path, hub_limit: int = HUB_REEXPORT_LIMIT) -> Selection:
    """The base test files for ``touched`` (see the module docstring for the rules)."""
    existing = {p for p in touched.paths if (tree / p).is_file()}
    tests = base_test_files(tree)
    sel = Selection()
    for path in sorted(existing):
        if is_test_file(path) and touched.ops[path] != "add":
            sel.add(path, f"edited:{path}")
    modules = sorted(
        p
        for p in existing
        if p.endswith(".py")
        and touched.ops[p] != "add"
        and (p.startswith("vllm/") or (p.startswith("tests/") and not is_test_file(p)))
    )
    sel.modules = modules
    if not modules:
        return dict_sorted(sel)
    imports = {rel: imported_names((tree / rel).read_text(errors="replace"), rel) for rel in tests}
    exports: dict[str, dict[str, str]] = {}
    for path in modules:
        module = module_name(path)
        stem = path.rsplit("/", 1)[-1][: -len(".py")]
        if stem == "__init__":
            stem = path.split("/")[-2]
        mirror = mirror_dir(path)
        ancestor = mirror
        while ancestor != "tests" and not (tree / ancestor).is_dir():
            ancestor = ancestor.rsplit("/", 1)[0]
        name_re = re.compile(rf"test_{re.escape(stem)}(_[^/]*)?\.py$")
        reach = {rel: reaches(imports[rel], module, tree, exports) for rel in tests}
        via_reexport = [rel for rel, how in reach.items() if how == "reexport"]
        use_reexport = len(via_reexport) <= hub_limit
        if not use_reexport:
            sel.bounds[path] = (
                f"a hub: {len(via_reexport)} test files reach it only through a package "
                f"re-export (over {hub_limit}); those are not selected for it"
            )
        for rel in tests:
            if reach[rel] == "direct" or (reach[rel] == "reexport" and use_reexport):
                sel.add(rel, f"imports:{path}")
            if rel.startswith(ancestor + "/") and name_re.match(rel.rsplit("/", 1)[-1]):
                sel.add(rel, f"name:{path}")
            if mirror != "tests" and rel.rsplit("/", 1)[0] == mirror:
                sel.add(rel, f"dir:{path}")
    return dict_sorted(sel)


def dict_sorted(sel: Selection) -> Selection:
    sel.files = {k: sorted(sel.files[k]) for k in sorted(sel.files)}
    return sel


# -- outcomes ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    """One test id's outcome (see OUTCOMES) and, unless it passed, why (first line)."""

    outcome: str
    reason: str = ""

    def to_json(self) -> list[str] | str:
        return [self.outcome, self.reason] if self.reason else self.outcome

    @staticmethod
    def from_json(raw: list[str] | str) -> Outcome:
        return Outcome(raw) if isinstance(raw, str) else Outcome(raw[0], raw[1])


def _short(reason: str, limit: int = 300) -> str:
    line = " ".join(reason.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _skip_outcome(reason: str) -> str:
    return "hub-skip" if HUB_SKIP_PREFIX in reason else "skipped"


def fold(records: Iterable[Mapping[str, object]], *, died: str = "") -> dict[str, Outcome]:
    """Per test id, the outcome of a recorder JSON-lines stream.

    setup failed -> error; setup skipped -> skipped (hub-skip when it is the hub's offline error);
    call -> its outcome; a failed teardown after a pass -> error; a file that failed to collect
    -> error under the file's id, one that skipped at module level -> skipped. With ``died``
    (the process ended without finishing), the test that was running is an error saying so.
    """
    out: dict[str, Outcome] = {}
    running: str | None = None
    for rec in records:
        event = rec.get("event")
        tid = str(rec.get("id", ""))
        reason = _short(str(rec.get("reason", "")))
        outcome = str(rec.get("outcome", ""))
        if event == "start":
            running = tid
        elif event == "crash":
            out[tid] = Outcome("error", reason)
            running = None
        elif event == "collect":
            out[tid] = Outcome("error" if outcome == "failed" else _skip_outcome(reason), reason)
        elif event == "report":
            when = rec.get("when")
            if when == "setup":
                if outcome == "failed":
                    out[tid] = Outcome("error", reason)
                elif outcome == "skipped":
                    out[tid] = Outcome(_skip_outcome(reason), reason)
                elif outcome in ("xfailed", "xpassed"):
                    out[tid] = Outcome(outcome, reason)
            elif when == "call":
                if outcome == "skipped":
                    out[tid] = Outcome(_skip_outcome(reason), reason)
                else:
                    out[tid] = Outcome(outcome, reason)
            elif when == "teardown":
                if outcome == "failed" and out.get(tid, Outcome("passed")).outcome == "passed":
                    out[tid] = Outcome("error", f"teardown: {reason}")
                if running == tid:
                    running = None
    if died and running is not None:
        out[running] = Outcome("error", died)
    return out


def file_of(test_id: str) -> str:
    return test_id.split("::", 1)[0]


def counts_by_file(outcomes: Mapping[str, Outcome]) -> dict[str, dict[str, int]]:
    """file -> {outcome: count} (only non-zero counts)."""
    per: dict[str, Counter[str]] = {}
    for tid, o in outcomes.items():
        per.setdefault(file_of(tid), Counter())[o.outcome] += 1
    return {f: dict(sorted(c.items())) for f, c in sorted(per.items())}


def totals(outcomes: Mapping[str, Outcome]) -> dict[str, int]:
    return dict(sorted(Counter(o.outcome for o in outcomes.values()).items()))


# -- comparison --------------------------------------------------------------------------------


@dataclass
class Comparison:
    """Stock against patched, per test id."""

    regressions: list[dict[str, str]] = field(default_factory=list)
    fixed: list[dict[str, str]] = field(default_factory=list)
    changed: list[dict[str, str]] = field(default_factory=list)
    only_patched: list[dict[str, str]] = field(default_factory=list)

    def to_json(self) -> dict[str, list[dict[str, str]]]:
        return {
            "regressions": self.regressions,
            "fixed": self.fixed,
            "changed": self.changed,
            "only_patched": self.only_patched,
        }


def compare(stock: Mapping[str, Outcome], patched: Mapping[str, Outcome]) -> Comparison:
    """Classify every id: a stock pass that does not pass on patched is a regression.

    An id that stock ran and patched did not record is ``missing`` on patched; when patched has
    a file-level record for its file (collection error, module skip), that record is the
    outcome. Stock-non-pass -> patched pass is ``fixed``; any other difference is ``changed``.
    """
    cmp = Comparison()
    for tid in sorted(stock):
        s = stock[tid]
        p = patched.get(tid) or patched.get(file_of(tid)) or Outcome("missing", "not recorded")
        if s.outcome == p.outcome or (p.reason == NOT_RUN_REASON and s.outcome != "passed"):
            continue
        row = {"id": tid, "stock": s.outcome, "patched": p.outcome, "reason": p.reason}
        if s.outcome == "passed" and p.outcome in NOT_PASSED_ON_PATCHED:
            cmp.regressions.append(row)
        elif p.outcome == "passed":
            row["reason"] = s.reason
            cmp.fixed.append(row)
        else:
            cmp.changed.append(row)
    for tid in sorted(set(patched) - set(stock)):
        if "::" not in tid and any(file_of(s) == tid for s in stock):
            continue  # a file-level record already compared above, per stock id
        p = patched[tid]
        cmp.only_patched.append({"id": tid, "patched": p.outcome, "reason": p.reason})
    return cmp


GPU_ONLY_MARKERS = (
    "Found no NVIDIA driver",
    "libcuda.so",
    "Torch not compiled with CUDA",
    "CUDA driver",
    "No CUDA GPUs are available",
    "'_OpNamespace' '_C' object has no attribute",
    "_C.abi3.so",
    "requires CUDA",
    "CUDA is not available",
    "cuda is not available",
)
"""Stock failure texts that mean the test needs a GPU or vLLM's CUDA ops (absent on CPU)."""


def _first_line(reason: str) -> str:
    return reason.split(" | ")[0][:200]


def cpu_cannot_run(stock: Mapping[str, Outcome]) -> dict[str, dict[str, object]]:
    """What this CPU machine cannot run, by reason: every non-hub skip, and every stock
    failure/error whose text says it needs a GPU (GPU_ONLY_MARKERS). reason -> outcome, ids."""
    out: dict[str, dict[str, object]] = {}
    for tid, o in sorted(stock.items()):
        gpu = o.outcome in ("failed", "error") and any(m in o.reason for m in GPU_ONLY_MARKERS)
        if o.outcome == "skipped" or gpu:
            key = _first_line(o.reason) or "(no reason given)"
            entry = out.setdefault(key, {"outcome": o.outcome, "ids": []})
            entry["ids"].append(tid)
    return dict(sorted(out.items(), key=lambda kv: (-len(kv[1]["ids"]), kv[0])))


def stock_failures(stock: Mapping[str, Outcome]) -> dict[str, list[str]]:
    """The other stock failures/errors (not GPU-only), by reason: upstream tests that fail on
    the official wheel here (missing test dependencies, network, ...); they cannot regress."""
    out: dict[str, list[str]] = {}
    for tid, o in sorted(stock.items()):
        if o.outcome in ("failed", "error") and not any(m in o.reason for m in GPU_ONLY_MARKERS):
            out.setdefault(_first_line(o.reason) or "(no reason given)", []).append(tid)
    return dict(sorted(out.items(), key=lambda kv: (-len(kv[1]), kv[0])))


# -- running one side --------------------------------------------------------------------------


@dataclass
class SideRun:
    """The outcomes of one side's run and how it went."""

    outcomes: dict[str, Outcome]
    seconds: float
    restarts: int
    complete: bool
    file_seconds: dict[str, float]
    killed: bool = False
    started: list[str] = field(default_factory=list)
    """Files in the order their first test started."""


def read_records(path: Path) -> list[dict[str, object]]:
    if not path.is_file():
        return []
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:
            continue  # a line cut short by a killed process
    return records


def scratch_tests(tree: Path, work: Path) -> Path:
    """A copy of the base tree's ``tests/`` and pytest settings in ``work``; returns its root."""
    root = work / "run"
    shutil.copytree(tree / "tests", root / "tests", symlinks=True)
    shutil.copyfile(tree / "pyproject.toml", root / "pyproject.toml")
    return root


def pytest_command(python: str, timeout_s: int) -> list[str]:
    return [
        python,
        "-m",
        "pytest",
        "-p",
        RECORDER,
        "-p",
        "no:cacheprovider",
        "-q",
        "-rfE",
        "--continue-on-collection-errors",
        *([f"--timeout={timeout_s}"] if timeout_s else []),
    ]


CONFTEST_IMPORT_ERROR = re.compile(r"ImportError while loading conftest '([^']+)'")


def stream(proc: subprocess.Popen[str], log: Path) -> list[str]:
    """Print ``proc``'s output as it comes, write it to ``log``; returns the last 200 lines."""
    tail: list[str] = []
    assert proc.stdout is not None
    with log.open("a", encoding="utf-8") as fh:
        for line in proc.stdout:
            sys.stdout.write(line)
            fh.write(line)
            tail.append(line.rstrip("\n"))
            if len(tail) > 200:
                del tail[:100]
    sys.stdout.flush()
    return tail


def run_side(
    python: str,
    run_root: Path,
    targets: Sequence[str],
    env: Mapping[str, str],
    *,
    work: Path,
    label: str,
    timeout_s: int = TEST_TIMEOUT_S,
    limit_s: float = RUN_LIMIT_S,
    max_restarts: int = MAX_RESTARTS,
    only: Sequence[str] | None = None,
) -> SideRun:
    """Run ``targets`` (files or ids) with ``python -m pytest`` in ``run_root``; fold outcomes.

    A process that ends without the recorder's ``finished`` line (segfault, OOM kill) is
    restarted with everything already recorded deselected; the test that was running is an
    error naming the exit status. A conftest that cannot be imported (a missing test
    dependency) makes every target under its directory an error with that reason, and the rest
    run. Past ``limit_s`` the process is killed and the run is marked incomplete (what it did
    not reach is missing, which the comparison reports).
    """
    records_path = work / f"{label}.jsonl"
    done_path = work / f"{label}.done"
    log = work / f"{label}.log"
    only_path = work / f"{label}.only"
    for path in (records_path, done_path, log, only_path):
        path.unlink(missing_ok=True)
    full_env = {
        **env,
        "DCP_UPSTREAM_OUTCOMES": str(records_path),
        "DCP_UPSTREAM_DONE": str(done_path),
    }
    if only is not None:
        only_path.write_text("".join(f"{tid}\n" for tid in only))
        full_env["DCP_UPSTREAM_ONLY"] = str(only_path)
    start = time.monotonic()
    restarts = 0
    complete = False
    killed = False
    pending = list(targets)
    while pending:
        remaining = limit_s - (time.monotonic() - start)
        if remaining <= 0:
            break
        cmd = [*pytest_command(python, timeout_s), *pending]
        proc = subprocess.Popen(
            cmd,
            cwd=run_root,
            env=full_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            start_new_session=True,
        )
        timer = _kill_after(proc, remaining)
        try:
            tail = stream(proc, log)
            rc = proc.wait()
        except BaseException:
            os.killpg(proc.pid, 9)  # the runner was interrupted: leave no pytest behind
            raise
        finally:
            timer.cancel()
        records = read_records(records_path)
        if any(r.get("event") == "finished" for r in records[-1:]):
            complete = True
            break
        if timer.fired:
            killed = True
            print(f"upstream tests [{label}]: killed at the {limit_s:.0f} s run limit")
            _append(records_path, _crash_record(records, f"killed at the {limit_s:.0f} s limit"))
            break
        bad = _failed_conftest(tail, run_root)
        if bad is not None:
            conftest_dir, message = bad
            hit = [t for t in pending if t.startswith(conftest_dir + "/")]
            if not hit:
                print(f"upstream tests [{label}]: {message}; no target under it, stopping")
                break
            print(f"upstream tests [{label}]: {message}: {len(hit)} file(s) under it cannot run")
            for t in hit:
                _append(
                    records_path,
                    {"event": "collect", "id": t, "outcome": "failed", "reason": message},
                )
            pending = [t for t in pending if t not in hit]
            continue
        crash = _crash_record(records, f"the pytest process died (exit {rc}) during this test")
        if crash is None or restarts >= max_restarts:
            print(f"upstream tests [{label}]: pytest ended (exit {rc}) without finishing")
            break
        restarts += 1
        _append(records_path, crash)
        print(f"upstream tests [{label}]: pytest died (exit {rc}) in {crash['id']}; resuming")
        done = [tid for tid in fold(read_records(records_path)) if "::" in tid]
        done_path.write_text("".join(f"{tid}\n" for tid in done))
    records = read_records(records_path)
    file_seconds: dict[str, float] = {}
    for rec in records:
        if rec.get("event") == "report":
            f = file_of(str(rec.get("id", "")))
            file_seconds[f] = round(file_seconds.get(f, 0.0) + float(rec.get("duration", 0.0)), 3)
    started: list[str] = []
    for rec in records:
        if rec.get("event") == "start" and file_of(str(rec.get("id"))) not in started:
            started.append(file_of(str(rec.get("id"))))
    return SideRun(
        fold(records),
        round(time.monotonic() - start, 1),
        restarts,
        complete,
        file_seconds,
        killed,
        started,
    )


class _kill_after:
    """Kill ``proc``'s process group after ``seconds`` (a daemon timer); ``fired`` says so."""

    def __init__(self, proc: subprocess.Popen[str], seconds: float) -> None:
        import threading

        self.fired = False
        self._proc = proc
        self._timer = threading.Timer(seconds, self._kill)
        self._timer.daemon = True
        self._timer.start()

    def _kill(self) -> None:
        self.fired = True
        try:
            os.killpg(self._proc.pid, 9)
        except ProcessLookupError:
            pass

    def cancel(self) -> None:
        self._timer.cancel()


def _append(path: Path, record: Mapping[str, object] | None) -> None:
    if record is None:
        return
    with path.open("a", encoding="utf-8") as fh:
        fh.write(json.dumps(dict(record), sort_keys=True) + "\n")


def _crash_record(records: Sequence[Mapping[str, object]], why: str) -> dict[str, str] | None:
    """An error record for the test that was running when the stream stopped, or None."""
    running = None
    for rec in records:
        if rec.get("event") == "start":
            running = str(rec.get("id"))
        elif rec.get("event") == "report" and rec.get("when") == "teardown":
            if rec.get("id") == running:
                running = None
    if running is None:
        return None
    return {"event": "crash", "id": running, "reason": why}


def _failed_conftest(tail: Sequence[str], run_root: Path) -> tuple[str, str] | None:
    """(conftest directory relative to the run root, message) of a conftest import error."""
    for i, line in enumerate(tail):
        match = CONFTEST_IMPORT_ERROR.search(line)
        if match:
            path = Path(match.group(1))
            rel = path.relative_to(run_root) if path.is_absolute() else path
            detail = next((t.strip() for t in tail[i + 1 :] if t.startswith("E ")), "")
            detail = detail[1:].strip() if detail else "import error"
            return rel.parent.as_posix(), f"conftest {rel.as_posix()} cannot be imported: {detail}"
    return None


# -- environments ------------------------------------------------------------------------------

UPSTREAM_TEST_DEPS = ("pytest-asyncio==1.5.0",)
"""Test plugins some upstream conftests import at module level (tests/entrypoints/...:
``pytest_asyncio``), installed ``--no-deps --target`` a directory on PYTHONPATH for both sides,
so the stock and the patched run see the same test tools."""


def install_test_deps(python: str, dest: Path) -> Path:
    """``pip install --no-deps --target dest`` of UPSTREAM_TEST_DEPS (kept when already there)."""
    stamp = dest / ".dcp-deps"
    want = "\n".join(UPSTREAM_TEST_DEPS) + "\n"
    if stamp.is_file() and stamp.read_text() == want:
        return dest
    if dest.exists():
        shutil.rmtree(dest)
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    env.setdefault("PIP_CACHE_DIR", str(REPO / ".cache" / "pip"))
    cmd = [python, "-m", "pip", "install", "-q", "--no-deps", "--target", str(dest)]
    subprocess.run([*cmd, *UPSTREAM_TEST_DEPS], env=env, check=True)
    stamp.write_text(want)
    return dest


def hub_setup(python: str, work: Path) -> tuple[dict[str, str], dict[str, object]]:
    """The hub environment of a run and its record: the offline fixture iff the hub is down."""
    from patchset.export import HF_HOST, hub_offline_env

    offline = hub_offline_env()
    if not offline:
        if os.environ.get("HF_HUB_OFFLINE") == "1":
            print("upstream tests: HF_HUB_OFFLINE=1 is set: hub models come from the user's cache")
            return {}, {"reachable": False, "fixture": None}
        return {}, {"reachable": True, "fixture": None}
    cache = work / "hub-fixture"
    cache.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        [python, str(HUB_FIXTURE / "build_cache.py"), str(cache)],
        capture_output=True,
        text=True,
        check=True,
    )
    repos = proc.stdout.split()
    print(
        f"upstream tests: {HF_HOST} is unreachable: HF_HUB_OFFLINE=1 and the OFFLINE FIXTURE "
        f"model cache {HUB_FIXTURE.relative_to(REPO)} for {', '.join(repos)}: the published "
        "config.json values with a STAND-IN byte-level tokenizer (NOT the real vocabulary), "
        "no weights; a failure that is only the hub's offline error is reported as a hub skip"
    )
    env = {**offline, "HF_HUB_CACHE": str(cache)}
    record = {
        "reachable": False,
        "fixture": {
            "path": HUB_FIXTURE.relative_to(REPO).as_posix(),
            "models": repos,
            "tokenizer": "stand-in byte-level BPE, NOT the real vocabulary",
        },
    }
    return env, record


def side_env(pythonpath: Sequence[str], hub_env: Mapping[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "HF_HUB_CACHE")}
    env.update(hub_env)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["PYTHONPATH"] = os.pathsep.join([*pythonpath, str(RECORDER_DIR)])
    return env


def installed_vllm(python: str) -> dict[str, str]:
    """``python``'s vllm: version, location, and the archive sha256 when pip recorded one."""
    code = (
        "import importlib.metadata as m, json, importlib.util as u\n"
        "d = m.distribution('vllm'); info = {'version': d.version}\n"
        "s = u.find_spec('vllm'); info['location'] = list(s.submodule_search_locations)[0]\n"
        "t = d.read_text('direct_url.json')\n"
        "h = json.loads(t).get('archive_info', {}).get('hashes', {}).get('sha256') if t else None\n"
        "info['archive_sha256'] = h or ''\n"
        "print(json.dumps(info))\n"
    )
    proc = subprocess.run([python, "-c", code], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise UpstreamError(f"{python} cannot import vllm: {proc.stderr.strip()[-300:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


class UpstreamError(Exception):
    """A refusal: the message says what is wrong and which command fixes it."""


def git_revision() -> str:
    proc = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True, check=False
    )
    rev = proc.stdout.strip() if proc.returncode == 0 else "unknown"
    dirty = subprocess.run(
        ["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    return f"{rev}{'+dirty' if dirty else ''}"


def base_version(tree: Path) -> str:
    for name in ("PKG-INFO",):
        path = tree / name
        if path.is_file():
            for line in path.read_text(errors="replace").splitlines():
                if line.startswith("Version:"):
                    return line.split(":", 1)[1].strip()
    match = re.search(r"__version__\s*=.*?['\"]([^'\"]+)", (tree / "vllm/_version.py").read_text())
    if match:
        return match.group(1)
    raise UpstreamError(f"{tree}: cannot tell the vLLM version (no PKG-INFO, no _version.py)")


def machine() -> dict[str, object]:
    return {"host": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version()}


# -- baseline and check ------------------------------------------------------------------------


def baseline_path(results: Path, version: str) -> Path:
    return results / f"upstream-baseline-{version}.json"


def report_path(results: Path, version: str) -> Path:
    return results / f"upstream-tests-{version}.json"


RULE_PRIORITY = {"edited": 0, "name": 1, "dir": 2, "imports": 3, "rerun": 0}
"""Run order: a file's strongest rule first (the series' own edits, then the module's named
test file, its test directory, its importers), then more reasons, then the path. Under a time
budget the strongest evidence runs first."""


def selection_targets(sel: Selection) -> list[str]:
    """The selected files in run order, minus whole-file deselections."""

    def key(f: str) -> tuple[int, int, str]:
        reasons = sel.files[f]
        return (min(RULE_PRIORITY[r.split(":", 1)[0]] for r in reasons), -len(reasons), f)

    return sorted((f for f in sel.files if f not in DESELECTED), key=key)


def run_selection(
    python: str,
    tree: Path,
    sel: Selection,
    pythonpath: Sequence[str],
    *,
    label: str,
    work: Path,
    timeout_s: int,
    limit_s: float,
    only: Sequence[str] | None = None,
    restrict: Sequence[str] | None = None,
) -> tuple[SideRun, dict[str, object]]:
    deps = install_test_deps(python, work / f"deps-{label}")
    hub_env, hub = hub_setup(python, work)
    run_root = scratch_tests(tree, work / label)
    env = side_env([*pythonpath, str(deps)], hub_env)
    targets = selection_targets(sel)
    if restrict is not None:
        targets = [t for t in targets if t in set(restrict)]
    if only is not None:
        wanted = {file_of(tid) for tid in only}
        targets = [t for t in targets if t in wanted]
    deselect = [f"--deselect={tid}" for tid in DESELECTED if "::" in tid]
    what = f"{len(targets)} file(s)" + (f", {len(only)} test id(s)" if only is not None else "")
    print(f"upstream tests [{label}]: {what}, per-test timeout {timeout_s} s")
    run = run_side(
        python,
        run_root,
        [*deselect, *targets],
        env,
        work=work,
        label=label,
        timeout_s=timeout_s,
        limit_s=limit_s,
        only=only,
    )
    return run, hub


def write_json(path: Path, data: Mapping[str, object]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)


def make_baseline(
    *,
    python: str,
    tree: Path,
    touched: Touched,
    results: Path,
    work: Path,
    command: str,
    timeout_s: int = TEST_TIMEOUT_S,
    limit_s: float = RUN_LIMIT_S,
) -> Path:
    """Run the selection on the official wheel (``python``) and write the baseline JSON.

    ``limit_s`` is the time budget: files run in selection order (RULE_PRIORITY); when the
    budget ends the run is stopped, the file in progress and those not reached are recorded as
    ``over_budget`` with that reason and dropped, the files before it are ``covered``. The
    patched side runs only covered files, so CI's time is bounded by the budget."""
    version = base_version(tree)
    wheel_pin = touched.pins.get("vllm.wheel")
    if not wheel_pin or not touched.pins.get("vllm.sdist"):
        raise UpstreamError(f"{touched.source} names no vllm.sdist/vllm.wheel pins")
    info = installed_vllm(python)
    if info["version"] != version:
        raise UpstreamError(
            f"{python} has vllm {info['version']}, the base tree is {version}: the baseline must "
            "come from the official wheel of the pinned base"
        )
    if info["archive_sha256"] and info["archive_sha256"] != wheel_pin:
        raise UpstreamError(
            f"{python}'s vllm was installed from a wheel with sha256 {info['archive_sha256']}, "
            f"not the pinned official wheel {wheel_pin}"
        )
    if "+" in info["version"]:
        raise UpstreamError(f"{python} has an overlay wheel ({info['version']}), not the official")
    sel = select(touched, tree)
    run, hub = run_selection(
        python, tree, sel, [], label="stock", work=work, timeout_s=timeout_s, limit_s=limit_s
    )
    targets = selection_targets(sel)
    covered = covered_files(targets, run)
    host = machine()
    why = (
        f"not finished within the baseline's {limit_s:.0f} s time budget on {host['host']} "
        f"({host['cpus']} CPUs); `make upstream-baseline UPSTREAM_BUDGET=<s>` covers more"
    )
    over = {f: why for f in targets if f not in covered}
    keep = set(covered)
    run.outcomes = {t: o for t, o in run.outcomes.items() if file_of(t) in keep}
    if over:
        print(f"upstream baseline: {len(covered)} file(s) covered, {len(over)} over the budget")
    data = {
        "schema_version": SCHEMA_VERSION,
        "kind": "upstream-baseline",
        "command": command,
        "revision": git_revision(),
        "base": {"version": version, "pins": dict(sorted(touched.pins.items()))},
        "stock": {
            "python": python,
            "vllm": info["version"],
            "wheel_sha256_verified": bool(info["archive_sha256"]),
            "seconds": run.seconds,
            "restarts": run.restarts,
            "budget_s": limit_s,
        },
        "machine": host,
        "settings": settings(timeout_s),
        "hub": hub,
        "touched": {"source": touched.source, "digest": touched.digest(), "paths": touched.paths},
        "selection": sel.files,
        "selection_bounds": sel.bounds,
        "covered": covered,
        "over_budget": over,
        "files": {
            f: {"counts": c, "seconds": run.file_seconds.get(f, 0.0)}
            for f, c in counts_by_file(run.outcomes).items()
        },
        "totals": totals(run.outcomes),
        "cpu_cannot_run": cpu_cannot_run(run.outcomes),
        "stock_failures": stock_failures(run.outcomes),
        "outcomes": {tid: o.to_json() for tid, o in sorted(run.outcomes.items())},
    }
    out = baseline_path(results, version)
    write_json(out, data)
    print(f"upstream baseline: {out} ({totals(run.outcomes)}, {run.seconds:.0f} s)")
    return out


def covered_files(targets: Sequence[str], run: SideRun) -> list[str]:
    """The targets a stock run covered: all of a complete run; of a run stopped at its budget,
    those that collected or started, except the file in progress (its later tests never ran).
    A run that died otherwise is refused."""
    if run.complete:
        return list(targets)
    if not run.killed:
        raise UpstreamError("the stock run did not finish (see above): no baseline written")
    partial = run.started[-1] if run.started else None
    seen = set(run.started) | {file_of(t) for t in run.outcomes}
    return [f for f in targets if f in seen and f != partial]


def settings(timeout_s: int) -> dict[str, object]:
    """What besides the tests decides an outcome; a baseline is only valid with the same."""
    return {
        "test_timeout_s": timeout_s,
        "hub_reexport_limit": HUB_REEXPORT_LIMIT,
        "deselected": dict(sorted(DESELECTED.items())),
        "test_deps": list(UPSTREAM_TEST_DEPS),
    }


REGENERATE = "make upstream-baseline"


def load_baseline(path: Path, touched: Touched, sel: Selection, timeout_s: int) -> dict:
    """The baseline, refused (UpstreamError) unless it matches the pins, touched set, selection."""
    if not path.is_file():
        raise UpstreamError(f"no stock baseline {path}; generate it with `{REGENERATE}`")
    data = json.loads(path.read_text())
    problems = []
    if data.get("schema_version") != SCHEMA_VERSION:
        problems.append(f"schema_version {data.get('schema_version')} is not {SCHEMA_VERSION}")
    pins = data.get("base", {}).get("pins", {})
    for key in sorted(set(pins) | set(touched.pins)):
        if pins.get(key) != touched.pins.get(key):
            problems.append(
                f"pin {key}: baseline {pins.get(key)}, {touched.source} {touched.pins.get(key)}"
            )
    base_touched = data.get("touched", {})
    if base_touched.get("digest") != touched.digest():
        old, new = set(base_touched.get("paths", [])), set(touched.paths)
        delta = [f"+{p}" for p in sorted(new - old)] + [f"-{p}" for p in sorted(old - new)]
        problems.append(
            f"touched set differs from the baseline's ({len(delta)} path(s): "
            f"{', '.join(delta[:8])}{' ...' if len(delta) > 8 else ''})"
        )
    elif list(data.get("selection", {})) != list(sel.files):
        problems.append("the selection rules give other files than the baseline's")
    if data.get("settings") != settings(timeout_s):
        problems.append(f"settings {data.get('settings')} are not {settings(timeout_s)}")
    if problems:
        raise UpstreamError(
            f"refusing the stock baseline {path}: " + "; ".join(problems) + f". Regenerate it "
            f"with `{REGENERATE}`"
        )
    return data


def overlay_changed(tree: Path, ref: str) -> list[str]:
    """Files under vllm/ a git tree changed against ``ref`` (any state) or left untracked."""

    def git(*args: str) -> list[str]:
        proc = subprocess.run(
            ["git", "-C", str(tree), *args], capture_output=True, text=True, check=True
        )
        return [line for line in proc.stdout.splitlines() if line]

    changed = set(git("diff", "--name-only", ref, "--", "vllm"))
    changed |= set(git("ls-files", "--others", "--exclude-standard", "--", "vllm"))
    return sorted(changed)


def check(
    *,
    python: str,
    tree: Path,
    touched: Touched,
    results: Path,
    work: Path,
    command: str,
    patched: dict[str, object],
    overlay: tuple[Path, list[str]] | None = None,
    timeout_s: int = TEST_TIMEOUT_S,
    limit_s: float = RUN_LIMIT_S,
    report: Path | None = None,
    run_all: bool = False,
) -> int:
    """Run the selection on the patched side, compare with the baseline, write the report."""
    from patchset.export import installed_package_dir, overlay_package

    version = base_version(tree)
    sel = select(touched, tree)
    if not sel.files:
        print(
            f"upstream tests: no base test file reaches the {len(touched.paths)} touched path(s) "
            "(the series only adds files): nothing to compare"
        )
        return 0
    base_file = baseline_path(results, version)
    base = load_baseline(base_file, touched, sel, timeout_s)
    pythonpath: list[str] = []
    if overlay is not None:
        otree, changed = overlay
        installed = installed_package_dir(python)
        if installed is None:
            raise UpstreamError(f"{python} has no vllm installed")
        root = overlay_package(installed, otree, changed, work / "overlay")
        pythonpath.append(str(root))
        print(f"upstream tests: overlay of {len(changed)} file(s) from {otree} on {installed}")
    stock = {tid: Outcome.from_json(v) for tid, v in base["outcomes"].items()}
    only = None if run_all else sorted(t for t, o in stock.items() if o.outcome == "passed")
    run, hub = run_selection(
        python,
        tree,
        sel,
        pythonpath,
        label="patched",
        work=work,
        timeout_s=timeout_s,
        limit_s=limit_s,
        only=only,
        restrict=base["covered"],
    )
    if only is not None:
        for tid, o in stock.items():
            if o.outcome != "passed" and tid not in run.outcomes:
                run.outcomes[tid] = Outcome("not-run", NOT_RUN_REASON)
    cmp = compare(stock, run.outcomes)
    flaky: list[dict[str, str]] = []
    if cmp.regressions:
        ids = sorted({r["id"] if "::" in r["id"] else file_of(r["id"]) for r in cmp.regressions})
        print(f"upstream tests: {len(cmp.regressions)} regression(s); running them once more")
        again, _ = run_selection(
            python,
            tree,
            Selection(files={i: ["rerun"] for i in ids}),
            pythonpath,
            label="patched-rerun",
            work=work,
            timeout_s=timeout_s,
            limit_s=limit_s,
        )
        confirmed = []
        for row in cmp.regressions:
            second = again.outcomes.get(row["id"])
            if second is not None and second.outcome == "passed":
                flaky.append({**row, "rerun": "passed"})
            else:
                confirmed.append(row)
        cmp.regressions = confirmed
    data = {
        "schema_version": SCHEMA_VERSION,
        "kind": "upstream-tests",
        "command": command,
        "revision": git_revision(),
        "base": base["base"],
        "machine": machine(),
        "settings": base["settings"],
        "hub": {"stock": base["hub"], "patched": hub},
        "touched": {"source": touched.source, "digest": touched.digest(), "paths": touched.paths},
        "stock": {
            "baseline": base_file.relative_to(REPO).as_posix()
            if base_file.is_relative_to(REPO)
            else str(base_file),
            "revision": base["revision"],
            **base["stock"],
        },
        "patched": {
            **patched,
            "seconds": run.seconds,
            "restarts": run.restarts,
            "complete": run.complete,
            "ran": "every selected test" if run_all else "the ids that passed on stock",
        },
        "selection": sel.files,
        "selection_bounds": sel.bounds,
        "over_budget": base["over_budget"],
        "files": per_file_report(base, run),
        "totals": {"stock": base["totals"], "patched": totals(run.outcomes)},
        **cmp.to_json(),
        "flaky": flaky,
        "cpu_cannot_run": cpu_cannot_run(stock),
        "stock_failures": stock_failures(stock),
        "verdict": "pass" if not cmp.regressions and run.complete else "fail",
    }
    out = report or report_path(results, version)
    write_json(out, data)
    print_summary(data, out)
    return 0 if data["verdict"] == "pass" else 1


def per_file_report(base: Mapping[str, object], run: SideRun) -> dict[str, object]:
    stock_files = base["files"]
    patched_counts = counts_by_file(run.outcomes)
    out = {}
    for f in sorted(set(stock_files) | set(patched_counts)):
        s = stock_files.get(f, {})
        out[f] = {
            "stock": s.get("counts", {}),
            "patched": patched_counts.get(f, {}),
            "stock_seconds": s.get("seconds", 0.0),
            "patched_seconds": run.file_seconds.get(f, 0.0),
        }
    return out


def print_summary(data: Mapping[str, object], out: Path) -> None:
    files = data["files"]
    rows = [*data["regressions"], *data["flaky"], *data["fixed"], *data["changed"]]
    differ = sorted({file_of(row["id"]) for row in rows})
    print(f"upstream tests: {len(files)} file(s); stock {data['totals']['stock']}")
    print(f"upstream tests: patched {data['totals']['patched']}")
    for f in differ:
        print(f"  {f}: stock {files[f]['stock']} -> patched {files[f]['patched']}")
    for row in data["flaky"]:
        print(f"  FLAKY (failed, passed on a rerun): {row['id']}")
    for row in data["fixed"]:
        print(f"  fixed: {row['id']} ({row['stock']} on stock)")
    for row in data["changed"]:
        print(f"  changed: {row['id']}: {row['stock']} -> {row['patched']}: {row['reason']}")
    for row in data["regressions"]:
        print(f"  REGRESSION {row['id']}: passed on stock, {row['patched']}: {row['reason']}")
    if not data["patched"]["complete"]:
        print("upstream tests: the patched run did not finish (see above)")
    print(f"upstream tests: report {out}")
    n = len(data["regressions"])
    print(f"upstream tests: {'FAILED: ' + str(n) + ' regression(s)' if n else 'no regressions'}")


def lock_like(
    trees: Sequence[Path], ref: str, pins: Mapping[str, str], locks: Sequence[Path]
) -> dict[str, object]:
    """A lock-like JSON (pins + one pseudo-patch per source) from git trees and locks."""
    ops = {"A": "add", "M": "modify", "D": "delete"}
    patches = []
    for lock in locks:
        t = load_touched(lock)
        files = [{"path": p, "op": op} for p, op in sorted(t.ops.items())]
        patches.append({"name": f"vllm/lock:{lock}", "files": files})
    for tree in trees:
        proc = subprocess.run(
            ["git", "-C", str(tree), "diff", "--name-status", "--no-renames", ref],
            capture_output=True,
            text=True,
            check=True,
        )
        files = []
        for line in proc.stdout.splitlines():
            status, path = line.split("\t", 1)
            files.append({"path": path, "op": ops.get(status[0], "modify")})
        patches.append({"name": f"vllm/git:{tree}@{ref}", "files": files})
    return {"schema_version": 1, "pins": dict(sorted(pins.items())), "patches": patches}


STOCK_MARKER = "dcp-stock-wheel.json"


def make_stock_venv(venv: Path) -> str:
    """A venv with the OFFICIAL pinned vLLM wheel (+ the pinned b12x wheel and the test tools of
    tests/vllm_tree_tests.py): the stock twin of the test venv. Reused when it has that wheel."""
    from patchset.fetch import pinned_file
    from patchset.hashing import sha256_file
    from vllm_tree_tests import install_fresh

    wheel = pinned_file("vllm", "wheel", root=REPO, offline=True)
    b12x = pinned_file("b12x", "wheel", root=REPO, offline=True)
    digest = sha256_file(wheel)
    python = venv / "bin" / "python"
    marker = venv / STOCK_MARKER
    if python.exists() and marker.is_file():
        if json.loads(marker.read_text()).get("sha256") == digest:
            print(f"stock venv: reusing {venv} ({wheel.name})")
            return str(python)
    if venv.exists():
        shutil.rmtree(venv)
    print(f"stock venv: creating {venv} with {wheel.name} + {b12x.name} (official, unpatched)")
    env = {**os.environ, "PIP_CACHE_DIR": str(REPO / ".cache" / "pip")}
    env.setdefault("PIP_DISABLE_PIP_VERSION_CHECK", "1")
    # the test venv's installation (tests/vllm_tree_tests.py): the same substitutes and order,
    # so that stock and patched differ only in the vLLM wheel's files
    if install_fresh(venv, wheel, b12x, env) != 0:
        raise UpstreamError(f"stock venv: installing into {venv} failed (pip's error above)")
    marker.write_text(json.dumps({"filename": wheel.name, "sha256": digest}) + "\n")
    return str(python)


# -- command line ------------------------------------------------------------------------------


def _default_tree(offline: bool = False) -> Path:
    from patchset.fetch import pristine_tree

    return pristine_tree("vllm", root=REPO, offline=offline)


def _terminate(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def main(argv: Sequence[str] | None = None) -> int:
    import signal

    signal.signal(signal.SIGTERM, _terminate)
    sys.path.insert(0, str(REPO / "tools"))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--lock", type=Path, default=REPO / "series.lock")
        p.add_argument("--base-tree", type=Path, help="pristine base tree (default: build/base)")

    def running(p: argparse.ArgumentParser) -> None:
        common(p)
        p.add_argument("--results", type=Path, default=REPO / "results")
        p.add_argument("--work", type=Path, default=REPO / "build" / "upstream-tests")
        p.add_argument("--timeout", type=int, default=TEST_TIMEOUT_S)
        p.add_argument("--limit", type=float, default=RUN_LIMIT_S)

    p = sub.add_parser("select", help="print the selected test files and why")
    common(p)
    p = sub.add_parser("baseline", help="run on the official wheel, write the stock baseline")
    running(p)
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--python", help="a python with the official pinned wheel")
    g.add_argument("--stock-venv", type=Path, help="make (or reuse) this venv with that wheel")
    p = sub.add_parser("check", help="run on the patched side and compare with the baseline")
    running(p)
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--venv", type=Path, help="the test venv with the overlay wheel")
    g.add_argument("--python", help="with --overlay-tree: a python with the official wheel")
    p.add_argument("--overlay-tree", type=Path, help="a patched git tree laid over --python")
    p.add_argument("--overlay-ref", default="base", help="what --overlay-tree is compared to")
    p.add_argument("--report", type=Path, help="where the report goes (default: results/)")
    p.add_argument("--all", action="store_true", help="run every id, not only stock passes")
    p = sub.add_parser("lock-like", help="a lock-like touched list from git trees and locks")
    p.add_argument("--git", type=Path, action="append", default=[], help="a patched git tree")
    p.add_argument("--ref", default="base")
    p.add_argument("--from-lock", type=Path, action="append", default=[])
    p.add_argument("--pin", action="append", default=[], help="KEY=SHA256 (vllm.sdist, ...)")
    p.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    command = "tests/upstream_tests.py " + " ".join(sys.argv[1:] if argv is None else argv)
    try:
        if args.command == "lock-like":
            pins = dict(item.split("=", 1) for item in args.pin)
            write_json(args.out, lock_like(args.git, args.ref, pins, args.from_lock))
            print(f"lock-like: {args.out}")
            return 0
        touched = load_touched(args.lock.resolve())
        tree = (args.base_tree or _default_tree()).resolve()
        if args.command == "select":
            sel = select(touched, tree)
            print(f"{len(sel.files)} file(s) for {len(touched.paths)} touched path(s) on {tree}")
            for f, reasons in sel.files.items():
                print(f"{f}\t{' '.join(reasons)}")
            for path, why in sel.bounds.items():
                print(f"bound: {path}: {why}")
            return 0
        work = args.work.resolve()
        if work.exists():
            shutil.rmtree(work)
        work.mkdir(parents=True)
        if args.command == "baseline":
            stock = args.python or make_stock_venv(args.stock_venv.resolve())
            make_baseline(
                python=stock,
                tree=tree,
                touched=touched,
                results=args.results.resolve(),
                work=work,
                command=command,
                timeout_s=args.timeout,
                limit_s=args.limit,
            )
            return 0
        if args.venv is not None:
            if args.overlay_tree is not None:
                parser.error("--overlay-tree goes with --python, not --venv")
            python = str(args.venv.resolve() / "bin" / "python")
            marker = args.venv.resolve() / "dcp-wheel.json"
            if not marker.is_file():
                raise UpstreamError(f"{args.venv} has no dcp-wheel.json: run `make testenv`")
            patched: dict[str, object] = {"python": python, "wheel": json.loads(marker.read_text())}
            overlay = None
        else:
            if args.overlay_tree is None:
                parser.error("--python needs --overlay-tree (the patched side)")
            otree = args.overlay_tree.resolve()
            changed = overlay_changed(otree, args.overlay_ref)
            rev = subprocess.run(
                ["git", "-C", str(otree), "rev-parse", "HEAD"],
                capture_output=True,
                text=True,
                check=False,
            ).stdout.strip()
            python = args.python
            patched = {
                "python": python,
                "overlay": {
                    "tree": str(otree),
                    "head": rev,
                    "ref": args.overlay_ref,
                    "files": changed,
                },
            }
            overlay = (otree, changed)
        return check(
            python=python,
            tree=tree,
            touched=touched,
            results=args.results.resolve(),
            work=work,
            command=command,
            patched=patched,
            overlay=overlay,
            timeout_s=args.timeout,
            limit_s=args.limit,
            report=args.report.resolve() if args.report else None,
            run_all=args.all,
        )
    except UpstreamError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
