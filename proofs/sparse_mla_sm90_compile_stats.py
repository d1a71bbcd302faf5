# SPDX-License-Identifier: Apache-2.0
"""Offline sm_90 compile of the Triton sparse-MLA kernel variants: registers, spills, SASS mix.

No GPU needed: Triton compiles the shipped kernel file (--kernel-path) for sm_90 with the
benchmark's specialisation (fp32 split partials, 16-divisible sizes and strides) and its
bundled ptxas; cuobjdump reports registers, stack (spill) bytes and the static instruction mix.
These are compile facts, not timings. Used for design/triton-sparse-mla.md:

    python proofs/sparse_mla_sm90_compile_stats.py \
        --kernel-path build/vllm/vllm/v1/attention/ops/triton_sparse_mla.py [--prefetch | --bf16]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import types
from collections import Counter
from pathlib import Path

from sm90_compile import CAPABILITIES, compile_cuda, cuobjdump, load_leaf, resources, signature

# The pointer arguments of the sparse-MLA kernel (_sparse_mla_fp8_ds_mla_fwd_kernel) and their
# element types; the rest are constexprs, qk_scale (fp32) and i32 sizes and strides.
SPARSE_MLA_PTRS = {
    "q_ptr": "*bf16",
    "qpe_ptr": "*bf16",
    "kv_ptr": "*u8",
    "idx_ptr": "*i32",
    "count_ptr": "*i32",
    "out_ptr": "*fp32",
    "lse_ptr": "*fp32",
}
# (block_h, block_n, num_warps, num_stages, flat_records, prefetch), prefetch one of
# PREFETCH_MODES
PREFETCH_MODES = ("none", "records", "slots")  # -, prefetch=True, prefetch_slots=True
DEFAULT_POINTS = [
    (bh, bn, w, st, flat, "none")
    for bh, bn, w, st in ((16, 64, 4, 2), (16, 64, 8, 2), (64, 128, 8, 1), (64, 64, 8, 2))
    for flat in (False, True)
]
# --prefetch: flat addressing with and without each prefetch variant, at the tilings the
# benchmark sweeps (BLOCK_H 32 at 64 heads included).
PREFETCH_POINTS = [
    (bh, bn, w, st, True, mode)
    for bh, bn, w, st in (
        (16, 64, 4, 2),
        (16, 64, 8, 2),
        (64, 128, 8, 1),
        (64, 64, 8, 2),
        (32, 64, 4, 2),
        (32, 64, 8, 2),
    )
    for mode in PREFETCH_MODES
]
# --bf16: the same tilings and prefetch modes, flat, with and without bf16_dequant (an 8th
# point field; absent = False).
BF16_POINTS = [(*pt, bf16) for pt in PREFETCH_POINTS for bf16 in (False, True)]
OPS = (
    "IMAD",
    "IADD3",
    "I2F",
    "F2I",
    "FMUL",
    "FFMA",
    "F2FP",
    "HADD2",
    "HMUL2",
    "HFMA2",
    "PRMT",
    "HMMA",
    "HGMMA",
    "LDG",
)


def load(path: Path) -> types.ModuleType:
    return load_leaf(path, "triton_sparse_mla_stats")


# Stand-in GPUs for --plans: (SMs, shared memory per block) by capability (H200; RTX PRO
# 6000 Blackwell; DGX Spark's GB10).
STAND_INS = {90: (132, 227 * 1024), 120: (188, 99 * 1024), 121: (48, 99 * 1024)}
PLAN_ROWS = (1, 2, 3, 4, 8, 9, 16, 32, 64, 263, 264, 4096)
PLAN_HEADS = (8, 16, 32, 64, 128)


def plan_points(kern, capability: int) -> list[tuple]:
    """Every distinct kernel launch ``plan_sparse_mla`` chooses by default on the stand-in GPU
    of ``capability`` (rows x heads x contiguous or paged cache, top-k 2048)."""
    import torch

    kern._device_info = lambda device: STAND_INS[capability]
    points = set()
    for rows in PLAN_ROWS:
        for heads in PLAN_HEADS:
            for contiguous in (False, True):
                p = kern.plan_sparse_mla(
                    rows, heads, 2048, torch.device("cpu"), contiguous=contiguous
                )
                mode = "records" if p.prefetch else "slots" if p.prefetch_slots else "none"
                points.add(
                    (
                        p.block_h,
                        p.block_n,
                        p.num_warps,
                        p.num_stages,
                        p.flat_records,
                        mode,
                    )
                )
    return sorted(points)


def compile_point(kern, point, capability: int = 90) -> dict:
    bh, bn, warps, stages, flat, prefetch, *rest = point
    bf16 = bool(rest and rest[0])
    fn = kern._sparse_mla_fp8_ds_mla_fwd_kernel
    names = fn.arg_names
    consts = dict(
        HAS_COUNTS=False,
        BLOCK_H=bh,
        BLOCK_N=bn,
        FLAT_RECORDS=flat,
        EMULATE=False,
        ROUND_OUT=False,
    )
    if "NVFP4" in names:  # the fp8_ds_mla launches of a kernel that also reads nvfp4_ds_mla
        consts.update(NVFP4=False)
    if "FOLD_SCALES" in names:  # kernel files from before fold_scales left the kernel
        consts.update(FOLD_SCALES=False)
    if "PREFETCH" in names:  # kernel files from before the prefetch variants lack them
        consts.update(PREFETCH=prefetch == "records", PREFETCH_SLOTS=prefetch == "slots")
    elif prefetch != "none":
        raise SystemExit("--prefetch: this kernel file has no prefetch variants")
    if "BF16_DEQUANT" in names:
        consts.update(BF16_DEQUANT=bf16)
    elif bf16:
        raise SystemExit("--bf16: this kernel file has no bf16_dequant variant")
    sig, attrs = signature(fn, SPARSE_MLA_PTRS, consts)
    compiled = compile_cuda(
        fn, sig, consts, attrs, capability=capability, num_warps=warps, num_stages=stages
    )
    res, sass = cuobjdump(compiled, "-res-usage", "-sass")
    return dict(
        capability=capability,
        block_h=bh,
        block_n=bn,
        num_warps=warps,
        num_stages=stages,
        flat_records=flat,
        prefetch=prefetch,
        bf16_dequant=bf16,
        **resources(res),
        shared_bytes=compiled.metadata.shared,
        sass={op: len(re.findall(rf"\b{op}\b", sass)) for op in OPS},
        # global loads by width / kind (LDGSTS: cp.async into shared memory)
        loads=dict(sorted(Counter(re.findall(r"\bLDG[.A-Z0-9_]*", sass)).items())),
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernel-path", type=Path, required=True)
    parser.add_argument("--out", type=Path, default=None, help="also write the rows as JSON")
    parser.add_argument(
        "--prefetch",
        action="store_true",
        help="compile PREFETCH_POINTS (flat, each prefetch variant) instead of DEFAULT_POINTS",
    )
    parser.add_argument(
        "--bf16",
        action="store_true",
        help="compile BF16_POINTS (PREFETCH_POINTS with and without bf16_dequant; kernel "
        "files up to revision 605d99b: the variant left the kernel once it timed slower)",
    )
    parser.add_argument(
        "--plans",
        action="store_true",
        help="compile every launch plan_sparse_mla chooses by default on a stand-in GPU of "
        "--capability (STAND_INS); exit 1 if one fails to compile",
    )
    parser.add_argument(
        "--capability",
        type=int,
        choices=CAPABILITIES,
        default=90,
        help="CUDA compute capability to compile for (default 90)",
    )
    args = parser.parse_args()
    os.environ.pop("TRITON_INTERPRET", None)
    kern = load(args.kernel_path)
    rows = []
    points = (
        plan_points(kern, args.capability)
        if args.plans
        else BF16_POINTS
        if args.bf16
        else PREFETCH_POINTS
        if args.prefetch
        else DEFAULT_POINTS
    )
    failed = 0
    for point in points:
        try:
            row = compile_point(kern, point, args.capability)
        except Exception as exc:  # recorded and printed; the exit status says it
            failed += 1
            row = dict(point=list(point), ok=False, error=f"{type(exc).__name__}: {exc}"[:2000])
        # a launch the planner picks must also fit the GPU's shared memory per block (the
        # compile does not check it; the launch would fail at run time)
        limit = STAND_INS[args.capability][1]
        if args.plans and row.get("shared_bytes", 0) > limit:
            failed += 1
            row.update(ok=False, error=f"needs {row['shared_bytes']} B of shared memory > {limit}")
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.out is not None:
        import hashlib

        import triton

        doc = dict(
            kind="sparse-mla-sm90-compile",
            what=f"offline sm_{args.capability} compile facts (registers, spills, static "
            "SASS); not timings",
            command=" ".join([sys.executable, *sys.argv]),
            kernel_path=str(args.kernel_path),
            kernel_sha256=hashlib.sha256(args.kernel_path.read_bytes()).hexdigest(),
            triton=triton.__version__,
            rows=rows,
        )
        args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"{len(rows) - failed} of {len(rows)} launches compiled for sm_{args.capability}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
