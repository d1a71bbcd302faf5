"""lint runs the base's own pre-commit hooks (local Python ones) on each patch's state."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from conftest import patch_bytes, write_tree
from patchset.errors import ExternalToolError, PatchsetError
from patchset.lint import lint_patches
from patchset.precommit import Hook, check_patch, hook_env, hook_tree, load_config
from patchset.series import load_series

SPDX = (
    b"# SPDX-License-Identifier: Apache-2.0\n"
    b"# SPDX-FileCopyrightText: Copyright contributors to the vLLM project\n"
)
CLEAN = SPDX + b'"""A module."""\n\nVALUE = 1\n'
PYPROJECT = b'[tool.ruff]\nline-length = 88\n\n[tool.ruff.lint]\nselect = ["E", "F"]\n'

# A checker in the base's own style: one error line per offending file, exit 1 if any.
FORBID = b"""import sys

bad = 0
for path in sys.argv[1:]:
    for number, line in enumerate(open(path, encoding="utf-8"), 1):
        if "FORBIDDEN" in line:
            print(f"{path}:{number}: error: FORBIDDEN found")
            bad = 1
sys.exit(bad)
"""
# A checker that needs no file arguments and reads the git index, like check_dockerignore_tracked.
TRACKED = b"""import subprocess, sys

files = subprocess.run(["git", "ls-files"], capture_output=True, text=True).stdout.split()
stray = [f for f in files if f.endswith(".tmp")]
for f in stray:
    print(f"error: {f} is tracked")
sys.exit(1 if stray else 0)
"""
# A formatter-like hook: it rewrites a file that holds REWRITE_ME (pre-commit fails it then).
REWRITE = b"""import sys

for path in sys.argv[1:]:
    text = open(path, encoding="utf-8").read()
    if "REWRITE_ME" in text:
        open(path, "w", encoding="utf-8").write(text.replace("REWRITE_ME", "rewritten"))
"""
MISSING = b"import not_a_module_anywhere\n"

CONFIG = b"""exclude: 'vllm/third_party/.*'
repos:
- repo: https://github.com/astral-sh/ruff-pre-commit
  rev: v0.14.0
  hooks:
  - id: ruff-check
- repo: local
  hooks:
  - id: check-forbidden
    name: no FORBIDDEN
    entry: python tools/pre_commit/forbid.py
    language: python
    types: [python]
  - id: check-tracked
    name: no tracked .tmp
    entry: python tools/pre_commit/tracked.py
    language: python
    pass_filenames: false
  - id: mypy
    entry: python tools/pre_commit/mypy.py "3.11"
    language: python
    types_or: [python, pyi]
    additional_dependencies: ["mypy==1.20.2", regex]
  - id: docs-tool
    entry: python tools/pre_commit/docs.py
    language: python
    types: [markdown]
    additional_dependencies: [regex, PyYAML]
  - id: png-lint
    entry: tools/pre_commit/png-lint.sh
    language: script
    types: [png]
"""
HOOKS = {
    "tools/pre_commit/forbid.py": FORBID,
    "tools/pre_commit/tracked.py": TRACKED,
    "tools/pre_commit/mypy.py": b"import sys\nsys.exit(0)\n",
    "tools/pre_commit/docs.py": b"import sys\nsys.exit(0)\n",
}


def lint(tmp_path: Path, base: dict[str, bytes], patches: list[tuple[str, bytes]], **kw):
    root, tree = tmp_path / "repo", tmp_path / "base"
    write_tree(
        tree,
        {"pyproject.toml": PYPROJECT, ".pre-commit-config.yaml": CONFIG, **HOOKS, **base},
    )
    (root / "patches" / "vllm").mkdir(parents=True)
    for name, data in patches:
        (root / "patches" / name).write_bytes(data)
    (root / "series").write_text("".join(f"{n}\n" for n, _ in patches))
    series = load_series(root)
    reports = lint_patches(series, series, {"vllm": tree}, workdir=tmp_path, **kw)
    return {r.patch: r for r in reports}


def hook_findings(report) -> list[tuple[str, str, str]]:
    return sorted(
        (f.path, f.rule, f.message) for f in report.findings if f.rule.startswith("pre-commit:")
    )


def test_config_keeps_local_python_hooks_and_names_what_it_does_not_run() -> None:
    config = load_config(CONFIG.decode())
    assert [h.id for h in config.hooks] == ["check-forbidden", "check-tracked", "mypy", "docs-tool"]
    assert config.exclude == "vllm/third_party/.*"
    forbid, tracked, mypy, _docs = config.hooks
    assert forbid.argv == ("python", "tools/pre_commit/forbid.py")
    assert tracked.pass_filenames is False
    assert mypy.argv == ("python", "tools/pre_commit/mypy.py", "3.11")
    assert config.not_run == ("png-lint (language script)",)
    # one environment for all hooks: the union of their additional_dependencies
    assert config.requirements == ("PyYAML", "mypy==1.20.2", "regex")


@pytest.mark.parametrize(
    ("hook", "path", "selected"),
    [
        (Hook("h", ("python",), types=("python",)), "vllm/a.py", True),
        (Hook("h", ("python",), types=("python",)), "vllm/a.yaml", False),
        (Hook("h", ("python",), files="^vllm/"), "tests/a.py", False),
        (Hook("h", ("python",), files="^vllm/", exclude="_skip"), "vllm/a_skip.py", False),
        (Hook("h", ("python",), types_or=("python", "pyi")), "vllm/a.pyi", True),
        (Hook("h", ("python",), types_or=("rust",)), "vllm/a.py", False),
        (Hook("h", ("python",)), "vllm/third_party/x.py", False),  # the config's exclude
    ],
)
def test_hooks_select_paths_as_pre_commit_does(hook: Hook, path: str, selected: bool) -> None:
    assert hook.selects(path, global_exclude="vllm/third_party/.*") is selected


def test_a_hook_failure_the_patch_brings_is_a_finding(tmp_path: Path) -> None:
    bad = patch_bytes({"vllm/a.py": (CLEAN, CLEAN + b"X = 'FORBIDDEN'\n")}, subject="[Core] Bad")
    report = lint(tmp_path, {"vllm/a.py": CLEAN}, [("vllm/0001-a.patch", bad)])["vllm/0001-a.patch"]
    [(path, rule, message)] = hook_findings(report)
    assert (path, rule) == ("vllm/a.py", "pre-commit:check-forbidden")
    assert "vllm/a.py:6: error: FORBIDDEN found" in message
    ran = f"pre-commit hooks run ({sys.executable}): check-forbidden, check-tracked, mypy"
    assert any(ran in n for n in report.notes)
    assert any("not run: png-lint (language script)" in n for n in report.notes)


def test_a_failure_already_in_the_base_is_not_the_patchs(tmp_path: Path) -> None:
    dirty = CLEAN + b"X = 'FORBIDDEN'\n"
    same = patch_bytes({"vllm/a.py": (dirty, dirty + b"Y = 2\n")}, subject="[Core] Same")
    report = lint(tmp_path, {"vllm/a.py": dirty}, [("vllm/0001-a.patch", same)])[
        "vllm/0001-a.patch"
    ]
    assert hook_findings(report) == []
    assert any("check-forbidden fails before the patch too" in n for n in report.notes)


def test_a_patch_adding_to_a_failure_of_the_base_is_blamed_for_its_own_lines(
    tmp_path: Path,
) -> None:
    dirty = CLEAN + b"X = 'FORBIDDEN'\n"
    more = patch_bytes({"vllm/a.py": (dirty, dirty + b"Y = 'FORBIDDEN'\n")}, subject="[Core] More")
    report = lint(tmp_path, {"vllm/a.py": dirty}, [("vllm/0001-a.patch", more)])[
        "vllm/0001-a.patch"
    ]
    [(_path, _rule, message)] = hook_findings(report)
    assert message == "vllm/a.py:7: error: FORBIDDEN found"  # line 6 was there before


def test_each_patch_is_checked_on_the_state_the_series_gives_it(tmp_path: Path) -> None:
    """0001 adds the offending line; 0002 touches another file only and is clean; 0003
    changes the offending file again and, the line being there before it, adds nothing."""
    first = CLEAN + b"X = 'FORBIDDEN'\n"
    p1 = patch_bytes({"vllm/a.py": (CLEAN, first)}, subject="[Core] One")
    p2 = patch_bytes({"vllm/b.py": (CLEAN, CLEAN + b"Z = 3\n")}, subject="[Core] Two")
    p3 = patch_bytes({"vllm/a.py": (first, first + b"W = 4\n")}, subject="[Core] Three")
    reports = lint(
        tmp_path,
        {"vllm/a.py": CLEAN, "vllm/b.py": CLEAN},
        [("vllm/0001-a.patch", p1), ("vllm/0002-b.patch", p2), ("vllm/0003-c.patch", p3)],
    )
    assert [f[1] for f in hook_findings(reports["vllm/0001-a.patch"])] == [
        "pre-commit:check-forbidden"
    ]
    assert hook_findings(reports["vllm/0002-b.patch"]) == []
    assert hook_findings(reports["vllm/0003-c.patch"]) == []


def test_a_hook_without_filenames_sees_the_patchs_git_index(tmp_path: Path) -> None:
    tmp = patch_bytes({"vllm/stray.tmp": (None, b"x\n")}, subject="[Core] Stray")
    report = lint(tmp_path, {"vllm/a.py": CLEAN}, [("vllm/0001-a.patch", tmp)])["vllm/0001-a.patch"]
    [(path, rule, message)] = hook_findings(report)
    assert (path, rule) == ("vllm/stray.tmp", "pre-commit:check-tracked")
    assert message == "error: vllm/stray.tmp is tracked"


def test_a_hook_that_rewrites_a_file_fails_and_the_change_is_undone(tmp_path: Path) -> None:
    config = CONFIG.replace(b"tools/pre_commit/forbid.py", b"tools/pre_commit/rewrite.py")
    base = {".pre-commit-config.yaml": config, "tools/pre_commit/rewrite.py": REWRITE}
    post = CLEAN + b"Y = 'REWRITE_ME'\n"
    p1 = patch_bytes({"vllm/a.py": (CLEAN, post)}, subject="[Core] One")
    p2 = patch_bytes({"vllm/b.py": (CLEAN, CLEAN + b"Z = 3\n")}, subject="[Core] Two")
    reports = lint(
        tmp_path,
        {**base, "vllm/a.py": CLEAN, "vllm/b.py": CLEAN},
        [("vllm/0001-a.patch", p1), ("vllm/0002-b.patch", p2)],
    )
    [(path, rule, message)] = hook_findings(reports["vllm/0001-a.patch"])
    assert (path, rule) == ("vllm/a.py", "pre-commit:check-forbidden")
    assert message == "the hook changed vllm/a.py (reverted)"
    assert hook_findings(reports["vllm/0002-b.patch"]) == []
    # the scratch tree holds the patch's bytes again after the run
    write_tree(tmp_path / "b2", {**HOOKS, **base, "vllm/a.py": CLEAN})
    with hook_tree(tmp_path / "b2", sys.executable, tmp_path) as tree:
        runs = check_patch(tree, load_config(config.decode()), {"vllm/a.py": (CLEAN, post)})
        [run] = [r for r in runs if r.hook == "check-forbidden"]
        assert not run.ok and (tree.path / "vllm/a.py").read_bytes() == post


def test_a_hook_that_cannot_import_its_dependencies_is_an_error(tmp_path: Path) -> None:
    data = patch_bytes({"vllm/a.py": (CLEAN, CLEAN + b"Y = 2\n")}, subject="[Core] Ok")
    with pytest.raises(PatchsetError, match="check-forbidden cannot run with .*not_a_module"):
        lint(
            tmp_path,
            {"tools/pre_commit/forbid.py": MISSING, "vllm/a.py": CLEAN},
            [("vllm/0001-a.patch", data)],
        )


def test_without_a_hook_python_no_hook_runs(tmp_path: Path) -> None:
    bad = patch_bytes({"vllm/a.py": (CLEAN, CLEAN + b"X = 'FORBIDDEN'\n")}, subject="[Core] Bad")
    report = lint(tmp_path, {"vllm/a.py": CLEAN}, [("vllm/0001-a.patch", bad)], hooks_python=None)[
        "vllm/0001-a.patch"
    ]
    assert hook_findings(report) == []
    assert not any("pre-commit" in n for n in report.notes)


# A hook that calls a tool of its environment by name, as vLLM's mypy hook calls `mypy`.
WHICH = b"""import os, shutil, sys

print(shutil.which("hook-tool"), os.environ.get("VIRTUAL_ENV"))
"""


def test_a_hook_finds_the_tools_of_its_environment_on_path(tmp_path: Path) -> None:
    env = tmp_path / "env"
    (env / "bin").mkdir(parents=True)
    (env / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (env / "bin" / "python").symlink_to(sys.executable)
    tool = env / "bin" / "hook-tool"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    write_tree(tmp_path / "base", {"tools/which.py": WHICH, "vllm/a.py": CLEAN})
    with hook_tree(tmp_path / "base", str(env / "bin" / "python"), tmp_path) as tree:
        ok, lines = tree.run(Hook("which", ("python", "tools/which.py")), ["vllm/a.py"])
    assert ok and lines == (f"{tool} {env}",)


def test_the_hook_environment_is_made_once_and_remade_when_half_made(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    with pytest.raises(PatchsetError, match="not made and --offline forbids pip"):
        hook_env(cache, (), offline=True)
    python = Path(hook_env(cache, ()))
    env = python.parent.parent
    assert (env / "pyvenv.cfg").is_file()
    sentinel = env / "sentinel"
    sentinel.write_text("x")
    assert Path(hook_env(cache, (), offline=True)) == python and sentinel.exists()  # reused
    (env / ".patchset-hook-env").unlink()  # as a killed run leaves it
    assert Path(hook_env(cache, ())) == python and not sentinel.exists()  # made again
    # other requirements are another environment
    with pytest.raises(PatchsetError, match="not made"):
        hook_env(cache, ("regex",), offline=True)


def test_a_failed_install_leaves_no_environment_that_counts_as_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "no-wheels"))
    cache = tmp_path / "cache"
    with pytest.raises(ExternalToolError, match="making the pre-commit hooks' environment failed"):
        hook_env(cache, ("not-a-package-anywhere==0",))
    with pytest.raises(PatchsetError, match="not made"):
        hook_env(cache, ("not-a-package-anywhere==0",), offline=True)
