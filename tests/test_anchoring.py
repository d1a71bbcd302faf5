"""Hunk placement follows git's anchoring rules (apply.c): a hunk whose old range starts at
line 0 or 1 must match at the start of the file, a hunk without trailing context must match
at its end; such a hunk is never moved to where its one-sided context happens to occur
mid-file. Each case is checked against real ``git apply`` on the same bytes."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from conftest import Workspace, snapshot
from patchset.diffparse import apply_file, parse_diff
from patchset.errors import PatchDoesNotApply


def _lines(*names: str) -> bytes:
    return b"".join(n.encode() + b"\n" for n in names)


def _diff(body: str) -> bytes:
    head = f"diff --git a/f b/f\nindex {'1' * 40}..{'2' * 40} 100644\n--- a/f\n+++ b/f\n"
    return (head + body).encode()


APPEND = "@@ -5,3 +5,4 @@\n A\n B\n C\n+new\n"
INSERT = "@@ -1,3 +1,4 @@\n+new\n A\n B\n C\n"
CASES = [
    # (name, hunk, target file): the hunk was made where its context was at the end / start
    ("append, context only mid-file", APPEND, _lines("p", "q", "r", "s", "A", "B", "C", "t", "u")),
    ("append, context at the end after an offset", APPEND, _lines("p", "q", "A", "B", "C")),
    ("append, context mid-file and at the end", APPEND, _lines("A", "B", "C", "x", "A", "B", "C")),
    ("insert, context only mid-file", INSERT, _lines("z", "A", "B", "C", "x")),
    ("insert, context at the start", INSERT, _lines("A", "B", "C", "x", "y")),
    (
        "both sides, context after",
        "@@ -3,4 +3,5 @@\n x\n+new\n y\n z\n w\n",
        _lines("a", "x", "y", "z", "w", "b", "c"),
    ),
]


def _git_apply(tmp_path: Path, target: bytes, diff: bytes) -> bytes | None:
    work = tmp_path / "git"
    work.mkdir(exist_ok=True)
    (work / "f").write_bytes(target)
    (work / "p.diff").write_bytes(diff)
    done = subprocess.run(
        ["git", "apply", "--no-index", "p.diff"], cwd=work, capture_output=True, check=False
    )
    return (work / "f").read_bytes() if done.returncode == 0 else None


def _ours(target: bytes, diff: bytes) -> bytes | None:
    (fp,), problems = parse_diff(diff)
    assert not problems
    try:
        return apply_file(target, fp)
    except PatchDoesNotApply:
        return None


@pytest.mark.parametrize(("name", "hunk", "target"), CASES, ids=[c[0] for c in CASES])
def test_placement_is_what_git_apply_does(tmp_path: Path, name: str, hunk: str, target: bytes):
    diff = _diff(hunk)
    assert _ours(target, diff) == _git_apply(tmp_path, target, diff)


def test_git_refuses_the_mid_file_cases_and_applies_the_others(tmp_path: Path) -> None:
    """The cases are not vacuous: git refuses some and applies others."""
    results = [_git_apply(tmp_path, t, _diff(h)) for _, h, t in CASES]
    assert results[0] is None and results[3] is None
    assert results[1] is not None and results[4] is not None and results[5] is not None


def test_import_refuses_an_append_whose_context_is_not_at_the_end(
    ws: Workspace, tmp_path, capsys, monkeypatch
) -> None:
    config = tmp_path / "gitconfig"
    config.write_text("[user]\n\tname = T\n\temail = t@example.invalid\n")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(config))
    ws.setup({"f": CASES[0][2]}, [])
    before = snapshot(ws.repo)
    diff = tmp_path / "append.diff"
    diff.write_bytes(("--- a/f\n+++ b/f\n" + APPEND).encode())
    assert ws.cli("import", str(diff), "--subject", "[Test] Append") == 1
    err = capsys.readouterr().err
    assert "end of the file" in err, err
    assert snapshot(ws.repo) == before


def test_out_of_order_hunks_are_named_as_such() -> None:
    target = _lines(*"abcdefghijklmnop")
    diff = _diff("@@ -9,3 +9,3 @@\n h\n-i\n+I\n j\n@@ -2,3 +2,3 @@\n b\n-c\n+C\n d\n")
    (fp,), _ = parse_diff(diff)
    with pytest.raises(PatchDoesNotApply, match="out of order"):
        apply_file(target, fp)
