"""The tool's package: its modules import one another without a circle, and it ships no
test-only code (fault injection lives in ``tests/crashpoints.py``).

Every import of one ``patchset`` module by another counts, wherever it is written: at the top,
inside a function, or under ``if TYPE_CHECKING:`` (a circle hidden in a function or a type
annotation is still a circle of meaning). ``from . import __version__`` names the package, not a
module, and does not count.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "tools" / "patchset"


def imported_modules(source: str, modules: set[str]) -> set[str]:
    """The modules of ``modules`` that ``source`` (a module of the package) imports anywhere."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name.split(".")[1] for a in node.names if a.name.startswith("patchset.")]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level == 0 and base != "patchset" and not base.startswith("patchset."):
                continue
            parts = base.split(".")[1:] if node.level == 0 else base.split(".")
            parts = [p for p in parts if p]
            # `from patchset import journal` / `from . import journal`: each name may be a module
            names = [parts[0]] if parts else [a.name for a in node.names]
        found.update(n for n in names if n in modules)
    return found


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """Module name -> the package's modules it imports."""
    modules = {p.stem for p in package.glob("*.py")}
    return {
        p.stem: imported_modules(p.read_text(encoding="utf-8"), modules) - {p.stem}
        for p in sorted(package.glob("*.py"))
    }


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component with more than one module, each as one circle
    (``a -> b -> a``), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(_circle(graph, set(component)))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def _circle(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """A shortest path through ``component`` from its first module back to it."""
    start = min(component)
    paths = {start: [start]}
    queue = [start]
    for node in queue:
        for nxt in sorted(graph[node] & component):
            if nxt == start:
                return [*paths[node], start]
            if nxt not in paths:
                paths[nxt] = [*paths[node], nxt]
                queue.append(nxt)
    raise AssertionError(f"{sorted(component)} is not strongly connected")


def test_the_package_imports_without_a_circle() -> None:
    found = cycles(import_graph())
    assert not found, "import circles in tools/patchset: " + "; ".join(
        " -> ".join(c) for c in found
    )


def test_the_check_sees_function_level_and_type_checking_imports(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import B\n"
    )
    (tmp_path / "b.py").write_text("def f():\n    from patchset import c\n")
    (tmp_path / "c.py").write_text("import patchset.a\nfrom . import __version__\n")
    graph = import_graph(tmp_path)
    assert graph == {"a": {"b"}, "b": {"c"}, "c": {"a"}}
    assert cycles(graph) == [["a", "b", "c", "a"]]


def test_no_test_only_code_ships() -> None:
    shipped = {p.name: p.read_text(encoding="utf-8") for p in PACKAGE.glob("*.py")}
    assert "crashpoint.py" not in shipped
    reading = sorted(name for name, text in shipped.items() if "PATCHSET_TEST_" in text)
    assert not reading, f"modules that read a test-only variable: {reading}"
