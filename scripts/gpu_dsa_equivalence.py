# SPDX-License-Identifier: Apache-2.0
"""GPU evidence: the tiny DSA model gives the same greedy tokens and log-probs across configs.

Two sub-commands, so that every engine start-up is its own process:

``run``      starts vLLM once with one configuration (TP, DCP, attention backend, kv-cache dtype,
             optional MTP) on the tiny DeepSeek-V3.2 model (random ``dummy`` weights, no
             tokenizer, token-id prompts), generates greedily for prompts of the given lengths
             with ``logprobs=20`` at every step, and writes ``<out>/<name>.json``: the command,
             git revision, machine, configuration, the attention backend / impl / kv-cache dtype
             each attention layer actually used, and per prompt the tokens and top-20 log-probs
             of every step. A configuration that fails to start is recorded with its error.
``compare``  merges two run JSONs into ``<out>/<name>.json``: per prompt both token lists, the
             first step where they differ, the log-prob differences at the first generated step
             (after prefill, where attention over the whole prompt decides) and the maximum over
             all steps that share their context, and ``"equivalent"``: every prompt has equal
             tokens and every compared log-prob differs by at most ``--atol``.

Greedy decoding with random weights falls into short token cycles, so equal tokens alone can hide
a wrong attention result; the log-probs are compared at every step whose context is equal in both
runs (steps 0..d where d is the first differing token), over the token ids present in both top-20
lists.

The runs issue 3 asks for (on the GPU machine, patched tree: ``VARIANT=patched source
.gpu/device-env.sh``; ``$OUT`` comes back; S=scripts/gpu_dsa_equivalence.py). Backends are forced
where the comparison is about one backend; with the whole series the selector picks, under DCP
on SM90, FLASH_ATTN_MLA_SPARSE for the default (bf16) cache and FLASHMLA_SPARSE for fp8_ds_mla
(TRITON_MLA_SPARSE_FP8_DS_MLA is the SM12x choice)::

    # one H200: the new backend forced at DCP=1 against the native kernels
    python $S run --name dsa-tp1-triton-fp8 --attention-backend TRITON_MLA_SPARSE_FP8_DS_MLA \\
        --kv-cache-dtype fp8_ds_mla
    python $S run --name dsa-tp1-flashmla-fp8 --attention-backend FLASHMLA_SPARSE \\
        --kv-cache-dtype fp8_ds_mla
    python $S run --name dsa-tp1-fa-bf16 --attention-backend FLASH_ATTN_MLA_SPARSE
    python $S compare --name dsa-eq-triton-vs-flashmla-fp8-tp1 \\
        $OUT/dsa-tp1-triton-fp8.json $OUT/dsa-tp1-flashmla-fp8.json
    # different cache dtypes (e4m3 records vs bf16): informative, looser tolerance
    python $S compare --name dsa-eq-triton-fp8-vs-fa-bf16-tp1 --atol 0.5 \\
        $OUT/dsa-tp1-triton-fp8.json $OUT/dsa-tp1-fa-bf16.json

    # two H200: TP=2 DCP=2 against TP=2 DCP=1, per backend, same cache dtype
    python $S run --name dsa-tp2-dcp1-triton-fp8 --tp 2 \\
        --attention-backend TRITON_MLA_SPARSE_FP8_DS_MLA --kv-cache-dtype fp8_ds_mla
    python $S run --name dsa-tp2-dcp2-triton-fp8 --tp 2 --dcp 2 \\
        --attention-backend TRITON_MLA_SPARSE_FP8_DS_MLA --kv-cache-dtype fp8_ds_mla
    python $S compare --name dsa-eq-tp2-dcp2-vs-dcp1-triton \\
        $OUT/dsa-tp2-dcp2-triton-fp8.json $OUT/dsa-tp2-dcp1-triton-fp8.json
    # the same pairs for FLASHMLA_SPARSE (--kv-cache-dtype fp8_ds_mla, patch 0007) and
    # FLASH_ATTN_MLA_SPARSE (default cache, patch 0006); and one run without
    # --attention-backend to record what the selector picks:
    python $S run --name dsa-tp2-dcp2-auto --tp 2 --dcp 2

Add ``--mtp 1`` to a run to put MTP verify rows (query length 2) through the decode path, and
``--cuda-graphs`` to capture CUDA graphs (default: eager). Each ``run`` is one engine start-up
(~3.5 min cold, mostly JIT).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import random
import shlex
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
# The GPU recipe copies ../shared/gpu to .gpu inside the checkout (the device sees only the
# checkout); on the development machine the model config is read from ../shared/gpu.
MODEL_CANDIDATES = (REPO / ".gpu" / "tiny_dsa", REPO.parent / "shared" / "gpu" / "tiny_dsa")
SCHEMA_VERSION = 1
DEFAULT_LENS = "1024,8192,16384"
# Vocabulary ids drawn for prompts: skip bos/eos (0, 1) and stay below vocab_size (32000).
PROMPT_ID_RANGE = (2, 31999)


def _out_dir(arg: str | None) -> Path:
    if arg:
        return Path(arg)
    return Path(os.environ["OUT"]) if os.environ.get("OUT") else REPO / "results"


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    print(f"wrote {path}", flush=True)


def git_revision() -> dict[str, Any]:
    """The checkout's revision; the device copy has no .git, so DCP_GIT_REV may name it."""
    info: dict[str, Any] = {"env_DCP_GIT_REV": os.environ.get("DCP_GIT_REV")}
    try:
        head = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        info.update(head=head, dirty=bool(dirty))
    except (OSError, subprocess.CalledProcessError):
        info.update(head=None, dirty=None)
    manifest = REPO / ".gpu-overlay" / "MANIFEST"
    if manifest.is_file():
        info["overlay_manifest_sha256"] = hashlib.sha256(manifest.read_bytes()).hexdigest()
    return info


def machine_info() -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {
        "hostname": platform.node(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "variant": os.environ.get("VARIANT", "stock"),
    }
    if torch.cuda.is_available():
        info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        info["capability"] = list(torch.cuda.get_device_capability(0))
    try:
        import vllm

        info["vllm"] = vllm.__version__
        info["vllm_path"] = str(Path(vllm.__file__).parent)
    except ImportError:
        info["vllm"] = None
    return info


def default_model() -> Path:
    for path in MODEL_CANDIDATES:
        if (path / "config.json").is_file():
            return path
    return MODEL_CANDIDATES[0]


def make_prompts(lens: list[int], seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(*PROMPT_ID_RANGE) for _ in range(n)] for n in lens]


def _attention_layers(model: Any) -> list[dict[str, Any]]:
    """Runs inside each worker: the backend, impl and kv-cache dtype of every attention layer."""
    seen: dict[tuple[str, str, str, str], int] = {}
    for module in model.modules():
        backend = getattr(module, "attn_backend", None)
        impl = getattr(module, "impl", None)
        if backend is None or impl is None:
            continue
        key = (
            type(module).__name__,
            backend.get_name(),
            type(impl).__name__,
            str(getattr(module, "kv_cache_dtype", None)),
        )
        seen[key] = seen.get(key, 0) + 1
    return [
        {"layer": k[0], "backend": k[1], "impl": k[2], "kv_cache_dtype": k[3], "count": n}
        for k, n in sorted(seen.items())
    ]


def _step_records(output: Any) -> list[dict[str, Any]]:
    steps = []
    if output.logprobs is None:
        raise RuntimeError("the engine returned no logprobs")
    for token, logprobs in zip(output.token_ids, output.logprobs, strict=True):
        top = sorted(
            ((int(tid), float(lp.logprob)) for tid, lp in logprobs.items()),
            key=lambda item: (-item[1], item[0]),
        )
        chosen = logprobs.get(token)
        steps.append(
            {
                "token": int(token),
                "logprob": float(chosen.logprob) if chosen is not None else None,
                "top": [[tid, lp] for tid, lp in top],
            }
        )
    return steps


def cmd_run(args: argparse.Namespace) -> int:
    # collective_rpc/apply_model send a callable to the workers.
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
    lens = [int(x) for x in args.lens.split(",")]
    if args.model is None:
        args.model = default_model()
    config: dict[str, Any] = {
        "model": str(args.model),
        "tensor_parallel_size": args.tp,
        "decode_context_parallel_size": args.dcp,
        "attention_backend": args.attention_backend,
        "kv_cache_dtype": args.kv_cache_dtype,
        "mtp_tokens": args.mtp,
        "enforce_eager": not args.cuda_graphs,
        "max_model_len": args.max_model_len,
        "max_num_batched_tokens": args.max_num_batched_tokens,
        "gpu_memory_utilization": args.gpu_memory_utilization,
        "seed": args.seed,
        "prompt_lens": lens,
        "max_tokens": args.max_tokens,
        "logprobs": args.logprobs,
    }
    result: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "kind": "run",
        "name": args.name,
        "command": shlex.join([sys.executable, *sys.argv]),
        "revision": git_revision(),
        "machine": machine_info(),
        "config": config,
        "started_unix": time.time(),
    }
    out_path = _out_dir(args.out_dir) / f"{args.name}.json"

    from vllm import LLM, SamplingParams

    engine_kwargs: dict[str, Any] = dict(
        model=str(args.model),
        load_format="dummy",
        skip_tokenizer_init=True,
        seed=args.seed,
        tensor_parallel_size=args.tp,
        decode_context_parallel_size=args.dcp,
        max_model_len=args.max_model_len,
        enforce_eager=not args.cuda_graphs,
        gpu_memory_utilization=args.gpu_memory_utilization,
        max_logprobs=max(20, args.logprobs),
    )
    if args.max_num_batched_tokens is not None:
        engine_kwargs["max_num_batched_tokens"] = args.max_num_batched_tokens
    if args.attention_backend:
        engine_kwargs["attention_backend"] = args.attention_backend
    if args.kv_cache_dtype:
        engine_kwargs["kv_cache_dtype"] = args.kv_cache_dtype
    if args.mtp:
        engine_kwargs["speculative_config"] = {
            "method": "mtp",
            "num_speculative_tokens": args.mtp,
        }
    result["engine_kwargs"] = dict(engine_kwargs)

    t0 = time.time()
    try:
        llm = LLM(**engine_kwargs)
    except Exception as e:  # recorded as evidence (e.g. stock 0.26.0 refusing DCP)
        result.update(
            ok=False,
            error=f"{type(e).__name__}: {e}",
            traceback=traceback.format_exc()[-8000:],
            engine_start_s=round(time.time() - t0, 1),
        )
        _write_json(out_path, result)
        return 1
    result["engine_start_s"] = round(time.time() - t0, 1)
    try:
        result["attention_layers"] = llm.apply_model(_attention_layers)
    except Exception as e:  # informative only; the run itself is still valid
        result["attention_layers"] = f"unavailable: {type(e).__name__}: {e}"

    params = SamplingParams(
        temperature=0.0,
        max_tokens=args.max_tokens,
        ignore_eos=True,
        detokenize=False,
        logprobs=args.logprobs,
    )
    prompts = []
    for n, ids in zip(lens, make_prompts(lens, args.seed), strict=True):
        t1 = time.time()
        out = llm.generate([{"prompt_token_ids": ids}], params, use_tqdm=False)[0]
        completion = out.outputs[0]
        prompts.append(
            {
                "prompt_len": n,
                "prompt_sha256": hashlib.sha256(json.dumps(ids).encode()).hexdigest(),
                "tokens": [int(t) for t in completion.token_ids],
                "steps": _step_records(completion),
                "generate_s": round(time.time() - t1, 3),
            }
        )
        print("LEN", n, "tokens", completion.token_ids[:12], flush=True)
    result.update(ok=True, prompts=prompts)
    _write_json(out_path, result)
    return 0


def _compare_steps(
    steps_a: list[dict[str, Any]], steps_b: list[dict[str, Any]], upto: int
) -> list[dict[str, Any]]:
    rows = []
    for i in range(min(upto, len(steps_a), len(steps_b))):
        top_a = {tid: lp for tid, lp in steps_a[i]["top"]}
        top_b = {tid: lp for tid, lp in steps_b[i]["top"]}
        common = sorted(set(top_a) & set(top_b))
        diffs = [abs(top_a[t] - top_b[t]) for t in common]
        rows.append(
            {
                "step": i,
                "common_top_ids": len(common),
                "max_abs_logprob_diff": max(diffs) if diffs else None,
                "top1_equal": steps_a[i]["top"][0][0] == steps_b[i]["top"][0][0],
            }
        )
    return rows


def compare_runs(a: dict[str, Any], b: dict[str, Any], atol: float) -> dict[str, Any]:
    """Per-prompt token and log-prob comparison of two run results."""
    prompts = []
    prompts_a, prompts_b = a.get("prompts", []), b.get("prompts", [])
    if a.get("ok") and b.get("ok") and len(prompts_a) != len(prompts_b):
        raise SystemExit("the runs served different numbers of prompts")
    for pa, pb in zip(prompts_a, prompts_b, strict=False):
        if pa["prompt_sha256"] != pb["prompt_sha256"]:
            raise SystemExit(f"prompt of length {pa['prompt_len']} differs between the runs")
        ta, tb = pa["tokens"], pb["tokens"]
        first_diff = next((i for i, (x, y) in enumerate(zip(ta, tb, strict=False)) if x != y), None)
        if first_diff is None and len(ta) != len(tb):
            first_diff = min(len(ta), len(tb))
        # Steps 0..first_diff share their context in both runs.
        upto = len(ta) if first_diff is None else first_diff + 1
        rows = _compare_steps(pa["steps"], pb["steps"], upto)
        step_max = [
            r["max_abs_logprob_diff"] for r in rows if r["max_abs_logprob_diff"] is not None
        ]
        max_diff = max(step_max) if step_max else None
        first_step = rows[0] if rows else None
        prompts.append(
            {
                "prompt_len": pa["prompt_len"],
                "tokens_a": ta,
                "tokens_b": tb,
                "tokens_equal": first_diff is None,
                "first_token_difference": first_diff,
                "first_step_max_abs_logprob_diff": (
                    first_step["max_abs_logprob_diff"] if first_step else None
                ),
                "first_step_common_top_ids": first_step["common_top_ids"] if first_step else 0,
                "max_abs_logprob_diff": max_diff,
                "compared_steps": len(rows),
                "steps": rows,
                "equivalent": first_diff is None and max_diff is not None and max_diff <= atol,
            }
        )
    both_ok = bool(a.get("ok")) and bool(b.get("ok"))
    return {
        "prompts": prompts,
        "equivalent": both_ok
        and len(prompts) == len(a.get("config", {}).get("prompt_lens", []))
        and all(p["equivalent"] for p in prompts),
    }


def _summary(run: dict[str, Any], path: str) -> dict[str, Any]:
    return {
        "file": path,
        "name": run.get("name"),
        "ok": run.get("ok"),
        "error": run.get("error"),
        "config": run.get("config"),
        "attention_layers": run.get("attention_layers"),
        "revision": run.get("revision"),
        "machine": run.get("machine"),
        "command": run.get("command"),
        "engine_start_s": run.get("engine_start_s"),
    }


def cmd_compare(args: argparse.Namespace) -> int:
    a = json.loads(Path(args.a).read_text())
    b = json.loads(Path(args.b).read_text())
    merged = compare_runs(a, b, args.atol)
    result = {
        "schema_version": SCHEMA_VERSION,
        "kind": "comparison",
        "name": args.name,
        "command": shlex.join([sys.executable, *sys.argv]),
        "revision": git_revision(),
        "a": _summary(a, args.a),
        "b": _summary(b, args.b),
        "tolerance": {
            "atol_logprob": args.atol,
            "rule": (
                "equivalent iff both runs served every prompt, the greedy tokens are equal, "
                "and at every step the log-probs of the token ids in both top-k lists differ "
                "by at most atol_logprob"
            ),
        },
        **merged,
    }
    _write_json(_out_dir(args.out_dir) / f"{args.name}.json", result)
    for p in merged["prompts"]:
        print(
            f"LEN {p['prompt_len']}: tokens_equal={p['tokens_equal']} "
            f"first_diff={p['first_token_difference']} "
            f"first_step_max={p['first_step_max_abs_logprob_diff']} "
            f"max={p['max_abs_logprob_diff']}",
            flush=True,
        )
    print("equivalent:", merged["equivalent"], flush=True)
    return 0 if merged["equivalent"] else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)

    run = sub.add_parser("run", help="serve one configuration and record tokens + logprobs")
    run.add_argument("--name", required=True, help="result file stem")
    run.add_argument("--model", type=Path, default=None, help="default: .gpu/tiny_dsa")
    run.add_argument("--tp", type=int, default=1)
    run.add_argument("--dcp", type=int, default=1)
    run.add_argument("--attention-backend", default=None, help="e.g. TRITON_MLA_SPARSE_FP8_DS_MLA")
    run.add_argument("--kv-cache-dtype", default=None, help="e.g. fp8_ds_mla, auto")
    run.add_argument("--mtp", type=int, default=0, help="MTP speculative tokens (0 = off)")
    run.add_argument("--lens", default=DEFAULT_LENS, help="comma-separated prompt lengths")
    run.add_argument("--max-tokens", type=int, default=32)
    run.add_argument("--logprobs", type=int, default=20)
    run.add_argument("--max-model-len", type=int, default=32768)
    run.add_argument("--max-num-batched-tokens", type=int, default=None)
    run.add_argument("--gpu-memory-utilization", type=float, default=0.5)
    run.add_argument("--cuda-graphs", action="store_true", help="default: enforce_eager")
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--out-dir", default=None, help="default: $OUT, else results/")
    run.set_defaults(func=cmd_run)

    cmp = sub.add_parser("compare", help="merge two run JSONs into an equivalence verdict")
    cmp.add_argument("--name", required=True, help="result file stem")
    cmp.add_argument("--atol", type=float, default=0.05, help="max |logprob difference|")
    cmp.add_argument("--out-dir", default=None, help="default: $OUT, else results/")
    cmp.add_argument("a")
    cmp.add_argument("b")
    cmp.set_defaults(func=cmd_compare)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.cmd == "run" and args.max_tokens < 32:
        raise SystemExit("--max-tokens must be >= 32 for the equivalence evidence")
    return args.func(args)


if __name__ == "__main__":  # vLLM starts worker processes with spawn
    sys.exit(main())
