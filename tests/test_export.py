"""export: upstream mboxes, PR bodies, the standalone check and the CPU test runner."""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest
from conftest import CONTRIBUTOR, SIGNED, git, patch_bytes, write_tree
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from patchset.export import (
    OverlayTestRunner,
    TestRun,
    body_words,
    check_record,
    check_standalone,
    checkout_revision,
    export_patches,
    export_problems,
    mbox_bytes,
    plan_selections,
    plan_test_paths,
    pr_body,
    signer_identity,
    split_description,
    subject_problem,
    table,
    upstream_subject,
)
from patchset.gitops import ScratchRepo
from patchset.series import load_series, parse_patch

LINES = b"".join(b"line %d\n" % i for i in range(1, 41))
DESCRIPTION = (
    "Purpose: make line 5 right.\n\nWhat: one line.\n\n"
    "Test Plan: python -m pytest -q tests/test_a.py\n\nTest Result: 3 passed"
)


def write_repo(root: Path, base: Path, base_files: dict[str, bytes], patches) -> None:
    """A dcp-series checkout with ``patches`` [(name, bytes)] listed in order."""
    write_tree(base, base_files)
    (root / "patches" / "vllm").mkdir(parents=True, exist_ok=True)
    for name, data in patches:
        (root / "patches" / name).parent.mkdir(parents=True, exist_ok=True)
        (root / "patches" / name).write_bytes(data)
    (root / "series").write_text("".join(f"{name}\n" for name, _ in patches))


def mboxes_for(root: Path) -> dict[str, bytes]:
    patches = load_series(root)
    return {p.name: mbox_bytes(p, (root / "patches" / p.name).read_bytes()) for p in patches}


def test_mbox_drops_series_trailers_and_keeps_signoff_and_diff() -> None:
    data = patch_bytes(
        {"a.py": (LINES, LINES.replace(b"line 5\n", b"five\n"))},
        subject="[PATCH] [Model] Fix five",
        depends=("vllm/0001-x.patch",),
        description=DESCRIPTION,
    )
    patch, problems = parse_patch("vllm/0002-y.patch", data)
    assert patch is not None, problems
    mbox = mbox_bytes(patch, data)
    assert b"Upstream-Status:" not in mbox and b"Depends-on:" not in mbox
    assert f"Signed-off-by: {SIGNED}\n---\n".encode() in mbox
    assert mbox.endswith(data[data.index(b"diff --git") :])


@pytest.mark.parametrize(
    "subject, ok",
    [
        ("[PATCH] [Model] Derive x", True),
        ("[Bugfix][Kernel] Fix y", True),
        ("[PATCH v2 3/7] [Spec Decode] Z", True),
        ("Fix y", False),
        ("[Model]Fix y", False),
        ("[PATCH] Fix y", False),
        ("[] Fix", False),
    ],
)
def test_subject_must_be_tag_then_title(subject: str, ok: bool) -> None:
    assert (subject_problem(subject) is None) == ok


def test_upstream_subject_strips_only_the_patch_prefix() -> None:
    assert upstream_subject("[PATCH] [Model] X") == "[Model] X"
    assert upstream_subject("[Model] X") == "[Model] X"


def test_description_splits_into_pr_template_sections() -> None:
    parts = split_description(DESCRIPTION)
    assert parts.purpose == "make line 5 right.\n\nWhat: one line."
    assert parts.test_plan == "python -m pytest -q tests/test_a.py"
    assert parts.test_result == "3 passed"


def test_pr_body_names_the_tests_and_dependencies() -> None:
    data = patch_bytes(
        {"tests/test_a.py": (None, b"def test_a():\n    pass\n"), "a.py": (LINES, LINES + b"x\n")},
        subject="[PATCH] [Model] Fix five",
        description=DESCRIPTION,
    )
    patch, _ = parse_patch("vllm/0002-y.patch", data)
    assert patch is not None
    body = pr_body(patch, ("vllm/0001-x.patch",))
    for needle in (
        "# [Model] Fix five",
        "## Purpose\n\nmake line 5 right.",
        "## Test Plan\n\npython -m pytest -q tests/test_a.py",
        "- `tests/test_a.py`",
        "## Test Result\n\n3 passed",
        "This PR builds on: `vllm/0001-x.patch`",
    ):
        assert needle in body


def test_export_problems_name_each_missing_piece() -> None:
    data = patch_bytes(
        {"a.py": (LINES, LINES + b"x\n")}, subject="[PATCH] Fix", description="Only why."
    )
    patch, _ = parse_patch("vllm/0001-x.patch", data)
    assert patch is not None
    problems = export_problems(patch)
    assert any("'[Tag] Title'" in p for p in problems)
    assert any("Test Plan" in p for p in problems)
    assert any("Test Result" in p for p in problems)


@pytest.mark.parametrize(("purpose_words", "too_long"), [(288, False), (289, True)])
def test_a_pr_body_over_300_words_is_a_problem(purpose_words: int, too_long: bool) -> None:
    """Title (3 words), 'Purpose:' (1), the purpose, 'Test Plan: pytest tests/test_a.py' (4),
    'Test Result: 3 passed' (4): 300 words pass, 301 do not; the trailers do not count."""
    description = (
        "Purpose: "
        + " ".join(["word"] * purpose_words)
        + "\n\nTest Plan: pytest tests/test_a.py\n\nTest Result: 3 passed\n"
    )
    data = patch_bytes(
        {"a.py": (LINES, LINES + b"x\n")},
        subject="[PATCH] [Core] Fix it",
        description=description,
    )
    patch, _ = parse_patch("vllm/0001-x.patch", data)
    assert patch is not None
    assert body_words(patch) == 3 + 1 + purpose_words + 4 + 4
    over = [p for p in export_problems(patch) if "words, over 300" in p]
    assert bool(over) is too_long


def two_patch_repo(tmp_path: Path, *, declare: bool) -> tuple[Path, Path]:
    """0001 changes line 5; 0002 changes the line 0001 wrote (declared or not)."""
    post1 = LINES.replace(b"line 5\n", b"line five\n")
    post2 = post1.replace(b"line five\n", b"line FIVE\n")
    p1 = patch_bytes({"a.py": (LINES, post1)}, subject="[PATCH] [Core] One")
    p2 = patch_bytes(
        {"a.py": (post1, post2)},
        subject="[PATCH] [Core] Two",
        depends=("vllm/0001-one.patch",) if declare else (),
    )
    p3 = patch_bytes({"b.py": (LINES, LINES + b"end\n")}, subject="[PATCH] [Core] Three")
    root, base = tmp_path / "repo", tmp_path / "base"
    write_repo(
        root,
        base,
        {"a.py": LINES, "b.py": LINES},
        [("vllm/0001-one.patch", p1), ("vllm/0002-two.patch", p2), ("vllm/0003-three.patch", p3)],
    )
    return root, base


@pytest.mark.parametrize("declare", [True, False])
def test_standalone_check_reports_needed_dependencies(tmp_path: Path, declare: bool) -> None:
    root, base = two_patch_repo(tmp_path, declare=declare)
    patches = load_series(root)
    results = check_standalone(
        patches, patches, mboxes_for(root), {"vllm": base}, tmp_path / "work"
    )
    verdicts = {r.name: (r.verdict, r.needs) for r in results}
    assert verdicts["vllm/0001-one.patch"] == ("ok", ())
    assert verdicts["vllm/0003-three.patch"] == ("ok", ())
    if declare:
        assert verdicts["vllm/0002-two.patch"] == ("ok", ())
    else:
        assert verdicts["vllm/0002-two.patch"] == ("needs", ("vllm/0001-one.patch",))
    rendered = "\n".join(table(results))
    assert ("needs vllm/0001-one.patch" in rendered) != declare


def test_standalone_check_reports_a_patch_that_applies_nowhere(tmp_path: Path) -> None:
    bad = patch_bytes({"a.py": (b"not the base\n", b"x\n")}, subject="[PATCH] [Core] Bad")
    root, base = tmp_path / "repo", tmp_path / "base"
    write_repo(root, base, {"a.py": LINES}, [("vllm/0001-bad.patch", bad)])
    patches = load_series(root)
    [result] = check_standalone(patches, patches, mboxes_for(root), {"vllm": base}, tmp_path / "w")
    assert result.verdict == "fails" and not result.passed
    assert "does not apply" in result.describe()


def test_check_runs_the_patch_tests_against_the_changed_files(tmp_path: Path) -> None:
    """The runner sees base + this patch, and every series path (for a series-patched install)."""
    data = patch_bytes(
        {
            "vllm/mod.py": (b"VALUE = 1\n", b"VALUE = 2\n"),
            "tests/test_mod.py": (None, b"def test_value():\n    pass\n"),
        },
        subject="[PATCH] [Core] Two",
    )
    other = patch_bytes({"vllm/other.py": (b"O = 1\n", b"O = 3\n")}, subject="[PATCH] [Core] O")
    root, base = tmp_path / "repo", tmp_path / "base"
    write_repo(
        root,
        base,
        {"vllm/mod.py": b"VALUE = 1\n", "vllm/other.py": b"O = 1\n"},
        [("vllm/0001-two.patch", data), ("vllm/0002-other.patch", other)],
    )
    patches = load_series(root)
    calls = []

    def runner(
        tree: Path, changed: Sequence[str], tests: Sequence[str], keyword: str | None = None
    ) -> TestRun:
        assert keyword is None
        files = {p: (tree / p).read_bytes() for p in changed}
        calls.append((files, list(tests)))
        return TestRun(tuple(tests), True, "1 passed in 0.01s")

    first, second = check_standalone(
        patches, patches, mboxes_for(root), {"vllm": base}, tmp_path / "w", run_tests=runner
    )
    assert calls == [
        (
            {
                "tests/test_mod.py": b"def test_value():\n    pass\n",
                "vllm/mod.py": b"VALUE = 2\n",
                "vllm/other.py": b"O = 1\n",
            },
            ["tests/test_mod.py"],
        )
    ]
    assert first.passed and first.tests and first.tests.summary == "1 passed in 0.01s"
    assert second.passed and second.tests is None


SELECTING_PLAN = (
    "Purpose: two.\n\nTest Plan:\n"
    "  TRITON_INTERPRET=1 pytest tests/test_a.py \\\n"
    "    tests/test_b.py -q -k 'x and not y'\n"
    "  pytest tests/test_c.py -q; pytest tests/test_d.py -k gpu_only  # GPU (not run)\n"
    "  pytest tests/test_e.py -k=e_only  # CPU\n"
    "\nTest Result: 3 passed"
)


def test_plan_selections_take_each_cpu_commands_keyword() -> None:
    data = patch_bytes(
        {"vllm/mod.py": (b"V = 1\n", b"V = 2\n")},
        subject="[PATCH] [Core] Two",
        description=SELECTING_PLAN,
    )
    patch, problems = parse_patch("vllm/0001-two.patch", data)
    assert patch is not None, problems
    assert plan_selections(patch) == {
        "tests/test_a.py": "x and not y",
        "tests/test_b.py": "x and not y",
        "tests/test_e.py": "e_only",
    }


def test_standalone_runs_the_test_plans_selection_apart(tmp_path: Path) -> None:
    """A test module the Test Plan runs with ``-k`` runs with it; the others run whole; one
    failing selection fails the patch's tests."""
    data = patch_bytes(
        {
            "vllm/mod.py": (b"V = 1\n", b"V = 2\n"),
            "tests/test_a.py": (None, b"def test_x():\n    pass\n"),
            "tests/test_c.py": (None, b"def test_c():\n    pass\n"),
        },
        subject="[PATCH] [Core] Two",
        description=SELECTING_PLAN,
    )
    root, base = tmp_path / "repo", tmp_path / "base"
    write_repo(root, base, {"vllm/mod.py": b"V = 1\n"}, [("vllm/0001-two.patch", data)])
    patches = load_series(root)
    calls = []

    def runner(
        tree: Path, changed: Sequence[str], tests: Sequence[str], keyword: str | None = None
    ) -> TestRun:
        calls.append((list(tests), keyword))
        ok = keyword is None
        return TestRun(tuple(tests), ok, "1 passed" if ok else "1 failed", ("boom",), 1.0)

    (result,) = check_standalone(
        patches, patches, mboxes_for(root), {"vllm": base}, tmp_path / "w", run_tests=runner
    )
    assert calls == [(["tests/test_a.py"], "x and not y"), (["tests/test_c.py"], None)]
    assert result.tests is not None and result.tests.ok is False and not result.passed
    assert result.tests.selections == (("tests/test_a.py", "x and not y"),)
    assert result.tests.summary == "-k 'x and not y': 1 failed; 1 passed"
    assert result.tests.output_tail == ("boom",) and result.tests.seconds == 2.0


def test_standalone_runs_each_targets_tests_with_its_runner(tmp_path: Path) -> None:
    """Runners given per target: the b12x patch's tests run with the b12x runner, the vLLM
    patch's with the vLLM one, and --require-tests holds for both targets."""
    vllm_patch = patch_bytes(
        {
            "vllm/mod.py": (b"V = 1\n", b"V = 2\n"),
            "tests/test_mod.py": (None, b"def test_v():\n    pass\n"),
        },
        subject="[PATCH] [Core] V",
    )
    b12x_patch = patch_bytes(
        {
            "b12x/comm.py": (b"C = 1\n", b"C = 2\n"),
            "tests/test_comm.py": (None, b"def test_c():\n    pass\n"),
        },
        subject="[PATCH] [Comm] C",
    )
    b12x_bare = patch_bytes({"b12x/comm.py": (b"C = 1\n", b"C = 3\n")}, subject="[PATCH] [Comm] D")
    root, base, b12x_base = tmp_path / "repo", tmp_path / "base", tmp_path / "b12x-base"
    write_repo(
        root,
        base,
        {"vllm/mod.py": b"V = 1\n"},
        [
            ("vllm/0001-v.patch", vllm_patch),
            ("b12x/0001-c.patch", b12x_patch),
            ("b12x/0002-d.patch", b12x_bare),
        ],
    )
    write_tree(b12x_base, {"b12x/comm.py": b"C = 1\n"})
    patches = load_series(root)
    calls: dict[str, list[tuple[bytes, list[str]]]] = {"vllm": [], "b12x": []}

    def runner_for(target: str):
        def runner(tree, changed, tests, keyword=None) -> TestRun:
            source = tree / ("vllm/mod.py" if target == "vllm" else "b12x/comm.py")
            calls[target].append((source.read_bytes(), list(tests)))
            return TestRun(tuple(tests), True, "1 passed")

        return runner

    results = check_standalone(
        patches,
        patches,
        mboxes_for(root),
        {"vllm": base, "b12x": b12x_base},
        tmp_path / "w",
        run_tests={"vllm": runner_for("vllm"), "b12x": runner_for("b12x")},
        require_tests=True,
    )
    assert calls == {
        "vllm": [(b"V = 2\n", ["tests/test_mod.py"])],
        "b12x": [(b"C = 2\n", ["tests/test_comm.py"])],
    }
    assert [r.passed for r in results] == [True, True, False]
    assert any("adds or changes no test module" in p for p in results[2].problems)


def fake_install(tmp_path: Path) -> Path:
    site = tmp_path / "site"
    write_tree(
        site, {"vllm/__init__.py": b"", "vllm/mod.py": b"VALUE = 1\n", "vllm/data.bin": b"d"}
    )
    return site / "vllm"


TEST_MOD = b"""import vllm.mod


def test_patched_value_and_overlay():
    assert vllm.mod.VALUE == 2
    assert "overlay" in vllm.mod.__file__
"""


@pytest.mark.parametrize("patched", [True, False])
def test_overlay_runner_imports_the_patched_package(tmp_path: Path, patched: bool) -> None:
    tree = tmp_path / "tree"
    write_tree(
        tree,
        {
            "vllm/__init__.py": b"",
            "vllm/mod.py": b"VALUE = 2\n",
            "tests/__init__.py": b"",
            "tests/test_mod.py": TEST_MOD,
        },
    )
    runner = OverlayTestRunner(
        python=sys.executable, workdir=tmp_path, installed=fake_install(tmp_path), timeout_s=300
    )
    changed = ["vllm/mod.py", "tests/test_mod.py"] if patched else []
    run = runner(tree, changed, ["tests/test_mod.py"])
    assert run.ok is patched, run.output_tail
    assert ("1 passed" in run.summary) is patched


def test_overlay_runner_passes_the_keyword_and_fails_an_empty_selection(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    two = b"def test_kept():\n    pass\n\n\ndef test_dropped():\n    assert False\n"
    write_tree(tree, {"vllm/__init__.py": b"", "tests/test_two.py": two})
    runner = OverlayTestRunner(workdir=tmp_path, installed=fake_install(tmp_path), timeout_s=300)
    whole = runner(tree, [], ["tests/test_two.py"])
    kept = runner(tree, [], ["tests/test_two.py"], keyword="kept")
    none = runner(tree, [], ["tests/test_two.py"], keyword="no_such_test")
    assert whole.ok is False and "1 failed" in whole.summary
    assert kept.ok is True and "1 passed" in kept.summary and "1 deselected" in kept.summary
    assert none.ok is False and none.summary == "-k 'no_such_test' selects no test"


def test_runner_reports_a_module_skipped_on_cpu_as_not_run(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    skipped = b'import pytest\n\npytest.skip("CUDA required", allow_module_level=True)\n'
    write_tree(tree, {"vllm/__init__.py": b"", "tests/test_gpu.py": skipped})
    runner = OverlayTestRunner(workdir=tmp_path, installed=fake_install(tmp_path))
    run = runner(tree, [], ["tests/test_gpu.py"])
    assert run.ok is None and run.summary == "not run on CPU: CUDA required"


def test_overlay_runner_overlays_the_targets_package(tmp_path: Path) -> None:
    site = tmp_path / "site"
    write_tree(site, {"b12x/__init__.py": b"", "b12x/comm.py": b"C = 1\n"})
    tree = tmp_path / "tree"
    test = b"import b12x.comm\n\n\ndef test_c():\n    assert b12x.comm.C == 2\n"
    write_tree(tree, {"b12x/comm.py": b"C = 2\n", "tests/test_comm.py": test})
    runner = OverlayTestRunner(workdir=tmp_path, extra_path=str(site), package="b12x")
    missing = runner(tree, ["b12x/comm.py"], ["tests/test_comm.py"])
    assert missing.ok is None and missing.summary.endswith("has no b12x installed")
    runner = OverlayTestRunner(workdir=tmp_path, installed=site / "b12x", package="b12x")
    run = runner(tree, ["b12x/comm.py"], ["tests/test_comm.py"])
    assert run.ok is True and "1 passed" in run.summary, run.output_tail


def test_runner_without_vllm_reports_not_run(tmp_path: Path) -> None:
    runner = OverlayTestRunner(python=str(tmp_path / "no-such-python"))
    run = runner(tmp_path, [], ["tests/test_x.py"])
    assert run.ok is None and run.summary.startswith("not run")


def test_export_writes_mbox_and_pr_body_per_patch(tmp_path: Path) -> None:
    root, _ = two_patch_repo(tmp_path, declare=True)
    patches = load_series(root)
    out = export_patches(root, patches, patches, tmp_path / "out")
    assert [e.mbox.name for e in out] == [
        "0001-one.mbox",
        "0002-two.mbox",
        "0003-three.mbox",
    ]
    assert out[1].depends_on == ("vllm/0001-one.patch",)
    assert all(e.pr_body.read_text().startswith("# [Core] ") for e in out)


line_edits = st.lists(
    st.tuples(
        st.integers(0, 39),
        st.sampled_from(["replace", "insert", "delete"]),
        st.binary(min_size=0, max_size=12).map(
            lambda b: b.replace(b"\n", b" ").replace(b"\r", b" ") + b"\n"
        ),
    ),
    min_size=1,
    max_size=6,
)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(edits=line_edits, subject_tag=st.sampled_from(["Core", "Bugfix][Kernel", "Spec Decode"]))
def test_export_then_git_am_round_trips(tmp_path_factory, edits, subject_tag: str) -> None:
    """Any generated patch, exported, applies with git am to the base and gives its postimage."""
    tmp = tmp_path_factory.mktemp("rt")
    lines = LINES.splitlines(keepends=True)
    for at, kind, text in edits:
        at = min(at, len(lines))
        if kind == "insert" or not lines or at == len(lines):
            lines.insert(at, text)
        elif kind == "replace":
            lines[at] = text
        else:
            del lines[at]
    post = b"".join(lines)
    subject = f"[PATCH] [{subject_tag}] Generated"
    data = patch_bytes(
        {"a.py": (LINES, post)} if post != LINES else {"b.py": (None, b"b\n")}, subject=subject
    )
    patch, problems = parse_patch("vllm/0001-gen.patch", data)
    assert patch is not None, problems
    base = tmp / "base"
    write_tree(base, {"a.py": LINES})
    repo = ScratchRepo.create(tmp / "scratch")
    repo.import_tree(base, "base")
    result = repo.am(mbox_bytes(patch, data))
    assert result.ok, result.output
    assert repo.subject() == f"[{subject_tag}] Generated"
    assert "Signed-off-by: " in repo.message()
    if post != LINES:
        assert (repo.path / "a.py").read_bytes() == post


USER = CONTRIBUTOR


@pytest.fixture
def no_git_user() -> None:
    """No git identity: what ``hermetic_git_config`` gives every test, named where it matters."""


def test_mbox_signed_by_the_exporter_replaces_the_placeholder() -> None:
    data = patch_bytes({"a.py": (LINES, LINES + b"x\n")}, subject="[PATCH] [Model] Fix five")
    patch, problems = parse_patch("vllm/0001-y.patch", data)
    assert patch is not None, problems
    mbox = mbox_bytes(patch, data, USER).decode()
    assert f"From: {USER}\n" in mbox
    assert f"Signed-off-by: {USER}\n---\n" in mbox
    assert "example.invalid" not in mbox


def test_signer_identity_reads_git_config(tmp_path: Path, git_user: str) -> None:
    assert signer_identity(tmp_path) == git_user


def test_signer_identity_refuses_without_git_config_naming_the_command(
    tmp_path: Path, no_git_user: None
) -> None:
    from patchset.errors import PatchsetError

    with pytest.raises(PatchsetError) as err:
        signer_identity(tmp_path)
    assert "user.email" in str(err.value)
    assert "git config --global user.email" in (err.value.hint or "")


def test_exported_series_mbox_applies_with_git_am_signed_off_by_the_user(
    tmp_path: Path, git_user: str
) -> None:
    """The whole exported series, one mbox, through ``git am`` onto the base: every commit
    is the user's (author and DCO sign-off), none carries a series-only trailer."""
    root, base = two_patch_repo(tmp_path, declare=True)
    patches = load_series(root)
    export_patches(root, patches, patches, tmp_path / "out", signer=git_user)
    repo = ScratchRepo.create(tmp_path / "scratch")
    repo.import_tree(base, "base")
    result = repo.am((tmp_path / "out" / "vllm" / "series.mbox").read_bytes())
    assert result.ok, result.output
    import subprocess

    log = subprocess.run(
        ["git", "-C", str(repo.path), "log", "-3", "--format=%an <%ae>%n%B%n@@"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    commits = [c for c in log.split("@@") if c.strip()]
    assert len(commits) == 3
    for commit in commits:
        assert commit.strip().startswith(git_user)
        assert f"Signed-off-by: {git_user}" in commit
        assert "example.invalid" not in commit and "Upstream-Status" not in commit


def test_cli_export_refuses_without_a_git_identity(tmp_path: Path, capsys, no_git_user) -> None:
    from patchset.cli import main

    root, _ = two_patch_repo(tmp_path, declare=True)
    code = main(["-C", str(root), "export", "--to", str(tmp_path / "out")])
    printed = capsys.readouterr()
    assert code == 1
    assert "git config --global user.name" in printed.out + printed.err
    assert not (tmp_path / "out").exists()


def test_cli_export_check_prints_the_table_and_fails_on_a_needed_dependency(
    tmp_path: Path, capsys, git_user
) -> None:
    from patchset.cli import main

    root, base = two_patch_repo(tmp_path, declare=False)
    (root / "pins.toml").write_text("schema_version = 1\n")
    out = tmp_path / "out"
    code = main(
        [
            "-C",
            str(root),
            "export",
            "--check",
            "--no-tests",
            "--to",
            str(out),
            "--base",
            f"vllm={base}",
        ]
    )
    printed = capsys.readouterr().out
    assert code == 1
    assert "vllm/0002-two.patch" in printed and "needs vllm/0001-one.patch" in printed
    check = json.loads((out / "check.json").read_text())
    assert check["vllm/0002-two.patch"]["needs"] == ["vllm/0001-one.patch"]
    assert check["vllm/0001-one.patch"]["standalone"] == "standalone OK"
    assert sorted(p.name for p in (out / "vllm").iterdir())[:2] == [
        "0001-one.mbox",
        "0001-one.pr.md",
    ]


REPO = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_first_real_series_patch_applies_standalone_on_the_pinned_sdist(tmp_path: Path) -> None:
    """End to end on the real pinned vLLM sdist (from the fetch cache, offline)."""
    import os

    from patchset.errors import PatchsetError
    from patchset.fetch import pristine_tree
    from patchset.series import for_target, load_series

    try:
        base = pristine_tree("vllm", root=REPO, offline=True)
    except PatchsetError as exc:
        reason = f"pinned vLLM sdist not available offline ({exc.message}): run `make fetch`"
        if os.environ.get("PATCHSET_E2E") == "require":
            pytest.fail(reason)
        pytest.skip(reason)
    patch = for_target(load_series(REPO), "vllm")[0]
    data = (REPO / "patches" / patch.name).read_bytes()
    mboxes = {patch.name: mbox_bytes(patch, data)}
    [result] = check_standalone((patch,), (patch,), mboxes, {"vllm": base}, tmp_path)
    assert result.verdict == "ok" and result.passed, result.describe()
    assert result.tests is not None and result.tests.ok is None  # no runner: reported, not run
    own_tests = tuple(p for p in patch.paths if p.startswith("tests/") and p.endswith(".py"))
    assert set(result.tests.files) <= set(own_tests)


# -- issue 30: every patch standalone on the pinned base *with its tests* --------------------


def test_plan_test_paths_are_the_vllm_tree_tests_the_test_plan_names() -> None:
    description = (
        "Why.\n\nTest Plan: TRITON_INTERPRET=1 pytest tests/v1/a/test_x.py \\\n"
        "  tests/test_y.py -q; dcp-series proofs: pytest proofs/test_p.py "
        "evidence/tests/test_e.py tests/v1/a/test_x.py\n\nTest Result: 3 passed in tests/z.py"
    )
    data = patch_bytes({"a.py": (LINES, LINES + b"x\n")}, description=description)
    patch, problems = parse_patch("vllm/0001-a.patch", data)
    assert patch is not None, problems
    assert plan_test_paths(patch) == ("tests/v1/a/test_x.py", "tests/test_y.py")


def plan_repo(tmp_path: Path, *, declare: bool) -> tuple[Path, Path]:
    """0001 adds tests/test_one.py; 0002's Test Plan runs it too (declared or not)."""
    one = patch_bytes(
        {
            "a.py": (LINES, LINES.replace(b"line 5\n", b"five\n")),
            "tests/test_one.py": (None, b"def test_one():\n    pass\n"),
        },
        subject="[PATCH] [Core] One",
        description="Why.\n\nTest Plan: pytest tests/test_one.py\n\nTest Result: 1 passed",
    )
    two = patch_bytes(
        {
            "b.py": (LINES, LINES.replace(b"line 9\n", b"nine\n")),
            "tests/test_two.py": (None, b"def test_two():\n    pass\n"),
        },
        subject="[PATCH] [Core] Two",
        description="Why.\n\nTest Plan: pytest tests/test_two.py tests/test_one.py\n\n"
        "Test Result: 2 passed",
        depends=("vllm/0001-one.patch",) if declare else (),
    )
    bare = patch_bytes({"b.py": (LINES, LINES + b"end\n")}, subject="[PATCH] [Core] Bare")
    root, base = tmp_path / "repo", tmp_path / "base"
    write_repo(
        root,
        base,
        {"a.py": LINES, "b.py": LINES},
        [
            ("vllm/0001-one.patch", one),
            ("vllm/0002-two.patch", two),
            ("vllm/0003-bare.patch", bare),
        ],
    )
    return root, base


@pytest.mark.parametrize("declare", [True, False])
def test_a_test_plan_naming_a_test_another_patch_adds_is_not_standalone(
    tmp_path: Path, declare: bool
) -> None:
    root, base = plan_repo(tmp_path, declare=declare)
    patches = load_series(root)
    results = check_standalone(patches, patches, mboxes_for(root), {"vllm": base}, tmp_path / "w")
    two = {r.name: r for r in results}["vllm/0002-two.patch"]
    assert two.verdict == "ok"  # it applies alone: only its Test Plan needs 0001
    assert two.passed is declare
    if not declare:
        assert two.problems == (
            "tests/test_one.py (named by its Test Plan) is not in the base with only this patch "
            "and its Depends-on applied",
        )
        assert "tests/test_one.py (named by its Test Plan)" in "\n".join(table(results))


def test_require_tests_fails_a_patch_without_its_own_test_module(tmp_path: Path) -> None:
    root, base = plan_repo(tmp_path, declare=True)
    patches = load_series(root)
    mboxes = mboxes_for(root)
    loose = check_standalone(patches, patches, mboxes, {"vllm": base}, tmp_path / "a")
    strict = check_standalone(
        patches, patches, mboxes, {"vllm": base}, tmp_path / "b", require_tests=True
    )
    assert [r.passed for r in loose] == [True, True, True]
    assert [r.passed for r in strict] == [True, True, False]
    assert strict[2].problems == (
        "adds or changes no test module under tests/ (each patch brings its own)",
    )
    # only targets whose tests run are held to it
    other = check_standalone(
        patches,
        patches,
        mboxes,
        {"vllm": base},
        tmp_path / "c",
        require_tests=True,
        test_targets=("b12x",),
    )
    assert all(r.passed for r in other)


ENV_TEST = b"""import os

import vllm.mod


def test_env_and_patch():
    assert os.environ["DCP_EXPORT_CHECK_ENV"] == "on"
    assert vllm.mod.VALUE == 2
"""


def test_cli_export_check_json_records_base_python_env_and_verdicts(
    tmp_path: Path, capsys, git_user, monkeypatch
) -> None:
    import patchset.export as export
    from patchset.cli import main

    data = patch_bytes(
        {"vllm/mod.py": (b"VALUE = 1\n", b"VALUE = 2\n"), "tests/test_mod.py": (None, ENV_TEST)},
        subject="[PATCH] [Core] Value",
        description="Why.\n\nTest Plan: pytest tests/test_mod.py\n\nTest Result: 1 passed",
    )
    root, base = tmp_path / "repo", tmp_path / "base"
    write_repo(
        root,
        base,
        {"vllm/__init__.py": b"", "vllm/mod.py": b"VALUE = 1\n"},
        [("vllm/0001-value.patch", data)],
    )
    (root / "pins.toml").write_text("schema_version = 1\n")
    installed = fake_install(tmp_path)
    monkeypatch.setattr(export, "installed_package_dir", lambda *_a, **_k: installed)
    out = tmp_path / "out"
    argv = ["-C", str(root), "export", "--check", "--to", str(out), "--base", f"vllm={base}"]
    argv += ["--test-python", sys.executable, "--json", str(tmp_path / "r" / "check.json")]
    assert main([*argv, "--require-tests"]) == 1  # the test needs the environment variable
    failed = json.loads((tmp_path / "r" / "check.json").read_text())
    assert failed["summary"]["tests_failed"] == ["vllm/0001-value.patch"]
    assert failed["summary"]["passed"] is False
    assert main([*argv, "--require-tests", "--test-env", "DCP_EXPORT_CHECK_ENV=on"]) == 0
    record = json.loads((tmp_path / "r" / "check.json").read_text())
    assert record["schema_version"] == 1 and record["require_tests"] is True
    assert record["bases"] == {"vllm": {"tree": str(base.resolve()), "given": True}}
    assert record["tests"]["env"] == {"DCP_EXPORT_CHECK_ENV": "on"}
    assert record["tests"]["python"] == sys.executable
    [patch] = record["patches"]
    assert (patch["name"], patch["verdict"], patch["passed"]) == (
        "vllm/0001-value.patch",
        "ok",
        True,
    )
    assert patch["tests"]["ok"] is True and "1 passed" in patch["tests"]["summary"]
    assert patch["tests"]["seconds"] >= 0
    assert patch["sha256"] == hashlib.sha256(data).hexdigest()  # which patch file was checked
    assert record["git_revision"] is None  # this checkout is no git repository
    assert record["machine"]["cpus"] >= 1 and record["machine"]["python"]
    assert record["summary"]["tests_passed"] == 1 and record["summary"]["passed"] is True
    assert record["command"][:3] == ["patchset", "-C", str(root)]
    assert main([*argv, "--test-env", "NOT A PAIR"]) == 1
    assert "expected KEY=VALUE" in capsys.readouterr().err


def test_check_record_counts_each_outcome() -> None:
    from patchset.export import Standalone

    results = [
        Standalone("vllm/0001-a.patch", "ok", (), tests=TestRun(("tests/t.py",), True, "1 passed")),
        Standalone("vllm/0002-b.patch", "needs", (), needs=("vllm/0001-a.patch",)),
        Standalone("vllm/0003-c.patch", "ok", (), tests=TestRun(("tests/u.py",), None, "not run")),
        Standalone("vllm/0004-d.patch", "fails", (), problems=("git said no",)),
    ]
    record = check_record(
        results,
        bases={},
        tests=None,
        require_tests=False,
        command=[],
        seconds=1,
        patch_sha256={r.name: "0" * 64 for r in results},
        checkout={"git_revision": None, "series_uncommitted": None},
    )
    assert record["summary"] == {
        "patches": 4,
        "standalone_ok": 2,
        "needs": ["vllm/0002-b.patch"],
        "does_not_apply": ["vllm/0004-d.patch"],
        "tests_passed": 1,
        "tests_failed": [],
        "tests_not_run": ["vllm/0003-c.patch"],
        "without_tests": ["vllm/0002-b.patch", "vllm/0004-d.patch"],
        "passed": False,
    }


def test_checkout_revision_is_head_and_says_when_the_series_files_differ(tmp_path: Path) -> None:
    """The record names the revision the patches were read at, and says when ``series``,
    ``pins.toml`` or ``patches/`` hold uncommitted changes (a revision alone would then lie)."""
    assert checkout_revision(tmp_path) == {"git_revision": None, "series_uncommitted": None}
    write_tree(tmp_path, {"series": b"vllm/0001-a.patch\n", "patches/vllm/0001-a.patch": b"x\n"})
    (tmp_path / "README.md").write_text("docs\n")
    git(tmp_path, "init", "-q")
    git(tmp_path, "add", "-A")
    git(tmp_path, "commit", "-q", "-m", "series")
    head = git(tmp_path, "rev-parse", "HEAD").strip()
    assert checkout_revision(tmp_path) == {"git_revision": head, "series_uncommitted": False}
    (tmp_path / "README.md").write_text("other docs\n")  # not what the check reads
    assert checkout_revision(tmp_path)["series_uncommitted"] is False
    (tmp_path / "patches/vllm/0001-a.patch").write_bytes(b"y\n")
    assert checkout_revision(tmp_path) == {"git_revision": head, "series_uncommitted": True}
