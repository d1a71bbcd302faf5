"""Zero-context hunks only at a file's start or end; UTF-8 paths with git's quoting; deleted files
come back with their own mode; directories emptied by a deletion are removed and restored."""

from __future__ import annotations

import os

from conftest import Workspace, git, header_bytes, patch_bytes, snapshot, write_tree
from patchset.hashing import git_blob_id

LINES = b"".join(b"line %d\n" % i for i in range(1, 11))


def _u0_patch(path: str, pre: bytes, post: bytes, hunk: bytes) -> bytes:
    index = f"index {git_blob_id(pre)}..{git_blob_id(post)} 100644\n".encode()
    head = f"diff --git a/{path} b/{path}\n".encode() + index
    return header_bytes() + head + f"--- a/{path}\n+++ b/{path}\n".encode() + hunk


def test_zero_context_hunk_in_the_middle_is_refused(ws: Workspace, capsys) -> None:
    middle = LINES.replace(b"line 5\n", b"line 5\ninserted\n")
    patch = _u0_patch("m.py", LINES, middle, b"@@ -5,0 +6 @@\n+inserted\n")
    ws.setup({"m.py": LINES}, [])
    ws.add_patch("vllm/0001-u0.patch", patch)
    ws.write_series(["vllm/0001-u0.patch"])
    assert ws.cli("lock") == 1
    assert "no context lines" in capsys.readouterr().err


def test_zero_context_hunks_at_the_start_and_end_apply(ws: Workspace) -> None:
    post = b"first\n" + LINES + b"last\n"
    hunks = b"@@ -0,0 +1 @@\n+first\n@@ -10,0 +12 @@\n+last\n"
    ws.setup({"m.py": LINES}, [("vllm/0001-ends.patch", _u0_patch("m.py", LINES, post, hunks))])
    assert ws.cli("apply") == 0
    assert (ws.tree / "m.py").read_bytes() == post


def _git_patch(tmp, quote: bool) -> tuple[dict[str, bytes], bytes]:
    repo = tmp / ("q" if quote else "raw")
    base = {"pkg/café.txt": b"un\n", "pkg/x.py": b"x\n"}
    write_tree(repo, base)
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "base")
    (repo / "pkg/café.txt").write_bytes(b"deux\n")
    git(
        repo,
        "commit",
        "-qam",
        "[Test] Accents\n\nUpstream-Status: Pending\nSigned-off-by: a <a@b.c>",
    )
    quoting = "true" if quote else "false"
    out = git(
        repo,
        "-c",
        f"core.quotePath={quoting}",
        "format-patch",
        "--full-index",
        "--no-signature",
        "--zero-commit",
        "-N",
        "--no-stat",
        "-1",
        "--stdout",
    )
    return base, out.encode()


def test_non_ascii_paths_quoted_or_raw_are_utf8(ws: Workspace, tmp_path, capsys) -> None:
    for quote in (True, False):
        base, patch = _git_patch(tmp_path, quote)
        assert (b'"a/pkg/caf\\303\\251.txt"' in patch) == quote
        ws.setup(base, [("vllm/0001-accents.patch", patch)])
        assert ws.cli("apply") == 0
        assert (ws.tree / "pkg/café.txt").read_bytes() == b"deux\n"
        assert sorted(os.listdir(ws.tree / "pkg")) == ["café.txt", "x.py"]
        assert "pkg/café.txt" in (ws.repo / "series.lock").read_text(encoding="utf-8")
        assert ws.cli("verify") == 0
        assert ws.cli("unapply") == 0
    (ws.tree / "pkg/café.txt").write_bytes(b"edited\n")
    capsys.readouterr()
    assert ws.cli("apply") == 1
    assert "pkg/café.txt: expected" in capsys.readouterr().err


def test_deleted_files_come_back_with_their_own_mode(ws: Workspace) -> None:
    base = {"pkg/keep.py": b"k\n", "pkg/secret.py": b"s\n", "pkg/tool.sh": b"t\n"}
    patch = patch_bytes({"pkg/secret.py": (b"s\n", None), "pkg/tool.sh": (b"t\n", None)})
    ws.setup(base, [("vllm/0001-rm.patch", patch)])
    os.chmod(ws.tree / "pkg/secret.py", 0o600)
    os.chmod(ws.tree / "pkg/tool.sh", 0o775)
    before = snapshot(ws.tree)
    assert ws.cli("apply") == 0
    assert ws.cli("unapply") == 0
    assert snapshot(ws.tree) == before


def test_directory_emptied_by_a_deletion_is_removed_and_restored(ws: Workspace) -> None:
    base = {"pkg/keep.py": b"k\n", "pkg/old/deep/gone.py": b"g\n"}
    ws.setup(base, [("vllm/0001-rm.patch", patch_bytes({"pkg/old/deep/gone.py": (b"g\n", None)}))])
    os.chmod(ws.tree / "pkg/old", 0o700)
    before = snapshot(ws.tree)
    assert ws.cli("apply") == 0
    assert not (ws.tree / "pkg/old").exists()
    assert ws.cli("verify") == 0
    assert ws.cli("unapply") == 0
    assert snapshot(ws.tree) == before
