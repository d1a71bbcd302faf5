# SPDX-License-Identifier: Apache-2.0
"""Run a patched vLLM tree's CUDA-only tests on CPU under the Triton interpreter.

Not a GPU run: a check, before a lease reaches them, that a CUDA test's own logic holds and
that the kernels it calls do what it asserts when Triton interprets them. For each FILE it
writes a copy beside it (``test_zz_interpret_<name>.py``) with the CUDA device strings
replaced by ``cpu`` and the CUDA skips dropped, runs the copy through
``evidence/dev/tree_pytest.sh`` with ``TRITON_INTERPRET=1`` and ``CUDA_VISIBLE_DEVICES=""``
(vLLM then keeps Triton on a host without a GPU driver), and removes the copy.

    python evidence/dev/interpret_cuda_tests.py build/vllm \\
        tests/v1/attention/test_triton_mla_sparse_fp8_ds_mla.py::forward_kernel \\
        tests/v1/spec_decode/test_eagle_step_kernel.py --log results/logs/x.log

``FILE::EXPR`` runs only the tests pytest's ``-k EXPR`` selects. Exit status: pytest's,
the worst over the files; a copy in which a CUDA device string or skip survived is an error.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

# (pattern, replacement): the forms the series' CUDA tests use
REWRITES = [
    (r'torch\.device\("cuda"\)', 'torch.device("cpu")'),
    (r'\bdev = "cuda"', 'dev = "cpu"'),
    (r'device="cuda"', 'device="cpu"'),
    (r"DEVICE_TYPE = current_platform\.device_type", 'DEVICE_TYPE = "cpu"'),
    (r"^@requires_cuda\n", ""),
    (r'^@pytest\.mark\.skipif\(not current_platform\.is_cuda\(\), reason="[^"]*"\)\n', ""),
    (
        r"^if not current_platform\.is_cuda_alike\(\) and not current_platform\.is_xpu\(\):\n"
        r"    pytest\.skip\([^\n]*\)\n",
        "",
    ),
]
LEFT = re.compile(
    r'^@requires_cuda|torch\.device\("cuda"\)|device="cuda"|\bdev = "cuda"'
    r"|^@pytest\.mark\.skipif\(not current_platform\.is_cuda",
    re.MULTILINE,
)


def interpreted_copy(text: str) -> str:
    """The test file's text with its CUDA device strings and CUDA skips rewritten."""
    for pattern, repl in REWRITES:
        text = re.sub(pattern, repl, text, flags=re.MULTILINE)
    left = LEFT.findall(text)
    if left:
        raise ValueError(f"CUDA-only forms left after the rewrite: {sorted(set(left))}")
    return text


def run_file(tree: Path, spec: str, log) -> int:
    rel, _, expr = spec.partition("::")
    src = tree / rel
    copy = src.with_name(f"test_zz_interpret_{src.stem.removeprefix('test_')}.py")
    copy.write_text(interpreted_copy(src.read_text()))
    env = {**os.environ, "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}
    cmd = ["bash", str(HERE / "tree_pytest.sh"), str(tree), str(copy.relative_to(tree))]
    cmd += ["-q", "-rfEs", *(["-k", expr] if expr else [])]
    try:
        print(f"== {spec}", file=log, flush=True)
        proc = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, check=False)
        print(f"== {spec}: rc={proc.returncode}", file=log, flush=True)
        return proc.returncode
    finally:
        copy.unlink()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("tree", type=Path)
    ap.add_argument("files", nargs="+", help="tests/... paths in the tree, optionally ::EXPR")
    ap.add_argument("--log", type=Path, help="also write the output here")
    args = ap.parse_args(argv)
    with open(args.log, "w") if args.log else contextlib.nullcontext(sys.stdout) as out:
        rc = max(run_file(args.tree.resolve(), spec, out) for spec in args.files)
    if args.log:
        print(args.log.read_text())
    return rc


if __name__ == "__main__":
    sys.exit(main())
