# SPDX-License-Identifier: Apache-2.0
"""Sweep of the adaptive-depth cost model beyond the ranges the proofs assert (not a test).

Prints, per verify-cost slope ``alpha`` and geometric acceptance profile ``(q0, decay)``,
the adaptive throughput as a fraction of the best fixed ladder depth whenever it is below
97%, using the same model as proofs/test_adaptive_depth.py (2,000 steps, batch 1, seed 0).
design/mtp.md quotes its output.

    DCP_VLLM_TREE=build/vllm python proofs/sweep_adaptive_depth.py

It loads the controller of vllm/0012 (vLLM 0.33.0 base) through ``conftest.load_leaf``, the
loader the proofs use.
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


def main() -> None:
    ad = load_controller()
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
