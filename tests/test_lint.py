"""lint: ruff with the base tree's config on touched files, SPDX on new files, stray prints."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import patch_bytes, write_tree
from patchset.lint import added_lines, debug_calls, lint_patches, pinned_ruff_version, spdx_problem
from patchset.series import load_series

PYPROJECT = b"""[tool.ruff]
line-length = 88

[tool.ruff.lint]
select = ["E", "F", "I"]
"""
SPDX = (
    b"# SPDX-License-Identifier: Apache-2.0\n"
    b"# SPDX-FileCopyrightText: Copyright contributors to the vLLM project\n"
)
CLEAN = SPDX + b'"""A module."""\n\nVALUE = 1\n'


def lint(tmp_path: Path, base: dict[str, bytes], patches: list[tuple[str, bytes]]):
    root, tree = tmp_path / "repo", tmp_path / "base"
    write_tree(tree, {"pyproject.toml": PYPROJECT, **base})
    (root / "patches" / "vllm").mkdir(parents=True)
    for name, data in patches:
        (root / "patches" / name).write_bytes(data)
    (root / "series").write_text("".join(f"{n}\n" for n, _ in patches))
    series = load_series(root)
    reports = lint_patches(series, series, {"vllm": tree}, workdir=tmp_path)
    return {r.patch: r for r in reports}


def rules(report) -> list[tuple[str, str]]:
    return sorted((f.path, f.rule) for f in report.findings)


def test_clean_patch_has_no_findings(tmp_path: Path) -> None:
    data = patch_bytes({"vllm/a.py": (CLEAN, CLEAN + b"OTHER = 2\n")}, subject="[Core] Ok")
    reports = lint(tmp_path, {"vllm/a.py": CLEAN}, [("vllm/0001-a.patch", data)])
    assert reports["vllm/0001-a.patch"].findings == ()


def test_new_ruff_finding_is_reported_with_its_line(tmp_path: Path) -> None:
    post = CLEAN + b"import os\n"
    data = patch_bytes({"vllm/a.py": (CLEAN, post)}, subject="[Core] Bad import")
    report = lint(tmp_path, {"vllm/a.py": CLEAN}, [("vllm/0001-a.patch", data)])[
        "vllm/0001-a.patch"
    ]
    found = {(f.path, f.rule, f.line) for f in report.findings}
    assert ("vllm/a.py", "ruff:F401", 6) in found
    assert ("vllm/a.py", "ruff:E402", 6) in found


def test_preexisting_ruff_finding_is_not_blamed_on_the_patch(tmp_path: Path) -> None:
    dirty = CLEAN + b"LONG = '" + b"a" * 100 + b"'\n"
    data = patch_bytes({"vllm/a.py": (dirty, dirty + b"OTHER = 2\n")}, subject="[Core] Ok")
    reports = lint(tmp_path, {"vllm/a.py": dirty}, [("vllm/0001-a.patch", data)])
    assert reports["vllm/0001-a.patch"].findings == ()


def test_unformatted_result_is_reported_unless_it_was_before(tmp_path: Path) -> None:
    ugly = CLEAN + b"x = {  'a':1}\n"
    data = patch_bytes({"vllm/a.py": (CLEAN, ugly)}, subject="[Core] Ugly")
    reports = lint(tmp_path, {"vllm/a.py": CLEAN}, [("vllm/0001-a.patch", data)])
    assert ("vllm/a.py", "format") in rules(reports["vllm/0001-a.patch"])
    again = patch_bytes({"vllm/a.py": (ugly, ugly + b"y = 1\n")}, subject="[Core] Keep")
    reports = lint(tmp_path / "2", {"vllm/a.py": ugly}, [("vllm/0001-a.patch", again)])
    report = reports["vllm/0001-a.patch"]
    assert report.findings == ()
    assert any("not ruff-formatted before" in n for n in report.notes)


def test_later_patch_is_linted_on_top_of_earlier_ones(tmp_path: Path) -> None:
    one = CLEAN + b"import os\n"
    p1 = patch_bytes({"vllm/a.py": (CLEAN, one)}, subject="[Core] One")
    p2 = patch_bytes({"vllm/a.py": (one, one + b"B = os.sep\n")}, subject="[Core] Two")
    reports = lint(
        tmp_path, {"vllm/a.py": CLEAN}, [("vllm/0001-a.patch", p1), ("vllm/0002-b.patch", p2)]
    )
    assert ("vllm/a.py", "ruff:F401") in rules(reports["vllm/0001-a.patch"])
    assert ("vllm/a.py", "ruff:F401") not in rules(reports["vllm/0002-b.patch"])


@pytest.mark.parametrize(
    "content, problem",
    [
        (CLEAN, False),
        (b"", False),
        (b"VALUE = 1\n", True),
        (SPDX.split(b"\n")[0] + b"\nVALUE = 1\n", True),
        (b"#!/usr/bin/env python\n" + CLEAN, False),
    ],
)
def test_new_file_needs_both_spdx_lines(tmp_path: Path, content: bytes, problem: bool) -> None:
    assert (spdx_problem("vllm", "vllm/new.py", content) is not None) == problem
    data = patch_bytes({"vllm/new.py": (None, content)}, subject="[Core] New")
    report = lint(tmp_path, {}, [("vllm/0001-a.patch", data)])["vllm/0001-a.patch"]
    assert (("vllm/new.py", "spdx") in rules(report)) == problem


def test_spdx_is_not_required_of_markdown_or_other_targets() -> None:
    assert spdx_problem("vllm", "docs/x.md", b"text\n") is None
    assert spdx_problem("b12x", "b12x/x.py", b"x = 1\n") is None


def test_stray_print_on_added_library_lines_only(tmp_path: Path) -> None:
    base = CLEAN + b'print("kept")\n'
    post = base + b'print("debug")\nlogger_print = 1\nobj.print("x")  # method\n'
    post += b'print("ok")  # noqa: T201\nbreakpoint()\n'
    test_post = SPDX + b'print("fine in tests")\n'
    data = patch_bytes(
        {"vllm/a.py": (base, post), "tests/test_a.py": (None, test_post)}, subject="[Core] P"
    )
    report = lint(tmp_path, {"vllm/a.py": base}, [("vllm/0001-a.patch", data)])["vllm/0001-a.patch"]
    prints = sorted((f.line, f.message) for f in report.findings if f.rule == "debug-print")
    assert prints == [(7, "stray print() call"), (11, "stray breakpoint() call")]


def test_added_lines_and_debug_calls_helpers() -> None:
    assert added_lines(b"a\nb\n", b"a\nx\nb\n") == {2}
    assert added_lines(None, b"a\n") == {1}
    assert debug_calls(b"import pdb\npdb.set_trace()\n", {2}) == [(2, "set_trace")]


def test_header_problems_are_findings(tmp_path: Path) -> None:
    data = patch_bytes(
        {"vllm/a.py": (CLEAN, CLEAN + b"B = 2\n")}, subject="No tag", description="Why."
    )
    report = lint(tmp_path, {"vllm/a.py": CLEAN}, [("vllm/0001-a.patch", data)])[
        "vllm/0001-a.patch"
    ]
    messages = [f.message for f in report.findings if f.rule == "header"]
    assert any("'[Tag] Title'" in m for m in messages)
    assert any("Test Plan" in m for m in messages)


def test_cli_lint_exit_code_and_findings(tmp_path: Path, capsys) -> None:
    from patchset.cli import main

    root, tree = tmp_path / "repo", tmp_path / "base"
    write_tree(tree, {"pyproject.toml": PYPROJECT, "vllm/a.py": CLEAN})
    bad = patch_bytes({"vllm/a.py": (CLEAN, CLEAN + b"import os\n")}, subject="[Core] Bad")
    good = patch_bytes({"vllm/b.py": (None, CLEAN)}, subject="[Core] Good")
    write_tree(root, {"patches/vllm/0001-bad.patch": bad, "patches/vllm/0002-good.patch": good})
    (root / "series").write_text("vllm/0001-bad.patch\nvllm/0002-good.patch\n")
    base = ["--base", f"vllm={tree}"]
    assert main(["-C", str(root), "lint", *base]) == 1
    printed = capsys.readouterr().out
    assert "FAIL vllm/0001-bad.patch" in printed and "ruff:F401" in printed
    assert "OK   vllm/0002-good.patch" in printed
    assert main(["-C", str(root), "lint", "vllm/0002-good.patch", *base]) == 0


@pytest.mark.parametrize(
    ("rev_line", "expected"),
    [
        ("rev: v0.14.0", "0.14.0"),
        ("rev: f368fb366ff7f2f808dd324b83a6d32267799e19  # frozen: v0.17.2", "0.17.2"),
        ("rev: 1368fb366ff7f2f808dd324b83a6d32267799e19  # frozen: v0.17.2", "0.17.2"),
        ("rev: f368fb366ff7f2f808dd324b83a6d32267799e19", None),
    ],
)
def test_pinned_ruff_version_reads_a_tag_or_a_frozen_sha(
    tmp_path: Path, rev_line: str, expected: str | None
) -> None:
    (tmp_path / ".pre-commit-config.yaml").write_text(
        "repos:\n- repo: https://github.com/astral-sh/ruff-pre-commit\n"
        f"  {rev_line}\n  hooks:\n  - id: ruff-check\n"
    )
    assert pinned_ruff_version(tmp_path) == expected
