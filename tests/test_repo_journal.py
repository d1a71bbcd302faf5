"""The series maintainer's writes to the checkout (import, refresh, lock) are all or nothing.

A kill (SIGKILL, SIGTERM) or a full disk at every write point of ``import`` and ``refresh``
(``PATCHSET_TEST_CRASH``, as for apply in test_journal.py) ends, once the next command ran,
with the checkout and the tree as before or the command finished; nothing is left that makes
the series unreadable (an unlisted patch, a ``.tmp`` under ``patches/``). Two imports at once
take two numbers.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import crashpoints
import pytest
from conftest import Workspace, patch_bytes, snapshot

TOOLS = str(Path(__file__).resolve().parents[1] / "tools")
BASE = {
    "pkg/a.py": b"".join(b"a%d = %d\n" % (i, i) for i in range(30)),
    "pkg/b.py": b"b = 1\n",
}
A2 = BASE["pkg/a.py"].replace(b"a5 = 5\n", b"a5 = 50\n")
A3 = A2.replace(b"a25 = 25\n", b"a25 = 250\n")
FIRST = (
    "vllm/0001-one.patch",
    patch_bytes({"pkg/a.py": (BASE["pkg/a.py"], A2), "pkg/b.py": (b"b = 1\n", b"b = 2\n")}),
)


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    config = tmp_path / "gitconfig"
    config.write_text("[user]\n\tname = Imp Orter\n\temail = imp@example.invalid\n")
    out = dict(os.environ, PYTHONPATH=TOOLS, GIT_CONFIG_GLOBAL=str(config))
    out.pop("PATCHSET_TEST_CRASH", None)
    return out


def _run(ws: Workspace, env: dict, *args: str, crash: str | None = None):
    run_env = dict(env)
    if crash:
        run_env["PATCHSET_TEST_CRASH"] = crash
    argv = [sys.executable, crashpoints.SCRIPT, "-C", str(ws.repo), *args]
    if args[0] in ("refresh", "status", "verify", "unapply", "recover", "apply"):
        argv += ["--tree", str(ws.tree)]
    if args[0] in ("refresh", "import", "lock"):
        argv += ["--base", f"vllm={ws.base}"]
    return subprocess.run(argv, env=run_env, capture_output=True, text=True, timeout=60)


def _copy(src: Path, dst: Path) -> None:
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst, symlinks=True)


def _incoming(tmp_path: Path) -> Path:
    path = tmp_path / "incoming.patch"
    path.write_bytes(patch_bytes({"pkg/a.py": (A2, A3)}, subject="[Test] Twenty five"))
    return path


def _sweep(ws, env, tmp_path, args, settle, roots, actions=("KILL", "TERM", "ENOSPC")):
    """Crash ``args`` at every write point; after ``settle`` the roots are as before or as
    after a clean run. Returns how many points were tried."""
    saved = {root: tmp_path / f"saved-{root.name}" for root in roots}
    for root, copy in saved.items():
        _copy(root, copy)
    before = {root: snapshot(root) for root in roots}
    clean = _run(ws, env, *args)
    assert clean.returncode == 0, clean
    after = {root: snapshot(root) for root in roots}
    assert after != before
    points = 0
    for action in actions:
        for point in range(1, 200):
            for root, copy in saved.items():
                _copy(copy, root)
            crashed = _run(ws, env, *args, crash=f"{point}:{action}")
            if crashed.returncode == 0:
                if not (ws.repo / ".patchset").exists():
                    assert {r: snapshot(r) for r in roots} == after
                    break
                # the injected failure hit the delete of a finished run's journal: the run
                # succeeded and the next command drops the journal
                assert action == "ENOSPC"
                _run(ws, env, "status")
                assert {r: snapshot(r) for r in roots} == after
                continue
            points += 1
            assert "Traceback" not in crashed.stderr, crashed.stderr
            if action == "ENOSPC":  # rolled back in process, and says so
                assert "rolled back" in crashed.stderr, crashed.stderr
            log = []
            for command in settle:
                done = _run(ws, env, *command)
                log.append(f"{command}: {done.returncode} {done.stdout} {done.stderr}")
                assert "Traceback" not in done.stderr, done.stderr
            now = {r: snapshot(r) for r in roots}
            assert now in (before, after), (action, point, crashed.stderr, log)
            assert not list(ws.repo.glob("patches/**/*.tmp"))
        else:
            raise AssertionError("the command never finished")
    return points


def test_import_killed_at_every_write_point(ws: Workspace, env, tmp_path) -> None:
    ws.setup(BASE, [FIRST])
    incoming = _incoming(tmp_path)
    points = _sweep(ws, env, tmp_path, ("import", str(incoming)), [("status",)], [ws.repo])
    assert points >= 15


def test_refresh_killed_at_every_write_point(ws: Workspace, env, tmp_path) -> None:
    ws.setup(BASE, [FIRST])
    assert ws.cli("apply") == 0
    (ws.tree / "pkg/a.py").write_bytes(A3)
    (ws.tree / "pkg/b.py").write_bytes(b"b = 1\n")  # reverted: drops out of the patch
    settle = [("status",), ("refresh", "vllm/0001-one.patch")]
    points = _sweep(
        ws, env, tmp_path, ("refresh", "vllm/0001-one.patch"), settle, [ws.repo, ws.tree]
    )
    assert points >= 20


def test_a_killed_import_never_makes_the_series_unreadable(ws: Workspace, env, tmp_path) -> None:
    """Right after the kill (before anything recovered), unapply still works."""
    ws.setup(BASE, [FIRST])
    assert ws.cli("apply") == 0
    incoming = _incoming(tmp_path)
    for point in range(1, 40):
        crashed = _run(ws, env, "import", str(incoming), crash=f"{point}:KILL")
        if crashed.returncode == 0:
            break
        assert _run(ws, env, "unapply").returncode == 0
        assert _run(ws, env, "apply").returncode == 0
    assert point > 5


def test_an_import_started_during_another_waits_and_takes_the_next_number(
    ws: Workspace, env, tmp_path, monkeypatch
) -> None:
    """The second import starts while the first is between reading the series and writing;
    it must wait for the checkout's lock, then see the first's entry."""
    import time

    import patchset.importer as intake

    ws.setup(BASE, [FIRST])
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", env["GIT_CONFIG_GLOBAL"])
    inputs = []
    for index, line in enumerate((b"a12 = 12\n", b"a20 = 20\n")):
        path = tmp_path / f"in{index}.patch"
        change = {"pkg/a.py": (A2, A2.replace(line, b"# " + line))}
        path.write_bytes(patch_bytes(change, subject=f"[Test] Change {index}"))
        inputs.append(path)
    real = intake.compute_lock
    second: list[subprocess.Popen] = []

    def slow(*args, **kwargs):
        if not second:
            argv = [sys.executable, "-m", "patchset", "-C", str(ws.repo), "import"]
            argv += [str(inputs[1]), "--base", f"vllm={ws.base}"]
            second.append(
                subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            )
            time.sleep(4)  # time enough for the second import to finish, were it not locked out
        return real(*args, **kwargs)

    monkeypatch.setattr(intake, "compute_lock", slow)
    assert ws.cli("import", str(inputs[0]), "--base", f"vllm={ws.base}") == 0
    assert second[0].wait(timeout=60) == 0, second[0].stderr.read()
    lines = (ws.repo / "series").read_text().splitlines()
    listed = [x for x in lines if x and not x.startswith("#")]
    assert listed == [FIRST[0], "vllm/0002-change-0.patch", "vllm/0003-change-1.patch"], listed
    assert ws.cli("lock", "--check") == 0
