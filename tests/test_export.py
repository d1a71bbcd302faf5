"""export: upstream mboxes, PR bodies, the standalone check and the CPU test runner."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest
from conftest import CONTRIBUTOR, SIGNED, patch_bytes, write_tree
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from patchset.export import (
    OverlayTestRunner,
    TestRun,
    check_standalone,
    export_patches,
    export_problems,
    mbox_bytes,
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

    def runner(tree: Path, changed: Sequence[str], tests: Sequence[str]) -> TestRun:
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


def test_runner_reports_a_module_skipped_on_cpu_as_not_run(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    skipped = b'import pytest\n\npytest.skip("CUDA required", allow_module_level=True)\n'
    write_tree(tree, {"vllm/__init__.py": b"", "tests/test_gpu.py": skipped})
    runner = OverlayTestRunner(workdir=tmp_path, installed=fake_install(tmp_path))
    run = runner(tree, [], ["tests/test_gpu.py"])
    assert run.ok is None and run.summary == "not run on CPU: CUDA required"


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
