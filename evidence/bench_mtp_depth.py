#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Patch 0012 on one GPU: the adaptive depth against every fixed depth in tokens per second, on
the cost-realistic checkpoint (make_mtp_cost_ckpt.py), with repeats, spread and noise.

Two kinds of child process, each with its own log (the parent reads the memory figures the
engine logged):

* ``bench``: ONE engine with MTP, ``num_speculative_tokens`` 5 and the adaptive depth on the
  ladder 1/2/3/4/5, so FULL CUDA graphs exist for every depth 1-5 (query lengths 2-6). Before
  each run the scheduler's controller is replaced: ``kN`` is a controller on the one-rung
  ladder ``(N,)`` (a fixed depth N), ``adaptive`` a fresh controller with 0012's defaults
  (ladder 2/4/5, windows 32/16/16), as a new engine starts it. Every mode therefore runs in the
  same engine, the same memory and the same graphs, and the modes of a workload run back to
  back in an order that changes with the repeat (a Williams design: mtp_depth_report.py).
  Workloads: ``prose`` and ``code`` (one request, 512 tokens), ``stream`` (one request whose
  content alternates code and prose every 768 tokens, 3,072 tokens) and ``mixed_batch`` (four
  prose and four code requests in one batch, 512 tokens each). Each run records its tokens per
  second, steps, depth per step, the acceptance per draft position and whether every token is
  the one the checkpoint's tables say (``exact``).
* ``engine``: a stock configuration per mode (no speculation; ``num_speculative_tokens`` 2, 4,
  5; the adaptive depth with its default ladder) built on its own, run a few times per
  workload: its log gives the CUDA-graph memory of that configuration, the run without
  speculation gives t(1), and the fixed ones check that a forced depth runs as fast as the
  stock fixed depth. These are not interleaved with the bench's runs (separate engines).

The parent merges the parts into one result (``--out``): per workload the tokens/s of every
mode (median, min, max), adaptive over each fixed depth as paired ratios, the goal, the step
time curve t(q) and the graph memory per engine. A part is rewritten after every run, so a
killed run leaves what finished; ``complete`` says whether every planned run did. A part that
is complete in ``--work`` is kept and the bench child keeps the runs of a part a deadline cut,
so a benchmark cut by a deadline is finished by running the same command again (on a GPU
lease: one more call; the repeat a cut run belonged to is then finished in a new engine).

    python evidence/bench_mtp_depth.py run --ckpt <work>/mtp-cost --work <work>/mtp-bench \
        --out results/mtp-adaptive-cost-h100-0.34.0.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import make_mtp_cost_ckpt
import mtp_acceptance
import mtp_depth_report as report
from bench_timing import spread

PROMPT_LEN = 32
WARMUP_TOKENS = 64
WORKLOADS: dict[str, dict[str, Any]] = {
    "prose": {"requests": [("prose", 1000)], "tokens": 512},
    "code": {"requests": [("code", 1000)], "tokens": 512},
    # starts at the stream's first position: code, prose, code, prose
    "stream": {"requests": [("stream", -1)], "tokens": 4 * 768},
    "mixed_batch": {
        "requests": [(c, s) for s in (0, 1250, 2500, 3750) for c in ("prose", "code")],
        "tokens": 512,
    },
}
ENGINE_MODES = {
    "nospec": None,
    "k2": {"method": "mtp", "num_speculative_tokens": 2},
    "k4": {"method": "mtp", "num_speculative_tokens": 4},
    "k5": {"method": "mtp", "num_speculative_tokens": 5},
    "adaptive": {
        "method": "mtp",
        "num_speculative_tokens": 5,
        "adaptive_speculative_tokens": "acceptance",
    },
}
BENCH_SPEC = {
    "method": "mtp",
    "num_speculative_tokens": 5,
    "adaptive_speculative_tokens": "acceptance",
    "adaptive_speculative_tokens_ladder": [1, 2, 3, 4, 5],
}


def workload_prompts(tables: mtp_acceptance.Tables, name: str) -> list[list[int]]:
    return [
        mtp_acceptance.prompt(tables, cycle, start, PROMPT_LEN)
        for cycle, start in WORKLOADS[name]["requests"]
    ]


def expected_tokens(tables: mtp_acceptance.Tables, prompt: list[int], n: int) -> list[int]:
    """The greedy tokens of a request: the target's chain from the prompt's last token."""
    return mtp_acceptance.simulate(tables, prompt[-1], n, 0)[0]


COMPILE: dict[str, dict[str, Any]] = {
    # vLLM's default: Inductor, piecewise graphs for mixed batches, FULL for decode
    "inductor": {"cudagraph_mode": "FULL_AND_PIECEWISE"},
    # no torch.compile (engines start minutes sooner); decode steps still replay FULL graphs
    "none": {"mode": 0, "cudagraph_mode": "FULL_DECODE_ONLY"},
}


def engine_kwargs(
    ckpt: Path, spec: dict[str, Any] | None, gpu_mem: float, compile_mode: str = "inductor"
) -> dict[str, Any]:
    longest = PROMPT_LEN + max(w["tokens"] for w in WORKLOADS.values())
    kw: dict[str, Any] = dict(
        model=str(ckpt),
        skip_tokenizer_init=True,
        seed=0,
        max_model_len=longest + 64,
        max_num_seqs=8,
        enable_prefix_caching=False,
        gpu_memory_utilization=gpu_mem,
        compilation_config=dict(COMPILE[compile_mode]),
        disable_log_stats=False,
    )
    if spec is not None:
        kw["speculative_config"] = dict(spec)
    return kw


def timed_generate(
    llm: Any,
    tables: mtp_acceptance.Tables,
    workload: str,
    depths: list[int] | None,
    tokens: int | None = None,
) -> dict[str, Any]:
    """One generate() of ``workload``: tokens, wall time, steps (and depth per step when the
    scheduler's steps are recorded in ``depths``), and whether every token is the tables'."""
    from vllm import SamplingParams

    prompts = workload_prompts(tables, workload)
    n = tokens or WORKLOADS[workload]["tokens"]
    params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, detokenize=False)
    if depths is not None:
        del depths[:]
    t0 = time.perf_counter()
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    wall = time.perf_counter() - t0
    got = [list(o.outputs[0].token_ids) for o in outs]
    per_depth: dict[str, int] = {}
    for d in depths or []:
        per_depth[str(d)] = per_depth.get(str(d), 0) + 1
    return {
        "workload": workload,
        "tokens": sum(len(g) for g in got),
        "wall_s": wall,
        "steps": len(depths) if depths is not None else None,
        "steps_per_depth": per_depth,
        "exact": got == [expected_tokens(tables, p, n) for p in prompts],
    }


class _Run:
    """The bench child's engine: runs a workload under a forced controller."""

    def __init__(self, llm: Any, tables: mtp_acceptance.Tables) -> None:
        from gate.spec_metrics import find_scheduler, record_depths

        self.llm = llm
        self.tables = tables
        scheduler = find_scheduler(llm)
        if scheduler is None or scheduler.adaptive_depth is None:
            raise RuntimeError("no in-process scheduler with an adaptive controller")
        self.scheduler: Any = scheduler
        self.depths = record_depths(llm)

    def controller(self, mode: str) -> Any:
        from vllm.v1.spec_decode.adaptive_depth import AdaptiveDepthController

        class Recording(AdaptiveDepthController):
            verifications: list[tuple[int, int]]

            def verify(self, request_id: str, num_draft_tokens: int, num_accepted: int) -> bool:
                self.verifications.append((num_draft_tokens, num_accepted))
                return super().verify(request_id, num_draft_tokens, num_accepted)

        ctl = Recording() if mode == "adaptive" else Recording(ladder=(int(mode[1:]),))
        ctl.verifications = []
        return ctl

    def run(self, workload: str, mode: str, tokens: int | None = None) -> dict[str, Any]:
        ctl = self.controller(mode)
        self.scheduler.adaptive_depth = ctl
        out = timed_generate(self.llm, self.tables, workload, self.depths, tokens)
        out["mode"] = mode
        out["acceptance_per_position"] = report.acceptance_per_position(ctl.verifications, 5)
        out["verifications"] = len(ctl.verifications)
        return out


def run_part(path: Path, part: dict[str, Any], body: Callable[[dict[str, Any]], None]) -> int:
    """Run ``body(part)``; ``complete`` if it returns, the error if it raises; the part is
    written either way."""
    try:
        body(part)
        part["complete"] = True
    except Exception as e:  # noqa: BLE001 - recorded in the part
        part["error"] = repr(e)
        part["traceback"] = traceback.format_exc()[-4000:]
    _write(path, part)
    return 0 if part["complete"] else 1


def _llm(args: argparse.Namespace, spec: dict[str, Any] | None, part: dict[str, Any]) -> Any:
    import vllm
    from vllm import LLM

    part["vllm"] = vllm.__version__  # the imported tree's
    t0 = time.time()
    llm = LLM(**engine_kwargs(args.ckpt, spec, args.gpu_mem, args.compile))
    part["startup_s"] = round(time.time() - t0, 1)
    return llm


def child_bench(args: argparse.Namespace) -> int:
    _, tables = make_mtp_cost_ckpt.load_tables(args.ckpt)
    part: dict[str, Any] = {"role": "bench", "spec": BENCH_SPEC, "runs": [], "complete": False}
    if args.part.is_file():  # a call cut this child: keep its runs and do the rest
        done = json.loads(args.part.read_text())
        part["runs"] = [r for r in done.get("runs", []) if r.get("repeat", -1) < args.repeats]
        part["resumed"] = done.get("resumed", 0) + 1
    finished = {(r["repeat"], r["workload"], r["mode"]) for r in part["runs"]}

    def body(part: dict[str, Any]) -> None:
        runner = _Run(_llm(args, BENCH_SPEC, part), tables)
        # warm-up: every mode at batch 1 and batch 8, short, so that no kernel is compiled
        # for a new shape inside a timed run (the MoE's Triton kernel is, per token count)
        for mode in report.MODES:
            for workload in ("prose", "mixed_batch"):
                part.setdefault("warmup", []).append(runner.run(workload, mode, WARMUP_TOKENS))
        for r in range(args.repeats):
            for w, workload in enumerate(WORKLOADS):
                for mode in report.mode_order(r, w):
                    if (r, workload, mode) in finished:
                        continue
                    part["runs"].append(runner.run(workload, mode) | {"repeat": r})
                    _write(args.part, part)

    return run_part(args.part, part, body)


def child_engine(args: argparse.Namespace) -> int:
    _, tables = make_mtp_cost_ckpt.load_tables(args.ckpt)
    part: dict[str, Any] = {"role": "engine", "mode": args.mode, "runs": [], "complete": False}

    def body(part: dict[str, Any]) -> None:
        from gate.spec_metrics import record_depths

        llm = _llm(args, ENGINE_MODES[args.mode], part)
        depths = record_depths(llm)
        for r in range(args.repeats):
            for workload in WORKLOADS:
                run = timed_generate(llm, tables, workload, depths)
                part["runs"].append(run | {"mode": args.mode, "repeat": r})
                _write(args.part, part)

    return run_part(args.part, part, body)


def _write(path: Path, record: dict[str, Any]) -> None:
    import provenance

    provenance.write_json_atomic(path, record)


def _child(args: argparse.Namespace, role: str, part: Path, extra: list[str]) -> dict[str, Any]:
    """Run one child with its own log; its part (or a stand-in saying why there is none) with
    the memory figures of its log."""
    if part.is_file():
        done = json.loads(part.read_text())
        if done.get("complete"):  # a previous call finished it: keep it
            return done | {"reused": True}
    log = part.with_suffix(".log")
    timeout = min(args.child_timeout_s, args.deadline.left())
    if timeout < args.min_child_s:
        return {"runs": [], "complete": False, "skipped": f"{timeout:.0f} s left", "memory": None}
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        role,
        "--ckpt",
        str(args.ckpt),
        "--part",
        str(part),
        "--gpu-mem",
        str(args.gpu_mem),
        "--compile",
        args.compile,
        *extra,
    ]
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    env["PYTHONPATH"] = os.pathsep.join(
        [str(Path(__file__).resolve().parent), env.get("PYTHONPATH", "")]
    ).rstrip(os.pathsep)
    t0 = time.time()
    with log.open("w") as f:
        try:
            rc: int | str = subprocess.run(
                cmd, stdout=f, stderr=subprocess.STDOUT, env=env, timeout=timeout
            ).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    rec = json.loads(part.read_text()) if part.is_file() else {"runs": [], "complete": False}
    rec |= {"returncode": rc, "wall_s": round(time.time() - t0, 1), "log": log.name}
    rec["memory"] = report.read_engine_log(log.read_text(errors="replace"))
    _write(part, rec)
    return rec


def _of(runs: list[dict[str, Any]], workload: str) -> list[dict[str, Any]]:
    """The runs of one workload."""
    return [r for r in runs if r["workload"] == workload]


def where_time_goes(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One workload's steps per depth per mode and the step-time account of each mode, on the
    step curve of the workload's own fixed-depth runs."""
    use = report.depth_use(runs)
    curve = report.step_curve(runs, [])
    walls: dict[str, list[float]] = {}
    for run in runs:
        walls.setdefault(run["mode"], []).append(1e3 * run["wall_s"])
    measured = {m: statistics.median(v) for m, v in walls.items()}
    return {
        "depth_use": use,
        "time_model": report.step_time_model(use, curve["step_ms"], measured),
    }


def merge(
    ckpt_record: dict[str, Any], bench: dict[str, Any], engines: dict[str, dict[str, Any]]
) -> dict[str, Any]:
    """The result: per-workload summaries, the step curve, graph memory, completeness."""
    runs = bench.get("runs", [])
    nospec = engines.get("nospec", {}).get("runs", [])
    curve_b1 = report.step_curve(_of(runs, "code"), _of(nospec, "code"))
    curve_b8 = report.step_curve(_of(runs, "mixed_batch"), _of(nospec, "mixed_batch"))
    workloads = {}
    for w in WORKLOADS:
        runs_w = _of(runs, w)
        workloads[w] = report.summarize(runs_w, w) | where_time_goes(runs_w)
    stock = {}
    for mode, part in engines.items():
        stock[mode] = {
            "complete": part.get("complete", False),
            "error": part.get("error"),
            "memory": part.get("memory"),
            "startup_s": part.get("startup_s"),
            "tokens_per_s": {
                w: spread([report.tokens_per_s(r) for r in _of(part.get("runs", []), w)])
                for w in WORKLOADS
                if _of(part.get("runs", []), w)
            },
            "exact": all(r["exact"] for r in part.get("runs", [])),
        }
    return {
        "checkpoint": {k: ckpt_record[k] for k in ("geometry", "seed", "profiles", "weight_bytes")}
        | {"file_bytes": ckpt_record["file_bytes"]},
        "workloads_spec": {
            w: {"requests": len(v["requests"]), "tokens": v["tokens"]} for w, v in WORKLOADS.items()
        },
        "bench_engine": {
            "spec": bench.get("spec"),
            "complete": bench.get("complete", False),
            "error": bench.get("error"),
            "memory": bench.get("memory"),
            "startup_s": bench.get("startup_s"),
            # calls a deadline cut, each finished by a new engine (its runs kept)
            "resumed": bench.get("resumed", 0),
            "repeats": 1 + max((r["repeat"] for r in runs), default=-1),
        },
        "workloads": workloads,
        "adaptive_over_best_fixed": {
            w: s.get("adaptive_over_best_fixed") for w, s in workloads.items()
        },
        "step_curve": {"batch_1": curve_b1, "batch_8": curve_b8},
        "stock_engines": stock,
        "exact": all(r["exact"] for r in runs) and all(s["exact"] for s in stock.values()),
        # the measurements themselves, so that the summaries can be recomputed (remerge)
        "runs": {
            "bench": runs,
            "engines": {mode: part.get("runs", []) for mode, part in engines.items()},
        },
        "complete": bool(bench.get("complete"))
        and all(p.get("complete") for p in engines.values()),
    }


def parent(args: argparse.Namespace) -> int:
    import provenance
    from bench_timing import Deadline

    args.deadline = Deadline(args.deadline_s)
    if not (args.ckpt / make_mtp_cost_ckpt.RECORD).is_file():
        make_mtp_cost_ckpt.write(args.ckpt, dict(make_mtp_cost_ckpt.GEOMETRY))
    ckpt_record, _ = make_mtp_cost_ckpt.load_tables(args.ckpt)
    args.work.mkdir(parents=True, exist_ok=True)
    bench = _child(args, "bench", args.work / "bench.json", ["--repeats", str(args.repeats)])
    engines = {}
    for mode in args.engines:
        engines[mode] = _child(
            args,
            "engine",
            args.work / f"engine-{mode}.json",
            ["--mode", mode, "--repeats", str(args.engine_repeats)],
        )
    result = merge(ckpt_record, bench, engines)
    result["note"] = (
        "one GPU; every mode of the bench runs in one engine (forced controllers), the stock "
        "engines run apart and are not interleaved with it"
    )
    result["base"] = bench.get("vllm")
    result["compile"] = {"name": args.compile, "compilation_config": COMPILE[args.compile]}
    provenance.write_result(args.out, result)
    print(
        json.dumps(
            {
                "out": str(args.out),
                "complete": result["complete"],
                "adaptive_over_best_fixed": result["adaptive_over_best_fixed"],
            }
        )
    )
    return 0 if result["complete"] else 1


def remerge(args: argparse.Namespace) -> int:
    """The result recomputed on any machine from the parts a GPU run left in ``--work``:
    the checkpoint record, command, revision, machine and base stay the GPU run's (from
    ``--result``, the result that run wrote); ``summarized_by`` names this command."""
    import provenance

    like = json.loads(args.result.read_text())
    bench = json.loads((args.work / "bench.json").read_text())
    engines = {
        mode: json.loads((args.work / f"engine-{mode}.json").read_text())
        for mode in like.get("stock_engines", {})
    }
    result = merge(like["checkpoint"], bench, engines)
    for key in ("note", "base", "compile", "command", "git_revision", "machine"):
        if key in like:
            result[key] = like[key]
    result["summarized_by"] = {
        "command": provenance.command([__file__, *args.argv] if args.argv else None),
        "git_revision": provenance.git_revision(),
    }
    provenance.write_result(args.out, result)
    return 0 if result["complete"] else 1


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="role")
    run = sub.add_parser("run", help="the whole benchmark")
    run.add_argument("--ckpt", type=Path, required=True)
    run.add_argument("--work", type=Path, required=True)
    run.add_argument("--out", type=Path, required=True)
    run.add_argument("--repeats", type=int, default=7)
    run.add_argument("--engine-repeats", type=int, default=3)
    run.add_argument(
        "--engines",
        type=lambda s: [m for m in s.split(",") if m],
        default=list(ENGINE_MODES),
        help=f"stock engines to build, comma-separated, of {','.join(ENGINE_MODES)}",
    )
    run.add_argument("--gpu-mem", type=float, default=0.85)
    run.add_argument("--compile", choices=list(COMPILE), default="inductor")
    run.add_argument("--child-timeout-s", type=float, default=1200)
    run.add_argument(
        "--deadline-s",
        type=float,
        default=3600,
        help="start no child that would have less than --min-child-s of this left",
    )
    run.add_argument("--min-child-s", type=float, default=150)
    again = sub.add_parser("remerge", help="recompute a result from its parts (no GPU)")
    again.add_argument("--work", type=Path, required=True, help="the run's parts")
    again.add_argument("--result", type=Path, required=True, help="the result the run wrote")
    again.add_argument("--out", type=Path, required=True)
    for role in ("bench", "engine"):
        child = sub.add_parser(role, help=f"child process: {role}")
        child.add_argument("--ckpt", type=Path, required=True)
        child.add_argument("--part", type=Path, required=True)
        child.add_argument("--gpu-mem", type=float, default=0.85)
        child.add_argument("--compile", choices=list(COMPILE), default="inductor")
        child.add_argument("--repeats", type=int, default=7)
        if role == "engine":
            child.add_argument("--mode", choices=list(ENGINE_MODES), required=True)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    args.argv = argv  # None: sys.argv
    if args.role == "bench":
        return child_bench(args)
    if args.role == "engine":
        return child_engine(args)
    if args.role == "remerge":
        return remerge(args)
    if args.role != "run":
        parser().error("choose run, remerge, bench or engine")
    bad = [m for m in args.engines if m not in ENGINE_MODES]
    if bad:
        parser().error(f"--engines: unknown {bad}; valid: {', '.join(ENGINE_MODES)}")
    if args.repeats < 1 or args.engine_repeats < 1:
        parser().error("--repeats and --engine-repeats must be >= 1")
    return parent(args)


if __name__ == "__main__":
    sys.exit(main())
