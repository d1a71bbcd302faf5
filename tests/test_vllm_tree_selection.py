"""Which vLLM-tree tests ``tests/vllm_tree_tests.py run`` runs: a test module a patch adds runs
whole; an upstream module a patch adds tests to runs with the ``-k`` of the Test Plans of the
patches that touch it (the rest of it is upstream's, compared with the stock baseline by
``upstream_tests.py``)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from conftest import load_tree_tests, patch_bytes, write_tree


def _plan(command: str) -> str:
    return f"Purpose: x.\n\nTest Plan:\n  {command}\n\nTest Result: 1 passed"


UPSTREAM = b"def test_upstream():\n    pass\n"


def _series(root: Path, tree: Path) -> None:
    """0001 adds tests/test_new.py; 0002 and 0003 add tests to the upstream tests/test_cfg.py
    (with -k) and 0003 also touches tests/test_both.py, which 0001 touches without -k."""
    patches = {
        "vllm/0001-a.patch": patch_bytes(
            {
                "tests/test_new.py": (None, b"def test_new():\n    pass\n"),
                "tests/test_both.py": (UPSTREAM, UPSTREAM + b"\n\ndef test_b():\n    pass\n"),
            },
            subject="[PATCH] [Core] A",
            description=_plan("pytest tests/test_new.py tests/test_both.py -q"),
        ),
        "vllm/0002-b.patch": patch_bytes(
            {"tests/test_cfg.py": (UPSTREAM, UPSTREAM + b"\n\ndef test_nvfp4():\n    pass\n")},
            subject="[PATCH] [Core] B",
            description=_plan("pytest tests/test_cfg.py -q -k nvfp4"),
        ),
        "vllm/0003-c.patch": patch_bytes(
            {
                "tests/test_cfg.py": (UPSTREAM, UPSTREAM + b"\n\ndef test_head():\n    pass\n"),
                "tests/test_both.py": (UPSTREAM, UPSTREAM + b"\n\ndef test_c():\n    pass\n"),
                "tests/test_gone.py": (UPSTREAM, None),
            },
            subject="[PATCH] [Core] C",
            description=_plan(
                "pytest tests/test_cfg.py tests/test_both.py -k 'head and not slow'"
                "; pytest tests/test_cfg.py -k gpu_only  # GPU"
            ),
        ),
    }
    (root / "patches" / "vllm").mkdir(parents=True)
    for name, data in patches.items():
        (root / "patches" / name).write_bytes(data)
    (root / "series").write_text("".join(f"{name}\n" for name in patches))
    write_tree(
        tree,
        {
            "tests/test_new.py": b"",
            "tests/test_both.py": b"",
            "tests/test_cfg.py": b"",
            "pyproject.toml": b"",
        },
    )


def test_selection_follows_the_test_plans(tmp_path: Path) -> None:
    mod = load_tree_tests("vllm_tree_tests_selection")
    root, tree = tmp_path / "repo", tmp_path / "tree"
    _series(root, tree)
    assert mod.series_test_selection(root, tree) == {
        "tests/test_both.py": None,  # 0001 runs it whole
        "tests/test_cfg.py": "(nvfp4) or (head and not slow)",
        "tests/test_new.py": None,
    }


def test_run_issues_one_pytest_per_selection_and_fails_on_any(tmp_path: Path, monkeypatch) -> None:
    mod = load_tree_tests("vllm_tree_tests_selection")
    root, tree, venv = tmp_path / "repo", tmp_path / "tree", tmp_path / "venv"
    _series(root, tree)
    venv.mkdir()
    (venv / mod.MARKER).write_text(json.dumps({"filename": "vllm-x.whl"}))
    calls: list[list[str]] = []
    codes = iter([0, 5])  # the selected run finds no test: pytest's 5

    def fake_run(cmd, **kwargs):
        calls.append(cmd[cmd.index("--timeout=900") + 1 :])
        return subprocess.CompletedProcess(cmd, next(codes))

    monkeypatch.setattr(mod.subprocess, "run", fake_run)
    monkeypatch.setattr(mod, "hub_offline_env", lambda: {})
    assert mod.run_tests(root, tree, venv, []) == 5
    assert calls == [
        ["tests/test_both.py", "tests/test_new.py"],
        ["-k", "(nvfp4) or (head and not slow)", "tests/test_cfg.py"],
    ]
