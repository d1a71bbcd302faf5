"""journal: a run killed or failed at any write point is rolled back, verified, by the next one.

A test-only injection point (``PATCHSET_TEST_CRASH=<n>:<action>``) kills the process (SIGKILL,
SIGTERM, SIGHUP) or fails with ENOSPC at its n-th write; every n is tried until the run ends
on its own. After each crash the tree must be byte-identical to before or fully applied and
verified once ``recover`` (or the next ``apply``/``unapply``) ran, and ``verify``/``status`` must
never call a half-written tree fine.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import crashpoints
import pytest
from conftest import Workspace, patch_bytes, snapshot

TOOLS = str(Path(__file__).resolve().parents[1] / "tools")
BASE = {
    "pkg/a.py": b"".join(b"a%d = %d\n" % (i, i) for i in range(40)),
    "pkg/b.py": b"def f():\n    return 1\n",
    "pkg/old/gone.py": b"old\n",
}
A2 = BASE["pkg/a.py"].replace(b"a5 = 5\n", b"a5 = 50\n")
A3 = A2.replace(b"a30 = 30\n", b"a30 = 300\n")


def _patches() -> list[tuple[str, bytes]]:
    return [
        ("vllm/0001-one.patch", patch_bytes({"pkg/a.py": (BASE["pkg/a.py"], A2)})),
        (
            "vllm/0002-two.patch",
            patch_bytes(
                {
                    "pkg/new/mod.py": (None, b"x = 1\n"),
                    "pkg/old/gone.py": (BASE["pkg/old/gone.py"], None),
                    "pkg/a.py": (A2, A3),
                }
            ),
        ),
    ]


def _run(ws: Workspace, *args: str, crash: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=TOOLS)
    env.pop("PATCHSET_TEST_CRASH", None)
    if crash:
        env["PATCHSET_TEST_CRASH"] = crash
    argv = [sys.executable, crashpoints.SCRIPT, "-C", str(ws.repo), *args, "--tree", str(ws.tree)]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)


def _states(ws: Workspace) -> tuple[dict, dict]:
    ws.setup(BASE, _patches())
    os.chmod(ws.tree / "pkg/b.py", 0o600)
    before = snapshot(ws.tree)
    assert ws.cli("apply") == 0
    applied = snapshot(ws.tree)
    assert ws.cli("unapply") == 0
    assert snapshot(ws.tree) == before
    return before, applied


def _core(snap: dict) -> dict:
    """The tree without the journal's staging (which holds no change until journal.json)."""
    return {k: v for k, v in snap.items() if k != ".patchset" and not k.startswith(".patchset/j")}


def _settle(ws: Workspace, before: dict, applied: dict, command: str) -> str:
    """After a crash: status/verify never report a half tree as fine; recovery ends in a
    whole state. Returns which one."""
    now = _core(snapshot(ws.tree))
    status = _run(ws, "status")
    assert "Traceback" not in status.stderr and "exists without" not in status.stderr, status
    if now not in (_core(before), _core(applied)):
        assert status.returncode != 0, status
        assert _run(ws, "verify").returncode != 0
    if command == "recover":
        done = _run(ws, "recover")
        assert done.returncode in (0, 2), done
    else:
        done = _run(ws, command)
        assert done.returncode in (0, 2), done
    now = snapshot(ws.tree)
    assert now in (before, applied), done
    if now == applied:
        assert ws.cli("verify") == 0
    return "before" if now == before else "applied"


@pytest.mark.parametrize("signal_name", ["KILL", "TERM", "HUP"])
def test_apply_killed_at_every_write_point_recovers(ws: Workspace, signal_name: str) -> None:
    before, applied = _states(ws)
    seen = set()
    for point in range(1, 200):
        crashed = _run(ws, "apply", crash=f"{point}:{signal_name}")
        if crashed.returncode in (0,):
            assert snapshot(ws.tree) == applied
            break
        seen.add(_settle(ws, before, applied, "recover" if point % 2 else "apply"))
        if snapshot(ws.tree) == applied:
            assert ws.cli("unapply") == 0
        assert snapshot(ws.tree) == before
    else:
        raise AssertionError("apply never finished")
    assert point > 10 and "before" in seen


@pytest.mark.parametrize("signal_name", ["KILL", "TERM"])
def test_unapply_killed_at_every_write_point_recovers(ws: Workspace, signal_name: str) -> None:
    before, applied = _states(ws)
    assert ws.cli("apply") == 0
    for point in range(1, 200):
        crashed = _run(ws, "unapply", crash=f"{point}:{signal_name}")
        if crashed.returncode == 0:
            assert snapshot(ws.tree) == before
            break
        state = _settle(ws, before, applied, "recover" if point % 2 else "unapply")
        if state == "before":
            assert ws.cli("apply") == 0
        assert snapshot(ws.tree) == applied
    else:
        raise AssertionError("unapply never finished")
    assert point > 10


def test_failed_rollback_is_finished_by_recover(ws: Workspace) -> None:
    """ENOSPC at write n starts the in-process rollback; a kill inside it leaves a journal that
    recover (or the next apply) finishes."""
    before, applied = _states(ws)
    killed = 0
    for fail in (3, 8, 14, 20):
        for kill in (1, 2, 4):
            crashed = _run(ws, "apply", crash=f"{fail}:ENOSPC,{fail + kill}:KILL")
            if crashed.returncode == 0:
                assert ws.cli("unapply") == 0
                continue
            killed += crashed.returncode == -9
            assert _settle(ws, before, applied, "recover") == "before"
            assert snapshot(ws.tree) == before
    assert killed >= 4  # on early failures the rollback has fewer write points than the kill


def test_enospc_rolls_back_in_process(ws: Workspace, capsys) -> None:
    before, _ = _states(ws)
    failed = 0
    for point in (2, 6, 12, 18):
        result = _run(ws, "apply", crash=f"{point}:ENOSPC")
        if result.returncode == 0:
            assert ws.cli("unapply") == 0
            continue
        failed += 1
        assert result.returncode == 1 and "No space left on device" in result.stderr
        assert (
            "every write was rolled back" in result.stderr
            and "hint: apply/unapply" not in result.stderr
        )
        assert snapshot(ws.tree) == before
    assert failed >= 3


def test_free_space_is_checked_before_the_first_write(ws: Workspace, monkeypatch, capsys) -> None:
    before, _ = _states(ws)
    import patchset.journal as journal

    monkeypatch.setattr(journal, "free_bytes", lambda path: 100)
    assert ws.cli("apply") == 1
    err = capsys.readouterr().err
    assert "not enough free space" in err and "nothing was changed" in err
    assert snapshot(ws.tree) == before


def test_verify_and_status_name_an_interrupted_run_and_the_command(ws: Workspace) -> None:
    before, applied = _states(ws)
    for point in range(8, 40):
        crashed = _run(ws, "apply", crash=f"{point}:KILL")
        if (ws.tree / ".patchset/journal/journal.json").exists():
            assert snapshot(ws.tree) not in (before, applied)
            break
        ws.reset_tree()
        os.chmod(ws.tree / "pkg/b.py", 0o600)
    else:
        raise AssertionError("no crash point left a half-written tree")
    assert crashed.returncode != 0
    for command in ("verify", "status"):
        result = _run(ws, command)
        assert result.returncode == 1
        assert "interrupted apply" in result.stderr
        assert "patchset recover" in result.stderr
    assert _run(ws, "recover").returncode == 0
    assert snapshot(ws.tree) == before


def test_apply_on_an_inconsistent_tree_is_not_nothing_to_do(ws: Workspace, capsys) -> None:
    """`make apply` accepts only exit 0; a drifted 'applied' tree exits 1, never 2."""
    _states(ws)
    assert ws.cli("apply") == 0
    (ws.tree / "pkg/a.py").write_bytes(b"half\n")
    assert ws.cli("apply") == 1
    assert "drifted" in capsys.readouterr().err
    assert ws.cli("apply", "--if-needed") == 1
    (ws.tree / "pkg/a.py").write_bytes(A3)
    assert ws.cli("apply") == 2
    assert ws.cli("apply", "--if-needed") == 0


def test_makefile_apply_accepts_only_a_verified_tree() -> None:
    makefile = (Path(__file__).resolve().parents[1] / "Makefile").read_text()
    line = next(x for x in makefile.splitlines() if "$(PATCHSET) apply" in x)
    assert "--if-needed" in line and "$$?" not in line


def test_an_unwritable_file_mid_apply_is_rolled_back_and_said_so(ws, monkeypatch, capsys) -> None:
    """An immutable touched file (os.replace and os.chmod on it fail with EPERM) stops the
    apply after other files were moved: the rollback never chmods a path it did not move, the
    tree ends as before, and the message names the file and says the writes were rolled back
    (and recover has nothing left to do)."""
    import errno

    before, _ = _states(ws)
    stuck = str(ws.tree / "pkg/a.py")
    real_replace, real_chmod = os.replace, os.chmod

    def replace(src, dst, *args, **kwargs):
        if str(dst) == stuck:
            raise PermissionError(errno.EPERM, "Operation not permitted", str(dst))
        return real_replace(src, dst, *args, **kwargs)

    def chmod(path, mode, *args, **kwargs):
        if str(path) == stuck:
            raise PermissionError(errno.EPERM, "Operation not permitted", str(path))
        return real_chmod(path, mode, *args, **kwargs)

    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(os, "chmod", chmod)
    assert ws.cli("apply") == 1
    err = capsys.readouterr().err
    assert "pkg/a.py" in err and "every write was rolled back" in err, err
    monkeypatch.undo()
    assert snapshot(ws.tree) == before
    assert ws.cli("recover", "--tree", str(ws.tree)) == 2


def test_an_empty_state_dir_left_by_a_kill_is_recovered(ws: Workspace, capsys) -> None:
    """A kill between the journal's delete and the removal of the emptied .patchset/ leaves
    an empty .patchset/: recover removes it (exit 0), it is not 'nothing to do'."""
    before, _ = _states(ws)
    (ws.tree / ".patchset" / "journal").mkdir(parents=True)
    os.rmdir(ws.tree / ".patchset" / "journal")
    assert ws.cli("recover", "--tree", str(ws.tree)) == 0
    assert snapshot(ws.tree) == before


def test_ctrl_c_before_the_journal_prints_no_traceback(ws: Workspace, monkeypatch, capsys):
    import patchset.apply as apply_module

    before, _ = _states(ws)

    def interrupted(*_args, **_kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(apply_module, "trusted_state", interrupted)
    assert ws.cli("apply") == 130
    err = capsys.readouterr().err
    assert "interrupted by SIGINT" in err and "Traceback" not in err
    assert snapshot(ws.tree) == before
