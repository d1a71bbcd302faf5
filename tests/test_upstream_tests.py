"""tests/upstream_tests.py without vLLM: the selection rules, the outcome fold, the comparison,
the baseline refusals, and the runner on small generated pytest suites (crash, conftest error)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import upstream_tests as ut
from upstream_tests import Outcome

PINS = {"vllm.sdist": "a" * 64, "vllm.wheel": "b" * 64}


def write(root: Path, rel: str, text: str = "") -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def lock(tmp: Path, files: dict[str, str], pins: dict[str, str] | None = None) -> Path:
    data = {
        "pins": {**(PINS if pins is None else pins), "b12x.sdist": "c" * 64},
        "patches": [
            {"name": "vllm/0001-x.patch", "files": [{"path": p, "op": o} for p, o in files.items()]}
        ],
    }
    return write(tmp, "series.lock", json.dumps(data))


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A small vLLM-shaped base tree: a package re-exporting from a submodule, tests around it."""
    t = tmp_path / "base"
    write(t, "vllm/__init__.py")
    write(t, "vllm/envs.py", "X = 1\n")
    write(t, "vllm/config/__init__.py", "from vllm.config.vllm import VllmConfig\n")
    write(t, "vllm/config/vllm.py", "class VllmConfig: ...\n")
    write(t, "vllm/config/vllm_extra.py", "Y = 2\n")
    write(t, "vllm/v1/core/sched/scheduler.py", "class Scheduler: ...\n")
    write(t, "tests/test_envs.py", "import vllm.envs as envs\n")
    write(t, "tests/test_other.py", "import os\n")
    write(t, "tests/config/test_misc.py", "import json\n")
    write(t, "tests/config/sub/test_deep.py", "import json\n")
    write(t, "tests/engine/test_uses_config.py", "from vllm.config import VllmConfig\n")
    write(t, "tests/engine/test_extra.py", "from vllm.config.vllm_extra import Y\n")
    write(t, "tests/engine/test_func_import.py", "def f():\n    from vllm.config import vllm\n")
    write(t, "tests/v1/core/utils.py", "from vllm.v1.core.sched.scheduler import Scheduler\n")
    write(t, "tests/v1/core/test_scheduler.py", "from .utils import create_scheduler\n")
    write(t, "tests/v1/core/test_scheduler_e2e.py", "import pytest\n")
    write(t, "tests/v1/core/test_kv.py", "import pytest\n")
    write(t, "tests/v1/other/test_helper_user.py", "from tests.v1.core.utils import x\n")
    return t


def test_load_touched_keeps_the_first_add_and_only_the_target(tmp_path: Path) -> None:
    """A path the series first adds stays ``add``; other targets' patches and pins are dropped."""
    data = {
        "pins": {**PINS, "b12x.sdist": "c" * 64},
        "patches": [
            {"name": "vllm/0001-a.patch", "files": [{"path": "vllm/new.py", "op": "add"}]},
            {"name": "vllm/0002-b.patch", "files": [{"path": "vllm/new.py", "op": "modify"}]},
            {"name": "b12x/0001-c.patch", "files": [{"path": "b12x/x.py", "op": "modify"}]},
        ],
    }
    t = ut.load_touched(write(tmp_path, "l.json", json.dumps(data)))
    assert dict(t.ops) == {"vllm/new.py": "add"}
    assert dict(t.pins) == PINS
    assert t.digest() != ut.Touched({"vllm/other.py": "add"}, PINS, "x").digest()


def test_another_platforms_wheel_pin_does_not_stale_the_baseline(
    tree: Path, tmp_path: Path
) -> None:
    """The stock baseline runs on the sdist and ``[vllm.wheel]``: pinning an aarch64 wheel
    beside them leaves it valid (a changed x86_64 wheel pin still refuses it, see below)."""
    touched = ut.load_touched(lock(tmp_path, {"vllm/envs.py": "modify"}))
    sel = ut.select(touched, tree)
    path = baseline_for(touched, sel, tmp_path / "b.json")
    more = {**PINS, "vllm.wheel_aarch64": "e" * 64}
    touched = ut.load_touched(lock(tmp_path, {"vllm/envs.py": "modify"}, more))
    assert "vllm.wheel_aarch64" not in touched.pins
    assert ut.load_baseline(path, touched, sel, ut.TEST_TIMEOUT_S)["base"]["version"] == "9.9.9"


def test_imported_names_resolve_relative_and_nested_imports() -> None:
    """Relative imports resolve against the file's package; imports inside functions count."""
    src = "import a.b\nfrom .utils import u\nfrom ..pkg import m\ndef f():\n    from c import d\n"
    names = ut.imported_names(src, "tests/v1/core/test_x.py")
    assert names == {
        ("a.b", None),
        ("tests.v1.core.utils", "u"),
        ("tests.v1.pkg", "m"),
        ("c", "d"),
    }


def test_reaches_direct_submodule_and_reexport_but_not_a_name_prefix(tree: Path) -> None:
    """``vllm.config.vllm`` is reached by its own import, ``from vllm.config import vllm`` and the
    re-exported ``VllmConfig``; ``vllm.config.vllm_extra`` and ``vllm.config`` alone do not."""
    m = "vllm.config.vllm"
    assert ut.reaches({("vllm.config.vllm", "VllmConfig")}, m, tree) == "direct"
    assert ut.reaches({("vllm.config", "vllm")}, m, tree) == "direct"
    assert ut.reaches({("vllm.config", "VllmConfig")}, m, tree) == "reexport"
    assert ut.reaches({("vllm.config.vllm_extra", "Y")}, m, tree) is None
    assert ut.reaches({("vllm.config", "CacheConfig")}, m, tree) is None
    assert ut.reaches({("vllm.config", None)}, m, tree) is None


def test_select_applies_every_rule_with_its_reason(tree: Path, tmp_path: Path) -> None:
    """Each rule selects what it says and records why; added files and root modules add no dir
    rule; a touched test helper selects its importers; unrelated tests stay out."""
    touched = ut.load_touched(
        lock(
            tmp_path,
            {
                "vllm/config/vllm.py": "modify",
                "vllm/envs.py": "modify",
                "vllm/v1/core/sched/scheduler.py": "modify",
                "vllm/v1/new_module.py": "add",
                "tests/v1/core/test_kv.py": "modify",
                "tests/v1/core/utils.py": "modify",
                "tests/v1/core/test_added.py": "add",
            },
        )
    )
    sel = ut.select(touched, tree)
    assert sel.files == {
        "tests/config/test_misc.py": ["dir:vllm/config/vllm.py"],
        "tests/engine/test_func_import.py": ["imports:vllm/config/vllm.py"],
        "tests/engine/test_uses_config.py": ["imports:vllm/config/vllm.py"],
        "tests/test_envs.py": ["imports:vllm/envs.py", "name:vllm/envs.py"],
        "tests/v1/core/test_kv.py": [
            "dir:tests/v1/core/utils.py",
            "edited:tests/v1/core/test_kv.py",
        ],
        "tests/v1/core/test_scheduler.py": [
            "dir:tests/v1/core/utils.py",
            "imports:tests/v1/core/utils.py",
            "name:vllm/v1/core/sched/scheduler.py",
        ],
        "tests/v1/core/test_scheduler_e2e.py": [
            "dir:tests/v1/core/utils.py",
            "name:vllm/v1/core/sched/scheduler.py",
        ],
        "tests/v1/other/test_helper_user.py": ["imports:tests/v1/core/utils.py"],
    }
    assert "tests/config/sub/test_deep.py" not in sel.files  # dir rule: not recursive
    assert "tests/test_other.py" not in sel.files  # root module: no dir rule
    assert "tests/engine/test_extra.py" not in sel.files  # vllm_extra is not vllm


def test_select_bounds_a_hub_module_to_its_direct_importers(tree: Path, tmp_path: Path) -> None:
    """Over the limit of re-export-only importers, a module keeps its direct importers (and name,
    dir rules) and the bound is recorded; at the limit the re-export importers stay."""
    touched = ut.load_touched(lock(tmp_path, {"vllm/config/vllm.py": "modify"}))
    write(tree, "tests/engine/test_direct.py", "from vllm.config.vllm import VllmConfig\n")
    full = ut.select(touched, tree, hub_limit=1)
    assert "tests/engine/test_uses_config.py" in full.files and full.bounds == {}
    bounded = ut.select(touched, tree, hub_limit=0)
    assert "tests/engine/test_uses_config.py" not in bounded.files
    assert bounded.files["tests/engine/test_direct.py"] == ["imports:vllm/config/vllm.py"]
    assert bounded.files["tests/engine/test_func_import.py"] == ["imports:vllm/config/vllm.py"]
    assert bounded.files["tests/config/test_misc.py"] == ["dir:vllm/config/vllm.py"]
    assert bounded.bounds["vllm/config/vllm.py"].startswith("a hub: 1 test files reach it only")


def test_select_dir_rule_needs_the_exact_mirror_directory(tree: Path, tmp_path: Path) -> None:
    """``vllm/config/x.py`` takes ``tests/config/*`` (not ``tests/config/sub/``)."""
    write(tree, "vllm/config/cache.py", "Z = 3\n")
    sel = ut.select(ut.load_touched(lock(tmp_path, {"vllm/config/cache.py": "modify"})), tree)
    assert sel.files == {"tests/config/test_misc.py": ["dir:vllm/config/cache.py"]}


def test_select_of_only_added_files_is_empty(tree: Path, tmp_path: Path) -> None:
    """A series that only adds files reaches no upstream test."""
    sel = ut.select(ut.load_touched(lock(tmp_path, {"vllm/brand_new.py": "add"})), tree)
    assert sel.files == {} and sel.modules == []


def test_selection_targets_run_the_strongest_rule_first() -> None:
    sel = ut.Selection(
        files={
            "tests/a.py": ["imports:vllm/x.py"],
            "tests/b.py": ["dir:vllm/x.py", "imports:vllm/x.py"],
            "tests/c.py": ["name:vllm/x.py"],
            "tests/d.py": ["edited:tests/d.py"],
            "tests/e.py": ["dir:vllm/y.py"],
        }
    )
    assert ut.selection_targets(sel) == [
        "tests/d.py",
        "tests/c.py",
        "tests/b.py",
        "tests/e.py",
        "tests/a.py",
    ]


def test_covered_files_drop_the_file_in_progress_at_the_budget() -> None:
    """At the budget: files that ran or failed to collect are covered, the one in progress and
    the ones never reached are not; a complete run covers all; a dead run is refused."""
    targets = ["t/a.py", "t/b.py", "t/c.py", "t/d.py"]
    outcomes = {
        "t/a.py::x": Outcome("passed"),
        "t/b.py::y": Outcome("passed"),
        "t/d.py": Outcome("error"),
    }
    run = ut.SideRun(outcomes, 1.0, 0, False, {}, killed=True, started=["t/a.py", "t/b.py"])
    assert ut.covered_files(targets, run) == ["t/a.py", "t/d.py"]
    done = ut.SideRun(outcomes, 1.0, 0, True, {}, started=["t/a.py", "t/b.py"])
    assert ut.covered_files(targets, done) == targets
    dead = ut.SideRun(outcomes, 1.0, 0, False, {}, started=["t/a.py"])
    with pytest.raises(ut.UpstreamError):
        ut.covered_files(targets, dead)


def rep(tid: str, when: str, outcome: str, reason: str = "") -> dict[str, object]:
    return {"event": "report", "id": tid, "when": when, "outcome": outcome, "reason": reason}


def test_fold_maps_each_phase_to_one_outcome() -> None:
    """setup failure -> error, hub skip -> hub-skip, failed teardown after a pass -> error, a file
    that fails to collect -> error, a crash record -> error, the running test of a dead run."""
    records = [
        {"event": "start", "id": "t.py::a"},
        rep("t.py::a", "setup", "passed"),
        rep("t.py::a", "call", "passed"),
        rep("t.py::a", "teardown", "passed"),
        rep("t.py::b", "setup", "failed", "fixture broke"),
        rep("t.py::c", "setup", "skipped", "Skipped: CUDA required"),
        rep("t.py::d", "call", "skipped", "Skipped: needs huggingface.co, unreachable here"),
        rep("t.py::e", "call", "passed"),
        rep("t.py::e", "teardown", "failed", "leak"),
        rep("t.py::f", "call", "xfailed", "known"),
        {"event": "collect", "id": "u.py", "outcome": "failed", "reason": "ImportError: x"},
        {"event": "collect", "id": "v.py", "outcome": "skipped", "reason": "no GPU"},
        {"event": "crash", "id": "t.py::g", "reason": "died"},
        {"event": "start", "id": "t.py::h"},
    ]
    out = ut.fold(records, died="the process died")
    assert {k: v.outcome for k, v in out.items()} == {
        "t.py::a": "passed",
        "t.py::b": "error",
        "t.py::c": "skipped",
        "t.py::d": "hub-skip",
        "t.py::e": "error",
        "t.py::f": "xfailed",
        "u.py": "error",
        "v.py": "skipped",
        "t.py::g": "error",
        "t.py::h": "error",
    }
    assert out["t.py::h"].reason == "the process died"
    assert ut.counts_by_file(out)["t.py"] == {
        "error": 4,
        "hub-skip": 1,
        "passed": 1,
        "skipped": 1,
        "xfailed": 1,
    }


def test_compare_flags_every_way_a_stock_pass_can_be_lost() -> None:
    """pass -> fail / error / skip / not recorded / file collection error is a regression;
    fail -> pass is fixed; fail -> error is changed; a new id is only_patched."""
    stock = {
        "a.py::ok": Outcome("passed"),
        "a.py::fails": Outcome("passed"),
        "a.py::errors": Outcome("passed"),
        "a.py::skips": Outcome("passed"),
        "a.py::gone": Outcome("passed"),
        "a.py::was_bad": Outcome("failed", "boom"),
        "a.py::bad_worse": Outcome("failed"),
        "a.py::cpu": Outcome("skipped", "CUDA"),
        "b.py::x": Outcome("passed"),
        "b.py::y": Outcome("skipped", "CUDA"),
    }
    patched = {
        "a.py::ok": Outcome("passed"),
        "a.py::fails": Outcome("failed", "AttributeError: adaptive_depth"),
        "a.py::errors": Outcome("error", "setup"),
        "a.py::skips": Outcome("skipped", "why"),
        "a.py::was_bad": Outcome("passed"),
        "a.py::bad_worse": Outcome("error"),
        "a.py::cpu": Outcome("skipped", "CUDA"),
        "a.py::new": Outcome("passed"),
        "b.py": Outcome("error", "ImportError: cannot import name"),
    }
    cmp = ut.compare(stock, patched)
    assert [(r["id"], r["patched"]) for r in cmp.regressions] == [
        ("a.py::errors", "error"),
        ("a.py::fails", "failed"),
        ("a.py::gone", "missing"),
        ("a.py::skips", "skipped"),
        ("b.py::x", "error"),
    ]
    assert cmp.regressions[1]["reason"] == "AttributeError: adaptive_depth"
    assert [r["id"] for r in cmp.fixed] == ["a.py::was_bad"]
    assert [r["id"] for r in cmp.changed] == ["a.py::bad_worse", "b.py::y"]
    assert [r["id"] for r in cmp.only_patched] == ["a.py::new"]


def test_compare_of_identical_sides_is_empty() -> None:
    side = {"a.py::x": Outcome("passed"), "a.py::y": Outcome("failed", "r")}
    assert ut.compare(side, dict(side)).to_json() == {
        "regressions": [],
        "fixed": [],
        "changed": [],
        "only_patched": [],
    }


def test_cpu_cannot_run_groups_skips_and_gpu_failures_by_reason() -> None:
    """Non-hub skips and GPU-only failures are what CPU cannot run; other stock failures and
    hub skips are not."""
    stock = {
        "a.py::x": Outcome("skipped", "CUDA required"),
        "a.py::y": Outcome("skipped", "CUDA required"),
        "b.py": Outcome("skipped", "needs ROCm"),
        "c.py::z": Outcome("hub-skip", "needs huggingface.co"),
        "c.py::w": Outcome("passed"),
        "d.py::g": Outcome("failed", "RuntimeError: Found no NVIDIA driver on your system."),
        "d.py::h": Outcome("failed", "ModuleNotFoundError: No module named 'ray'"),
    }
    assert ut.cpu_cannot_run(stock) == {
        "CUDA required": {"outcome": "skipped", "ids": ["a.py::x", "a.py::y"]},
        "RuntimeError: Found no NVIDIA driver on your system.": {
            "outcome": "failed",
            "ids": ["d.py::g"],
        },
        "needs ROCm": {"outcome": "skipped", "ids": ["b.py"]},
    }
    assert ut.stock_failures(stock) == {"ModuleNotFoundError: No module named 'ray'": ["d.py::h"]}


def baseline_for(touched: ut.Touched, sel: ut.Selection, path: Path, **over: object) -> Path:
    data = {
        "schema_version": ut.SCHEMA_VERSION,
        "base": {"version": "9.9.9", "pins": dict(touched.pins)},
        "touched": {"digest": touched.digest(), "paths": touched.paths},
        "selection": sel.files,
        "settings": ut.settings(ut.TEST_TIMEOUT_S),
        "outcomes": {},
    }
    data.update(over)
    path.write_text(json.dumps(data))
    return path


def test_load_baseline_accepts_a_matching_one(tree: Path, tmp_path: Path) -> None:
    touched = ut.load_touched(lock(tmp_path, {"vllm/envs.py": "modify"}))
    sel = ut.select(touched, tree)
    path = baseline_for(touched, sel, tmp_path / "b.json")
    assert ut.load_baseline(path, touched, sel, ut.TEST_TIMEOUT_S)["base"]["version"] == "9.9.9"


@pytest.mark.parametrize(
    "change, expected",
    [
        ("pin", "pin vllm.wheel: baseline " + "b" * 64),
        ("touched", "touched set differs from the baseline's (1 path(s): +vllm/config/vllm.py)"),
        ("timeout", "settings"),
        ("missing", "no stock baseline"),
    ],
)
def test_load_baseline_refuses_a_stale_one_and_names_the_fix(
    tree: Path, tmp_path: Path, change: str, expected: str
) -> None:
    """A baseline of another pin, touched set or timeout, or none, is refused; the message says
    what differs and the make target that regenerates it."""
    touched = ut.load_touched(lock(tmp_path, {"vllm/envs.py": "modify"}))
    sel = ut.select(touched, tree)
    path = baseline_for(touched, sel, tmp_path / "b.json")
    timeout = ut.TEST_TIMEOUT_S
    if change == "pin":
        touched = ut.load_touched(
            lock(tmp_path, {"vllm/envs.py": "modify"}, {**PINS, "vllm.wheel": "d" * 64})
        )
    elif change == "touched":
        touched = ut.load_touched(
            lock(tmp_path, {"vllm/envs.py": "modify", "vllm/config/vllm.py": "modify"})
        )
        sel = ut.select(touched, tree)
    elif change == "timeout":
        timeout = 5
    else:
        path.unlink()
    with pytest.raises(ut.UpstreamError) as err:
        ut.load_baseline(path, touched, sel, timeout)
    assert expected in str(err.value)
    assert "make upstream-baseline" in str(err.value)


# -- the runner on generated suites, with this Python's pytest (no vLLM) -----------------------


def run_suite(tmp_path: Path, files: dict[str, str], targets: list[str]) -> ut.SideRun:
    root = tmp_path / "run"
    for rel, text in files.items():
        write(root, rel, text)
    work = tmp_path / "work"
    work.mkdir()
    env = ut.side_env([], {})
    return ut.run_side(
        sys.executable, root, targets, env, work=work, label="t", timeout_s=0, limit_s=120
    )


def test_run_side_records_outcomes_and_resumes_after_a_crash(tmp_path: Path) -> None:
    """A test that kills the interpreter is an error naming the exit status; the tests after it
    still run (the process is restarted with what was recorded deselected)."""
    suite = (
        "import os, pytest\n"
        "def test_a(): pass\n"
        "def test_b(): assert False, 'nope'\n"
        "def test_c(): os._exit(3)\n"
        "def test_d(): pass\n"
        "@pytest.mark.skip(reason='no GPU')\n"
        "def test_e(): pass\n"
    )
    files = {"tests/test_s.py": suite, "tests/test_bad.py": "import no_such_module_xyz\n"}
    run = run_suite(tmp_path, files, ["tests/test_s.py", "tests/test_bad.py"])
    got = {k: (v.outcome, v.reason) for k, v in run.outcomes.items()}
    assert run.complete and run.restarts == 1
    assert got["tests/test_s.py::test_a"] == ("passed", "")
    assert got["tests/test_s.py::test_b"][0] == "failed"
    assert "nope" in got["tests/test_s.py::test_b"][1]
    assert got["tests/test_s.py::test_c"] == (
        "error",
        "the pytest process died (exit 3) during this test",
    )
    assert got["tests/test_s.py::test_d"] == ("passed", "")
    assert got["tests/test_s.py::test_e"][0] == "skipped"
    assert got["tests/test_bad.py"][0] == "error"
    assert "no_such_module_xyz" in got["tests/test_bad.py"][1]


def test_run_side_isolates_a_conftest_that_cannot_be_imported(tmp_path: Path) -> None:
    """Files under a conftest that fails to import are errors with that reason; others run."""
    files = {
        "tests/a/conftest.py": "import missing_test_plugin_xyz\n",
        "tests/a/test_x.py": "def test_x(): pass\n",
        "tests/b/test_y.py": "def test_y(): pass\n",
    }
    run = run_suite(tmp_path, files, ["tests/a/test_x.py", "tests/b/test_y.py"])
    assert run.outcomes["tests/b/test_y.py::test_y"].outcome == "passed"
    bad = run.outcomes["tests/a/test_x.py"]
    assert bad.outcome == "error"
    assert "tests/a/conftest.py cannot be imported" in bad.reason
    assert "missing_test_plugin_xyz" in bad.reason
