"""Refusal messages say what is wrong in one line each: plain diffs, binary patches, CRLF files,
missing files, non-ASCII names."""

from __future__ import annotations

from conftest import Workspace, git, header_bytes, patch_bytes, write_tree
from patchset.diffparse import apply_file, parse_diff
from patchset.model import FilePatch
from patchset.patchfile import split_patch

PLAIN = b"--- a/a.py\n+++ b/a.py\n@@ -1 +1 @@\n-a\n+b\n"


def _refusal(ws: Workspace, capsys, data: bytes) -> list[str]:
    ws.setup({"a.py": b"a\n"}, [])
    ws.add_patch("vllm/0001-x.patch", data)
    ws.write_series(["vllm/0001-x.patch"])
    assert ws.cli("apply") == 1
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("  ")]


def test_plain_unified_diff_points_at_import(ws: Workspace, capsys) -> None:
    lines = _refusal(ws, capsys, PLAIN)
    assert len(lines) == 1, lines
    assert "plain unified diff" in lines[0] and "patchset import" in lines[0]
    assert "Upstream-Status" not in lines[0]


def test_binary_patch_is_one_message(ws: Workspace, tmp_path, capsys) -> None:
    repo = tmp_path / "g"
    write_tree(repo, {"blob.bin": bytes(range(256)) * 8})
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "base")
    (repo / "blob.bin").write_bytes(bytes(reversed(range(256))) * 8)
    git(repo, "commit", "-qam", "bin")
    diff = git(repo, "diff", "--binary", "--full-index", "HEAD~1", "HEAD").encode()
    assert b"GIT binary patch" in diff and diff.count(b"\n") > 10
    lines = _refusal(ws, capsys, header_bytes() + diff)
    assert lines == ["  vllm/0001-x.patch: blob.bin: binary hunk ('GIT binary patch')"]


def test_crlf_patch_file_is_named_as_crlf(ws: Workspace, capsys) -> None:
    data = patch_bytes({"a.py": (b"a\n", b"b\n")}).replace(b"\n", b"\r\n")
    lines = _refusal(ws, capsys, data)
    assert len(lines) == 1 and "CRLF" in lines[0], lines


def test_missing_file_message_spells_the_operation() -> None:
    _, diff = split_patch(patch_bytes({"a.py": (b"a\n", b"b\n")}))
    files, problems = parse_diff(diff)
    assert not problems
    fp: FilePatch = files[0]
    try:
        apply_file(None, fp)
    except Exception as exc:  # noqa: BLE001 - the message is what is tested
        assert "patch modifies the file but it does not exist" in str(exc)
    else:
        raise AssertionError("applied to a missing file")


def test_non_ascii_names_print_as_written() -> None:
    diff = (
        b'diff --git "a/caf\\303\\251.py" "b/caf\\303\\251.py"\nold mode 100644\nnew mode 100755\n'
    )
    _, problems = parse_diff(diff)
    assert problems == ["café.py: mode change (100644 -> 100755); patches may not change modes"]


# -- issue 32: messages say what failed and only mention a rollback that happened -------------


def test_an_os_error_outside_the_journal_claims_no_rollback(ws: Workspace, capsys) -> None:
    ws.setup({"a.py": b"a\n"}, [])
    assert ws.cli("import", str(ws.repo / "no-such.patch"), "--subject", "[Test] X") == 1
    err = capsys.readouterr().err
    assert "No such file or directory" in err and "no-such.patch" in err
    assert "roll" not in err, err


def test_inode_exhaustion_is_named_before_anything_is_written(ws: Workspace, monkeypatch, capsys):
    import os

    from conftest import snapshot

    ws.setup({"a.py": b"a\n"}, [("vllm/0001-x.patch", patch_bytes({"a.py": (b"a\n", b"b\n")}))])
    before = snapshot(ws.tree)
    real = os.statvfs

    def no_inodes(path):
        got = real(path)
        return os.statvfs_result((*got[:5], 1000, 3, 3, *got[8:]))

    monkeypatch.setattr(os, "statvfs", no_inodes)
    assert ws.cli("apply") == 1
    err = capsys.readouterr().err
    assert "not enough free inodes" in err and "nothing was changed" in err, err
    assert snapshot(ws.tree) == before


def test_file_becoming_directory_names_the_patch_that_made_the_file(ws: Workspace, capsys):
    ws.setup({"a.py": b"a\n"}, [])
    ws.add_patch("vllm/0001-file.patch", patch_bytes({"pkg/x": (None, b"x\n")}))
    ws.add_patch("vllm/0002-edit.patch", patch_bytes({"pkg/x": (b"x\n", b"y\n")}))
    ws.add_patch("vllm/0003-dir.patch", patch_bytes({"pkg/x/y.py": (None, b"y\n")}))
    ws.write_series(["vllm/0001-file.patch", "vllm/0002-edit.patch", "vllm/0003-dir.patch"])
    assert ws.cli("lock") == 1
    err = capsys.readouterr().err
    line = next(x for x in err.splitlines() if "is a file and a directory" in x)
    assert "vllm/0001-file.patch" in line and "vllm/0003-dir.patch" in line, line


def test_verify_on_a_never_patched_tree_checks_the_base_and_exits_0(ws: Workspace, capsys):
    ws.setup({"a.py": b"a\n"}, [("vllm/0001-x.patch", patch_bytes({"a.py": (b"a\n", b"b\n")}))])
    assert ws.cli("verify") == 0
    out = capsys.readouterr().out
    assert "0 of 1 patch(es) applied" in out, out
    (ws.tree / "a.py").write_bytes(b"edited\n")
    assert ws.cli("verify") == 1
    assert "a.py: expected" in capsys.readouterr().err
