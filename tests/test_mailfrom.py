"""The exported ``From:`` is what ``git format-patch`` writes, and ``git am`` reads back the
name git records (issue 48, N9: quotes, a trailing dot, an encoded-word, non-ASCII)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from conftest import patch_bytes, write_tree
from patchset.errors import PatchsetError
from patchset.export import mbox_bytes
from patchset.gitops import ScratchRepo
from patchset.mailfrom import from_field, git_ident_name, mail_parts
from patchset.series import parse_patch

NAMES = [
    "Plain Name",
    "J. R. Hacker",
    'Ann "Q" Dev',
    "O'Neil, Jr.",
    "Zoë Ürban",
    "x =?UTF-8?q?y?= z",
    "back\\slash",
    " Lead Space",
    "Dr. Ähm Ümlaut-Öster (ÜÖ) Ärger-Übermaß",
]
ADDRESS = "a@example.invalid"


def _format_patch_from(name: str, tmp_path: Path) -> str:
    """The From: value (folded lines joined by newlines) git format-patch writes for a commit
    by ``name``."""
    repo = tmp_path / "fp"
    repo.mkdir()
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": name,
        "GIT_AUTHOR_EMAIL": ADDRESS,
        "GIT_COMMITTER_NAME": "c",
        "GIT_COMMITTER_EMAIL": "c@example.invalid",
    }
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "f").write_text("x\n")
    subprocess.run(["git", "-C", str(repo), "add", "f"], check=True)
    subprocess.run(["git", "-C", str(repo), "commit", "-qm", "[T] x"], check=True, env=env)
    lines = subprocess.run(
        ["git", "-C", str(repo), "format-patch", "-1", "--stdout"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\n")
    at = next(i for i, line in enumerate(lines) if line.startswith("From: "))
    value = [lines[at][len("From: ") :]]
    while lines[at + len(value)].startswith(" "):
        value.append(lines[at + len(value)])
    return "\n".join(value)


@pytest.mark.parametrize("name", NAMES)
def test_from_field_is_what_git_format_patch_writes(name: str, tmp_path: Path) -> None:
    assert from_field(name, ADDRESS) == _format_patch_from(name, tmp_path)


@pytest.mark.parametrize("name", NAMES)
def test_git_am_reads_back_the_exporters_name(name: str, tmp_path: Path) -> None:
    """An mbox exported with the signer ``name`` goes through git am with the author and the
    sign-off git itself would record for that user."""
    base = b"one\ntwo\n"
    data = patch_bytes({"a.py": (base, base + b"three\n")}, subject="[PATCH] [Core] Three")
    patch, problems = parse_patch("vllm/0001-three.patch", data)
    assert patch is not None, problems
    write_tree(tmp_path / "base", {"a.py": base})
    repo = ScratchRepo.create(tmp_path / "scratch")
    repo.import_tree(tmp_path / "base", "base")
    result = repo.am(mbox_bytes(patch, data, f"{name} <{ADDRESS}>"))
    assert result.ok, result.output
    author = subprocess.run(
        ["git", "-C", str(repo.path), "log", "-1", "--format=%an%n%B"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    recorded = git_ident_name(name)
    assert author.split("\n", 1)[0] == recorded
    assert f"Signed-off-by: {recorded} <{ADDRESS}>" in author


def test_a_stored_from_is_decoded_before_it_is_written_again() -> None:
    for name in NAMES:
        assert mail_parts(from_field(name, ADDRESS)) == (git_ident_name(name), ADDRESS)


def test_a_name_git_am_cannot_read_back_is_refused() -> None:
    with pytest.raises(PatchsetError, match="control character"):
        from_field("Tab\tName", ADDRESS)
    # git mailinfo's get_sane_name: over 60 bytes, or an '@', and the address becomes the name
    with pytest.raises(PatchsetError, match="over 60 bytes"):
        from_field("A" * 30 + " Zoë " + "B" * 26, ADDRESS)
    with pytest.raises(PatchsetError, match="holds '@'"):
        from_field("me@work", ADDRESS)
