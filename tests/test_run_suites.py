"""``tests/run_suites.py``, ``make test``'s suite runner: suites at once, logs whole, times."""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path
from typing import Any

import pytest

RUNNER = Path(__file__).resolve().parent / "run_suites.py"


def _runner() -> Any:
    spec = importlib.util.spec_from_file_location("run_suites", RUNNER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_two_jobs_run_two_suites_at_once(tmp_path: Path, capsys) -> None:
    runner = _runner()
    start = time.monotonic()
    code = runner.main(["--jobs", "2", "--logs", str(tmp_path), "a=sleep 1.5", "b=sleep 1.5"])
    wall = time.monotonic() - start
    assert code == 0
    assert wall < 2.7, f"{wall:.1f} s: the suites ran one after the other"
    out = capsys.readouterr().out
    assert "a: passed in" in out and "b: passed in" in out and "all passed" in out


def test_one_job_runs_them_in_the_order_given(tmp_path: Path, capsys) -> None:
    runner = _runner()
    code = runner.main(["--jobs", "1", "--logs", str(tmp_path), "z=echo first", "a=echo second"])
    assert code == 0
    out = capsys.readouterr().out
    assert out.index("first") < out.index("second")


def test_a_failed_suite_fails_the_run_and_the_others_still_run(tmp_path: Path, capsys) -> None:
    runner = _runner()
    code = runner.main(
        ["--jobs", "1", "--logs", str(tmp_path), "bad=echo broken; exit 3", "good=echo fine"]
    )
    assert code == 1
    out = capsys.readouterr().out
    assert "bad: FAILED (exit 3) in" in out and "good: passed in" in out
    assert "FAILED: bad" in out.splitlines()[-1]


def test_each_suite_log_is_printed_whole_never_interleaved(tmp_path: Path, capsys) -> None:
    """Two suites writing at the same time: each one's lines come out as one block."""
    runner = _runner()
    loop = "for i in 1 2 3 4 5; do echo {0}$i; sleep 0.1; done"
    code = runner.main(
        ["--logs", str(tmp_path), "--jobs", "2", "x=" + loop.format("x"), "y=" + loop.format("y")]
    )
    assert code == 0
    lines = capsys.readouterr().out.splitlines()
    for name in ("x", "y"):
        at = [i for i, line in enumerate(lines) if line in {f"{name}{k}" for k in range(1, 6)}]
        assert at == list(range(at[0], at[0] + 5)), lines
    assert (tmp_path / "x.log").read_text().split() == [f"x{k}" for k in range(1, 6)]


def test_suites_read_no_standard_input(tmp_path: Path) -> None:
    runner = _runner()
    assert runner.main(["--logs", str(tmp_path), "r=read -t 5 line || exit 0; exit 1"]) == 0


@pytest.mark.parametrize("spec", ["noequals", "Upper=true", "a=", "=true", "a b=true"])
def test_a_suite_that_is_not_name_equals_command_is_refused(tmp_path: Path, spec: str) -> None:
    runner = _runner()
    with pytest.raises(SystemExit, match="NAME=COMMAND"):
        runner.main(["--logs", str(tmp_path), spec])


def test_repeated_names_are_refused(tmp_path: Path) -> None:
    runner = _runner()
    with pytest.raises(SystemExit):
        runner.main(["--logs", str(tmp_path), "a=true", "a=false"])
