# SPDX-License-Identifier: Apache-2.0
"""GPU evidence: the exact PyTorch DCP top-k merge selects what the CuteDSL kernels select.

For index_topk 512/1024/2048 and DCP 2/4 (ranks simulated in one process), builds each rank's
local logits and local top-k, packs the candidates with the shipped Triton pack
(``pack_dcp_topk_candidates_cutedsl``) and with ``pack_dcp_topk_candidates_torch``, then selects
the global top-k from the concatenated candidates with the CuteDSL radix selector and with
``stable_topk_from_gathered_candidates_torch``. A case is identical when both packs are equal bit
for bit and every row's selected set is equal (the CuteDSL kernel writes its set in atomic order,
so rows are compared sorted). Inputs: random normal scores, tie-heavy small-integer scores with
-inf / -0.0 entries, and rows with fewer valid candidates than top-k (``-1`` padding).

Needs a CUDA GPU, vLLM 0.26.0 with ``nvidia-cutlass-dsl`` and ``quack-kernels`` importable, and
the patched tree (for the leaf module, loaded by path). Writes ``results/dcp-topk-h200.json``;
exits 1 when any case differs.

    python scripts/gpu_dcp_topk_check.py --vllm-tree build/vllm
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import shlex
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import torch
from evidence import git_revision

REPO = Path(__file__).resolve().parent.parent
LEAF = "vllm/v1/attention/ops/dcp_topk_merge.py"
TOPKS = (512, 1024, 2048)
WORLDS = (2, 4)
KINDS = ("random", "ties", "short")


def load_leaf(tree: Path) -> ModuleType:
    path = tree / LEAF
    if not path.is_file():
        raise SystemExit(f"{path} not found: pass --vllm-tree (the patched vLLM tree)")
    spec = importlib.util.spec_from_file_location("dcp_topk_merge_leaf", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def package_version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def make_rank_inputs(
    kind: str, rows: int, topk: int, local_width: int, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One rank's (logits, local top-k indices, row_starts) for a prefill-style chunk."""
    pad = 8
    row_starts = torch.randint(0, pad, (rows,), generator=gen, device="cuda", dtype=torch.int32)
    if kind == "ties":
        logits = torch.randint(-4, 4, (rows, local_width + pad), generator=gen, device="cuda")
        logits = logits.float()
        logits[:, ::7] = float("-inf")
        logits[:, 1::11] = -0.0
    else:
        logits = torch.randn((rows, local_width + pad), generator=gen, device="cuda")
    cols = row_starts.long().view(-1, 1) + torch.arange(local_width, device="cuda")
    window = logits.gather(1, cols)
    local = window.topk(topk, dim=1).indices.to(torch.int32)
    if kind == "short":
        # Rows whose local shard holds fewer tokens than top-k, one empty row.
        lengths = torch.randint(0, topk, (rows,), generator=gen, device="cuda")
        lengths[0] = 0
        pos = torch.arange(topk, device="cuda").view(1, -1)
        local = torch.where(pos < lengths.view(-1, 1), local, -1).to(torch.int32)
    return logits, local, row_starts


def cuda_time_ms(fn: Callable[[], object], iters: int) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(iters):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def run_case(
    leaf: ModuleType,
    cute: ModuleType,
    topk: int,
    world: int,
    kind: str,
    rows: int,
    seed: int,
    iters: int,
) -> dict[str, object]:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    local_width = topk + 777
    packs_equal = True
    packed_ranks = []
    inputs = []
    for rank in range(world):
        logits, local, row_starts = make_rank_inputs(kind, rows, topk, local_width, gen)
        a = torch.empty((rows, topk, 2), device="cuda", dtype=torch.float32)
        b = torch.empty_like(a)
        cute.pack_dcp_topk_candidates_cutedsl(logits, local, a, rank, world, 1, row_starts)
        leaf.pack_dcp_topk_candidates_torch(logits, local, b, rank, world, 1, row_starts)
        packs_equal &= torch.equal(a.view(torch.int32), b.view(torch.int32))
        packed_ranks.append(a)
        inputs.append((logits, local, row_starts, rank))
    gathered = torch.cat(packed_ranks, dim=1).contiguous()

    sel_cute = cute.stable_topk_from_gathered_candidates_cutedsl(gathered, topk)
    sel_torch = leaf.stable_topk_from_gathered_candidates_torch(gathered, topk)
    cute_sorted = sel_cute.sort(dim=1).values
    torch_sorted = sel_torch.sort(dim=1).values
    rows_differing = int((cute_sorted != torch_sorted).any(dim=1).sum().item())
    valid_per_row = (sel_torch >= 0).sum(dim=1).float()

    logits0, local0, starts0, rank0 = inputs[0]
    pack_out = torch.empty((rows, topk, 2), device="cuda", dtype=torch.float32)
    sel_out = torch.empty((rows, topk), device="cuda", dtype=torch.int32)
    timings = {
        "pack_triton_ms": cuda_time_ms(
            lambda: cute.pack_dcp_topk_candidates_cutedsl(
                logits0, local0, pack_out, rank0, world, 1, starts0
            ),
            iters,
        ),
        "pack_torch_ms": cuda_time_ms(
            lambda: leaf.pack_dcp_topk_candidates_torch(
                logits0, local0, pack_out, rank0, world, 1, starts0
            ),
            iters,
        ),
        "select_cutedsl_ms": cuda_time_ms(
            lambda: cute.stable_topk_from_gathered_candidates_cutedsl(gathered, topk, out=sel_out),
            iters,
        ),
        "select_torch_ms": cuda_time_ms(
            lambda: leaf.stable_topk_from_gathered_candidates_torch(gathered, topk, out=sel_out),
            iters,
        ),
    }
    return {
        "topk": topk,
        "dcp": world,
        "kind": kind,
        "rows": rows,
        "candidates_per_row": world * topk,
        "seed": seed,
        "packs_bit_identical": packs_equal,
        "rows_with_different_set": rows_differing,
        "mean_valid_selected_per_row": float(valid_per_row.mean().item()),
        "identical": packs_equal and rows_differing == 0,
        "timings": timings,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--vllm-tree",
        type=Path,
        default=Path(os.environ.get("DCP_VLLM_TREE", REPO / "build" / "vllm")),
        help="patched vLLM tree holding the leaf module (default: $DCP_VLLM_TREE or build/vllm)",
    )
    parser.add_argument("--out", type=Path, default=REPO / "results" / "dcp-topk-h200.json")
    parser.add_argument(
        "--rows",
        type=int,
        nargs="+",
        default=[64, 2048],
        help="rows per case: decode-sized and prefill-chunk-sized",
    )
    parser.add_argument("--topk", type=int, nargs="+", default=list(TOPKS), choices=TOPKS)
    parser.add_argument("--dcp", type=int, nargs="+", default=list(WORLDS), help="simulated ranks")
    parser.add_argument("--iters", type=int, default=20, help="timed iterations per kernel")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU")
    leaf = load_leaf(args.vllm_tree.resolve())
    from vllm.model_executor.kernels.attention.dsa import dcp_indexer_cutedsl as cute

    started = time.time()
    cases = []
    for topk in args.topk:
        for world in args.dcp:
            for kind in KINDS:
                for rows in args.rows:
                    seed = args.seed + len(cases)
                    case = run_case(leaf, cute, topk, world, kind, rows, seed, args.iters)
                    cases.append(case)
                    t = case["timings"]
                    print(
                        f"topk={topk} dcp={world} {kind:6s} rows={rows:5d} "
                        f"identical={case['identical']} "
                        f"select cutedsl {t['select_cutedsl_ms']:.3f} ms "
                        f"torch {t['select_torch_ms']:.3f} ms",
                        flush=True,
                    )

    props = torch.cuda.get_device_properties(0)
    identical = all(c["identical"] for c in cases)
    result = {
        "schema_version": 1,
        "command": shlex.join([sys.executable, *sys.argv]),
        "git_revision": git_revision(REPO),
        "vllm_tree": str(args.vllm_tree),
        "vllm_tree_git_revision": git_revision(args.vllm_tree),
        "machine": {
            "hostname": platform.node(),
            "gpu": props.name,
            "gpu_count": torch.cuda.device_count(),
            "compute_capability": f"{props.major}.{props.minor}",
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "triton": package_version("triton"),
            "vllm": package_version("vllm"),
            "nvidia-cutlass-dsl": package_version("nvidia-cutlass-dsl"),
            "quack-kernels": package_version("quack-kernels"),
        },
        "wall_s": round(time.time() - started, 1),
        "identical": identical,
        "cases": cases,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    print(f"identical={identical} over {len(cases)} cases; wrote {args.out}")
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
