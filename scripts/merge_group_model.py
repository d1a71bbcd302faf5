# SPDX-License-Identifier: Apache-2.0
"""CPU model of the merge's score-range pass on the benchmark's inputs: per case, the group it
leaves at the k-th key and whether ``radix_first_pass="range_rank"`` ranks that group (at most
``RANK_BLOCK`` candidates and at most top-k) or hands it to the radix passes.

The inputs are ``bench_dcp_topk.make_rank_inputs`` on a CPU generator and the leaf's torch pack;
the pass is modelled as the kernel does it: 256 bins over ``[min, max]`` of the row's valid
scores (padding in bin 0; rows with a non-finite score or one value skip it). A model, not a
timing: it says which path the GPU run of ``triton_rank`` takes.

    python scripts/merge_group_model.py --tree build/vllm
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from bench_dcp_topk import DECODE_TOPKS, KINDS, WORLDS, load_leaf, make_rank_inputs

BINS = 256


def range_pass_group(scores: torch.Tensor, ids: torch.Tensor, topk: int) -> int | None:
    """Candidates in the bin of the k-th key after the value pass, or None when the row
    resolves without a group (the pass skipped, or the bin holds exactly what is needed)."""
    valid = ids >= 0
    s = scores[valid]
    if s.numel() == 0 or not torch.isfinite(s).all() or s.max() <= s.min():
        return None
    scale = BINS / (s.max() - s.min())
    if not torch.isfinite(scale):
        return None
    digit = ((scores - s.min()) * scale).to(torch.int64).clamp(max=BINS - 1)
    digit = torch.where(valid, digit, 0)
    hist = torch.bincount(digit, minlength=BINS)
    at_least = hist.flip(0).cumsum(0).flip(0)
    k = min(topk, scores.numel())
    bin_ = int((at_least >= k).nonzero().max())
    above = int(at_least[bin_ + 1]) if bin_ < BINS - 1 else 0
    size = int(hist[bin_])
    return size if size > k - above else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", type=Path, required=True, help="patched vLLM tree")
    ap.add_argument("--rows", type=int, default=64)
    args = ap.parse_args()
    leaf = load_leaf(args.tree)
    for topk in DECODE_TOPKS:
        for world in WORLDS:
            for kind in KINDS:
                gen = torch.Generator().manual_seed(topk * 10 + world)
                packs = []
                for rank in range(world):
                    logits, local, starts = make_rank_inputs(kind, args.rows, topk, topk + 777, gen)
                    pack = torch.empty((args.rows, topk, 2))
                    leaf.pack_dcp_topk_candidates_torch(logits, local, pack, rank, world, 1, starts)
                    packs.append(pack)
                gathered = torch.cat(packs, dim=1)
                groups = sorted(
                    g
                    for r in range(args.rows)
                    if (g := range_pass_group(gathered[r, :, 0], gathered[r, :, 1].int(), topk))
                )
                ranked = sum(g <= leaf.RANK_BLOCK and g <= topk for g in groups)
                sizes = f"{groups[0]}/{groups[len(groups) // 2]}/{groups[-1]}" if groups else "-"
                print(
                    f"top-k {topk} DCP {world} {kind:6s}: rows with a group {len(groups)}/"
                    f"{args.rows}, its size min/median/max {sizes}, ranked {ranked}"
                )


if __name__ == "__main__":
    main()
