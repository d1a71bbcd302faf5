# SPDX-License-Identifier: Apache-2.0
"""Every Python module under evidence/ imports, and every import of a project module names a file
that exists.

Two checks per module (``evidence/*.py``, ``gate/``, ``dev/``, ``tests/``, ``dev/tests/``):

* **imported**: ``importlib.import_module`` in a fresh interpreter, with the module's folder and
  evidence/ first on ``sys.path`` (as ``python evidence/<script>.py`` runs it). A module may only
  fail to import for a missing third-party distribution of ``THIRD_PARTY`` (torch, vLLM and
  Triton are in the test venv and on the GPU machines, not in the repository venv this suite
  runs in); any other error fails. The test files themselves are left to pytest, which imports
  each one to collect it (a collection error fails the suite).
* **resolved**: every ``import X`` and ``from X import name`` in its source, inside functions
  too (where the lab imports torch-dependent modules late, so the import above never reaches
  them), parsed with ``ast``: X must be a project module (a file or package under the module's
  folder, evidence/, evidence/dev, evidence/tests/support, tools/, tests/ or proofs/: the
  folders the lab's modules and tests put on ``sys.path``), the standard library or
  one of ``THIRD_PARTY``; a name taken from a project module must be a submodule or be bound at
  its top level. A removed or renamed project file fails here whatever is installed.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

EVIDENCE = Path(__file__).resolve().parents[1]
REPO = EVIDENCE.parent
MODULES = sorted(p for p in EVIDENCE.rglob("*.py") if "__pycache__" not in p.parts)
TEST_FILES = {p for p in MODULES if p.parent.name == "tests" and p.name.startswith("test_")}
IMPORTED = [p for p in MODULES if p not in TEST_FILES]
SHARED_ROOTS = (
    EVIDENCE,
    EVIDENCE / "dev",
    EVIDENCE / "tests" / "support",
    REPO / "tools",
    REPO / "tests",
    REPO / "proofs",
)
THIRD_PARTY = frozenset(
    {
        "b12x",
        "cutlass",
        "flashinfer",
        "hypothesis",
        "openai",
        "pytest",
        "quack",
        "safetensors",
        "tokenizers",
        "torch",
        "triton",
        "vllm",
    }
)
"""Distributions the lab imports that the repository venv need not have."""


def _ids(paths: list[Path]) -> list[str]:
    return [str(p.relative_to(EVIDENCE)) for p in paths]


def _import_name(path: Path) -> tuple[str, Path]:
    """(the name ``import`` uses for ``path``, the folder that name is relative to)."""
    rel = path.relative_to(EVIDENCE)
    if rel.parts[0] == "gate":
        parts = [p.removesuffix(".py") for p in rel.parts]
        if parts[-1] == "__init__":
            parts.pop()
        return ".".join(parts), EVIDENCE
    return path.stem, path.parent


IMPORT_PROBE = r"""
import importlib, json, sys, traceback
name, folder, evidence = sys.argv[1:4]
sys.path[:0] = [folder, evidence]
try:
    importlib.import_module(name)
    print(json.dumps({"imported": True}))
except ModuleNotFoundError as e:
    print(json.dumps({"missing": e.name or "", "error": traceback.format_exc()[-3000:]}))
except BaseException:
    print(json.dumps({"error": traceback.format_exc()[-3000:]}))
"""


@pytest.mark.parametrize("path", IMPORTED, ids=_ids(IMPORTED))
def test_the_module_imports_unless_a_third_party_distribution_is_missing(path: Path) -> None:
    name, folder = _import_name(path)
    proc = subprocess.run(
        [sys.executable, "-c", IMPORT_PROBE, name, str(folder), str(EVIDENCE)],
        cwd=EVIDENCE,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    if got.get("imported"):
        return
    missing = got.get("missing")
    assert missing is not None, got["error"]
    assert missing.split(".")[0] in THIRD_PARTY, got["error"]


def _locate(dotted: str, roots: list[Path]) -> tuple[bool, Path | None]:
    """(whether the first name of ``dotted`` is a project module under one of ``roots``, the file
    or package folder of ``dotted`` itself or None when a part of it is missing)."""
    head, *rest = dotted.split(".")
    for root in roots:
        for found in (root / f"{head}.py", root / head):
            if not found.exists():
                continue
            for part in rest:
                if not found.is_dir():
                    return True, None  # a submodule of a plain module
                found = found / f"{part}.py" if (found / f"{part}.py").exists() else found / part
                if not found.exists():
                    return True, None
            return True, found
    return False, None


def _bound_names(tree: ast.Module) -> set[str]:
    """The names a module binds at its top level (inside if/try/with/for blocks too)."""
    names: set[str] = set()
    todo: list[ast.stmt] = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign | ast.For | ast.With):
            targets = node.targets if isinstance(node, ast.Assign) else []
            if isinstance(node, ast.AnnAssign | ast.AugAssign | ast.For):
                targets = [node.target]
            if isinstance(node, ast.With):
                targets = [i.optional_vars for i in node.items if i.optional_vars]
            for target in targets:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
        for field in ("body", "orelse", "finalbody", "handlers"):
            todo.extend(getattr(node, field, []) or [])
    return names


def _unresolved(path: Path) -> list[str]:
    """What ``path`` imports that names no project file, stdlib module or known distribution."""
    tree = ast.parse(path.read_text(), filename=str(path))
    roots = [path.parent, *SHARED_ROOTS]
    problems: list[str] = []

    def check(dotted: str, line: int) -> Path | None:
        project, found = _locate(dotted, roots)
        top = dotted.split(".")[0]
        if project and found is None:
            problems.append(f"line {line}: {dotted}: no such project file")
        elif not project and top not in sys.stdlib_module_names and top not in THIRD_PARTY:
            problems.append(f"line {line}: {dotted}: no project file, stdlib module or known dist")
        return found

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                check(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = path.parent
                for _ in range(node.level - 1):
                    base = base.parent
                module = base / (node.module or "").replace(".", "/")
                found: Path | None = module if module.is_dir() else module.with_suffix(".py")
                if found is not None and not found.exists():
                    problems.append(f"line {node.lineno}: relative {node.module}: no such file")
                    found = None
            else:
                found = check(node.module or "", node.lineno)
            if found is None:
                continue
            if found.is_dir():
                init = found / "__init__.py"
                bound = _bound_names(ast.parse(init.read_text())) if init.exists() else set()
                for alias in node.names:
                    if not ((found / f"{alias.name}.py").exists() or (found / alias.name).is_dir()):
                        if alias.name not in bound:
                            problems.append(f"line {node.lineno}: {node.module}.{alias.name}")
            else:
                bound = _bound_names(ast.parse(found.read_text()))
                if "__getattr__" in bound or "*" in bound:
                    continue
                for alias in node.names:
                    if alias.name != "*" and alias.name not in bound:
                        problems.append(
                            f"line {node.lineno}: {node.module} does not define {alias.name}"
                        )
    return problems


@pytest.mark.parametrize("path", MODULES, ids=_ids(MODULES))
def test_every_import_of_a_project_module_names_a_file_that_exists(path: Path) -> None:
    assert _unresolved(path) == []


def test_the_resolution_check_fails_for_a_missing_project_file(tmp_path: Path) -> None:
    module = tmp_path / "uses_removed.py"
    module.write_text(
        "import json\n"
        "from gate.spec_metrics import record_depths\n"
        "from gate import plans, no_such_gate_module\n"
        "import gate.no_such_module\n"
        "from provenance import no_such_helper\n"
        "def main():\n"
        "    import make_tiny_mtp_ckpt\n"
        "    from mtp_gpu_common import record_depths\n"
    )
    assert _unresolved(module) == [
        "line 3: gate.no_such_gate_module",
        "line 4: gate.no_such_module: no such project file",
        "line 5: provenance does not define no_such_helper",
        "line 7: make_tiny_mtp_ckpt: no project file, stdlib module or known dist",
        "line 8: mtp_gpu_common: no project file, stdlib module or known dist",
    ]
