"""Run the tests the series adds to vLLM's ``tests/`` tree against the INSTALLED overlay wheel.

Three steps, each a subcommand (``make test`` runs them in this order):

``venv``  create a fresh virtual environment and ``pip install`` the overlay wheel named by
          ``dist/receipt.json`` and the b12x wheel (the b12x overlay wheel of
          ``dist/receipt-b12x.json`` when the series patches b12x, else the pinned one; torch
          and every other dependency come from the index; pip's downloads are cached in
          ``.cache/pip``), plus the test tools the vLLM tests need; then install the b12x wheel
          once more, alone and last (``--no-deps --force-reinstall``), because flashinfer-python
          ships a ``b12x/__init__.py`` of its own and whichever distribution pip writes last owns
          that file (design/b12x.md). ``--reuse`` keeps an existing environment: as is when it
          has the same wheels, else with only the changed wheels reinstalled (``--no-deps``;
          overlay wheels share dependencies), b12x always last.
``list``  print the test files the series adds or changes (touched ``tests/**/test_*.py`` of
          the vllm patches that exist after the series).
``run``   copy the tree's ``tests/`` into a temporary directory (so the tree's ``vllm/`` source
          directory is never importable), and run exactly those files with the environment's
          Python: whole, or with the Test Plans' ``-k`` where every patch touching the file
          selects from it (``series_test_selection``); every file is printed before it runs
          and pytest reports every outcome.

The marker ``<venv>/dcp-wheel.json`` records the installed wheel's file name and sha256; the
end-to-end tests read it to find the environment and prove what it imports.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tools"))

from patchset.errors import PatchsetError  # noqa: E402
from patchset.export import HF_HOST, hub_offline_env, plan_selections  # noqa: E402
from patchset.fetch import pinned_file  # noqa: E402
from patchset.hashing import sha256_file  # noqa: E402
from patchset.installreqs import install_requirements  # noqa: E402
from patchset.pins import load_pins  # noqa: E402
from patchset.series import for_target, load_series  # noqa: E402

MARKER = "dcp-wheel.json"
CI_SUPPORT = REPO / "tests" / "support" / "dcp_ci_support"
TEST_TOOLS = ("pytest>=8", "pytest-timeout>=2.3", "hypothesis>=6.100", "tblib", str(CI_SUPPORT))
"""Installed next to the wheel: pytest (+ timeout), hypothesis (the proofs), tblib (vLLM's
tests/conftest), and tests/support/dcp_ci_support (a vLLM platform plugin that activates vLLM's
CPU platform where no GPU is visible, and a pytest plugin that reports hub-only failures as
skips with their reason when huggingface.co is unreachable)."""
TEST_TIMEOUT_S = 900
"""Per-test limit: a hung test fails instead of stalling CI."""
FRESH_VENV_GIB = 12
"""Free space a fresh test venv needs where it is made: 9.5 GiB installed (torch's CUDA build
with its nvidia-* libraries 4.7 GiB, Triton, flashinfer, vLLM), plus pip's unpacked downloads
while it installs. Checked before the first pip call, so a full disk is one clear line at the
start of ``make test``, never pip's ``OSError: [Errno 28]`` minutes into it."""


def free_gib(path: Path) -> float:
    """Free GiB of the file system that holds ``path`` (or its nearest existing ancestor)."""
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return shutil.disk_usage(probe).free / 2**30


def lacks_space(venv: Path, need_gib: float = FRESH_VENV_GIB) -> str | None:
    """Why a fresh venv at ``venv`` cannot be made (too little free space), or None."""
    free = free_gib(venv)
    if free >= need_gib:
        return None
    return (
        f"{venv}: {free:.1f} GiB free on its file system, a fresh test venv needs about "
        f"{need_gib} GiB; free space (e.g. `make clean`, old build/testenv copies) or make it "
        "elsewhere: make test TESTENV=<dir on a larger disk>"
    )


def series_test_files(root: Path, tree: Path) -> list[str]:
    """The vLLM-tree test files the series adds or changes and that exist after it, sorted."""
    touched = {
        f.path
        for patch in for_target(load_series(root), "vllm")
        for f in patch.files
        if f.path.startswith("tests/")
    }
    return sorted(
        path
        for path in touched
        if path.rsplit("/", 1)[-1].startswith("test_")
        and path.endswith(".py")
        and (tree / path).is_file()
    )


def series_test_selection(root: Path, tree: Path) -> dict[str, str | None]:
    """Each of ``series_test_files`` -> the ``-k`` expression to run it with, or None (whole).

    A file runs whole when a patch that touches it names no ``-k`` for it in its Test Plan
    (e.g. a test module the patch adds); a file every touching patch selects from (an upstream
    module such as ``tests/test_config.py`` with the patch's tests added to it) runs with the
    union of those selections: the rest of that module is upstream's, checked against the
    stock baseline by ``upstream_tests.py``."""
    files = set(series_test_files(root, tree))
    keywords: dict[str, list[str] | None] = {}
    for patch in for_target(load_series(root), "vllm"):
        chosen = plan_selections(patch)
        for f in patch.files:
            if f.path not in files:
                continue
            keyword = chosen.get(f.path)
            if keyword is None:
                keywords[f.path] = None
                continue
            known = keywords.setdefault(f.path, [])
            if known is not None:
                known.append(keyword)
    return {
        path: None if ks is None else " or ".join(f"({k})" for k in dict.fromkeys(ks))
        for path, ks in sorted(keywords.items())
    }


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def read_marker(venv: Path) -> dict[str, str] | None:
    try:
        data: dict[str, str] = json.loads((venv / MARKER).read_text())
    except (FileNotFoundError, ValueError):
        return None
    return data


def write_marker(venv: Path, wheel: Path, sha256: str, version: str, b12x: Path) -> None:
    data = {
        "filename": wheel.name,
        "sha256": sha256,
        "version": version,
        "b12x": {"filename": b12x.name, "sha256": sha256_file(b12x)},
    }
    (venv / MARKER).write_text(json.dumps(data, sort_keys=True) + "\n")


def b12x_wheel(receipt_dir: Path) -> Path:
    """The b12x wheel the environment gets: the b12x overlay wheel when ``make wheel`` built
    one (its receipt's sha256 checked), else the pinned b12x wheel from the fetch cache."""
    receipt_path = receipt_dir / "receipt-b12x.json"
    if receipt_path.is_file():
        receipt = json.loads(receipt_path.read_text())
        wheel = receipt_dir / receipt["wheel"]["filename"]
        if sha256_file(wheel) != receipt["wheel"]["sha256"]:
            raise PatchsetError(f"{wheel} is not the wheel {receipt_path.name} names: make wheel")
        return wheel
    return pinned_file("b12x", "wheel", root=REPO, offline=True)


def install_b12x_last(pip: list[str], b12x: Path, env: dict[str, str]) -> int:
    """Reinstall ``b12x`` alone so that its files, not flashinfer's embedded ``b12x``
    package shim, are the ``b12x/`` on the path (both RECORDs list ``b12x/__init__.py``)."""
    print(f"testenv: installing {b12x.name} last (flashinfer-python also writes b12x/__init__.py)")
    proc = subprocess.run([*pip, "--no-deps", "--force-reinstall", str(b12x)], env=env, check=False)
    if proc.returncode != 0:
        print(f"error: pip install of {b12x.name} failed (exit {proc.returncode})")
    return proc.returncode


def make_venv(receipt_path: Path, venv: Path, *, reuse: bool) -> int:
    receipt = json.loads(receipt_path.read_text())
    wheel = receipt_path.parent / receipt["wheel"]["filename"]
    actual = sha256_file(wheel)
    if actual != receipt["wheel"]["sha256"]:
        print(f"error: {wheel} has sha256 {actual}, the receipt says {receipt['wheel']['sha256']}")
        return 1
    marker = read_marker(venv)
    # The b12x wheel (vLLM's own `b12x` extra; the series' b12x overlay wheel when there is
    # one), hash-checked, so the environment is the pair the series targets.
    try:
        b12x = b12x_wheel(receipt_path.parent)
    except PatchsetError as exc:
        print(f"error: no b12x wheel to install ({exc.message}): make fetch / make wheel")
        return 1
    env = {**os.environ, "PIP_CACHE_DIR": str(REPO / ".cache" / "pip")}
    env.setdefault("PIP_DISABLE_PIP_VERSION_CHECK", "1")
    pip = [str(venv_python(venv)), "-m", "pip", "install", "--progress-bar", "off", "-q"]
    if reuse and marker and venv_python(venv).exists():
        tools = subprocess.run([*pip, *TEST_TOOLS], env=env, check=False)
        if tools.returncode != 0:
            print(f"error: pip install of the test tools failed (exit {tools.returncode})")
            return tools.returncode
        same_b12x = marker.get("b12x", {}).get("sha256") == sha256_file(b12x)
        if marker.get("sha256") == actual and same_b12x:
            print(f"testenv: reusing {venv} (it has {wheel.name} and {b12x.name} installed)")
            return 0
        # Overlay wheels differ only in package files and the version: same dependencies.
        print(f"testenv: reusing {venv}, installing {wheel.name} and {b12x.name} without deps")
        (venv / MARKER).unlink()
        cmd = [*pip, "--no-deps", "--force-reinstall", str(wheel)]
        proc = subprocess.run(cmd, env=env, check=False)
        if proc.returncode != 0:
            print(f"error: pip install failed (exit {proc.returncode})")
            return proc.returncode
        if install_b12x_last(pip, b12x, env) != 0:
            return 1
        write_marker(venv, wheel, actual, receipt["wheel"]["version"], b12x)
        return 0
    if venv.exists():
        print(f"testenv: removing {venv}")
        shutil.rmtree(venv)
    short = lacks_space(venv)
    if short is not None:
        print(f"error: {short}")
        return 1
    print(f"testenv: {free_gib(venv):.0f} GiB free where the venv goes")
    start = time.monotonic()
    print(f"testenv: creating {venv} and installing {wheel.name} + {b12x.name} with dependencies")
    rc = install_fresh(venv, wheel, b12x, env)
    if rc != 0:
        return rc
    write_marker(venv, wheel, actual, receipt["wheel"]["version"], b12x)
    print(f"testenv: ready in {time.monotonic() - start:.0f} s")
    return 0


def install_fresh(venv: Path, wheel: Path, b12x: Path, env: dict[str, str]) -> int:
    """A new venv at ``venv`` with ``wheel`` and its requirements (the pins.toml substitutes in
    place of the pins they replace), ``b12x`` (last) and the test tools; pip's exit code.
    The test venv and the stock venv of the upstream baseline are made the same way."""
    pip = [str(venv_python(venv)), "-m", "pip", "install", "--progress-bar", "off", "-q"]
    substitutes = load_pins(REPO / "pins.toml").get("vllm", "wheel").install_substitutes
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    if substitutes:
        # The wheel's own requirements with the pins.toml substitutes (an index that lacks a
        # declared pin); the wheel itself goes in --no-deps, so pip never asks for that pin.
        requirements, replaced = install_requirements(wheel, substitutes)
        for declared, used in replaced:
            print(f"testenv: installing {used} in place of the wheel's {declared} (pins.toml)")
        steps = [[*pip, "--no-deps", str(wheel)], [*pip, *requirements, str(b12x), *TEST_TOOLS]]
    else:
        steps = [[*pip, str(wheel), str(b12x), *TEST_TOOLS]]
    for cmd in steps:
        proc = subprocess.run(cmd, env=env, check=False)
        if proc.returncode != 0:
            print(f"error: pip install failed (exit {proc.returncode})")
            return proc.returncode
    return 1 if install_b12x_last(pip, b12x, env) != 0 else 0


def run_tests(root: Path, tree: Path, venv: Path, pytest_args: Sequence[str]) -> int:
    selection = series_test_selection(root, tree)
    files = list(selection)
    if not files:
        print("vLLM-tree tests: the series adds no test files under tests/: nothing to run")
        return 0
    marker = read_marker(venv)
    if marker is None:
        print(f"error: {venv} has no {MARKER}; run `{Path(__file__).name} venv` first")
        return 1
    print(f"vLLM-tree tests: {len(files)} file(s) from the series, against {marker['filename']}")
    for path in files:
        print(f"  {path}" + ("" if selection[path] is None else f"  -k {selection[path]!r}"))
    # One pytest run for the files that run whole, one per selected file.
    runs: list[tuple[list[str], list[str]]] = []
    whole = [path for path in files if selection[path] is None]
    if whole:
        runs.append(([], whole))
    for path in files:
        keyword = selection[path]
        if keyword is not None:
            runs.append((["-k", keyword], [path]))
    with tempfile.TemporaryDirectory(prefix="vllm-tree-tests-") as tmp:
        work = Path(tmp)
        shutil.copytree(tree / "tests", work / "tests", symlinks=True)
        # vLLM's pytest settings (markers) without its source tree.
        shutil.copyfile(tree / "pyproject.toml", work / "pyproject.toml")
        env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
        env.pop("PYTHONPATH", None)
        offline = hub_offline_env()
        if offline:
            print(
                f"vLLM-tree tests: {HF_HOST} is unreachable: HF_HUB_OFFLINE=1, so tests that "
                "need a model from the hub fail at once instead of retrying"
            )
            env.update(offline)
            print(
                "vLLM-tree tests: a failure that is only the hub's offline error is reported as "
                "SKIPPED with that reason (dcp_ci_support.hub_offline); all others still fail"
            )
        cmd = [str(venv_python(venv)), "-m", "pytest", "-v", "-rfEs", "-p", "no:cacheprovider"]
        cmd += [f"--timeout={TEST_TIMEOUT_S}"]
        codes = []
        for selecting, group in runs:
            if selecting:
                print(f"vLLM-tree tests: {group[0]} with the Test Plan's -k {selecting[1]!r}")
            proc = subprocess.run(
                [*cmd, *pytest_args, *selecting, *group], cwd=work, env=env, check=False
            )
            codes.append(proc.returncode)
    # the first failure's code (pytest's 5, "no test selected", is a failure here too)
    return next((code for code in codes if code != 0), 0)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("venv", help="create the test environment with the overlay wheel")
    p.add_argument("--receipt", type=Path, default=REPO / "dist" / "receipt.json")
    p.add_argument("--venv", type=Path, default=REPO / "build" / "testenv")
    p.add_argument("--reuse", action="store_true", help="keep an env with the same wheel")
    p = sub.add_parser("list", help="print the series' vLLM-tree test files")
    p.add_argument("--tree", type=Path, default=REPO / "build" / "vllm")
    p = sub.add_parser("run", help="run the series' vLLM-tree tests against the installed wheel")
    p.add_argument("--tree", type=Path, default=REPO / "build" / "vllm")
    p.add_argument("--venv", type=Path, default=REPO / "build" / "testenv")
    p.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    args = parser.parse_args(argv)
    try:
        if args.command == "venv":
            return make_venv(args.receipt.resolve(), args.venv.resolve(), reuse=args.reuse)
        if args.command == "list":
            for path in series_test_files(REPO, args.tree.resolve()):
                print(path)
            return 0
        return run_tests(REPO, args.tree.resolve(), args.venv.resolve(), args.pytest_args)
    except PatchsetError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        for line in exc.details:
            print(f"  {line}", file=sys.stderr)
        return exc.exit_code


if __name__ == "__main__":
    raise SystemExit(main())
