# SPDX-License-Identifier: Apache-2.0
"""What one rank of a gate run does inside vLLM (started by evidence/dcp_gate.py).

Every rank builds the same engine (vLLM's external_launcher is SPMD: each rank runs the
same prompts), serves the passes of the configuration and writes its attention layers; rank 0
also writes the tokens and top-k log-probs of every step.

The negative control is a test-only fault injected from here, never shipped: before the
engine is built, ``MLADCPManager.__init__`` is wrapped so that every DCP combine adds a
per-layer 0-dim fp32 device tensor ``shift`` to this rank's partial LSE. The shift is 0.0
(``x + 0.0 == x`` bit for bit, so clean passes are untouched) until the ``fault`` pass sets
it to -1e4 on one DCP rank: that rank's partial output then gets weight exp(-1e4) = 0 in the
LSE merge, i.e. it is dropped. Being a device tensor read by the kernel, the same switch
works under CUDA graphs (captured once, replayed with whatever the tensor holds).
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gate import memory_probe, plan

FAULT_SHIFT = -1.0e4
_SHIFTS: list[tuple[int, int, Any]] = []  # (dcp rank, dcp world size, shift tensor)


def install_fault_hook() -> None:
    from vllm.v1.attention.ops import dcp as dcp_ops

    cls = dcp_ops.MLADCPManager
    if getattr(cls, "_gate_fault_hook", False):
        return
    original = cls.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        import torch

        shift = torch.zeros((), dtype=torch.float32, device=self.device)
        combine = self.combine

        def combine_with_fault(partial_output: Any, partial_lse: Any, **kw: Any) -> Any:
            return combine(partial_output, partial_lse + shift, **kw)

        self.combine = combine_with_fault
        _SHIFTS.append((self.group.rank_in_group, self.group.world_size, shift))

    cls.__init__ = init
    cls._gate_fault_hook = True


_MERGES_SEEN: set[str] = set()  # DCP top-k merge backends the indexer really called


def install_merge_spy() -> None:
    """Record which DCP top-k merge backend the sparse indexer really runs.

    The run record's layer list names each layer's attention backend, not the merge its
    indexer calls; on the 2026-12-01 lease runs that asked for the torch merge ran the
    default one (DeepseekV32Attention did not pass the setting). The spy wraps the
    module-level ``_merge_dcp_topk_global`` (looked up at call time by the indexer op, so
    every caller is seen) and notes its ``backend`` argument ("auto" when none is given)."""
    import importlib

    sai = importlib.import_module("vllm.model_executor.layers.sparse_attn_indexer")
    if getattr(sai, "_gate_merge_spy", False):
        return
    original = sai._merge_dcp_topk_global

    def spy(*args: Any, **kwargs: Any) -> Any:
        _MERGES_SEEN.add(str(kwargs.get("backend", "auto")))
        return original(*args, **kwargs)

    sai._merge_dcp_topk_global = spy
    sai._gate_merge_spy = True


def merge_problems(cfg: plan.GateConfig) -> list[str]:
    """A run that asked for a merge backend must have run that one and no other."""
    kernel = cfg.engine_extra.get("kernel_config") or {}
    requested = kernel.get("sparse_indexer_dcp_merge_backend")
    seen = sorted(_MERGES_SEEN)
    if requested and requested != "auto" and seen != [requested]:
        return [f"asked for the {requested!r} DCP top-k merge, the indexer ran {seen}"]
    return []


def set_fault(on: bool, fault_rank: int) -> dict[str, Any]:
    import torch

    hit = 0
    for rank, world, shift in _SHIFTS:
        faulty = on and rank == fault_rank % world
        shift.fill_(FAULT_SHIFT if faulty else 0.0)
        hit += faulty
    torch.cuda.synchronize()
    return {"hooked_layers": len(_SHIFTS), "faulted_layers_this_rank": hit}


def attention_layers(model: Any) -> list[dict[str, Any]]:
    """Every module with an attention backend: what it really runs."""
    rows = []
    for name, module in model.named_modules():
        backend = getattr(module, "attn_backend", None)
        if backend is None or not hasattr(backend, "get_name"):
            continue
        impl = getattr(module, "impl", None)
        rows.append(
            {
                "module": name,
                "layer": getattr(module, "layer_name", None) or getattr(module, "prefix", name),
                "class": type(module).__name__,
                "backend": backend.get_name(),
                "impl": type(impl).__name__ if impl is not None else None,
                "kv_cache_dtype": str(getattr(module, "kv_cache_dtype", None)),
                "dcp_world_size": getattr(impl, "dcp_world_size", None),
                "num_heads": getattr(impl, "num_heads", None),
                "has_indexer": getattr(module, "indexer", None) is not None,
                "fp8_use_mixed_batch": getattr(impl, "fp8_use_mixed_batch", None),
            }
        )
    return rows


def machine_info() -> dict[str, Any]:
    """The shared provenance record plus the path the vllm package was imported from."""
    from provenance import machine

    info = machine()
    try:
        import vllm

        info["vllm"] = vllm.__version__  # the imported tree's, which an overlay may change
        info["vllm_path"] = str(Path(vllm.__file__).parent)
    except ImportError:
        info["vllm"] = None
    return info


def engine_kwargs(cfg: plan.GateConfig, emulated: bool = False) -> dict[str, Any]:
    """LLM(**kw) for a run; ``emulated``: its ranks share GPUs (plan.EMULATED_ENV)."""
    kw: dict[str, Any] = dict(
        model=cfg.model,
        skip_tokenizer_init=True,
        seed=cfg.seed,
        tensor_parallel_size=cfg.tp,
        decode_context_parallel_size=cfg.dcp,
        max_model_len=cfg.max_model_len,
        max_num_batched_tokens=cfg.max_num_batched_tokens,
        max_num_seqs=cfg.max_num_seqs or max(8, len(cfg.batch_lens)),
        enforce_eager=not cfg.graphs,
        gpu_memory_utilization=cfg.gpu_memory_utilization,
        kv_cache_memory_bytes=cfg.kv_cache_memory_bytes,
        max_logprobs=cfg.logprobs,
        # off by default: repeated and faulted passes must recompute (a gate that tests the
        # prefix cache turns it on; GateConfig refuses it beside the fault pass)
        enable_prefix_caching=cfg.enable_prefix_caching,
        disable_custom_all_reduce=True,
        disable_log_stats=False,
    )
    if cfg.tp > 1:
        kw["distributed_executor_backend"] = "external_launcher"
    if cfg.backend:
        kw["attention_backend"] = cfg.backend
    if cfg.kv_cache_dtype:
        kw["kv_cache_dtype"] = cfg.kv_cache_dtype
    if cfg.graphs:
        kw["compilation_config"] = {
            "cudagraph_mode": "FULL_AND_PIECEWISE",
            "cudagraph_capture_sizes": list(cfg.cudagraph_capture_sizes),
        }
    if cfg.tp > 1:
        # vLLM 0.33's all-reduce + RMSNorm fusion pass (enabled in eager mode too, per the
        # log) builds FlashInfer's trtllm all-reduce workspace in its __init__: 4.6 of the 5.5
        # minutes of the first TP=2 start on the 2026-12-01 lease (rank log 15:14:06 ->
        # 15:18:44). The gates run vLLM's NCCL all-reduce instead (recorded in
        # engine_kwargs); the fusion is not what they test.
        cc = kw.setdefault("compilation_config", {})
        cc["pass_config"] = {**cc.get("pass_config", {}), "fuse_allreduce_rms": False}
    if emulated and cfg.tp > 1 and cfg.dcp == 1:
        # vLLM 0.34 shards FlashMLA-sparse (fp8 cache) and FlashInfer-sparse prefill by token
        # across TP ranks without DCP (attention_config.sparse_mla_shard_q), exchanging
        # through symmetric memory that refuses two ranks on one device (the 2026-12-06
        # 14:05Z lease's TP 4 DCP 1 FlashMLA run). With DCP > 1 vLLM never shards so, so the
        # DCP = 1 reference then takes the by-head path its DCP twin takes.
        kw["attention_config"] = {"sparse_mla_shard_q": False}
    for key, value in cfg.engine_extra.items():  # validated by GateConfig (plan.py)
        if key in plan.HARNESS_KEYS:  # the harness's own, not vLLM's
            continue
        if key == "kernel_config" and isinstance(kw.get(key), dict):
            kw[key] = {**kw[key], **value}
        else:
            kw[key] = value
    return kw


LEDGER_TIME_LABEL = plan.TRANSPORT_EMULATED


_LEDGER: Any = None  # this process's gate/comm_ledger.CommLedger, when the run asked for one


def ledger_snapshot(reset: bool = True) -> dict[str, Any] | None:
    """This rank's DCP communication ledger (``dcp_comm_ledger_size > 0``, gate/comm_ledger.py):
    per layer and phase the calls, the exact wire bytes and the CUDA-event times, then reset so
    the next pass starts at zero. The engine is in-process (external_launcher), so the managers
    the ledger wraps are this rank's."""
    if _LEDGER is None:
        return None
    summary = _LEDGER.summary()
    if reset:
        _LEDGER.reset()
    summary["time_label"] = LEDGER_TIME_LABEL
    return summary


def _spec_tools() -> Any:
    from gate import spec_metrics  # the scheduler's depth trace and vLLM's spec-decode counters

    return spec_metrics


def step_records(completion: Any) -> list[dict[str, Any]]:
    if completion.logprobs is None:
        raise RuntimeError("the engine returned no logprobs")
    steps = []
    for token, lps in zip(completion.token_ids, completion.logprobs, strict=True):
        top = sorted(
            ((int(t), float(v.logprob)) for t, v in lps.items()), key=lambda x: (-x[1], x[0])
        )
        steps.append({"token": int(token), "top": [[t, round(lp, 6)] for t, lp in top]})
    return steps


def request_timing(out: Any) -> dict[str, Any]:
    m = getattr(out, "metrics", None)
    got: dict[str, Any] = {}
    for field in (
        "first_token_latency",
        "first_token_ts",
        "last_token_ts",
        "num_generation_tokens",
    ):
        v = getattr(m, field, None)
        if isinstance(v, (int, float)):
            got[field] = v
    if (
        "first_token_ts" in got
        and "last_token_ts" in got
        and got["last_token_ts"] > got["first_token_ts"]
    ):
        n = got.get("num_generation_tokens") or len(out.outputs[0].token_ids)
        got["decode_tok_per_s"] = round((n - 1) / (got["last_token_ts"] - got["first_token_ts"]), 2)
    return got


class RankRecord:
    """One rank's record (``<out>/<run>.rank<r>.json``), rewritten atomically (a temp file,
    then os.replace) at engine start, after every finished pass (``"complete": false`` and
    ``passes_complete``: the passes served so far, all of whose generate() calls returned)
    and at the end (``"complete": true``), so that a rank killed mid-run leaves the passes
    it finished; a pass cut off mid-way is never in it."""

    def __init__(self, out_dir: Path, name: str, rank: int) -> None:
        self.path = Path(out_dir) / f"{name}.rank{rank}.json"
        self.data: dict[str, Any] = {
            "rank": rank,
            "ok": False,
            "complete": False,
            "passes_complete": [],
            "passes": {},
        }

    def write(self) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(self.data) + "\n")
        os.replace(tmp, self.path)

    def pass_done(
        self,
        passes: dict[str, dict],
        extras: dict[str, Any],
        fault: dict[str, Any],
        keep_tokens: bool,
    ) -> None:
        """After a pass: every pass finished so far (rank 0 keeps the tokens), this rank's
        ledger and spec counters of those passes; still incomplete."""
        self.data["passes_complete"] = list(passes)
        self.data["passes"] = dict(passes) if keep_tokens else {}
        self.data["fault"] = fault
        self.data["ledger"] = extras.get("ledger")
        self.data["spec"] = extras.get("spec") if keep_tokens else None
        self.write()

    def finish(self) -> None:
        self.data.update(ok=True, complete=True)
        self.write()

    def fail(self, error: str, tb: str) -> None:
        """An exception: the record stays incomplete and keeps the passes finished before it."""
        self.data.update(ok=False, complete=False, error=error[:2000], traceback=tb[-6000:])
        self.write()


def run_passes(
    llm: Any,
    cfg: plan.GateConfig,
    log: Any,
    extras: dict[str, Any] | None = None,
    on_pass: Callable[[dict[str, dict], dict[str, Any]], None] | None = None,
) -> tuple[dict, dict]:
    """Serve every pass; ``extras`` (when given) gets per pass the ledger summary
    (``ledger``) and, for a speculative run, the spec-decode counters and depths
    (``spec``). ``on_pass(passes, fault_info)`` is called after each pass whose every
    generate() call returned (a pass that raises mid-way is not added)."""
    from vllm import SamplingParams

    params = SamplingParams(
        temperature=0.0,
        max_tokens=cfg.max_tokens,
        ignore_eos=True,
        detokenize=False,
        logprobs=cfg.logprobs,
    )
    prompts = plan.make_prompts(cfg)
    passes: dict[str, dict] = {}
    fault_info: dict[str, Any] = {}
    extras = {} if extras is None else extras
    ledger_on = cfg.engine_extra.get("dcp_comm_ledger_size", 0) > 0
    spec_tools = _spec_tools() if cfg.speculative else None
    depths = spec_tools.record_depths(llm) if spec_tools else None
    if ledger_on:
        ledger_snapshot()  # forget the start-up profile run's calls
    for pass_name in cfg.passes:
        before = spec_tools.spec_metrics(llm) if spec_tools else None
        depth_mark = len(depths) if depths is not None else 0
        if pass_name == "fault":
            fault_info = set_fault(True, cfg.fault_rank) | {
                "kind": "one DCP rank's partial output dropped from the LSE merge "
                f"(its partial LSE shifted by {FAULT_SHIFT:g})",
                "dcp_rank": cfg.fault_rank % cfg.dcp,
            }
        records: dict[str, Any] = {}
        try:
            for keys in plan.pass_groups(cfg, pass_name):
                ids = [plan.prompt_for(k, prompts) for k in keys]
                t0 = time.time()
                outs = llm.generate([{"prompt_token_ids": x} for x in ids], params, use_tqdm=False)
                dt = round(time.time() - t0, 3)
                for key, x, out in zip(keys, ids, outs, strict=True):
                    c = out.outputs[0]
                    records[key] = {
                        "prompt_len": len(x),
                        "prompt_sha256": plan.prompt_digest(x),
                        "tokens": [int(t) for t in c.token_ids],
                        "steps": step_records(c),
                        "group_s": dt,
                        # prompt tokens served from the prefix cache (None: not reported)
                        "num_cached_tokens": getattr(out, "num_cached_tokens", None),
                        "group_size": len(keys),
                        "timing": request_timing(out),
                    }
                first = records[keys[0]]["tokens"][:6]
                log(f"{cfg.name} {pass_name} {keys} {dt}s first tokens {first}")
        finally:
            if pass_name == "fault":
                set_fault(False, cfg.fault_rank)
        passes[pass_name] = records
        if ledger_on:
            extras.setdefault("ledger", {})[pass_name] = ledger_snapshot()
        if spec_tools:
            after = spec_tools.spec_metrics(llm)
            extras.setdefault("spec", {})[pass_name] = {
                "metrics": spec_tools.metrics_delta(before, after),
                "depths": None if depths is None else list(depths[depth_mark:]),
            }
        if on_pass is not None:
            on_pass(passes, fault_info)
    return passes, fault_info


def main(config_path: str, out_dir: str) -> int:
    cfg = plan.GateConfig.from_json(json.loads(Path(config_path).read_text()))
    rank = int(os.environ.get("RANK", "0"))
    out = Path(out_dir)

    def log(msg: str) -> None:
        print(f"[{cfg.name} r{rank} {time.strftime('%H:%M:%S')}] {msg}", flush=True)

    rec = RankRecord(out, cfg.name, rank)
    record = rec.data
    llm: Any = None  # the engine, once built
    reservation: Any = None  # 0016's plan and reservation (memory_probe runs)
    try:
        from vllm import LLM

        if cfg.dcp > 1:
            install_fault_hook()
            install_merge_spy()
        kw = engine_kwargs(cfg, emulated=os.environ.get(plan.EMULATED_ENV) == "1")
        record["engine_kwargs"] = {k: v for k, v in kw.items()}
        ledger_size = cfg.engine_extra.get("dcp_comm_ledger_size", 0)
        if ledger_size > 0:
            from gate import comm_ledger

            global _LEDGER
            _LEDGER = comm_ledger.install_in_vllm(ledger_size)
        if cfg.memory_probe:
            memory_probe.install()
        t0 = time.time()
        llm = LLM(**kw)
        record["engine_start_s"] = round(time.time() - t0, 1)
        record["machine"] = machine_info()
        log(f"engine up in {record['engine_start_s']} s")
        record["attention_layers"] = llm.apply_model(attention_layers)[0]
        # the rank's GPU memory once the engine is up (KV pool, weights, buffers outside torch);
        # a reading that fails is recorded, never the run's failure
        try:
            record["device_memory"] = memory_probe.process_memory()
        except Exception as e:  # noqa: BLE001
            record["device_memory"] = {"error": f"{type(e).__name__}: {e}"}
        try:
            record["cudagraph_mode"] = str(
                llm.llm_engine.vllm_config.compilation_config.cudagraph_mode
            )
        except AttributeError:
            record["cudagraph_mode"] = None
        record["fault_hook_layers"] = len(_SHIFTS)
        if cfg.memory_probe:
            reservation = llm.apply_model(memory_probe.dcp_reservation)[0]
            record["memory"] = memory_probe.snapshot(llm, reservation)
        rec.write()  # the engine's facts survive a kill during the first pass
        extras: dict[str, Any] = {}

        def pass_done(passes: dict[str, dict], fault: dict[str, Any]) -> None:
            if cfg.memory_probe:
                record["memory"] = memory_probe.snapshot(llm, reservation)
            rec.pass_done(passes, extras, fault, keep_tokens=rank == 0)
            log(f"recorded passes {list(passes)}")

        run_passes(llm, cfg, log, extras, on_pass=pass_done)
        if cfg.dcp > 1:
            record["merge_backends_seen"] = sorted(_MERGES_SEEN)
            problems = merge_problems(cfg)
            if problems:
                raise RuntimeError("; ".join(problems))
        rec.finish()
    except Exception as e:  # recorded: a configuration that fails is evidence too
        try:
            record.setdefault("machine", machine_info())
            if cfg.memory_probe:  # the steps up to the error (or a refused start-up)
                record["memory"] = memory_probe.snapshot(llm, reservation)
        except Exception:  # noqa: BLE001 - the error below is what matters
            pass
        rec.fail(f"{type(e).__name__}: {e}", traceback.format_exc())
        log(record["error"])
    log("wrote rank record")
    sys.stdout.flush()
    # external_launcher ranks must not hang in NCCL teardown: leave at once
    os._exit(0 if record["ok"] else 1)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    sys.exit(main(sys.argv[1], sys.argv[2]))
