# SPDX-License-Identifier: Apache-2.0
"""Check the attention-backend docs of a patched vLLM tree.

vLLM (0.33.0 on, the pinned base of pins.toml too) renders the tables of
``docs/design/attention_backends.md`` at docs-build time:
``docs/mkdocs/gen_files/generate_attention_backends.py`` (an mkdocs-gen-files script,
listed in ``mkdocs.yaml``) reads the backend registry and the CUDA priority lists by AST
and fills the page's ``--8<-- "gen:<key>"`` markers. The committed page holds only prose
and markers, and no pre-commit hook runs the generator. This script runs that generator
against TREE (a stand-in for ``mkdocs_gen_files`` captures the page) and exits non-zero
when:

* the generator fails on the tree (a missing or leftover marker, a parse error);
* a backend registered in ``AttentionBackendEnum`` gets no row in any table (the
  generator silently drops backends it cannot resolve), apart from the three that
  the stock pinned base already renders no row for (``BASE_ROWLESS``);
* ``--snapshot FILE`` is given and the rendered page differs from FILE (``--update``
  rewrites FILE instead).

Usage: check_attention_backend_docs.py TREE [--snapshot FILE [--update]]
"""

from __future__ import annotations

import argparse
import ast
import difflib
import importlib.util
import io
import sys
import types
from pathlib import Path

GENERATOR = Path("docs/mkdocs/gen_files/generate_attention_backends.py")
PAGE = "design/attention_backends.md"
REGISTRY = Path("vllm/v1/attention/backends/registry.py")
# Registered backends that the pinned base's own generator renders no row for
# (composite routes and the no-op backend); anything else without a row is drift.
BASE_ROWLESS = frozenset({"TRITON_FLASH_ATTN", "TRITON_FLASHINFER", "NO_ATTENTION"})


class CheckError(Exception):
    """The docs of the tree drifted or cannot be generated."""


def _gen_files_stand_in(pages: dict[str, str]) -> types.ModuleType:
    """What the generator uses of mkdocs_gen_files: ``open`` for writing, edit paths."""
    module = types.ModuleType("mkdocs_gen_files")

    class _Page(io.StringIO):
        def __init__(self, path: str) -> None:
            super().__init__()
            self._path = path

        def close(self) -> None:
            pages[self._path] = self.getvalue()
            super().close()

    def open_page(path: str, mode: str = "r", **_: object) -> _Page:
        if "w" not in mode:
            raise CheckError(f"generator opened {path} with mode {mode!r}")
        return _Page(str(path))

    module.open = open_page  # type: ignore[attr-defined]
    module.set_edit_path = lambda *_: None  # type: ignore[attr-defined]
    return module


def render(tree: Path) -> tuple[str, types.ModuleType]:
    """Run the tree's generator; return the page it writes and the generator module."""
    script = tree / GENERATOR
    if not script.is_file():
        raise CheckError(f"{script} not found: not a vLLM 0.33-style docs tree")
    pages: dict[str, str] = {}
    stand_ins = {"mkdocs_gen_files": _gen_files_stand_in(pages)}
    try:
        import regex  # noqa: F401  (generated_content.py imports it)
    except ImportError:
        import re

        stand_ins["regex"] = re
    saved_modules = {name: sys.modules.get(name) for name in [*stand_ins, "generated_content"]}
    saved_path = list(sys.path)
    try:
        sys.modules.update(stand_ins)
        sys.modules.pop("generated_content", None)
        spec = importlib.util.spec_from_file_location("dcp_attention_backend_docs", script)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)  # renders the page at import time
        except Exception as e:  # the generator's own errors (markers, parsing)
            raise CheckError(f"{script} failed: {type(e).__name__}: {e}") from e
    finally:
        sys.path[:] = saved_path
        for name, value in saved_modules.items():
            if value is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = value
    if PAGE not in pages:
        raise CheckError(f"{script} wrote {sorted(pages)}, not {PAGE}")
    return pages[PAGE], module


def registered_backends(tree: Path) -> list[str]:
    """Members of AttentionBackendEnum with a class path, read from the registry by AST."""
    source = (tree / REGISTRY).read_text()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef) and node.name == "AttentionBackendEnum":
            return [
                stmt.targets[0].id
                for stmt in node.body
                if isinstance(stmt, ast.Assign)
                and isinstance(stmt.targets[0], ast.Name)
                and not (isinstance(stmt.value, ast.Constant) and not stmt.value.value)
            ]
    raise CheckError(f"no AttentionBackendEnum in {tree / REGISTRY}")


def check(tree: Path, snapshot: Path | None, update: bool) -> list[str]:
    """Return the problems found (empty: the docs are in step with the tree)."""
    page, generator = render(tree)
    skipped = set(getattr(generator, "SKIP_BACKENDS", set()))
    problems = [
        f"{name} is registered in AttentionBackendEnum but has no row in {PAGE}"
        for name in registered_backends(tree)
        if name not in skipped | BASE_ROWLESS and f"| `{name}`" not in page
    ]
    if snapshot is not None:
        if update:
            snapshot.parent.mkdir(parents=True, exist_ok=True)
            snapshot.write_text(page)
        elif not snapshot.is_file():
            problems.append(f"{snapshot} missing (run with --update to write it)")
        elif (old := snapshot.read_text()) != page:
            diff = difflib.unified_diff(
                old.splitlines(keepends=True),
                page.splitlines(keepends=True),
                str(snapshot),
                f"{tree}: rendered {PAGE}",
            )
            problems.append("rendered page drifted from the snapshot:\n" + "".join(diff))
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tree", type=Path, help="patched vLLM source tree")
    parser.add_argument("--snapshot", type=Path, help="rendered page to compare with")
    parser.add_argument("--update", action="store_true", help="rewrite the snapshot")
    args = parser.parse_args(argv)
    if args.update and args.snapshot is None:
        parser.error("--update needs --snapshot")
    try:
        problems = check(args.tree.resolve(), args.snapshot, args.update)
    except CheckError as e:
        print(f"check_attention_backend_docs: {e}", file=sys.stderr)
        return 1
    for problem in problems:
        print(f"check_attention_backend_docs: {problem}", file=sys.stderr)
    if problems:
        return 1
    print(f"check_attention_backend_docs: {args.tree}: {PAGE} renders, every backend listed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
