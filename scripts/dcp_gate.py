#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""DCP equivalence gates: DCP > 1 must serve what DCP = 1 serves, on a checkpoint where
attention matters, within a tolerance derived from the measured noise floor, with a negative
control that the comparison must catch.

One command runs a suite of configurations, N ranks each, on however many GPUs the machine has:
one rank per GPU when there are N, else N processes on the GPUs with their own NCCL host
identities (one-GPU emulation over NCCL's socket transport). Every rank runs vLLM's
external_launcher; runs share the machine and run concurrently (fixed kv_cache_memory_bytes per
rank, at most --max-ranks processes at once)::

    python scripts/dcp_gate.py suite --suite needle-eager --work /tmp/gate --out results
    python scripts/dcp_gate.py suite --suite needle-graphs --work /tmp/gate --out results
    python scripts/dcp_gate.py suite --suite patched --backend TRITON_MLA_SPARSE_FP8_DS_MLA ...
    python scripts/dcp_gate.py run --name x --model DIR --tp 4 --dcp 2 --passes clean,fault
    python scripts/dcp_gate.py report --work /tmp/gate --suite needle-eager --out results

``suite`` writes the checkpoints (scripts/make_dsa_gate_ckpt.py, seeded), the run records
(``<work>/runs/<run>.json``: command, revision, base, machine, configuration, the backend/impl
of every attention layer on every rank, per prompt the tokens and top-k log-probs of every
step), then ``<out>/dcp-gate-noise-<ckpt>.json`` (noise floor, tolerance, sensitivity) and
``<out>/dcp-gate-<gate>.json`` per gate (scripts/gate/verdict.py says what they mean).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from gate import plan, plans, verdict  # noqa: E402

REPO = HERE.parent


def revision() -> dict[str, Any]:
    """The series revision ($DCP_GIT_REV on the device copy, which has no .git) and, for a
    patched tree, the overlay manifest's digest."""
    info: dict[str, Any] = {"series": os.environ.get("DCP_GIT_REV")}
    if not info["series"]:
        try:
            info["series"] = subprocess.run(
                ["git", "-C", str(REPO), "rev-parse", "HEAD"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            info["series"] = None
    return info


def base_info(machine: dict[str, Any] | None) -> dict[str, Any]:
    variant = os.environ.get("VARIANT", "stock")
    info: dict[str, Any] = {
        "vllm": (machine or {}).get("vllm"),
        "variant": variant,
        "vllm_path": (machine or {}).get("vllm_path"),
    }
    manifest = Path(os.environ.get("GATE_OVERLAY", Path.cwd() / ".gpu-overlay")) / "MANIFEST"
    if variant == "patched" and manifest.is_file():
        info["overlay_manifest_sha256"] = hashlib.sha256(manifest.read_bytes()).hexdigest()
        info["overlay_files"] = len(manifest.read_text().splitlines())
    return info


def gpu_count() -> int:
    if os.environ.get("GATE_GPUS"):
        return int(os.environ["GATE_GPUS"])
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=True)
        return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))
    except (OSError, subprocess.CalledProcessError):
        return 0


class Launch:
    """The rank processes of one run (each in its own process group)."""

    def __init__(self, cfg: plan.GateConfig, work: Path, port: int, gpus: int) -> None:
        self.cfg, self.work, self.port, self.gpus = cfg, work, port, gpus
        self.rank_dir = work / "ranks"
        self.rank_dir.mkdir(parents=True, exist_ok=True)
        cfg_path = self.rank_dir / f"{cfg.name}.config.json"
        cfg_path.write_text(json.dumps(cfg.to_json(), indent=1))
        for old in self.rank_dir.glob(f"{cfg.name}.rank*.json"):
            old.unlink()
        self.envs = [{**e, **cfg.env} for e in plan.rank_envs(cfg.world_size, gpus, port, cfg.name)]
        self.procs: list[subprocess.Popen] = []
        self.logs = []
        self.started = time.time()
        for r, env in enumerate(self.envs):
            log = open(work / "logs" / f"{cfg.name}.rank{r}.log", "w")
            self.logs.append(log)
            self.procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        str(HERE / "dcp_gate.py"),
                        "_rank",
                        str(cfg_path),
                        str(self.rank_dir),
                    ],
                    env=dict(os.environ, **env),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )

    def done(self) -> bool:
        return all(p.poll() is not None for p in self.procs)

    def kill(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for p in self.procs:
            p.wait()

    def collect(self, command: str, timed_out: bool) -> dict[str, Any]:
        for log in self.logs:
            log.close()
        ranks = []
        for r in range(self.cfg.world_size):
            path = self.rank_dir / f"{self.cfg.name}.rank{r}.json"
            ranks.append(json.loads(path.read_text()) if path.is_file() else None)
        r0 = ranks[0] or {}
        errors = [
            f"rank {r}: "
            + (
                rec.get("error")
                if rec
                else "no record (exit code "
                f"{self.procs[r].returncode}{', timed out' if timed_out else ''})"
            )
            for r, rec in enumerate(ranks)
            if not rec or not rec.get("ok")
        ]
        return {
            "schema_version": verdict.SCHEMA_VERSION,
            "kind": "dcp_gate_run",
            "name": self.cfg.name,
            "command": command,
            "revision": revision(),
            "base": base_info(r0.get("machine")),
            "machine": r0.get("machine"),
            "gpus_visible": self.gpus,
            "transport": plan.transport(self.cfg.world_size, self.gpus),
            "rank_env": self.envs,
            "config": self.cfg.to_json(),
            "checkpoint": checkpoint_info(self.cfg.model),
            "engine_kwargs": r0.get("engine_kwargs"),
            "engine_start_s": r0.get("engine_start_s"),
            "wall_s": round(time.time() - self.started, 1),
            "cudagraph_mode": r0.get("cudagraph_mode"),
            "attention_layers": [
                {"rank": r, "layers": (rec or {}).get("attention_layers", [])}
                for r, rec in enumerate(ranks)
            ],
            "fault": r0.get("fault") or {},
            "ok": not errors,
            "error": "; ".join(errors) or None,
            "tracebacks": [rec.get("traceback") for rec in ranks if rec and rec.get("traceback")][
                :2
            ],
            "exit_codes": [p.returncode for p in self.procs],
            "passes": r0.get("passes", {}),
        }


def checkpoint_info(model: str) -> dict[str, Any]:
    path = Path(model) / "gate_ckpt.json"
    info = json.loads(path.read_text()) if path.is_file() else {}
    return {"path": model, **info}


def run_many(
    configs: list[plan.GateConfig], work: Path, max_ranks: int, deadline_s: float, port0: int
) -> dict[str, dict[str, Any]]:
    """Run the configurations, as many at once as max_ranks allows; stop at the deadline."""
    (work / "logs").mkdir(parents=True, exist_ok=True)
    (work / "runs").mkdir(parents=True, exist_ok=True)
    gpus = gpu_count()
    if gpus < 1:
        raise SystemExit("no GPU visible (nvidia-smi -L): the gates run on a GPU machine")
    pending = list(configs)
    active: list[Launch] = []
    results: dict[str, dict[str, Any]] = {}
    t0 = time.time()
    port = port0
    command = shlex.join([sys.executable, *sys.argv])
    while pending or active:
        while pending and (
            not active or sum(a.cfg.world_size for a in active) + pending[0].world_size <= max_ranks
        ):
            cfg = pending.pop(0)
            print(
                f"[gate {time.strftime('%H:%M:%S')}] start {cfg.name} ({cfg.world_size} ranks)",
                flush=True,
            )
            active.append(Launch(cfg, work, port, gpus))
            port += 7
        late = time.time() - t0 > deadline_s
        for a in list(active):
            if a.done() or late:
                if not a.done():
                    a.kill()
                rec = a.collect(command, timed_out=late)
                results[a.cfg.name] = rec
                (work / "runs" / f"{a.cfg.name}.json").write_text(json.dumps(rec) + "\n")
                print(
                    f"[gate {time.strftime('%H:%M:%S')}] {a.cfg.name}: ok={rec['ok']} "
                    f"wall {rec['wall_s']} s {rec['error'] or ''}"[:600],
                    flush=True,
                )
                active.remove(a)
        if late:
            for cfg in pending:
                results[cfg.name] = {
                    "name": cfg.name,
                    "ok": False,
                    "config": cfg.to_json(),
                    "error": "not started before the deadline",
                }
            pending = []
        time.sleep(1)
    return results


def load_runs(work: Path) -> dict[str, dict[str, Any]]:
    runs = {}
    for p in sorted((work / "runs").glob("*.json")):
        d = json.loads(p.read_text())
        d["file"] = p.name
        runs[d["name"]] = d
    return runs


def report(suite: dict[str, Any], work: Path, out: Path) -> list[Path]:
    """Noise floor, tolerance and sensitivity per checkpoint, then every gate of the suite.

    Pure Python over the run records: ``report`` re-derives every verdict from
    ``<work>/runs`` on any machine (the figures stay those the runs recorded)."""
    runs = load_runs(work)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    noise_by_ckpt: dict[str, dict[str, Any]] = {}
    for label, (ckpt, a, b, pa, pb) in suite.get("noise", {}).items():
        if a in runs and b in runs:
            value, _ = verdict.pair_noise(runs[a], runs[b], pa, pb)
            noise_by_ckpt.setdefault(ckpt, {})[label] = {
                "max_abs_logprob_diff": value,
                "ref": a,
                "cand": b,
                "passes": [pa, pb],
            }
    tolerances: dict[str, dict[str, Any]] = {}
    for ckpt, pairs in noise_by_ckpt.items():
        try:
            tol = verdict.derive_tolerance({k: v["max_abs_logprob_diff"] for k, v in pairs.items()})
        except ValueError as e:
            print(f"{ckpt}: {e}", flush=True)
            continue
        tolerances[ckpt] = tol
        sens = {}
        for name, run in runs.items():
            if (
                run.get("ok")
                and run.get("passes", {}).get("sensitivity")
                and run.get("config", {}).get("model", "").rstrip("/").endswith("/" + ckpt)
            ):
                sens[name] = verdict.sensitivity(run, tol["atol_logprob"])
        doc = {
            "schema_version": verdict.SCHEMA_VERSION,
            "kind": verdict.NOISE_KIND,
            "checkpoint": ckpt,
            "command": shlex.join([sys.executable, *sys.argv]),
            "revision": revision(),
            "base": next((r.get("base") for r in runs.values() if r.get("base")), None),
            "machine": next((r.get("machine") for r in runs.values() if r.get("machine")), None),
            "noise_pairs": pairs,
            "checkpoints": {
                n: runs[n].get("checkpoint")
                for n in sorted({v[k] for v in pairs.values() for k in ("ref", "cand")})
            },
            "tolerance": tol,
            "sensitivity": sens,
        }
        path = out / f"dcp-gate-noise-{ckpt}.json"
        path.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
        written.append(path)
    for gate, (ref_name, cand_name) in suite.get("gates", {}).items():
        ref, cand = runs.get(ref_name), runs.get(cand_name)
        if ref is None or cand is None:
            print(f"gate {gate}: run {ref_name if ref is None else cand_name} missing", flush=True)
            continue
        ckpt = _ckpt_of(suite, ref_name)
        tol = tolerances.get(ckpt)
        if tol is None:
            print(f"gate {gate}: no tolerance for checkpoint {ckpt}", flush=True)
            continue
        sens = _best_sensitivity(runs, ckpt, tol["atol_logprob"], ref_name)
        result = verdict.gate_result(
            gate,
            ref,
            cand,
            tol,
            {
                "max_abs_logprob_diff": tol["noise_floor"],
                "pairs": noise_by_ckpt[ckpt],
            },
            sens,
        )
        result["command"] = shlex.join([sys.executable, *sys.argv])
        # the runs' revision (what was tested) plus the one that derived the verdict
        result["revision"] = dict(cand.get("revision") or {}, report=revision()["series"])
        result["machine"] = cand.get("machine")
        problems = verdict.validate(result)
        if problems:
            raise SystemExit(f"gate {gate}: malformed result {problems}")
        path = out / f"dcp-gate-{gate}.json"
        path.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
        written.append(path)
        print(
            f"GATE {gate}: equivalent={result['equivalent']} max={result['max_abs_logprob_diff']} "
            f"atol={tol['atol_logprob']:.4g} negative_control_detected="
            f"{result['negative_control_detected']} meaningful={result['meaningful']}",
            flush=True,
        )
    return written


def _ckpt_of(suite: dict[str, Any], run_name: str) -> str:
    for r in suite.get("runs", []):
        if r["name"] == run_name:
            return Path(r["model"].lstrip("@")).name
    return run_name.split("-")[0].removeprefix("p-")


def _best_sensitivity(runs: dict[str, Any], ckpt: str, atol: float, ref_name: str):
    """The sensitivity measured on the gate's own reference when it ran that pass, else on
    the checkpoint's TP=1 reference."""
    order = [ref_name] + sorted(n for n in runs if n != ref_name)
    for name in order:
        run = runs[name]
        if (
            run.get("ok")
            and run.get("passes", {}).get("sensitivity")
            and str(run.get("config", {}).get("model", "")).rstrip("/").endswith("/" + ckpt)
        ):
            s = verdict.sensitivity(run, atol)
            s["run"] = name
            return s
    return {"measured": False}


def resolve_suite(args: argparse.Namespace) -> dict[str, Any]:
    if args.suite == "patched":
        if not args.backend:
            raise SystemExit("--suite patched needs --backend (the patched tree's registry name)")
        return plans.patched_suite(args.backend, args.kv_cache_dtype)
    if args.suite in plans.SUITES:
        return plans.SUITES[args.suite]
    path = Path(args.suite)
    if path.is_file():
        return json.loads(path.read_text())
    raise SystemExit(
        f"unknown suite {args.suite!r}; valid: {', '.join(plans.SUITES)}, patched, or a JSON file"
    )


def make_checkpoints(suite: dict[str, Any], work: Path) -> dict[str, str]:
    paths = {}
    for name, argv in suite.get("checkpoints", {}).items():
        d = work / "ckpt" / name
        if not (d / "gate_ckpt.json").is_file():
            subprocess.run(
                [sys.executable, str(HERE / "make_dsa_gate_ckpt.py"), *argv, "--out", str(d)],
                check=True,
            )
        paths[name] = str(d)
    return paths


def cmd_suite(args: argparse.Namespace) -> int:
    suite = resolve_suite(args)
    work = Path(args.work)
    ckpts = make_checkpoints(suite, work)
    configs = []
    only = set(args.only.split(",")) if args.only else None
    for r in suite["runs"]:
        if only and r["name"] not in only:
            continue
        earlier = work / "runs" / f"{r['name']}.json"
        if earlier.is_file() and not args.rerun and json.loads(earlier.read_text()).get("ok"):
            print(f"[gate] {r['name']}: reusing {earlier}", flush=True)
            continue
        model = ckpts[r["model"][1:]] if r["model"].startswith("@") else r["model"]
        made = checkpoint_info(model).get("needle") or {}
        if made and "needle" not in r:  # a needle checkpoint: its prompts carry the needle
            r = {**r, "needle": int(made["needle_id"])}
        configs.append(plan.GateConfig.from_json({**r, "model": model}))
    run_many(configs, work, args.max_ranks, args.deadline_s, args.port)
    report(suite, work, Path(args.out))
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    report(resolve_suite(args), Path(args.work), Path(args.out))
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    cfg = plan.GateConfig(
        name=args.name,
        model=args.model,
        tp=args.tp,
        dcp=args.dcp,
        backend=args.backend,
        kv_cache_dtype=args.kv_cache_dtype,
        graphs=args.graphs,
        passes=tuple(args.passes.split(",")),
        lens=tuple(int(x) for x in args.lens.split(",")),
        batch_lens=tuple(int(x) for x in args.batch_lens.split(",") if x),
        max_tokens=args.max_tokens,
        kv_cache_memory_bytes=args.kv_cache_memory_bytes,
    )
    rec = run_many([cfg], Path(args.work), cfg.world_size, args.deadline_s, args.port)[cfg.name]
    print(json.dumps({k: rec.get(k) for k in ("name", "ok", "error", "transport")}), flush=True)
    return 0 if rec.get("ok") else 1


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name, fn in (("suite", cmd_suite), ("report", cmd_report)):
        p = sub.add_parser(name)
        p.add_argument(
            "--suite", required=True, help=f"{', '.join(plans.SUITES)}, patched, or JSON"
        )
        p.add_argument("--backend", default=None, help="for --suite patched")
        p.add_argument("--kv-cache-dtype", default="fp8_ds_mla", help="for --suite patched")
        p.add_argument("--work", default="/tmp/dcp-gate", help="checkpoints, runs, logs")
        p.add_argument("--out", default=str(REPO / "results"), help="gate result files")
        p.set_defaults(func=fn)
        if name == "suite":
            p.add_argument("--max-ranks", type=int, default=16, help="rank processes at once")
            p.add_argument("--deadline-s", type=float, default=3600.0)
            p.add_argument("--port", type=int, default=29600)
            p.add_argument("--only", default=None, help="comma-separated run names")
            p.add_argument("--rerun", action="store_true", help="ignore earlier run records")
    p = sub.add_parser("run", help="one configuration")
    p.add_argument("--name", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--dcp", type=int, default=1)
    p.add_argument("--backend", default=None)
    p.add_argument("--kv-cache-dtype", default=None)
    p.add_argument("--graphs", action="store_true")
    p.add_argument("--passes", default="clean")
    p.add_argument("--lens", default=",".join(map(str, plan.SINGLE_LENS)))
    p.add_argument("--batch-lens", default=",".join(map(str, plan.BATCH_LENS)))
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--kv-cache-memory-bytes", type=int, default=1 << 30)
    p.add_argument("--work", default="/tmp/dcp-gate")
    p.add_argument("--deadline-s", type=float, default=3600.0)
    p.add_argument("--port", type=int, default=29600)
    p.set_defaults(func=cmd_run)
    return ap


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "_rank":  # one rank, started by Launch
        import importlib

        # GATE_WORKER_MODULE: the CPU tests put a stand-in for vLLM here
        worker = importlib.import_module(os.environ.get("GATE_WORKER_MODULE", "gate.worker"))
        return worker.main(argv[1], argv[2])
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":  # vLLM may start worker processes with spawn
    sys.exit(main())
