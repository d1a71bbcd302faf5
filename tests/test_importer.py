"""`patchset import`: default `git format-patch` output, a `git diff` or a plain unified diff
becomes a series patch (full index from the base's blobs, a header with Subject, Upstream-Status:
Pending, Signed-off-by from git config), listed in series and locked; refusals as for apply."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from conftest import Workspace, git, patch_bytes, snapshot, write_tree

BASE = {
    "pkg/a.py": b"".join(b"a%d = %d\n" % (i, i) for i in range(20)),
    "pkg/run.sh": b"#!/bin/sh\necho 1\n",
}
A2 = BASE["pkg/a.py"].replace(b"a4 = 4\n", b"a4 = 40\n")
FIRST = ("vllm/0001-one.patch", patch_bytes({"pkg/a.py": (BASE["pkg/a.py"], A2)}))
IDENTITY = "Imp Orter <imp@example.invalid>"


@pytest.fixture
def repo_ws(ws: Workspace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Workspace:
    config = tmp_path / "gitconfig"
    config.write_text("[user]\n\tname = Imp Orter\n\temail = imp@example.invalid\n")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(config))
    ws.setup(BASE, [FIRST])
    return ws


def _upstream(tmp_path: Path) -> Path:
    """A scratch git repository at the state the series makes (what a contributor patches)."""
    repo = tmp_path / "upstream"
    write_tree(repo, {**BASE, "pkg/a.py": A2})
    (repo / "pkg/run.sh").chmod(0o755)
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "base")
    return repo


def _edit(repo: Path) -> None:
    text = (repo / "pkg/a.py").read_bytes().replace(b"a12 = 12\n", b"a12 = 120\n")
    (repo / "pkg/a.py").write_bytes(text)
    (repo / "pkg/new.py").write_bytes(b"NEW = 1\n")
    (repo / "pkg/run.sh").write_bytes(b"#!/bin/sh\necho 2\n")


def _imported(ws: Workspace, name: str) -> bytes:
    assert name in (ws.repo / "series").read_text().split()
    data = (ws.repo / "patches" / name).read_bytes()
    assert ws.cli("lock", "--check") == 0
    return data


def test_default_format_patch_output_is_imported(repo_ws: Workspace, tmp_path, capsys) -> None:
    upstream = _upstream(tmp_path)
    _edit(upstream)
    git(upstream, "add", "-A")
    git(upstream, "commit", "-qm", "[Kernel] Faster thing\n\nIt is faster because.")
    out = tmp_path / "fp"
    git(upstream, "format-patch", "-1", "-o", str(out))  # defaults: short index, stat, signature
    (mbox,) = out.iterdir()
    raw = mbox.read_bytes()
    assert b"[PATCH] [Kernel] Faster thing" in raw and b"\n-- \n" in raw
    assert repo_ws.cli("import", str(mbox)) == 0
    data = _imported(repo_ws, "vllm/0002-faster-thing.patch")
    text = data.decode()
    assert text.startswith("From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001")
    assert "Subject: [Kernel] Faster thing\n" in text and "It is faster because." in text
    date = next(line for line in raw.decode().splitlines() if line.startswith("Date: "))
    assert date + "\n" in text
    assert "Upstream-Status: Pending\n" in text and f"Signed-off-by: {IDENTITY}\n" in text
    assert "\n-- \n" not in text and "files changed" not in text and "file changed" not in text
    index_lines = [line for line in text.splitlines() if line.startswith("index ")]
    assert len(index_lines) == 3 and all(len(line.split()[1]) == 82 for line in index_lines)
    assert "index " + git(upstream, "rev-parse", "HEAD~1:pkg/run.sh").strip() in text
    assert "pkg/run.sh" in text and "100755" in text
    assert repo_ws.cli("apply") == 0
    assert (repo_ws.tree / "pkg/new.py").read_bytes() == b"NEW = 1\n"
    assert repo_ws.cli("verify") == 0


def test_git_diff_needs_a_subject(repo_ws: Workspace, tmp_path, capsys) -> None:
    upstream = _upstream(tmp_path)
    _edit(upstream)
    diff = tmp_path / "change.diff"
    diff.write_text(git(upstream, "diff"))
    before = snapshot(repo_ws.repo)
    assert repo_ws.cli("import", str(diff)) == 1
    assert "--subject '[Tag] Title'" in capsys.readouterr().err
    assert snapshot(repo_ws.repo) == before
    assert repo_ws.cli("import", str(diff), "--subject", "[Config] Change a12") == 0
    assert b"Subject: [Config] Change a12\n" in _imported(repo_ws, "vllm/0002-change-a12.patch")
    assert repo_ws.cli("apply") == 0


def test_plain_unified_diff_is_imported(repo_ws: Workspace, tmp_path) -> None:
    work = tmp_path / "plain"
    write_tree(work / "a", {"pkg/a.py": A2})
    write_tree(work / "b", {"pkg/a.py": A2.replace(b"a15 = 15\n", b"a15 = 150\n")})
    result = subprocess.run(
        ["diff", "-u", "a/pkg/a.py", "b/pkg/a.py"], cwd=work, capture_output=True, check=False
    )
    assert result.returncode == 1 and b"\t" in result.stdout.splitlines()[0]
    diff = tmp_path / "plain.diff"
    diff.write_bytes(result.stdout)
    name = "vllm/0007-fifteen.patch"
    args = ("import", str(diff), "--subject", "[Test] Fifteen", "--name", name)
    assert repo_ws.cli(*args) == 0
    assert b"index " in _imported(repo_ws, name)
    assert repo_ws.cli("apply") == 0
    assert b"a15 = 150\n" in (repo_ws.tree / "pkg/a.py").read_bytes()


def test_import_refuses_what_apply_refuses_and_writes_nothing(
    repo_ws: Workspace, tmp_path, capsys
) -> None:
    before = snapshot(repo_ws.repo)
    u0 = tmp_path / "u0.diff"
    u0.write_bytes(b"--- a/pkg/a.py\n+++ b/pkg/a.py\n@@ -9,0 +10 @@\n+inserted = 1\n")
    assert repo_ws.cli("import", str(u0), "--subject", "[Test] U0") == 1
    assert "no context lines" in capsys.readouterr().err
    wrong = tmp_path / "wrong.diff"
    wrong.write_bytes(b"--- a/pkg/a.py\n+++ b/pkg/a.py\n@@ -1,2 +1,2 @@\n-zz\n+yy\n a1 = 1\n")
    assert repo_ws.cli("import", str(wrong), "--subject", "[Test] Wrong") == 1
    assert "does not apply" in capsys.readouterr().err
    escape = tmp_path / "escape.diff"
    escape.write_bytes(b"--- a/../x.py\n+++ b/../x.py\n@@ -1 +1 @@\n-a\n+b\n")
    assert repo_ws.cli("import", str(escape), "--subject", "[Test] Escape") == 1
    assert "outside the tree" in capsys.readouterr().err
    untagged = tmp_path / "u.diff"
    untagged.write_bytes(b"--- a/pkg/a.py\n+++ b/pkg/a.py\n@@ -1 +1 @@\n-a0 = 0\n+a0 = 9\n")
    assert repo_ws.cli("import", str(untagged), "--subject", "no tag") == 1
    assert "[Tag] Title" in capsys.readouterr().err
    assert snapshot(repo_ws.repo) == before


# -- issue 32: valid diffs refused for the wrong reasons ---------------------------------------


DASH = b"".join([b"notes = '''\n", b"- a\n", b"- \n", b"'''\n"] * 1) + b"- \n"
"""A file whose last line is ``- `` (a hunk deleting it shows ``-- ``, like a signature)."""


@pytest.mark.parametrize("signature", [True, False])
def test_a_hunk_deleting_a_dash_space_line_is_not_a_signature(
    ws: Workspace, tmp_path, monkeypatch, signature: bool
) -> None:
    config = tmp_path / "gitconfig"
    config.write_text("[user]\n\tname = Imp Orter\n\temail = imp@example.invalid\n")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(config))
    ws.setup({**BASE, "pkg/notes.py": DASH}, [FIRST])
    upstream = tmp_path / "up"
    write_tree(upstream, {**BASE, "pkg/a.py": A2, "pkg/notes.py": DASH})
    git(upstream, "init", "-q")
    git(upstream, "add", "-A")
    git(upstream, "commit", "-qm", "base")
    (upstream / "pkg/notes.py").write_bytes(DASH[: -len(b"- \n")])
    git(upstream, "commit", "-qam", "[Docs] Drop the empty item")
    flags = [] if signature else ["--no-signature"]
    mbox = git(upstream, "format-patch", *flags, "-1", "--stdout").encode()
    assert b"\n-- \n" in mbox
    (tmp_path / "in.patch").write_bytes(mbox)
    assert ws.cli("import", str(tmp_path / "in.patch")) == 0
    assert ws.cli("apply") == 0
    assert (ws.tree / "pkg/notes.py").read_bytes() == DASH[: -len(b"- \n")]


def test_diff_ruN_of_two_directories_is_imported(repo_ws: Workspace, tmp_path, capsys) -> None:
    work = tmp_path / "dirs"
    write_tree(work / "old", {"pkg/a.py": A2})
    write_tree(
        work / "new",
        {"pkg/a.py": A2.replace(b"a15 = 15\n", b"a15 = 150\n"), "pkg/added.py": b"ADDED = 1\n"},
    )
    result = subprocess.run(["diff", "-ruN", "old", "new"], cwd=work, capture_output=True)
    assert result.returncode == 1 and b"diff -ruN old/pkg/a.py new/pkg/a.py" in result.stdout
    diff = tmp_path / "dirs.diff"
    diff.write_bytes(result.stdout)
    assert repo_ws.cli("import", str(diff), "--subject", "[Test] Two dirs") == 0, (
        capsys.readouterr().err
    )
    data = _imported(repo_ws, "vllm/0002-two-dirs.patch")
    assert b"new file mode 100644" in data and b"diff --git a/pkg/added.py b/pkg/added.py" in data
    assert repo_ws.cli("apply") == 0
    assert (repo_ws.tree / "pkg/added.py").read_bytes() == b"ADDED = 1\n"
    assert b"a15 = 150\n" in (repo_ws.tree / "pkg/a.py").read_bytes()


def test_a_path_missing_from_the_base_is_named_not_the_series(
    repo_ws: Workspace, tmp_path, capsys
) -> None:
    wrong = tmp_path / "wrong.diff"
    wrong.write_bytes(b"--- x/pkg/zz.py\n+++ y/pkg/zz.py\n@@ -1 +1 @@\n-a\n+b\n")
    assert repo_ws.cli("import", str(wrong), "--subject", "[Test] Missing") == 1
    err = capsys.readouterr().err
    assert "x/pkg/zz.py" in err or "pkg/zz.py" in err
    assert "does not exist" in err and "the tree the series produces" not in err, err


# -- issue 48 (N4, N6): --name parsed by the series' own rules before anything is staged -------


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("vllm/0013-x.patch/", "bad name"),  # N6: once left a journal nothing could read
        ("vllm/../../../escape/0013-x.patch", "bad name"),  # N4: wrote outside the checkout
        ("vllm/./0013-x.patch", "bad name"),
        ("vllm//0013-x.patch", "bad name"),
        ("vllm/0013-x", "bad name"),
        ("vllm/0013-caf\u00e9.patch", "bad name"),
        ("vllm/0013-x.patch\n", "bad name"),
        ("vllm/\u0660\u0660\u0661\u0663-x.patch", "bad name"),
        ("vllm/0001-other.patch", "number 0001 is already vllm/0001-one.patch's"),
        ("b12x/0013-x.patch", "is not a vllm patch"),
    ],
)
def test_a_bad_name_is_refused_before_anything_is_written(
    repo_ws: Workspace, tmp_path: Path, capsys, name: str, says: str
) -> None:
    diff = tmp_path / "x.diff"
    diff.write_bytes(b"--- a/pkg/a.py\n+++ b/pkg/a.py\n@@ -1 +1 @@\n-a0 = 0\n+a0 = 9\n")
    before = snapshot(repo_ws.repo)
    args = ["import", str(diff), "--subject", "[Test] X", "--name", name]
    if name.startswith("b12x/"):
        args += ["--target", "vllm"]
    assert repo_ws.cli(*args) == 1
    assert says in capsys.readouterr().err
    assert snapshot(repo_ws.repo) == before
    assert not (tmp_path / "escape").exists()
    # nothing half-done: every command still reads the checkout
    assert repo_ws.cli("lock", "--check") == 0
    repo_ws.cli("recover")
    assert "no interrupted run to recover" in capsys.readouterr().out
    # and a good name still imports
    assert (
        repo_ws.cli("import", str(diff), "--subject", "[Test] X", "--name", "vllm/0013-x.patch")
        == 0
    )


@pytest.mark.parametrize(
    ("flags", "new_side", "said"),
    [
        ("-ru", {"pkg/added.py": b"ADDED = 1\n"}, "Only in new/pkg: added.py"),
        ("-ru", {"pkg/0early.py": b"EARLY = 1\n"}, "Only in new/pkg: 0early.py"),
        ("-ruN", {"pkg/blob.bin": b"\x00\x01binary\x00"}, "Binary files old/pkg/blob.bin"),
    ],
    ids=["only-in", "only-in-first", "binary"],
)
def test_a_diff_notice_of_a_change_it_does_not_carry_refuses_the_import(
    repo_ws: Workspace, tmp_path, capsys, flags: str, new_side: dict[str, bytes], said: str
) -> None:
    """`diff -ru` (no -N) says "Only in ...", a binary file "Binary files ... differ": the import
    is refused naming that line and nothing is written (before, those lines were skipped and
    the rest imported with exit 0)."""
    work = tmp_path / "dirs"
    old_side = {"pkg/a.py": A2}
    if "pkg/blob.bin" in new_side:
        old_side["pkg/blob.bin"] = b"\x00\x02other\x00"
    write_tree(work / "old", old_side)
    changed = A2.replace(b"a15 = 15\n", b"a15 = 150\n")
    write_tree(work / "new", {"pkg/a.py": changed, **new_side})
    result = subprocess.run(["diff", flags, "old", "new"], cwd=work, capture_output=True)
    assert result.returncode == 1 and said.encode() in result.stdout
    diff = tmp_path / "dirs.diff"
    diff.write_bytes(result.stdout)
    before = snapshot(repo_ws.repo)
    assert repo_ws.cli("import", str(diff), "--subject", "[Test] Two dirs") == 1
    assert said in capsys.readouterr().err
    assert snapshot(repo_ws.repo) == before


@pytest.mark.parametrize("subject", ["[Test] One\nFrom: Evil <e@x>", "[Test] One\rTwo"])
def test_a_subject_with_a_line_break_is_refused(
    repo_ws: Workspace, tmp_path, capsys, subject: str
) -> None:
    """`--subject` with a newline or CR would write header lines nobody wrote (issue 48, N5)."""
    diff = tmp_path / "u.diff"
    diff.write_bytes(b"--- a/pkg/a.py\n+++ b/pkg/a.py\n@@ -1 +1 @@\n-a0 = 0\n+a0 = 9\n")
    before = snapshot(repo_ws.repo)
    assert repo_ws.cli("import", str(diff), "--subject", subject) == 1
    assert "control character or a line break" in capsys.readouterr().err
    assert snapshot(repo_ws.repo) == before


def test_a_description_git_am_would_cut_stops_lock(repo_ws: Workspace, capsys) -> None:
    """A description line git am reads as the diff's start passed `lock` and export, and git
    am then dropped the rest of the message and the sign-off (issue 48, N3)."""
    path = repo_ws.repo / "patches" / FIRST[0]
    text = path.read_bytes()
    head, sep, rest = text.partition(b"\n\n")
    path.write_bytes(head + sep + b"diff -u shows the change below.\n\n" + rest)
    assert repo_ws.cli("lock") == 1
    assert "git am would take it for the start of the diff" in capsys.readouterr().err
