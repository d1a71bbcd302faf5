"""patchfile: the format-patch header parses, serialises and round-trips; bad trailers refused."""

from __future__ import annotations

import pytest
from conftest import format_patch_head, git
from hypothesis import given
from hypothesis import strategies as st
from patchset.model import PatchHeader
from patchset.patchfile import (
    header_problems,
    parse_header,
    serialise_header,
    split_patch,
    upstream_status_problem,
)

WORD = (
    st.text(alphabet="abcdefghijklmnopqrstuvwxyz[]().,:-_ ", min_size=1, max_size=12)
    .map(str.strip)
    .filter(bool)
)
SENTENCE = st.lists(WORD, min_size=1, max_size=6).map(" ".join)
PARAGRAPH = st.lists(SENTENCE.map(lambda s: "desc " + s), min_size=1, max_size=3).map("\n".join)
TRAILER = st.tuples(
    st.sampled_from(["Upstream-Status", "Depends-on", "Signed-off-by", "Test-Result"]), SENTENCE
)
HEADERS = st.builds(
    PatchHeader,
    commit=st.text(alphabet="0123456789abcdef", min_size=40, max_size=40),
    author=SENTENCE,
    date=SENTENCE,
    subject=SENTENCE,
    description=st.lists(PARAGRAPH, max_size=3).map("\n\n".join),
    trailers=st.lists(TRAILER, min_size=1, max_size=4).map(tuple),
)


@given(HEADERS)
def test_header_round_trips_through_its_canonical_bytes(header: PatchHeader) -> None:
    """parse(serialise(h)) == h and serialise is a fixed point for every generated header."""
    data = serialise_header(header)
    assert parse_header(data) == header
    assert serialise_header(parse_header(data)) == data


def test_parses_real_format_patch_with_folded_subject(tmp_path) -> None:
    git(tmp_path, "init", "-q")
    (tmp_path / "f").write_text("a\n")
    git(tmp_path, "add", "f")
    git(tmp_path, "commit", "-qm", "base")
    (tmp_path / "f").write_text("b\n")
    title = "[Core] " + "a long title word " * 5
    body = "Purpose.\n\nUpstream-Status: Submitted [https://github.com/vllm-project/vllm/pull/1]"
    git(tmp_path, "commit", "-qasm", title.strip(), "-m", body, "-s")
    data = format_patch_head(tmp_path)
    header_text, diff = split_patch(data)
    assert diff.startswith(b"diff --git a/f b/f\n")
    header = parse_header(header_text)
    assert header.subject == "[PATCH] " + title.strip()
    assert header.description == "Purpose."
    assert header.upstream_status == "Submitted [https://github.com/vllm-project/vllm/pull/1]"
    assert header_problems(header) == []


def make(trailers: tuple[tuple[str, str], ...]) -> PatchHeader:
    return PatchHeader("0" * 40, "a <a@b>", "d", "[T] t", "body", trailers)


def test_header_without_upstream_status_or_signoff_is_refused() -> None:
    problems = header_problems(make((("Test-Plan", "x"),)))
    assert any("no 'Upstream-Status:'" in p for p in problems)
    assert any("no 'Signed-off-by:'" in p for p in problems)


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        ("Pending", True),
        ("Submitted [https://x/pull/1]", True),
        ("Submitted", True),
        ("Backport [https://x/commit/abc]", True),
        ("Inappropriate [CPU-only fixture]", True),
        ("Inappropriate", False),
        ("Pending [soon]", False),
        ("Merged", False),
        ("pending", False),
        ("Submitted https://x", False),
    ],
)
def test_upstream_status_values(value: str, ok: bool) -> None:
    assert (upstream_status_problem(value) is None) is ok


def test_not_a_format_patch_file_is_refused() -> None:
    from patchset.errors import PatchFormatError

    with pytest.raises(PatchFormatError, match="not a git format-patch file"):
        parse_header(b"Subject: x\n\n")


# -- what git am would cut (issue 48, N3) ------------------------------------------------------

CUT_CANDIDATES = [
    "diff -u a/x b/x",
    "diff --git a/x b/x",
    "Index: vllm/x.py",
    "---",
    "--- ",
    "---\t",
    "--- a/x.py",
    "---- not a break",
    "-- not one either",
    "--x",
    "diffs are fine",
    "Index:nospace",
    "  diff -u indented is fine",
    "From 0123456789abcdef0123456789abcdef01234567 Mon Sep 17 00:00:00 2001",
    "From someone Mon Dec  5 12:34:56 1999",
    "From the H200 runs at 12:34:56 today",
    "From the H200, the two runs agree.",
    "From x 1:2:3 2001",
]


def _git_mailinfo_keeps(line: str, tmp_path) -> bool:
    import subprocess

    mail = f"From: A <a@example.invalid>\nSubject: [T] x\n\nfirst\n{line}\nlast\n"
    proc = subprocess.run(
        ["git", "mailinfo", str(tmp_path / "msg"), str(tmp_path / "patch")],
        input=mail.encode(),
        capture_output=True,
        check=True,
    )
    assert proc.returncode == 0
    return "last" in (tmp_path / "msg").read_text()


def _git_mailsplit_count(line: str, tmp_path) -> int:
    import subprocess

    head = "From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n"
    mbox = tmp_path / "in.mbox"
    mbox.write_text(f"{head}From: A <a@example.invalid>\nSubject: [T] x\n\nfirst\n{line}\nlast\n")
    out = tmp_path / "split"
    out.mkdir(exist_ok=True)
    proc = subprocess.run(
        ["git", "mailsplit", f"-o{out}", str(mbox)], capture_output=True, text=True, check=True
    )
    return int(proc.stdout.strip())


@pytest.mark.parametrize("line", CUT_CANDIDATES)
def test_the_cut_rules_agree_with_git_itself(line: str, tmp_path) -> None:
    """git_am_patch_break / git_mailsplit_from_line say what this machine's git does."""
    from patchset.patchfile import git_am_patch_break, git_mailsplit_from_line

    assert git_am_patch_break(line) is not _git_mailinfo_keeps(line, tmp_path)
    assert git_mailsplit_from_line(line) is (_git_mailsplit_count(line, tmp_path) == 2)


@pytest.mark.parametrize(
    ("description", "said"),
    [
        ("Why.\ndiff -u a b shows it.", "start of the diff"),
        ("Why.\n--- below, the numbers", "start of the diff"),
        ("Why.\nFrom x Mon Dec  5 12:34:56 1999 on", "start of another mail"),
    ],
)
def test_a_description_git_am_would_cut_is_refused(description: str, said: str) -> None:
    header = make((("Upstream-Status", "Pending"), ("Signed-off-by", "A <a@b.c>")))
    header = PatchHeader(**{**header.__dict__, "description": description})
    problems = header_problems(header)
    assert any(said in p and "description line 2" in p for p in problems), problems


def test_a_subject_with_a_control_character_is_refused() -> None:
    header = make((("Upstream-Status", "Pending"), ("Signed-off-by", "A <a@b.c>")))
    header = PatchHeader(**{**header.__dict__, "subject": "[T] x\rFrom: evil"})
    assert any("control character" in p for p in header_problems(header))
