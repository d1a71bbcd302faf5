# SPDX-License-Identifier: Apache-2.0
"""Offline sm_90 compile of the DCP top-k merge's Triton kernels at every launch the launcher
makes: registers, spills, shared memory.

No GPU needed: Triton compiles the shipped leaf module (``--tree``: a patched vLLM tree) for
sm_90 with its bundled ptxas, at the block sizes and warp counts
``stable_topk_from_gathered_candidates_triton`` picks for 64 .. 16384 candidates (the radix
select, sized by the leaf's ``select_launch_meta``) and the pack kernel. The Triton
interpreter, which the proofs use, accepts code that the compiler refuses (a loop-carried value
that changes type, 2026-12-02: 126 CUDA test failures on the H200), so this is the CPU check
that the kernels compile at all. Compile facts, not timings:

    python proofs/dcp_topk_merge_sm90_compile.py --tree build/vllm [--out results/....json]

``--capability 120`` (or 121) compiles the same launches for the SM120/121 GPUs (RTX PRO 6000,
DGX Spark).

Exit status 1 when any launch fails to compile (each failure is printed and recorded).
"""

from __future__ import annotations

import argparse
import json
import sys
import types
from pathlib import Path

from sm90_compile import CAPABILITIES, compile_cuda, cuobjdump, load_leaf, resources

LEAF = "vllm/model_executor/kernels/attention/dsa/dcp_topk_merge.py"
# Candidates per row the launcher is asked to select from: decode (top-k 512/2048 x DCP 2/4),
# the smallest block, and the largest row it accepts.
CANDIDATES = (64, 1024, 2048, 4096, 8192, 16384)
TOPK = 2048


def load_merge(tree: Path) -> types.ModuleType:
    """The shipped leaf module with ``vllm.triton_utils`` mapped to the real Triton."""
    return load_leaf(tree / LEAF, "dcp_topk_merge_sm90")


def launches(leaf: types.ModuleType) -> list[dict]:
    """Every (kernel, constexprs, num_warps) the launchers make for CANDIDATES, sized by the
    leaf's own ``select_launch_meta`` and ``PACK_BLOCK_SIZE``."""
    out = [
        dict(
            kernel="_pack_dcp_topk_candidates_kernel",
            consts={
                "DCP_WORLD_SIZE": world,
                "CP_INTERLEAVE": 1,
                "HAS_ROW_STARTS": starts,
                "BLOCK_SIZE": leaf.PACK_BLOCK_SIZE,
            },
            num_warps=4,
        )
        for world in (2, 4)
        for starts in (False, True)
    ]
    for c in CANDIDATES:
        meta = leaf.select_launch_meta(c, TOPK)
        warps = meta.pop("num_warps")
        out.append(
            dict(
                kernel="_radix_topk_select_kernel",
                consts={**meta, "RADIX_BITS": leaf.RADIX_BITS},
                num_warps=warps,
                candidates=c,
            )
        )
    return out


def compile_launch(leaf: types.ModuleType, launch: dict, capability: int = 90) -> dict:
    fn = getattr(leaf, launch["kernel"])
    ptrs = {
        "gathered": "*fp32",
        "out": "*i32",
        "logits": "*fp32",
        "topk_indices": "*i32",
        "packed": "*fp32",
        "row_starts": "*i32",
    }
    consts = launch["consts"]
    sig = {n: "constexpr" if n in consts else ptrs.get(n, "i32") for n in fn.arg_names}
    compiled = compile_cuda(fn, sig, consts, capability=capability, num_warps=launch["num_warps"])
    (res,) = cuobjdump(compiled, "-res-usage")
    return dict(**resources(res), shared_bytes=compiled.metadata.shared)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", type=Path, required=True, help="patched vLLM tree")
    ap.add_argument("--out", type=Path, help="write the compile facts as JSON")
    ap.add_argument("--capability", type=int, choices=CAPABILITIES, default=90)
    args = ap.parse_args()
    target = f"sm_{args.capability}"
    leaf = load_merge(args.tree)
    import triton

    rows, failed = [], 0
    for launch in launches(leaf):
        row = {k: v for k, v in launch.items()}
        try:
            row.update(ok=True, **compile_launch(leaf, launch, args.capability))
        except Exception as exc:  # recorded and printed; the exit status says it
            failed += 1
            row.update(ok=False, error=f"{type(exc).__name__}: {exc}"[:2000])
        print(json.dumps(row), flush=True)
        rows.append(row)
    if args.out:
        args.out.write_text(
            json.dumps(
                {
                    "kind": "dcp_topk_merge_sm90_compile",
                    "command": " ".join(sys.argv),
                    "triton": triton.__version__,
                    "target": f"cuda {target}",
                    "launches": rows,
                    "failed": failed,
                },
                indent=1,
            )
            + "\n"
        )
    print(f"{len(rows) - failed} of {len(rows)} launches compiled for {target}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
