# SPDX-License-Identifier: Apache-2.0
"""Offline sm_90 compile of the Triton sparse-MLA kernel variants: registers, spills, SASS mix.

No GPU needed: Triton compiles the shipped kernel file (--kernel-path) for sm_90 with the
benchmark's specialisation (fp32 split partials, 16-divisible sizes and strides) and its
bundled ptxas; cuobjdump reports registers, stack (spill) bytes and the static instruction mix.
These are compile facts, not timings. Used for design/triton-sparse-mla.md:

    python scripts/sparse_mla_sm90_compile_stats.py \
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

from sm90_compile import compile_sm90, cuobjdump, load_leaf, resources

# (block_h, block_n, num_warps, num_stages, flat_records, fold_scales, prefetch), prefetch
# one of PREFETCH_MODES
PREFETCH_MODES = ("none", "records", "slots")  # -, prefetch=True, prefetch_slots=True
DEFAULT_POINTS = [
    (bh, bn, w, st, flat, fold, "none")
    for bh, bn, w, st in ((16, 64, 4, 2), (16, 64, 8, 2), (64, 128, 8, 1), (64, 64, 8, 2))
    for flat, fold in ((False, False), (True, False), (True, True))
]
# --prefetch: flat addressing with and without each prefetch variant, at the tilings the
# benchmark sweeps (BLOCK_H 32 at 64 heads included).
PREFETCH_POINTS = [
    (bh, bn, w, st, True, False, mode)
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


def small_points(kern) -> list[tuple]:
    """The default launch on a GPU with 99 KiB of shared memory per block (SM120/121, SM89):
    the kernel's own ``_TILINGS_SMALL`` per BLOCK_H, paged and flat."""
    return [
        (bh, bn, warps, stages, flat, False, "none")
        for bh, (bn, warps, stages) in sorted(kern._TILINGS_SMALL.items())
        for flat in (False, True)
    ]


def compile_point(kern, point, capability: int = 90) -> dict:
    bh, bn, warps, stages, flat, fold, prefetch, *rest = point
    bf16 = bool(rest and rest[0])
    fn = kern._sparse_mla_fp8_ds_mla_fwd_kernel
    names = fn.arg_names
    ptrs = {
        "q_ptr": "*bf16",
        "qpe_ptr": "*bf16",
        "kv_ptr": "*u8",
        "idx_ptr": "*i32",
        "count_ptr": "*i32",
        "out_ptr": "*fp32",
        "lse_ptr": "*fp32",
    }
    consts = dict(
        HAS_COUNTS=False,
        BLOCK_H=bh,
        BLOCK_N=bn,
        FLAT_RECORDS=flat,
        FOLD_SCALES=fold,
        EMULATE=False,
        ROUND_OUT=False,
    )
    if "PREFETCH" in names:  # kernel files from before the prefetch variants lack them
        consts.update(PREFETCH=prefetch == "records", PREFETCH_SLOTS=prefetch == "slots")
    elif prefetch != "none":
        raise SystemExit("--prefetch: this kernel file has no prefetch variants")
    if "BF16_DEQUANT" in names:
        consts.update(BF16_DEQUANT=bf16)
    elif bf16:
        raise SystemExit("--bf16: this kernel file has no bf16_dequant variant")
    sig = {
        n: ptrs.get(n, "constexpr" if n in consts else "fp32" if n == "qk_scale" else "i32")
        for n in names
    }
    attrs = {
        (i,): [["tt.divisibility", 16]]
        for i, n in enumerate(names)
        if n in ptrs or (sig[n] == "i32")
    }
    compiled = compile_sm90(
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
        fold_scales=fold,
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
        "--small",
        action="store_true",
        help="compile the kernel's own _TILINGS_SMALL (the default launch where a block gets "
        "99 KiB of shared memory), paged and flat; with --capability 120 or 121",
    )
    parser.add_argument(
        "--capability",
        type=int,
        choices=(90, 120, 121),
        default=90,
        help="CUDA compute capability to compile for (default 90)",
    )
    args = parser.parse_args()
    os.environ.pop("TRITON_INTERPRET", None)
    kern = load(args.kernel_path)
    rows = []
    points = (
        small_points(kern)
        if args.small
        else BF16_POINTS
        if args.bf16
        else PREFETCH_POINTS
        if args.prefetch
        else DEFAULT_POINTS
    )
    for point in points:
        row = compile_point(kern, point, args.capability)
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
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
