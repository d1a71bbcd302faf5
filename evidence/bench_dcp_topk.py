# SPDX-License-Identifier: Apache-2.0
"""GPU benchmark: the DCP global top-k merge, Triton and torch against CuTe DSL (vLLM 0.33.0).

For every case (DCP ranks simulated in one process) it builds each rank's local logits and
local top-k, packs the ``(score, global_id)`` candidates with the CuTe DSL path's Triton pack,
the leaf's Triton pack and the leaf's torch pack (they must agree bit for bit), concatenates the
ranks' packs (what the all-gather returns) and selects the global top-k with the CuTe DSL radix
selector, the leaf's Triton selector (``triton``: its radix select of 8-bit digits) and its
torch reference. A case is identical when the packs are bit-identical and every row selects the
same set (the CuTe DSL kernel writes its set in atomic order, so rows are compared sorted).
Runs up to 2026-12-02 09:59Z also timed the selector's comparison choices (``triton_range``,
``triton_rank``, ``triton_radix4``, ``triton_bisect``; the results JSON keeps their columns);
they left the leaf after that run, slower than ``triton`` at every decode shape.

Times (median of CUDA events) per backend, eager and CUDA-graph-replayed (a graph of up to
``--graph-calls`` back-to-back calls, replayed, divided by the call count: the time users get
under vLLM's CUDA graphs): ``select`` (the selector alone) and ``merge`` (one rank's pack plus
the selection; the all-gather between them is not timed). Each row carries
``time_over_cutedsl`` (CUDA-graph merge time of triton / torch over CuTe DSL, the ratio issue 16
judges) and the same ratios for eager
and select-only. Repetitions adapt to the call's time (each timing spends about ``--target-ms``
of GPU time, at least 5 repetitions), so the slow torch cases do not dominate the run.

Grids: ``decode`` = rows 1, 2, 8, 32, 64 x DCP 2/4 x top-k 512/2048 (``--decode-topk``; random
scores); ``old36`` = the 0.26 grid of results/dcp-topk-h200.json (random / ties / short x rows
64 / 2048 x DCP 2/4 x top-k 512/1024/2048). Decode cases run first; once ``--budget-s`` is spent
the remaining cases are listed under ``skipped`` (the JSON is rewritten after every case, so a
killed run keeps what it measured).

Needs one CUDA GPU, the vLLM 0.33.0 wheel with nvidia-cutlass-dsl and quack-kernels importable,
and the patched tree (the leaf module is loaded from it by path). Writes
``results/dcp-topk-merge-<gpu>-<UTC stamp>.json`` (or ``--out``); exits 1 when a case differs.
About 30-60 s on one H200 including the CuTe DSL and Triton JIT (a three-backend run took
28 s).

    python evidence/bench_dcp_topk.py --vllm-tree build/vllm
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from bench_timing import capture_graph, event_times
from provenance import command, git_revision, load_module, package_version
from provenance import machine as provenance_machine

REPO = Path(__file__).resolve().parent.parent
LEAF = "vllm/model_executor/kernels/attention/dsa/dcp_topk_merge.py"
TOPKS = (512, 1024, 2048)
DECODE_TOPKS = (512, 2048)
WORLDS = (2, 4)
DECODE_ROWS = (1, 2, 8, 32, 64)
OLD_ROWS = (64, 2048)
KINDS = ("random", "ties", "short")
BACKENDS = ("cutedsl", "triton", "torch")
# The variants compared with CuTe DSL.
VARIANTS = BACKENDS[1:]


def load_leaf(tree: Path) -> ModuleType:
    path = tree / LEAF
    if not path.is_file():
        raise SystemExit(f"{path} not found: pass --vllm-tree (the patched vLLM tree)")
    return load_module(path, "dcp_topk_merge_leaf")


def machine() -> dict[str, Any]:
    """The shared provenance record plus the fields the rendered tables name."""
    props = torch.cuda.get_device_properties(0)
    info = provenance_machine()
    info.update(
        gpu=props.name,
        gpu_count=torch.cuda.device_count(),
        compute_capability=f"{props.major}.{props.minor}",
        sm_count=props.multi_processor_count,
        **{name: package_version(name) for name in ("nvidia-cutlass-dsl", "quack-kernels")},
    )
    return info


def make_rank_inputs(
    kind: str, rows: int, topk: int, local_width: int, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One rank's (logits, local top-k indices, row_starts), on the generator's device."""
    pad = 8
    dev = gen.device
    row_starts = torch.randint(0, pad, (rows,), generator=gen, device=dev, dtype=torch.int32)
    if kind == "ties":
        logits = torch.randint(-4, 4, (rows, local_width + pad), generator=gen, device=dev)
        logits = logits.float()
        logits[:, ::7] = float("-inf")
        logits[:, 1::11] = -0.0
    else:
        logits = torch.randn((rows, local_width + pad), generator=gen, device=dev)
    cols = row_starts.long().view(-1, 1) + torch.arange(local_width, device=dev)
    local = logits.gather(1, cols).topk(topk, dim=1).indices.to(torch.int32)
    if kind == "short":
        # Rows whose local shard holds fewer tokens than top-k, one empty row.
        lengths = torch.randint(0, topk, (rows,), generator=gen, device=dev)
        lengths[0] = 0
        pos = torch.arange(topk, device=dev).view(1, -1)
        local = torch.where(pos < lengths.view(-1, 1), local, -1).to(torch.int32)
    return logits, local, row_starts


def eager_ms(fn: Callable[[], object], iters: int, warm: int = 3) -> float:
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    return statistics.median(event_times(fn, iters))


def repetitions(fn: Callable[[], object], args: argparse.Namespace) -> tuple[int, int]:
    """(graph calls, timed repetitions) that spend about ``args.target_ms`` per timing."""
    ms = max(eager_ms(fn, 3, warm=1), 1e-3)
    calls = max(1, min(args.graph_calls, int(1.0 / ms)))
    iters = max(5, min(args.iters, int(args.target_ms / (calls * ms))))
    return calls, iters


def graph_ms(fn: Callable[[], object], iters: int, calls: int) -> float:
    """Per-call time of ``calls`` back-to-back calls captured in one CUDA graph."""
    return eager_ms(capture_graph(fn, calls).replay, iters) / calls


def run_case(
    leaf: ModuleType,
    cute: ModuleType,
    grid: str,
    topk: int,
    world: int,
    kind: str,
    rows: int,
    seed: int,
    args: argparse.Namespace,
) -> dict[str, Any]:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    local_width = topk + 777
    packers = {
        "cutedsl": cute.pack_dcp_topk_candidates_cutedsl,
        "triton": leaf.pack_dcp_topk_candidates_triton,
        "torch": leaf.pack_dcp_topk_candidates_torch,
    }
    selectors = {
        "cutedsl": cute.stable_topk_from_gathered_candidates_cutedsl,
        "triton": leaf.stable_topk_from_gathered_candidates_triton,
        "torch": leaf.stable_topk_from_gathered_candidates_torch,
    }
    packs_equal = True
    packed_ranks, inputs = [], []
    for rank in range(world):
        logits, local, row_starts = make_rank_inputs(kind, rows, topk, local_width, gen)
        packs = {}
        for name in BACKENDS:
            packs[name] = torch.empty((rows, topk, 2), device="cuda", dtype=torch.float32)
            packers[name](logits, local, packs[name], rank, world, 1, row_starts)
        for name in VARIANTS:
            packs_equal &= torch.equal(
                packs["cutedsl"].view(torch.int32), packs[name].view(torch.int32)
            )
        packed_ranks.append(packs["cutedsl"])
        inputs.append((logits, local, row_starts))
    gathered = torch.cat(packed_ranks, dim=1).contiguous()

    selected = {name: select(gathered, topk) for name, select in selectors.items()}
    reference = selected["cutedsl"].sort(dim=1).values
    rows_differing = {
        name: int((selected[name].sort(dim=1).values != reference).any(dim=1).sum().item())
        for name in VARIANTS
    }

    logits0, local0, starts0 = inputs[0]
    pack_out = torch.empty((rows, topk, 2), device="cuda", dtype=torch.float32)
    sel_out = torch.empty((rows, topk), device="cuda", dtype=torch.int32)
    timings: dict[str, dict[str, float]] = {}
    for name in BACKENDS:
        pack, select = packers[name], selectors[name]

        def select_only(select=select) -> None:
            select(gathered, topk, out=sel_out)

        def merge(pack=pack, select=select) -> None:
            pack(logits0, local0, pack_out, 0, world, 1, starts0)
            select(gathered, topk, out=sel_out)

        s_calls, s_iters = repetitions(select_only, args)
        m_calls, m_iters = repetitions(merge, args)
        timings[name] = {
            "select_eager_ms": eager_ms(select_only, s_iters),
            "merge_eager_ms": eager_ms(merge, m_iters),
            "select_graph_ms": graph_ms(select_only, s_iters, s_calls),
            "merge_graph_ms": graph_ms(merge, m_iters, m_calls),
            "repetitions": {"select": [s_calls, s_iters], "merge": [m_calls, m_iters]},
        }

    def ratios(key: str) -> dict[str, float]:
        base = timings["cutedsl"][key]
        return {name: timings[name][key] / base for name in VARIANTS}

    identical = packs_equal and not any(rows_differing.values())
    return {
        "grid": grid,
        "topk": topk,
        "dcp": world,
        "kind": kind,
        "rows": rows,
        "candidates_per_row": world * topk,
        "seed": seed,
        "packs_bit_identical": packs_equal,
        "rows_with_different_set": rows_differing,
        "identical": identical,
        "timings": timings,
        "time_over_cutedsl": ratios("merge_graph_ms"),
        "time_over_cutedsl_eager": ratios("merge_eager_ms"),
        "select_time_over_cutedsl": ratios("select_graph_ms"),
        "select_time_over_cutedsl_eager": ratios("select_eager_ms"),
    }


def cases(args: argparse.Namespace) -> list[tuple[str, int, int, str, int]]:
    out = []
    if "decode" in args.grids:
        for topk in args.decode_topk:
            for world in args.dcp:
                for rows in DECODE_ROWS:
                    out.append(("decode", topk, world, "random", rows))
    if "old36" in args.grids:
        for topk in args.topk:
            for world in args.dcp:
                for kind in KINDS:
                    for rows in OLD_ROWS:
                        out.append(("old36", topk, world, kind, rows))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--vllm-tree",
        type=Path,
        default=Path(os.environ.get("DCP_VLLM_TREE", REPO / "build" / "vllm")),
        help="patched vLLM tree holding the leaf module (default: $DCP_VLLM_TREE or build/vllm)",
    )
    parser.add_argument("--out", type=Path, default=None, help="default: results/<name>.json")
    parser.add_argument(
        "--grids", nargs="+", default=["decode", "old36"], choices=["decode", "old36"]
    )
    parser.add_argument(
        "--topk", type=int, nargs="+", default=list(TOPKS), choices=TOPKS, help="old36 grid"
    )
    parser.add_argument(
        "--decode-topk", type=int, nargs="+", default=list(DECODE_TOPKS), choices=TOPKS
    )
    parser.add_argument("--dcp", type=int, nargs="+", default=list(WORLDS), help="simulated ranks")
    parser.add_argument("--iters", type=int, default=50, help="most timed repetitions")
    parser.add_argument("--graph-calls", type=int, default=20, help="most calls per CUDA graph")
    parser.add_argument(
        "--target-ms", type=float, default=25.0, help="GPU time per timing (sets repetitions)"
    )
    parser.add_argument(
        "--budget-s", type=float, default=85.0, help="skip the remaining cases after this"
    )
    parser.add_argument("--quick", action="store_true", help="the decode grid only")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU")
    started = time.time()
    leaf = load_leaf(args.vllm_tree.resolve())
    import vllm
    from vllm.model_executor.kernels.attention.dsa import dcp_indexer_cutedsl as cute

    info = machine()
    out = args.out
    if out is None:
        gpu = info["gpu"].split()[-1].lower()
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        out = REPO / "results" / f"dcp-topk-merge-{gpu}-{stamp}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    if args.quick:
        args.grids = ["decode"]
    todo = cases(args)
    results: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []
    errors: list[str] = []

    def write(final: bool) -> bool:
        identical = bool(results) and not errors and all(c["identical"] for c in results)
        decode = [c for c in results if c["grid"] == "decode"]
        result = {
            "schema_version": 2,
            "base": f"vllm {vllm.__version__}",
            "base_variant": "installed vLLM (CuTe DSL kernels) + the leaf of vllm_tree",
            "command": command(),
            "git_revision": git_revision(REPO),
            "vllm_tree": str(args.vllm_tree),
            "vllm_tree_git_revision": git_revision(args.vllm_tree),
            "machine": info,
            "wall_s": round(time.time() - started, 1),
            "finished": final,
            "identical": identical,
            "summary": {
                "cases": len(results),
                "cases_planned": len(todo),
                "cases_identical": sum(c["identical"] for c in results),
                "decode_max_time_over_cutedsl": {
                    name: max((c["time_over_cutedsl"][name] for c in decode), default=None)
                    for name in VARIANTS
                },
                "max_time_over_cutedsl": {
                    name: max((c["time_over_cutedsl"][name] for c in results), default=None)
                    for name in VARIANTS
                },
                "decode_max_select_time_over_cutedsl": {
                    name: max((c["select_time_over_cutedsl"][name] for c in decode), default=None)
                    for name in VARIANTS
                },
            },
            "cases": results,
            "skipped": skipped,
            "errors": errors,
        }
        tmp = out.with_suffix(out.suffix + ".tmp")
        tmp.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
        tmp.replace(out)
        return identical

    for i, (grid, topk, world, kind, rows) in enumerate(todo):
        spec = dict(grid=grid, topk=topk, dcp=world, kind=kind, rows=rows)
        if time.time() - started > args.budget_s:
            skipped.append(spec)
            continue
        try:
            case = run_case(leaf, cute, grid, topk, world, kind, rows, args.seed + i, args)
        except Exception as exc:  # recorded; the run goes on and exits 1
            errors.append(f"{spec}: {type(exc).__name__}: {str(exc)[:300]}")
            print(f"ERROR {spec}: {exc!r}"[:400], flush=True)
            write(False)
            continue
        results.append(case)
        write(False)
        r = case["time_over_cutedsl"]
        t = case["timings"]["cutedsl"]["merge_graph_ms"] * 1e3
        print(
            f"[{time.time() - started:5.1f}s] {grid:6s} topk={topk} dcp={world} {kind:6s} "
            f"rows={rows:5d} identical={case['identical']} cutedsl {t:.1f} us (graph merge), "
            f"triton x{r['triton']:.2f} torch x{r['torch']:.2f}",
            flush=True,
        )

    identical = write(True)
    print(
        f"identical={identical} over {len(results)} cases ({len(skipped)} skipped by the "
        f"budget, {len(errors)} errors) in {time.time() - started:.0f} s; wrote {out}"
    )
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
