#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Offline CUDA compile of every nvfp4_ds_mla Triton launch (no GPU): sm_90, sm_120, sm_121.

Compiles, with Triton and its bundled ptxas, for the stand-in GPU of each capability
(``sparse_mla_sm90_compile_stats.STAND_INS``):

* the sparse-MLA kernel with ``NVFP4=True`` at every launch ``plan_sparse_mla`` picks by
  default (``plan_points``: 1-4096 rows x 8-128 heads, paged and contiguous, top-k 2048), and
  checks that each fits the GPU's shared memory per block;
* the Triton nvfp4_ds_mla cache writer.

Reports registers, spill (stack) bytes, shared memory and a few static SASS counts per launch;
exit status 1 if any launch fails to compile or does not fit. Compile facts, not timings.

    python nvfp4_compile_check.py --tree /path/to/vllm-tree --capability 120 \
        --out nvfp4-compile-sm120-cpu.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
from pathlib import Path

# The offline-compile helpers live beside the CPU proofs that use them.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "proofs"))

from provenance import write_result  # noqa: E402
from sm90_compile import (  # noqa: E402
    CAPABILITIES,
    compile_cuda,
    cuobjdump,
    load_leaf,
    resources,
    signature,
)
from sparse_mla_sm90_compile_stats import (  # noqa: E402
    PLAN_HEADS,
    PLAN_ROWS,
    SPARSE_MLA_PTRS,
    STAND_INS,
)

KERNEL = "vllm/v1/attention/ops/triton_sparse_mla.py"
CODEC = "vllm/v1/attention/ops/triton_nvfp4_ds_mla_cache.py"
OPS = ("HMMA", "HGMMA", "IMAD", "FMUL", "PRMT", "SHF", "LOP3", "LDG", "LDGSTS")


def _facts(compiled) -> dict:
    res, sass = cuobjdump(compiled, "-res-usage", "-sass")
    return dict(
        **resources(res),
        shared_bytes=compiled.metadata.shared,
        sass={op: len(re.findall(rf"\b{op}\b", sass)) for op in OPS},
    )


def plan_points(kern, capability: int) -> list[tuple]:
    """Every distinct launch ``plan_sparse_mla(..., record_format="nvfp4_ds_mla")`` picks by
    default on the stand-in GPU of ``capability`` (rows x heads x contiguous or paged cache,
    top-k 2048), as sparse_mla_sm90_compile_stats.plan_points does for fp8_ds_mla."""
    import torch

    kern._device_info = lambda device: STAND_INS[capability]
    points = set()
    for rows in PLAN_ROWS:
        for heads in PLAN_HEADS:
            for contiguous in (False, True):
                p = kern.plan_sparse_mla(
                    rows,
                    heads,
                    2048,
                    torch.device("cpu"),
                    contiguous=contiguous,
                    record_format="nvfp4_ds_mla",
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


def compile_attention(kern, point, capability: int) -> dict:
    bh, bn, warps, stages, flat, prefetch = point
    fn = kern._sparse_mla_fp8_ds_mla_fwd_kernel
    consts = dict(
        HAS_COUNTS=True,
        BLOCK_H=bh,
        BLOCK_N=bn,
        FLAT_RECORDS=flat,
        PREFETCH=prefetch == "records",
        PREFETCH_SLOTS=prefetch == "slots",
        EMULATE=False,
        ROUND_OUT=False,
        NVFP4=True,
    )
    sig, attrs = signature(fn, SPARSE_MLA_PTRS, consts)
    compiled = compile_cuda(
        fn, sig, consts, attrs, capability=capability, num_warps=warps, num_stages=stages
    )
    return dict(
        kernel="sparse_mla_nvfp4",
        block_h=bh,
        block_n=bn,
        num_warps=warps,
        num_stages=stages,
        flat_records=flat,
        prefetch=prefetch,
        **_facts(compiled),
    )


def compile_writer(codec, capability: int) -> dict:
    fn = codec._concat_and_cache_nvfp4_ds_mla_kernel
    ptrs = {"kv_c_ptr": "*bf16", "k_pe_ptr": "*bf16", "cache_ptr": "*u8", "slot_ptr": "*i64"}
    sig, attrs = signature(fn, ptrs, ())
    compiled = compile_cuda(fn, sig, {}, attrs, capability=capability, num_warps=1)
    return dict(kernel="concat_and_cache_nvfp4_ds_mla", num_warps=1, **_facts(compiled))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", type=Path, required=True)
    ap.add_argument("--capability", type=int, choices=CAPABILITIES, default=120)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    os.environ.pop("TRITON_INTERPRET", None)
    kern = load_leaf(args.tree / KERNEL, "nvfp4_check_kernel")
    codec = load_leaf(args.tree / CODEC, "nvfp4_check_codec")
    limit = STAND_INS[args.capability][1]
    cap = args.capability
    jobs = [
        (f"sparse_mla_nvfp4 {p}", lambda p=p: compile_attention(kern, p, cap))
        for p in plan_points(kern, cap)
    ]
    jobs.append(("writer", lambda: compile_writer(codec, cap)))
    rows, failed = [], 0
    for name, job in jobs:
        try:
            row = job()
            row["ok"] = row["shared_bytes"] <= limit
            if not row["ok"]:
                row["error"] = f"needs {row['shared_bytes']} B of shared memory > {limit}"
        except Exception as exc:  # recorded; the exit status says it
            row = dict(kernel=name, ok=False, error=repr(exc)[:2000])
        failed += not row["ok"]
        row["capability"] = args.capability
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.out:
        import triton

        doc = dict(
            kind="nvfp4-ds-mla-compile",
            what=f"offline sm_{args.capability} compile facts of every nvfp4_ds_mla Triton "
            "launch (registers, spills, shared memory, static SASS); not timings",
            stand_in=dict(sms=STAND_INS[args.capability][0], smem_per_block=limit),
            kernel_sha256={
                p: hashlib.sha256((args.tree / p).read_bytes()).hexdigest() for p in (KERNEL, CODEC)
            },
            triton=triton.__version__,
            failed=failed,
            rows=rows,
        )
        write_result(args.out, doc, gpus=False)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
