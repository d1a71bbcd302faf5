# SPDX-License-Identifier: Apache-2.0
"""Sweep of the adaptive-depth cost model beyond the ranges the proofs assert (not a test).

Prints, per verify-cost slope ``alpha`` and geometric acceptance profile ``(q0, decay)``,
the adaptive throughput as a fraction of the best fixed ladder depth whenever it is below
97%, using the same model as proofs/test_adaptive_depth.py (2,000 steps, batch 1, seed 0);
and first, for one batch of half code-like and half prose-like requests, one depth per batch
against one depth per request (``mixed_batch``). design/mtp.md quotes its output.

    DCP_VLLM_TREE=build/vllm python proofs/sweep_adaptive_depth.py

It loads the controller of vllm/0012 (on the pinned vLLM base, pins.toml) through
``conftest.load_leaf``, the loader the proofs use.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from conftest import load_leaf  # noqa: E402

LADDER = (2, 4, 5)


def load_controller():
    return load_leaf("vllm/v1/spec_decode/adaptive_depth.py")


def accept_length(rng: random.Random, q0: float, decay: float) -> int:
    a, q = 0, q0
    while a < 5 and rng.random() < q:
        a += 1
        q *= decay
    return a


def fixed(trace: list[int], depth: int, alpha: float) -> float:
    return sum(1 + min(a, depth) for a in trace) / (len(trace) * (1 + alpha * depth))


def adaptive(ad, trace: list[int], alpha: float) -> float:
    ctl = ad.AdaptiveDepthController()
    epoch, depth = ctl.epoch, ctl.depth
    tokens, time = 0, 0.0
    for a in trace:
        acc = min(a, depth)
        tokens += 1 + acc
        time += 1 + alpha * depth
        ctl.observe(epoch, depth, acc)
        ctl.end_step()
        epoch, depth = ctl.epoch, ctl.depth
    return tokens / time


def mixed_batch(
    ad,
    code: tuple[float, float],
    prose: tuple[float, float],
    alpha: float,
    batch: int = 8,
    steps: int = 2000,
) -> dict[str, float]:
    """One batch, half code-like and half prose-like requests, in the same cost model with
    one step per batch: a step costs ``1 + alpha * d`` where ``d`` is the depth the batch
    drafts and verifies at (the largest depth in it: the drafter's loop is batched and a
    uniform verification shape pads to it), and request r yields ``1 + min(a_r, d_r)``.
    Per batch: one controller, pooled acceptance. Per request: one controller per request,
    each at its own depth, the step paying the largest; or every request verified at the
    largest (a uniform batch). Fixed: every ladder depth."""
    rng = random.Random(0)
    kinds = [code if i % 2 == 0 else prose for i in range(batch)]
    trace = [[accept_length(rng, q0, dec) for q0, dec in kinds] for _ in range(steps)]

    def run(per_request: bool, verify_at_max: bool = False) -> float:
        """``verify_at_max``: every request drafts and verifies at the batch's largest
        depth (a uniform batch), each controller observing only its own depth's prefix."""
        ctls = [ad.AdaptiveDepthController() for _ in range(batch if per_request else 1)]
        prev = [(c.epoch, c.depth) for c in ctls]
        tokens, time = 0, 0.0
        for step in trace:
            own = [prev[i if per_request else 0][1] for i in range(batch)]
            top = max(own)
            time += 1 + alpha * top
            for i, a in enumerate(step):
                c = i if per_request else 0
                tokens += 1 + min(a, top if verify_at_max else own[i])
                ctls[c].observe(prev[c][0], own[i], min(a, own[i]))
            for c in ctls:
                c.end_step()
            prev = [(c.epoch, c.depth) for c in ctls]
        return tokens / time

    fixed_tp = {
        d: sum(1 + min(a, d) for st in trace for a in st) / (steps * (1 + alpha * d))
        for d in LADDER
    }
    best = max(fixed_tp.values())
    return {
        "per_batch": run(False) / best,
        "per_request": run(True) / best,
        "per_request_uniform": run(True, verify_at_max=True) / best,
        "best_fixed": max(fixed_tp, key=fixed_tp.get),
    }


def main() -> None:
    ad = load_controller()
    print("one batch of 8, half code-like (q0, decay), half prose-like: throughput / best fixed")
    for alpha in (0.1, 0.2, 0.3):
        for code, prose in (((0.95, 1.0), (0.6, 0.9)), ((0.98, 1.0), (0.0, 1.0))):
            r = mixed_batch(ad, code, prose, alpha)
            print(
                f"alpha={alpha} code={code} prose={prose}: per batch {r['per_batch']:.3f}, "
                f"per request {r['per_request']:.3f}, per request verified at the "
                f"batch's largest {r['per_request_uniform']:.3f} (best fixed k{r['best_fixed']})"
            )
    for alpha in (0.03, 0.06, 0.1, 0.15, 0.2, 0.25, 0.3):
        below = []
        for q0 in (0.3, 0.4, 0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95, 0.98):
            for decay in (0.8, 0.9, 0.95, 1.0):
                rng = random.Random(0)
                trace = [accept_length(rng, q0, decay) for _ in range(2000)]
                tp = {d: fixed(trace, d, alpha) for d in LADDER}
                best = max(tp, key=tp.get)
                ratio = adaptive(ad, trace, alpha) / tp[best]
                if ratio < 0.97:
                    below.append(f"q0={q0} decay={decay}: {ratio:.3f} of k{best}")
        print(f"alpha={alpha}: {len(below)} of 44 profiles below 97%")
        for line in below:
            print("   ", line)


if __name__ == "__main__":
    main()
