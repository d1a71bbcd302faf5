# SPDX-License-Identifier: Apache-2.0
"""Copy the series' vLLM-tree tests, and the test modules they import, out of a patched tree.

The GPU machine receives at most 64 MiB per call and no vLLM source tree, so the series'
GPU-only tests (the ones the CPU runs skip) travel as a small bundle: every ``tests/`` file
some patch of the series adds or edits, plus the closure of the ``tests.*`` modules and
package ``__init__`` files they import (vLLM's tests import helpers such as
``tests.v1.attention.utils``), with vLLM's ``tests/conftest.py`` and ``pyproject.toml`` (its
fixtures and pytest markers), and under ``wheels/`` the wheels of what that conftest imports
beyond vLLM's own requirements (``CONFTEST_WHEELS``; the GPU machine has no package index, and
without tblib the 2026-12-01 run fell back to ``--noconftest`` and lost every fixture). Run
pytest from the bundle's root with ``python -m pytest`` so that ``tests`` is importable and the
installed (patched) vllm is the one under test; ``hf-cache/`` is an offline hub cache of the
model configs those tests name (HF_HUB_OFFLINE=1 HF_HUB_CACHE=hf-cache).

    .venv/bin/python evidence/dev/tree_tests_bundle.py build/vllm .gpu-tests   # the tool venv
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "tools"), str(REPO / "tests")]  # patchset; upstream_tests


# Imported by vLLM 0.33.0's tests/conftest.py, not required by vLLM itself (pure Python).
CONFTEST_WHEELS = ("tblib",)


def download_wheels(dest: Path, names: tuple[str, ...] = CONFTEST_WHEELS) -> None:
    """``pip download`` the wheels (no dependencies: they have none) into ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary", ":all:"]
    subprocess.run([*cmd, "-d", str(dest), *names], check=True)


def series_test_files(root: Path = REPO) -> list[str]:
    """Every tests/ path that a vllm patch of the series writes (the series' own parser):
    the files the series adds first, then the upstream files it extends, each group sorted,
    so that a run cut by its timeout has run the series' own tests (the 2026-12-01 GPU run
    spent most of its 400 s on the large upstream test_sparse_mla_backends.py)."""
    from patchset.series import for_target, load_series

    series = for_target(load_series(root), "vllm")
    files = [f for patch in series for f in patch.files if f.path.startswith("tests/")]
    extended = {f.path for f in files if f.op == "modify"}
    added = {f.path for f in files} - extended
    return sorted(added) + sorted(extended)


def _imported_test_modules(source: str, path: str) -> set[str]:
    """Dotted names a test file imports that may be ``tests.*`` modules (relative imports
    resolved as upstream_tests.py resolves them); a name may be a module or an attribute."""
    from upstream_tests import imported_names

    out: set[str] = set()
    for module, name in imported_names(source, path):
        if module.startswith("tests"):
            out.add(module)
            if name:
                out.add(f"{module}.{name}")
    return out


def closure(tree: Path, seeds: list[str]) -> list[str]:
    """The seed files present in ``tree``, the tests modules they import (transitively)
    and every package ``__init__.py`` above them."""
    todo = list(seeds)
    seen: set[str] = set()
    while todo:
        rel = todo.pop()
        if rel in seen or not (tree / rel).is_file():
            continue
        seen.add(rel)
        if rel.endswith(".py"):
            for name in _imported_test_modules((tree / rel).read_text(encoding="utf-8"), rel):
                stem = name.replace(".", "/")
                todo += [f"{stem}.py", f"{stem}/__init__.py"]
        parent = Path(rel).parent
        while str(parent) not in (".", ""):
            todo.append(f"{parent}/__init__.py")
            parent = parent.parent
    return sorted(seen)


# Hugging Face model configs the bundle's tests name (vLLM's test helpers build a ModelConfig
# from a hub id): each evidence/dev/hf_configs/<org>/<name>/ holds the files, written here from the
# public model cards' values. The GPU machine reaches no network: without them such a test
# waits on the hub until pytest's timeout (the 19:29Z lease lost 420 s to
# test_fp8_dcp_head_envelope that way).
HF_CONFIGS = REPO / "evidence" / "dev" / "hf_configs"


def write_offline_hf_cache(dest: Path, configs: Path = HF_CONFIGS) -> list[str]:
    """Lay ``configs``' <org>/<name>/ folders out as a Hugging Face hub cache under ``dest``
    (models--<org>--<name>/refs/main naming a snapshot whose files are copies), for
    HF_HUB_OFFLINE=1 HF_HUB_CACHE=dest. The snapshot id is the sha1 of the folder's files,
    so a changed config gets a new one. Returns the repo ids written."""
    written = []
    for model in sorted(p for p in configs.glob("*/*") if p.is_dir()):
        files = sorted(f for f in model.iterdir() if f.is_file())
        digest = hashlib.sha1()
        for f in files:
            digest.update(f.name.encode() + b"\0" + f.read_bytes())
        rev = digest.hexdigest()
        repo = dest / f"models--{model.parent.name}--{model.name}"
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / "main").write_text(rev)
        snap = repo / "snapshots" / rev
        snap.mkdir(parents=True, exist_ok=True)
        for f in files:
            shutil.copy2(f, snap / f.name)
        written.append(f"{model.parent.name}/{model.name}")
    return written


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("tree", type=Path, help="the patched vLLM source tree")
    p.add_argument("dest", type=Path, help="bundle root (replaced)")
    p.add_argument(
        "--no-wheels", action="store_true", help=f"do not download {', '.join(CONFTEST_WHEELS)}"
    )
    args = p.parse_args(argv)
    seeds = series_test_files()
    missing = [s for s in seeds if not (args.tree / s).is_file()]
    if missing:
        print(f"error: {args.tree} lacks {missing}: is the series applied?", file=sys.stderr)
        return 1
    # vLLM's tests/conftest.py (fixtures such as default_vllm_config) and its pytest settings
    files = closure(args.tree, [*seeds, "tests/conftest.py"]) + ["pyproject.toml"]
    if args.dest.exists():
        shutil.rmtree(args.dest)
    for rel in files:
        (args.dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(args.tree / rel, args.dest / rel)
    if not args.no_wheels:
        download_wheels(args.dest / "wheels")
    hub = write_offline_hf_cache(args.dest / "hf-cache")
    tests = [s for s in seeds if Path(s).name.startswith("test_")]
    (args.dest / "SERIES_TESTS").write_text("\n".join(tests) + "\n")
    print(
        f"{len(files)} files ({len(tests)} test files of the series, {len(hub)} offline hub "
        f"configs) -> {args.dest}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
