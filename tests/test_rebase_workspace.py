"""rebase --workspace: the persistent workspace of the hand work (issue 30, item 3).

A git repository old-base / old / new-base / new (one commit per patch), a linked work tree per
conflicting patch with its 3-way ``git am`` stopped in it, ``run-tests`` against a python with
the new release, and every way an existing or half-made workspace is refused or reused.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import git, patch_bytes, snapshot, write_tree
from patchset.errors import PatchsetError
from patchset.rebase import run_rebase
from test_rebase import ONE, PINS, edit, rebase_workspace, sdist_bytes


def make(tmp_path: Path, root: Path, old: Path, sdist: Path, workspace: Path, **kw):
    logs: list[str] = []
    report = run_rebase(
        root,
        kw.pop("onto", "vllm==2.0.0"),
        dry_run=kw.pop("dry_run", True),
        sdist=sdist,
        old_tree=old,
        workdir=tmp_path,
        workspace=workspace,
        log=logs.append,
        **kw,
    )
    return report, logs


def branches(repo: Path) -> dict[str, str]:
    out = git(repo, "for-each-ref", "--format=%(refname:short) %(objectname)", "refs/heads")
    return dict(line.split(" ", 1) for line in out.splitlines())


def subjects(repo: Path, spec: str) -> list[str]:
    return git(repo, "log", "--reverse", "--format=%s", spec).splitlines()


@pytest.fixture
def env(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("PATCHSET_CACHE", str(tmp_path / "cache"))
    root, old, sdist, wheel = rebase_workspace(tmp_path)
    return root, old, sdist, wheel


def test_workspace_holds_the_four_branches_and_a_conflict_work_tree(tmp_path: Path, env) -> None:
    root, old, sdist, _ = env
    before = snapshot(root)
    ws = tmp_path / "ws"
    report, logs = make(tmp_path, root, old, sdist, ws)
    assert snapshot(root) == before
    assert [o.status for o in report.outcomes] == ["clean", "conflict", "absorbed"]
    repo = ws / "repo"
    refs = branches(repo)
    assert {"old-base", "old", "new-base", "new", "conflict/vllm/0002-conflict"} == set(refs)
    # the series on the old base, one commit per patch, the header as the message
    assert subjects(repo, "old-base..old") == ["[Core] C", "[Core] A", "[Core] D"]
    assert "Signed-off-by: dcp-series" in git(repo, "log", "-1", "--format=%B", "old")
    # the new release is a child of the old base; new = new-base + the carried patches
    assert git(repo, "rev-parse", "new-base~1").strip() == refs["old-base"]
    assert subjects(repo, "new-base..new") == ["[Core] C"]
    assert git(repo, "symbolic-ref", "--short", "HEAD").strip() == "new"
    assert git(repo, "status", "--porcelain").strip() == ""
    # the conflicting patch: a linked work tree at new with git am -3 stopped in it
    tree = ws / "conflicts" / "vllm" / "0002-conflict"
    marked = (tree / "a.py").read_bytes()
    assert b"<<<<<<<" in marked and b"five\n" in marked and b"line 5 upstream\n" in marked
    assert b"forty\n" in (tree / "b.py").read_bytes()  # it starts from the carried patches
    assert git(tree, "diff", "--name-only", "--diff-filter=U").split() == ["a.py"]
    assert "You are in the middle of an am session" in git(tree, "status")
    manifest = json.loads((ws / "workspace.json").read_text())
    assert manifest["origin"]["old"] == {"version": "1.0.0", "sha256": "a" * 64}
    assert manifest["origin"]["new"]["version"] == "2.0.0"
    assert [p["name"] for p in manifest["origin"]["patches"]] == [
        "vllm/0001-clean.patch",
        "vllm/0002-conflict.patch",
        "vllm/0003-absorbed.patch",
    ]
    conflict = manifest["patches"][1]
    assert conflict["worktree"] == "conflicts/vllm/0002-conflict"
    assert conflict["unmerged"] == {"a.py": {"state": "UU", "regions": 1}}
    assert manifest["branches"] == {b: refs[b] for b in ("old-base", "old", "new-base", "new")}
    assert manifest["checkout_revision"] is None  # the test checkout is not a git repository
    assert os.access(ws / "run-tests", os.X_OK) and os.access(ws / "make-venv", os.X_OK)
    assert any(f"{tree} am --continue" in step for step in manifest["next_steps"])
    assert any("make-venv" in line for line in logs)
    # the hand work: resolve, add, continue -> the patch's commit with its header, on its branch
    (tree / "a.py").write_bytes(
        edit(edit(ONE, b"line 5\n", b"five upstream\n"), b"line 50\n", b"fifty\n")
    )
    git(tree, "add", "a.py")
    git(tree, "am", "--continue")
    assert subjects(repo, "new..conflict/vllm/0002-conflict") == ["[Core] A"]
    assert not list(tmp_path.glob(".ws.partial-*"))


def test_an_existing_workspace_of_the_same_origin_is_verified_and_reused(
    tmp_path: Path, env
) -> None:
    root, old, sdist, _ = env
    ws = tmp_path / "ws"
    make(tmp_path, root, old, sdist, ws)
    tree = ws / "conflicts" / "vllm" / "0002-conflict"
    (tree / "a.py").write_bytes(b"hand work in progress\n")
    before = snapshot(ws)
    _, logs = make(tmp_path, root, old, sdist, ws)
    assert snapshot(ws) == before  # the hand work is never touched
    assert any(line.startswith(f"Reusing the workspace {ws}") for line in logs)
    # a workspace whose branches moved is not what its manifest says: refused
    git(ws / "repo", "branch", "-f", "new-base", "old-base")
    with pytest.raises(PatchsetError, match="not as its manifest records") as err:
        make(tmp_path, root, old, sdist, ws)
    assert any("branch new-base: at" in d for d in err.value.details)


def test_a_workspace_of_another_base_or_series_is_refused_unchanged(tmp_path: Path, env) -> None:
    root, old, sdist, _ = env
    ws = tmp_path / "ws"
    make(tmp_path, root, old, sdist, ws)
    before = snapshot(ws)
    newer = tmp_path / "v3" / "vllm-3.0.0.tar.gz"
    newer.parent.mkdir()
    newer.write_bytes(sdist_bytes("vllm-3.0.0", {"a.py": ONE, "b.py": ONE}))
    with pytest.raises(
        PatchsetError,
        match=r"workspace for vllm 1.0.0 -> 2.0.0, not vllm 1.0.0 "
        r"-> 3.0.0",
    ):
        make(tmp_path, root, old, newer, ws, onto="vllm==3.0.0")
    # the same version number from another sdist (another sha256) is another base too
    other = tmp_path / "other" / "vllm-2.0.0.tar.gz"
    other.parent.mkdir()
    other.write_bytes(sdist_bytes("vllm-2.0.0", {"a.py": ONE, "b.py": ONE + b"x\n"}))
    with pytest.raises(PatchsetError, match="is a workspace for"):
        make(tmp_path, root, old, other, ws)
    # the series changed since: its hand work is not silently mixed with other patches
    path = root / "patches" / "vllm" / "0001-clean.patch"
    path.write_bytes(path.read_bytes().replace(b"[Core] C", b"[Core] C2"))
    with pytest.raises(PatchsetError, match="other patch files") as err:
        make(tmp_path, root, old, sdist, ws)
    assert err.value.details == ["vllm/0001-clean.patch: changed"]
    assert snapshot(ws) == before


def test_a_directory_that_is_no_workspace_is_refused_before_anything(tmp_path: Path, env) -> None:
    root, old, sdist, _ = env
    ws = tmp_path / "ws"
    write_tree(ws, {"notes.txt": b"mine\n"})
    before = snapshot(ws)
    with pytest.raises(PatchsetError, match="is not a patchset rebase workspace"):
        make(tmp_path, root, old, sdist, ws)
    assert snapshot(ws) == before
    assert not (tmp_path / "cache").exists()  # refused before the new release was fetched


def test_a_killed_run_leaves_no_workspace_and_the_next_run_cleans_up(
    tmp_path: Path, env, monkeypatch
) -> None:
    from patchset.gitops import ScratchRepo

    root, old, sdist, _ = env
    ws = tmp_path / "ws"

    def killed(*_args, **_kwargs):
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(ScratchRepo, "add_worktree", killed)
        with pytest.raises(KeyboardInterrupt):
            make(tmp_path, root, old, sdist, ws)
    assert not ws.exists() and not list(tmp_path.glob(".ws.partial-*"))
    # SIGKILL runs no cleanup: what it leaves is a hidden sibling, removed by the next run
    write_tree(tmp_path / ".ws.partial-k1ll", {"repo/half": b"x"})
    _, logs = make(tmp_path, root, old, sdist, ws)
    assert f"Removed {tmp_path / '.ws.partial-k1ll'}, left by a killed run" in logs
    assert (ws / "workspace.json").is_file() and not list(tmp_path.glob(".ws.partial-*"))


def test_a_second_run_on_the_same_workspace_is_refused_while_one_runs(tmp_path: Path, env):
    root, old, sdist, _ = env
    ws = tmp_path / "ws"
    with open(tmp_path / ".ws.lock", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(PatchsetError, match="another patchset rebase is making"):
            make(tmp_path, root, old, sdist, ws)
    assert not ws.exists()


def test_a_dirty_series_checkout_is_refused_and_a_clean_one_recorded(tmp_path: Path, env):
    root, old, sdist, _ = env
    git(root, "init", "-q")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "series")
    patch = root / "patches" / "vllm" / "0001-clean.patch"
    clean = patch.read_bytes()
    patch.write_bytes(clean.replace(b"[Core] C", b"[Core] Changed"))
    ws = tmp_path / "ws"
    with pytest.raises(PatchsetError, match="uncommitted changes") as err:
        make(tmp_path, root, old, sdist, ws)
    assert err.value.details == [" M patches/vllm/0001-clean.patch"]
    assert not ws.exists()
    patch.write_bytes(clean)
    make(tmp_path, root, old, sdist, ws)
    manifest = json.loads((ws / "workspace.json").read_text())
    assert manifest["checkout_revision"] == git(root, "rev-parse", "HEAD").strip()


def test_a_test_python_without_the_new_release_is_refused(tmp_path: Path, env) -> None:
    root, old, sdist, _ = env
    ws = tmp_path / "ws"
    with pytest.raises(PatchsetError, match="its installed vllm is missing, the new base is 2.0.0"):
        make(tmp_path, root, old, sdist, ws, test_python=sys.executable)
    assert not ws.exists()


# -- run-tests: a work tree's tests against the new release ------------------------------------

MOD = b"".join(b"X%d = %d\n" % (i, i) for i in range(1, 61))
TEST_40 = b"""import vllm.mod


def test_forty():
    assert vllm.mod.X40 == 400
    assert "run-tests-" in vllm.mod.__file__
"""
TEST_5 = b"""import vllm.mod


def test_five():
    assert vllm.mod.X5 == 500
"""


def package_workspace(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A series of a carried patch and a conflicting one, each with its test, over vllm/mod.py."""
    root, old = tmp_path / "repo", tmp_path / "old"
    base = {"vllm/__init__.py": b"", "vllm/mod.py": MOD, "pyproject.toml": b""}
    write_tree(old, base)
    carried = patch_bytes(
        {
            "vllm/mod.py": (MOD, edit(MOD, b"X40 = 40\n", b"X40 = 400\n")),
            "tests/test_forty.py": (None, TEST_40),
        },
        subject="[Core] Forty",
    )
    clash = patch_bytes(
        {
            "vllm/mod.py": (MOD, edit(MOD, b"X5 = 5\n", b"X5 = 500\n")),
            "tests/test_five.py": (None, TEST_5),
        },
        subject="[Core] Five",
    )
    patches = [("vllm/0001-forty.patch", carried), ("vllm/0002-five.patch", clash)]
    write_tree(root, {f"patches/{n}": d for n, d in patches})
    (root / "series").write_text("".join(f"{n}\n" for n, _ in patches))
    (root / "pins.toml").write_text(PINS.format(sdist="a" * 64, wheel="b" * 64))
    new = {**base, "vllm/mod.py": edit(MOD, b"X5 = 5\n", b"X5 = 55\n")}
    sdist = tmp_path / "vllm-2.0.0.tar.gz"
    sdist.write_bytes(sdist_bytes("vllm-2.0.0", new))
    return root, old, sdist


def installed(tmp_path: Path, version: str) -> Path:
    """A site directory with a vllm package and its dist-info at ``version``."""
    site = tmp_path / f"site-{version}"
    write_tree(
        site,
        {
            "vllm/__init__.py": b"",
            "vllm/mod.py": MOD,
            f"vllm-{version}.dist-info/METADATA": (
                f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n".encode()
            ),
        },
    )
    return site


def run_tests(ws: Path, tree: Path, site: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "TESTPY": sys.executable, "PYTHONPATH": str(site)}
    return subprocess.run(
        [str(ws / "run-tests"), str(tree), "-q", "-p", "no:randomly", *args],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )


def test_run_tests_runs_each_work_tree_against_the_new_release(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("PATCHSET_CACHE", str(tmp_path / "cache"))
    root, old, sdist = package_workspace(tmp_path)
    ws = tmp_path / "ws"
    report, _ = make(tmp_path, root, old, sdist, ws)
    assert [o.status for o in report.outcomes] == ["clean", "conflict"]
    manifest = json.loads((ws / "workspace.json").read_text())
    assert manifest["patches"][0]["tests"] == ["tests/test_forty.py"]
    assert f"{ws}/run-tests {ws}/repo tests/test_forty.py" in manifest["next_steps"]
    good = installed(tmp_path, "2.0.0")
    done = run_tests(ws, ws / "repo", good, "tests/test_forty.py")
    assert done.returncode == 0 and "1 passed" in done.stdout, done.stdout + done.stderr
    # a python with another release installed is refused, not silently used
    wrong = run_tests(ws, ws / "repo", installed(tmp_path, "1.0.0"), "tests/test_forty.py")
    assert wrong.returncode == 2
    assert "has vllm 1.0.0, the workspace's base is 2.0.0" in wrong.stderr
    # the conflicting patch: refused while unresolved, its test passes once resolved
    tree = ws / "conflicts" / "vllm" / "0002-five"
    stopped = run_tests(ws, tree, good, "tests/test_five.py")
    assert stopped.returncode == 2 and "unresolved paths" in stopped.stderr
    resolved = edit(edit(MOD, b"X5 = 5\n", b"X5 = 500\n"), b"X40 = 40\n", b"X40 = 400\n")
    (tree / "vllm" / "mod.py").write_bytes(resolved)
    git(tree, "add", "-A")
    git(tree, "am", "--continue")
    fixed = run_tests(ws, tree, good, "tests/test_five.py", "tests/test_forty.py")
    assert fixed.returncode == 0 and "2 passed" in fixed.stdout, fixed.stdout + fixed.stderr
    # without the fix the same test fails: run-tests runs the work tree, not the install
    (tree / "vllm" / "mod.py").write_bytes(MOD)
    assert run_tests(ws, tree, good, "tests/test_five.py").returncode == 1


def test_cli_rebase_workspace_prints_the_next_steps(tmp_path: Path, env, capsys) -> None:
    from patchset.cli import main
    from patchset.hashing import sha256_bytes

    root, _old, sdist, _ = env
    old_sdist = sdist_bytes("vllm-1.0.0", {"a.py": ONE, "b.py": ONE})
    (root / "pins.toml").write_text(PINS.format(sdist=sha256_bytes(old_sdist), wheel="b" * 64))
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "vllm-1.0.0.tar.gz").write_bytes(old_sdist)
    ws = tmp_path / "ws"
    argv = ["-C", str(root), "rebase", "--onto", "vllm==2.0.0", "--dry-run", "--sdist", str(sdist)]
    assert main([*argv, "--workspace", str(ws)]) == 0
    out = capsys.readouterr().out
    assert f"Made the workspace {ws}; next:" in out
    assert f"git -C {ws}/conflicts/vllm/0002-conflict am --continue" in out
    assert "vllm 1.0.0 -> 2.0.0: 1 clean, 1 conflict, 1 absorbed" in out
    assert main([*argv, "--workspace", str(root / "patches" / "ws")]) == 1
    assert "inside" in capsys.readouterr().err
