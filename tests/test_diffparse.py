"""diffparse: exact hunks, refusals of what the series must never carry."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from patchset.diffparse import apply_file, parse_diff, reverse, split_lines
from patchset.errors import PatchDoesNotApply
from patchset.refresh import render_file

LINE = st.sampled_from([b"a\n", b"b\n", b"c\n", b"\n", b"x = 1\n", b"\tdef f():\n", b"\xff\r\n"])
CONTENT = st.builds(
    lambda lines, tail: b"".join(lines) + tail,
    st.lists(LINE, max_size=30),
    st.sampled_from([b"", b"end"]),
)


def one(diff: bytes):
    files, problems = parse_diff(diff)
    assert problems == []
    assert len(files) == 1
    return files[0]


@settings(max_examples=300, deadline=None)
@given(pre=CONTENT, post=CONTENT)
def test_rendered_diff_applies_forward_and_backward_exactly(pre: bytes, post: bytes) -> None:
    """Applying a rendered diff to its preimage gives the postimage byte for byte, and its
    reverse gives the preimage back."""
    if pre == post:
        return
    fp = one(render_file("pkg/mod.py", pre, post, "100644"))
    assert apply_file(pre, fp) == post
    assert apply_file(post, reverse(fp)) == pre


@settings(max_examples=100, deadline=None)
@given(post=CONTENT)
def test_added_and_deleted_files_round_trip(post: bytes) -> None:
    """A new-file diff creates exactly its content; its reverse deletes it."""
    fp = one(render_file("new/file.py", None, post, "100755"))
    assert fp.op == "add" and fp.mode == "100755"
    assert apply_file(None, fp) == post
    assert apply_file(post, reverse(fp)) is None


def test_split_lines_breaks_only_on_newline() -> None:
    assert split_lines(b"a\rb\x0cc\nd") == [b"a\rb\x0cc\n", b"d"]


def test_hunk_applies_at_nearest_exact_offset_but_never_with_fuzz() -> None:
    pre = b"".join(b"line %d\n" % i for i in range(20))
    post = pre.replace(b"line 10\n", b"LINE 10\n")
    fp = one(render_file("f", pre, post, "100644"))
    shifted = b"extra\n" * 3 + pre
    assert apply_file(shifted, fp) == b"extra\n" * 3 + post
    fuzzed = pre.replace(b"line 8\n", b"line 8 \n")
    with pytest.raises(PatchDoesNotApply, match="zero fuzz"):
        apply_file(fuzzed, fp)


def test_add_refuses_existing_file_and_modify_refuses_missing_file() -> None:
    add = one(render_file("f", None, b"x\n", "100644"))
    with pytest.raises(PatchDoesNotApply, match="already exists"):
        apply_file(b"", add)
    modify = one(render_file("f", b"a\n", b"b\n", "100644"))
    with pytest.raises(PatchDoesNotApply, match="does not exist"):
        apply_file(None, modify)


BLOB = "1" * 40
GOOD_HEAD = f"index {BLOB}..{'2' * 40} 100644\n--- a/f\n+++ b/f\n@@ -1 +1 @@\n-a\n+b\n"


@pytest.mark.parametrize(
    ("diff", "reason"),
    [
        (
            f"diff --git a/f b/f\nindex {BLOB}..{'2' * 40} 100644\nGIT binary patch\nliteral 3\n",
            "binary hunk",
        ),
        (
            f"diff --git a/f b/f\nindex {BLOB}..{'2' * 40} 100644\n"
            "Binary files a/f and b/f differ\n",
            "binary hunk",
        ),
        ("diff --git a/f b/f\nold mode 100644\nnew mode 100755\n", "mode change"),
        (
            f"diff --git a/l b/l\nnew file mode 120000\nindex {'0' * 40}..{BLOB}\n"
            "--- /dev/null\n+++ b/l\n@@ -0,0 +1 @@\n+target\n",
            "not a regular file mode",
        ),
        ("diff --git a/f b/g\nsimilarity index 100%\nrename from f\nrename to g\n", "rename"),
        ("diff --git a/../x b/../x\n" + GOOD_HEAD, "outside the tree"),
        ("diff --git a//etc/passwd b//etc/passwd\n" + GOOD_HEAD, "absolute path"),
        ("diff --git a/.git/config b/.git/config\n" + GOOD_HEAD, "reserved directory"),
        ("diff --git a/.patchset/state.json b/.patchset/state.json\n" + GOOD_HEAD, "reserved"),
        (
            "diff --git a/f b/f\nindex 1111111..2222222 100644\n"
            "--- a/f\n+++ b/f\n@@ -1 +1 @@\n-a\n+b\n",
            "abbreviated index",
        ),
    ],
)
def test_refuses_unsafe_or_unsupported_diffs(diff: str, reason: str) -> None:
    files, problems = parse_diff(diff.encode())
    assert files == []
    assert any(reason in p for p in problems), problems


def test_collects_a_problem_for_every_bad_file() -> None:
    def bad(name: str) -> str:
        return f"diff --git a/{name} b/{name}\nold mode 100644\nnew mode 100755\n"

    files, problems = parse_diff((bad("f") + bad("g")).encode())
    assert problems == [
        "f: mode change (100644 -> 100755); patches may not change modes",
        "g: mode change (100644 -> 100755); patches may not change modes",
    ]


def test_no_newline_marker_is_kept_exactly() -> None:
    fp = one(render_file("f", b"a\nb", b"a\nc", "100644"))
    assert apply_file(b"a\nb", fp) == b"a\nc"
    with pytest.raises(PatchDoesNotApply):
        apply_file(b"a\nb\n", fp)
