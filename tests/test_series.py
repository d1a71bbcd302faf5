"""series: parse/serialise round trip; every bad entry reported in one error naming it."""

from __future__ import annotations

import pytest
from conftest import Workspace, patch_bytes
from hypothesis import given
from hypothesis import strategies as st
from patchset.errors import SeriesError
from patchset.series import load_series, name_problem, parse_series, serialise_series

NAMES = st.lists(
    st.builds(
        lambda t, n, s: f"{t}/{n:04d}-{s}.patch",
        st.sampled_from(["vllm", "b12x"]),
        st.integers(0, 9999),
        st.from_regex(r"[a-z0-9]+(-[a-z0-9]+)*", fullmatch=True),
    ),
    max_size=8,
)


@given(NAMES, st.text(alphabet="abc xyz#\n", max_size=40))
def test_series_round_trips(names: list[str], comment: str) -> None:
    """parse(serialise(names, comment)) gives back exactly the names, in order."""
    assert [e.name for e in parse_series(serialise_series(names, comment))] == names


def test_parse_skips_comments_and_blank_lines_and_keeps_line_numbers() -> None:
    entries = parse_series("# head\n\nvllm/0001-a.patch  # trailing\n  \nb12x/0001-b.patch\n")
    assert [(e.name, e.line) for e in entries] == [
        ("vllm/0001-a.patch", 3),
        ("b12x/0001-b.patch", 5),
    ]


@pytest.mark.parametrize(
    "name",
    [
        "vllm/1-a.patch",
        "vllm/0001-A.patch",
        "vllm/0001-a.diff",
        "torch/0001-a.patch",
        "vllm/sub/0001-a.patch",
        "vllm/0001-.patch",
        "/vllm/0001-a.patch",
        "vllm/0001-a.patch\n",  # `$` would match before a trailing newline
        "vllm/0001-a.patch/",
        "vllm/\u0660\u0660\u0661\u0663-a.patch",  # Arabic-Indic digits match `\d`
        "vllm/../0001-a.patch",
        "vllm//0001-a.patch",
        "vllm/0001-\u00e9.patch",
    ],
)
def test_bad_names_are_refused(name: str) -> None:
    assert name_problem(name) is not None


def good(**header: object) -> bytes:
    return patch_bytes({"f.py": (b"a\n", b"b\n")}, **header)


def test_every_problem_is_listed_in_one_error_naming_the_patch(ws: Workspace) -> None:
    ws.add_patch("vllm/0001-ok.patch", good())
    ws.add_patch("vllm/0002-unlisted.patch", good())
    ws.add_patch("vllm/0003-nostatus.patch", good(status=None))
    ws.add_patch("vllm/0004-nosignoff.patch", good(signed=False))
    ws.add_patch("vllm/0005-binary.patch", good() + b"diff --git a/x b/x\nGIT binary patch\n")
    ws.add_patch("vllm/0006-dep.patch", good(depends=("vllm/0009-later.patch",)))
    ws.add_patch("vllm/0009-later.patch", good())
    ws.add_patch(
        "vllm/0010-mode.patch",
        b"".join(
            [
                good().split(b"diff --git")[0],
                b"diff --git a/f b/f\nold mode 100644\nnew mode 100755\n",
            ]
        ),
    )
    ws.add_patch("vllm/0011-escape.patch", patch_bytes({"../up.py": (b"a\n", b"b\n")}))
    ws.write_series(
        [
            "vllm/0001-ok.patch",
            "vllm/0001-ok.patch",
            "vllm/0003-nostatus.patch",
            "vllm/0004-nosignoff.patch",
            "vllm/0005-binary.patch",
            "vllm/0006-dep.patch",
            "vllm/0007-missing.patch",
            "vllm/Bad Name.patch",
            "vllm/0009-later.patch",
            "vllm/0010-mode.patch",
            "vllm/0011-escape.patch",
        ]
    )
    with pytest.raises(SeriesError) as caught:
        load_series(ws.repo)
    details = "\n".join(caught.value.details)
    expected = [
        "vllm/0001-ok.patch (series line 3): duplicate entry",
        "vllm/0002-unlisted.patch: present under patches/ but not listed",
        "vllm/0003-nostatus.patch: header has no 'Upstream-Status:'",
        "vllm/0004-nosignoff.patch: header has no 'Signed-off-by:'",
        "vllm/0005-binary.patch: x: binary hunk",
        "vllm/0006-dep.patch: Depends-on vllm/0009-later.patch is not listed earlier",
        "vllm/0007-missing.patch (series line 8): listed but missing",
        "vllm/Bad Name.patch (series line 9): bad name",
        "vllm/0010-mode.patch: f: mode change",
        "vllm/0011-escape.patch: path '../up.py' is outside the tree",
    ]
    for line in expected:
        assert line in details
    assert len(caught.value.details) == len(expected), "\n".join(caught.value.details)


def test_valid_series_loads_in_order_with_targets(ws: Workspace) -> None:
    ws.add_patch("vllm/0002-b.patch", good())
    ws.add_patch("b12x/0001-a.patch", good())
    ws.add_patch("vllm/0003-c.patch", good(depends=("vllm/0002-b.patch",)))
    ws.write_series(["vllm/0002-b.patch", "b12x/0001-a.patch", "vllm/0003-c.patch"])
    patches = load_series(ws.repo)
    assert [(p.name, p.target) for p in patches] == [
        ("vllm/0002-b.patch", "vllm"),
        ("b12x/0001-a.patch", "b12x"),
        ("vllm/0003-c.patch", "vllm"),
    ]
    assert patches[2].header.depends_on == ("vllm/0002-b.patch",)
