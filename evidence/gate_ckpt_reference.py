#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""A CPU forward of the DCP gates' checkpoints, to predict a checkpoint's sensitivity before a
GPU lease is spent on it (fp32 torch; not vLLM, not evidence of equivalence).

It builds the checkpoint exactly as ``make_dsa_gate_ckpt.py`` does (same seed, gains and needle
knobs; the weights rounded to bf16 as the safetensors file stores them), serves the gate's own
seeded prompts (``gate.plan.make_prompts``) and their ``sensitivity`` perturbation
(``gate.plan.perturb``: the needle replaced), and reports per prompt the first generated
step's top-k log-probs of both, the gate's sensitivity measure
(``gate.verdict.step_move_lower_bound``) and the largest logit among the top-k (its bf16 ULP is
what one legitimate reordering moves a log-prob by: the gates' noise floor).

The model is ``gate_refmodel.py`` (fp32, no fp8, simplified RoPE), so its figures are
predictions; the GPU run measures them. Checked against the 2026-12-01 18:20Z H200 runs of
the o-gain-3 checkpoints at 1024 tokens (design/dcp-gates.md).

    python evidence/gate_ckpt_reference.py --ckpt glmn --lens 1024,8192 --out results/x.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE)]

import make_dsa_gate_ckpt as mk  # noqa: E402
from gate import plan, plans, verdict  # noqa: E402
from gate_refmodel import last_logits  # noqa: E402
from provenance import command  # noqa: E402


def checkpoint_tensors(argv: list[str]) -> tuple[dict[str, Any], dict[str, Any], int | None]:
    """(config, fp32 tensors holding the bf16-rounded weights, needle id) of a checkpoint
    given by ``make_dsa_gate_ckpt.py`` arguments (``--out`` is not needed)."""
    import torch

    args = mk.parser().parse_args([*argv, "--out", "-"] if "--out" not in argv else argv)
    cfg, _, t, _ = mk.make_tensors(args)
    stored = mk.to_checkpoint(t)
    return cfg, {k: v.to(torch.float32) for k, v in stored.items()}, args.needle


def step_record(logits, k: int) -> dict[str, Any]:
    """The gate's per-step record: the top-k ids with their log-probs."""
    lp = logits.log_softmax(-1)
    top = lp.topk(k)
    return {
        "token": int(top.indices[0]),
        "top": [[int(i), float(v)] for i, v in zip(top.indices, top.values, strict=True)],
        "max_top_logit": float(logits[top.indices].max()),
    }


def bf16_ulp(x: float) -> float:
    """The spacing of bf16 numbers at |x| (8 significant bits)."""
    return 2.0 ** (math.floor(math.log2(abs(x))) - 7) if x else 2.0**-133


def predict(ckpt_argv: list[str], lens: list[int], logprobs: int = 20) -> dict[str, Any]:
    cfg, t, needle = checkpoint_tensors(ckpt_argv)
    gc = plan.GateConfig(
        name="reference", model="ref", tp=1, dcp=1, lens=tuple(lens), batch_lens=(),
        needle=-1 if needle is None else needle,
    )  # fmt: skip
    prompts = plan.make_prompts(gc)
    rows: dict[str, Any] = {}
    for n in lens:
        ids = prompts[f"single/{n}"]
        t0 = time.perf_counter()
        clean = step_record(last_logits(cfg, t, ids), logprobs)
        moved = step_record(last_logits(cfg, t, plan.perturb(ids)), logprobs)
        d, common = verdict.step_difference(clean, moved)
        top_logit = max(clean["max_top_logit"], moved["max_top_logit"])
        row = rows[f"single/{n}~p{plan.PERTURB_POSITION}"] = {
            "first_step_move_lower_bound": verdict.step_move_lower_bound(clean, moved),
            "first_step_max_abs_logprob_diff": d,
            "common_top_ids": common,
            "first_token_changed": clean["token"] != moved["token"],
            "top_logprob": clean["top"][0][1],
            "max_top_logit": top_logit,
            "bf16_ulp_of_max_top_logit": bf16_ulp(top_logit),
            "seconds": round(time.perf_counter() - t0, 1),
        }
        print(json.dumps({n: row}), flush=True)
    figure = min(r["first_step_move_lower_bound"] for r in rows.values())
    ulp = max(r["bf16_ulp_of_max_top_logit"] for r in rows.values())
    atol = verdict.TOLERANCE_FACTOR * ulp
    return {
        "per_prompt": rows,
        "min_first_step_move_lower_bound": figure,
        "predicted_noise_floor": ulp,
        "predicted_tolerance": atol,
        "predicted_over_tolerance": figure / atol,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ckpt", default="glmn", help=f"{', '.join(plans.NEEDLE_CKPTS)}")
    ap.add_argument(
        "--args", default=None, help="make_dsa_gate_ckpt.py arguments instead of --ckpt"
    )
    ap.add_argument("--lens", default="1024,8192")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    ckpt_argv = args.args.split() if args.args else list(plans.NEEDLE_CKPTS[args.ckpt])
    lens = [int(x) for x in args.lens.split(",")]
    import os
    import platform

    from provenance import git_revision

    res = {
        "kind": "dcp-gate-ckpt-reference",
        "what": "CPU fp32 forward of a gate checkpoint: predicted sensitivity (not a GPU run)",
        "command": command(),
        "revision": git_revision(),
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
        },
        "checkpoint_args": ckpt_argv,
        "sensitivity_measure": verdict.SENSITIVITY_MEASURE,
        "noise_floor_rule": "one bf16 ULP of the largest top-k logit (what one legitimate "
        "reordering moves a log-prob by); tolerance = TOLERANCE_FACTOR x that",
        "margin_required": verdict.SENSITIVITY_MARGIN,
        **predict(ckpt_argv, lens),
    }
    text = json.dumps(res, indent=1) + "\n"
    if args.out:
        args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
