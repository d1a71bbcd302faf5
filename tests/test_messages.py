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
