"""gitops: scratch repositories, tree import, git am with vLLM subjects, apply checks."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import patch_bytes, snapshot, write_tree
from patchset.errors import ExternalToolError
from patchset.gitops import ScratchRepo

LINES = b"".join(b"line %d\n" % i for i in range(1, 31))


def make_repo(tmp_path: Path, files: dict[str, bytes]) -> tuple[ScratchRepo, str]:
    base = tmp_path / "base"
    write_tree(base, files)
    repo = ScratchRepo.create(tmp_path / "scratch")
    return repo, repo.import_tree(base, "base")


def test_import_tree_commits_every_file_including_ignored_ones(tmp_path: Path) -> None:
    files = {"a.py": b"x = 1\n", ".gitignore": b"*.so\n", "lib/native.so": b"\0\1"}
    repo, base = make_repo(tmp_path, files)
    assert repo.changed_paths("4b825dc642cb6eb9a060e54bf8d69288fbee4904", base) == sorted(files)
    assert repo.read(base, "lib/native.so") == b"\0\1"


def test_import_tree_does_not_touch_the_source_tree(tmp_path: Path) -> None:
    base = tmp_path / "base"
    write_tree(base, {"a.py": b"x = 1\n", "d/b.txt": b"b\n"})
    (base / "a.py").chmod(0o444)
    before = snapshot(base)
    ScratchRepo.create(tmp_path / "scratch").import_tree(base, "base")
    assert snapshot(base) == before


def test_create_refuses_a_non_empty_directory(tmp_path: Path) -> None:
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "file").write_text("mine")
    with pytest.raises(ExternalToolError, match="non-empty"):
        ScratchRepo.create(tmp_path / "busy")


def test_am_keeps_the_vllm_tag_and_signoff(tmp_path: Path) -> None:
    repo, _ = make_repo(tmp_path, {"a.py": LINES})
    mbox = patch_bytes(
        {"a.py": (LINES, LINES.replace(b"line 5\n", b"line five\n"))},
        subject="[PATCH] [Bugfix][Kernel] Fix line five",
    )
    result = repo.am(mbox)
    assert result.ok, result.output
    assert repo.subject() == "[Bugfix][Kernel] Fix line five"
    assert "Signed-off-by: dcp-series" in repo.message()
    assert (repo.path / "a.py").read_bytes().count(b"line five") == 1


def test_failed_am_is_reported_and_aborted(tmp_path: Path) -> None:
    repo, base = make_repo(tmp_path, {"a.py": LINES})
    mbox = patch_bytes({"a.py": (b"other\n", b"changed\n")}, subject="[PATCH] [X] No")
    result = repo.am(mbox)
    assert not result.ok
    repo.abort_am()
    assert repo.head() == base
    assert (repo.path / "a.py").read_bytes() == LINES


def test_apply_check_reports_offsets_and_failures(tmp_path: Path) -> None:
    moved = b"extra 1\nextra 2\n" + LINES
    repo, _ = make_repo(tmp_path, {"a.py": moved})
    patch = patch_bytes({"a.py": (LINES, LINES.replace(b"line 12\n", b"line twelve\n"))})
    check = repo.apply_check(patch)
    assert check.ok
    assert [(o.path, o.number, o.offset) for o in check.offsets] == [("a.py", 1, 2)]
    broken = patch_bytes({"a.py": (LINES, LINES.replace(b"line 12\n", b"x\n"))}).replace(
        b" line 11\n", b" line eleven\n"
    )
    check = repo.apply_check(broken)
    assert not check.ok
    assert check.failed and check.failed[0][0] == "a.py"


def test_reverse_check_detects_an_already_present_change(tmp_path: Path) -> None:
    post = LINES.replace(b"line 7\n", b"line seven\n")
    repo, _ = make_repo(tmp_path, {"a.py": post})
    patch = patch_bytes({"a.py": (LINES, post)})
    assert not repo.apply_check(patch).ok
    assert repo.apply_check(patch, reverse=True).ok


def test_format_patch_round_trips_through_am(tmp_path: Path) -> None:
    repo, base = make_repo(tmp_path, {"a.py": LINES})
    first = patch_bytes(
        {"a.py": (LINES, LINES + b"tail\n"), "new.py": (None, b"n = 1\n")},
        subject="[PATCH] [Core] Add tail",
    )
    assert repo.am(first).ok
    exported = repo.format_patch()
    tip = repo.head()
    repo.checkout(base)
    assert repo.am(exported).ok
    assert repo.changed_paths(tip, "HEAD") == []
    assert repo.subject() == "[Core] Add tail"


def test_three_way_am_never_follows_a_rename_into_another_file(tmp_path: Path) -> None:
    """A change to a file missing on HEAD is a modify/delete conflict, not an edit of a
    look-alike file that git's rename detection would pick."""
    repo, base = make_repo(tmp_path, {"a.py": LINES})
    patch = patch_bytes({"n.py": (LINES, LINES.replace(b"line 9\n", b"nine\n"))})
    result = repo.am(patch, three_way=True)
    assert not result.ok
    assert repo.unmerged() == {"n.py": "DU"}
    repo.abort_am()
    assert repo.head() == base and (repo.path / "a.py").read_bytes() == LINES
