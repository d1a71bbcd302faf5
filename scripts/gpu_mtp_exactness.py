#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""GPU: greedy MTP speculative decoding must reproduce the output without speculation.

vLLM 0.33, Model Runner V2 (the default; ``--runner v1`` for the deprecated V1 runner, which
refuses the adaptive depth). For one DCP size, runs the tiny DSA model with its MTP layer
(``num_nextn_predict_layers: 1``) without speculation and then with MTP at k = 1, 2, 4, 5 and
with the adaptive depth (``adaptive_speculative_tokens="acceptance"``, ladder 2/4/5, short
windows so that the depth moves within the run), CUDA graphs on (``--eager`` turns them off),
token-id prompts up to 3000 tokens, ``skip_tokenizer_init=True``. Every run must give the same
greedy tokens as the baseline, and the same top-``--logprobs`` ids with log-probabilities within
``--tol`` at every step (the first step after prefill included). Each result also carries a
negative control: the baseline with one token changed, which the same gate must refuse.

Weights: ``load_format="dummy"`` (random) by default; ``--ckpt DIR`` loads one checkpoint made
by ``make_tiny_mtp_ckpt.py``; ``--ckpt-root DIR --kinds agree,disagree,mixed`` runs each of
them in turn (``agree``: every draft accepted, the accept path; ``disagree``: every draft
rejected; ``mixed``: both, by prompt region), one result file per checkpoint. The prompts of a
run with ``mixed`` alternate between the code and the prose region.

``--baseline FILE`` takes the no-speculation run from an earlier result of the same prompts
instead of running it again.

Writes results/mtp_exactness-<variant>-<runner>-<graphs>-dcp<N>[-<kind>]-<stamp>.json (or
under $OUT), rewritten after every configuration, so a run cut short still leaves its figures.

    python scripts/gpu_mtp_exactness.py --ckpt-root /tmp/tiny_mtp_glm --kinds agree,disagree,mixed
    python scripts/gpu_mtp_exactness.py --dcp 2 --tp 2 --ks 2,5,adaptive
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

# The scheduler (and its adaptive controller) must live in this process to be inspected.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from mtp_gpu_common import (  # noqa: E402
    engine_kwargs,
    free_llm,
    metrics_delta,
    mode_key,
    mtp_spec,
    record_depths,
    resolved_cudagraph_mode,
    spec_metrics,
    tiny_dsa_dir,
    vllm_base,
    write_result,
)


def model_dir(args: argparse.Namespace) -> str:
    if args.ckpt:
        return args.ckpt
    src = Path(args.model) if args.model else tiny_dsa_dir()
    if args.arch == "deepseek_v32":
        return str(src)
    from make_tiny_mtp_ckpt import load_config

    cfg = load_config(src / "config.json", args.arch)
    tmp = Path(tempfile.mkdtemp(prefix="tiny_glm_dsa_"))
    (tmp / "config.json").write_text(json.dumps(cfg))
    return str(tmp)


def run_config(
    args, model: str, k: int | str, prompts, load_format: str = "dummy"
) -> dict[str, Any]:
    from vllm import LLM, SamplingParams

    kw = engine_kwargs(
        args,
        model,
        mtp_spec(k, windows=[4, 2, 2]),  # short windows: the depth moves within the run
        load_format=load_format,
    )
    if args.kv_cache_dtype:
        kw["kv_cache_dtype"] = args.kv_cache_dtype
    t0 = time.time()
    llm = LLM(**kw)
    started = time.time() - t0
    depths = record_depths(llm)
    params = SamplingParams(
        temperature=0.0,
        max_tokens=args.max_tokens,
        ignore_eos=True,
        detokenize=False,
        logprobs=args.logprobs,
    )
    before = spec_metrics(llm)
    t0 = time.time()
    outs = llm.generate(prompts, params)
    gen_s = time.time() - t0
    result = {
        "k": k,
        "startup_s": round(started, 1),
        "generate_s": round(gen_s, 2),
        "tokens": [list(o.outputs[0].token_ids) for o in outs],
        "logprobs": [
            [
                {str(tid): round(float(lp.logprob), 5) for tid, lp in step.items()}
                for step in (o.outputs[0].logprobs or [])
            ]
            for o in outs
        ],
        "metrics": metrics_delta(before, spec_metrics(llm)),
        "cudagraph_mode": resolved_cudagraph_mode(llm),
    }
    if depths is not None:
        result["depth_trace"] = depths
    free_llm(llm)
    return result


def compare(base: dict[str, Any], run: dict[str, Any], topk: int, tol: float):
    tokens_equal = base["tokens"] == run["tokens"]
    first_mismatch = None
    max_diff = 0.0
    ids_equal = True
    for p, (bt, rt) in enumerate(zip(base["tokens"], run["tokens"], strict=True)):
        for s, (a, b) in enumerate(zip(bt, rt, strict=False)):
            if a != b and first_mismatch is None:
                first_mismatch = [p, s]
    for bl, rl in zip(base["logprobs"], run["logprobs"], strict=True):
        for bs, rs in zip(bl, rl, strict=False):
            b_top = sorted(bs, key=bs.get, reverse=True)[:topk]
            r_top = sorted(rs, key=rs.get, reverse=True)[:topk]
            if set(b_top) != set(r_top):
                ids_equal = False
            for tid in set(bs) & set(rs):
                max_diff = max(max_diff, abs(bs[tid] - rs[tid]))
    return {
        "tokens_equal": tokens_equal,
        "first_mismatch": first_mismatch,
        "topk_ids_equal": ids_equal,
        "max_logprob_abs_diff": round(max_diff, 5),
        "ok": tokens_equal and ids_equal and max_diff <= tol,
    }


def negative_control(base: dict[str, Any], topk: int, tol: float) -> dict[str, Any]:
    """The gate applied to the baseline with its first generated token changed: it must
    refuse it (``caught``), or the gate could not fail."""
    flipped = json.loads(json.dumps({"tokens": base["tokens"], "logprobs": base["logprobs"]}))
    if not flipped["tokens"] or not flipped["tokens"][0]:
        return {"caught": False, "why": "baseline has no tokens"}
    flipped["tokens"][0][0] += 1
    verdict = compare(base, flipped, topk, tol)
    return {"caught": not verdict["ok"], "verdict": verdict}


def region_of_prompts(vocab: int, lens: list[int], kind: str | None, seed: int = 0):
    """Token-id prompts of the given lengths: random ids, or for the ``mixed`` checkpoint
    counting prompts alternating between the code ``[0, V/2)`` and prose ``[V/2, V)``
    regions (the last token's region decides whether the drafts are accepted)."""
    rng = random.Random(seed)
    prompts = []
    for i, n in enumerate(lens):
        if kind == "mixed":
            lo = 2 if i % 2 == 0 else vocab // 2
            hi = vocab // 2 if i % 2 == 0 else vocab
            offset = rng.randrange(hi - lo)
            # count upwards, cyclically inside the region (what the target generates)
            ids = [lo + (offset + j) % (hi - lo) for j in range(n)]
            prompts.append({"prompt_token_ids": ids})
        else:
            prompts.append({"prompt_token_ids": [rng.randrange(2, vocab) for _ in range(n)]})
    return prompts


def load_baseline(path: Path, payload: dict[str, Any]) -> dict[str, Any]:
    """The no_spec run of an earlier result, refused unless it ran the same prompts."""
    earlier = json.loads(path.read_text())
    for key in ("prompt_lens", "max_tokens", "weights", "arch", "dcp", "tp"):
        if earlier.get(key) != payload[key]:
            raise SystemExit(
                f"{path}: {key} is {earlier.get(key)!r}, this run uses {payload[key]!r}"
            )
    base = earlier.get("runs", {}).get("no_spec")
    if not base or "error" in base:
        raise SystemExit(f"{path}: no successful no_spec run")
    return base


def run_one(args, model: str, weights: str, kind: str | None) -> bool:
    """No speculation, then every k of ``--ks``, on one checkpoint; one result file."""
    vocab = json.loads((Path(model) / "config.json").read_text())["vocab_size"]
    lens = [int(n) for n in args.lens.split(",")]
    prompts = region_of_prompts(vocab, lens, kind)
    payload: dict[str, Any] = {
        "what": "greedy MTP speculative output equals no-spec output",
        "base": vllm_base(),
        "dcp": args.dcp,
        "tp": args.tp,
        "arch": args.arch,
        "weights": weights,
        "checkpoint": kind,
        "cuda_graphs": not args.eager,
        "runner": args.runner,
        "max_num_seqs": args.max_num_seqs,
        "prompt_lens": [len(p["prompt_token_ids"]) for p in prompts],
        "max_tokens": args.max_tokens,
        "tol": args.tol,
        "runs": {},
    }
    variant = os.environ.get("VARIANT", "stock")  # also in the record's "machine"
    graphs = "eager" if args.eager else "graphs"
    name = f"mtp_exactness-{variant}-{args.runner}-{graphs}-dcp{args.dcp}"
    if kind:
        name += f"-{kind}"
    path = None
    base = None
    ks = args.ks.split(",")
    if args.baseline is not None:
        base = load_baseline(args.baseline, payload)
        payload["runs"]["no_spec"] = base
        payload["baseline_from"] = args.baseline.name
    else:
        ks = ["0", *ks]
    for k in ks:
        key = mode_key(k)
        k_val: int | str = k if k == "adaptive" else int(k)
        try:
            run = run_config(args, model, k_val, prompts, "dummy" if weights == "dummy" else "auto")
        except Exception as e:  # noqa: BLE001 - recorded in the result file
            run = {"k": k_val, "error": repr(e), "traceback": traceback.format_exc()[-4000:]}
        if k == "0":
            base = run
            if "error" not in run:
                payload["negative_control"] = negative_control(run, args.logprobs, args.tol)
        elif base is not None and "error" not in base and "error" not in run:
            run["vs_no_spec"] = compare(base, run, args.logprobs, args.tol)
        summary = {key_: run[key_] for key_ in run if key_ not in ("tokens", "logprobs")}
        print(kind or "", key, json.dumps(summary)[:2000], flush=True)
        payload["runs"][key] = run
        payload["all_ok"] = all_ok(payload)
        if path is not None:
            path.unlink(missing_ok=True)
        path = write_result(name, payload)
    return bool(payload.get("all_ok"))


def all_ok(payload: dict[str, Any]) -> bool:
    """Every speculative run equals the baseline, at least one ran, and the negative
    control was caught (when the baseline ran here)."""
    runs = {k: r for k, r in payload["runs"].items() if k != "no_spec"}
    control = payload.get("negative_control")
    return (
        bool(runs)
        and all(r.get("vs_no_spec", {}).get("ok", False) for r in runs.values())
        and (control is None or bool(control.get("caught")))
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dcp", type=int, default=1)
    ap.add_argument("--tp", type=int, default=None, help="default: max(1, dcp)")
    ap.add_argument("--ks", default="1,2,4,5,adaptive")
    ap.add_argument("--model", default=None, help="dir with the tiny DSA config.json")
    ap.add_argument("--ckpt", default=None, help="checkpoint dir (make_tiny_mtp_ckpt.py)")
    ap.add_argument("--ckpt-root", type=Path, default=None, help="dir of agree/disagree/mixed")
    ap.add_argument("--kinds", default="agree,disagree,mixed", help="with --ckpt-root")
    ap.add_argument("--arch", default="glm_moe_dsa", choices=["deepseek_v32", "glm_moe_dsa"])
    ap.add_argument("--lens", default="64,257,1500,3000")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--logprobs", type=int, default=5)
    ap.add_argument("--tol", type=float, default=0.05)
    ap.add_argument("--max-model-len", type=int, default=8192)
    ap.add_argument("--gpu-mem", type=float, default=0.5)
    ap.add_argument("--kv-cache-dtype", default=None)
    ap.add_argument("--eager", action="store_true")
    ap.add_argument("--runner", default="v2", choices=["v1", "v2"])
    ap.add_argument(
        "--max-num-seqs", type=int, default=8, help="also bounds the CUDA graph sizes captured"
    )
    ap.add_argument("--baseline", type=Path, default=None, help="result file with a no_spec run")
    args = ap.parse_args(argv)
    args.tp = args.tp or max(1, args.dcp)
    # read by vLLM when the engine is configured, so it must be set before the first LLM
    os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "1" if args.runner == "v2" else "0"

    if args.ckpt_root is not None:
        kinds = [k for k in args.kinds.split(",") if k]
        from gpu_mtp_adaptive import ensure_ckpts

        ensure_ckpts(args.ckpt_root, args.arch, kinds)
        oks = [run_one(args, str(args.ckpt_root / k), str(args.ckpt_root / k), k) for k in kinds]
        return 0 if all(oks) else 1
    if args.ckpt:
        return 0 if run_one(args, args.ckpt, args.ckpt, None) else 1
    return 0 if run_one(args, model_dir(args), "dummy", None) else 1


if __name__ == "__main__":
    sys.exit(main())
