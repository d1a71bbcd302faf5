"""cli: exit codes 0/1/2, `patchset: error:` + `hint:` messages, argv as a parameter."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import Workspace, patch_bytes
from patchset.cli import main

BASE = {"a.py": b"a\n"}
PATCH = ("vllm/0001-a.patch", patch_bytes({"a.py": (b"a\n", b"b\n")}))


def test_error_prints_what_details_and_hint_and_exits_1(ws: Workspace, capsys) -> None:
    ws.setup(BASE, [PATCH])
    ws.write_series([PATCH[0], "vllm/0002-missing.patch"])
    assert ws.cli("apply") == 1
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "patchset: error: series refused: 1 problem(s)"
    assert err[1].startswith("  vllm/0002-missing.patch (series line 3): listed but missing")
    assert err[-1].startswith("hint: ")


def test_nothing_to_do_exits_2_on_stdout(ws: Workspace, capsys) -> None:
    ws.setup(BASE, [PATCH])
    capsys.readouterr()
    assert ws.cli("unapply") == 2
    captured = capsys.readouterr()
    assert captured.out.startswith("patchset: nothing to do:") and captured.err == ""


def test_unknown_upto_is_refused(ws: Workspace, capsys) -> None:
    ws.setup(BASE, [PATCH])
    assert ws.cli("apply", "--upto", "vllm/0009-nope.patch") == 1
    assert "--upto vllm/0009-nope.patch: not a patch of this target's series" in (
        capsys.readouterr().err
    )


def test_missing_lock_says_how_to_make_one(ws: Workspace, capsys) -> None:
    ws.setup(BASE, [PATCH])
    (ws.repo / "series.lock").unlink()
    assert ws.cli("apply") == 1
    err = capsys.readouterr().err
    assert "no series.lock" in err and "hint: run patchset lock" in err


def test_verify_of_missing_tree_is_an_error(ws: Workspace, capsys) -> None:
    ws.setup(BASE, [PATCH])
    assert ws.cli("verify", "--tree", str(ws.tree.parent / "nowhere")) == 1
    assert "no such tree" in capsys.readouterr().err


def test_repo_is_found_from_the_working_directory(ws, monkeypatch, capsys) -> None:
    ws.setup(BASE, [PATCH])
    (ws.repo / "sub").mkdir()
    monkeypatch.chdir(ws.repo / "sub")
    assert main(["lock", "--check", "--base", f"vllm={ws.base}"]) == 0
    assert "series.lock is current" in capsys.readouterr().out


def test_empty_series_locks_and_checks(ws: Workspace) -> None:
    assert ws.cli("lock") == 0
    assert ws.cli("lock", "--check") == 0


def test_bad_command_line_exits_2_via_argparse() -> None:
    with pytest.raises(SystemExit) as caught:
        main(["apply", "--target", "torch"])
    assert caught.value.code == 2


def test_python_dash_m_runs_the_cli(ws: Workspace) -> None:
    ws.setup(BASE, [PATCH])
    tools = Path(__file__).resolve().parents[1] / "tools"
    result = subprocess.run(
        [sys.executable, "-m", "patchset", "-C", str(ws.repo), "apply", "--tree", str(ws.tree)],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(tools), "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stderr
    assert "Applying vllm/0001-a.patch (1/1)" in result.stdout


def test_b12x_tree_is_verified_by_the_target_its_state_records(ws: Workspace, capsys) -> None:
    from conftest import write_tree

    write_tree(ws.base, BASE)
    ws.add_patch("b12x/0001-a.patch", PATCH[1])
    ws.write_series(["b12x/0001-a.patch"])
    ws.reset_tree()
    assert ws.cli("lock", "--base", f"b12x={ws.base}") == 0
    assert ws.cli("apply", "--target", "b12x") == 0
    assert ws.cli("verify") == 0
    assert ws.cli("status") == 0
    assert "applied      b12x/0001-a.patch" in capsys.readouterr().out
    assert ws.cli("unapply") == 0
    assert (ws.tree / "a.py").read_bytes() == b"a\n"
