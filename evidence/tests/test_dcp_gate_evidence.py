# SPDX-License-Identifier: Apache-2.0
"""The gate's negative-control rank on needle checkpoints and the ledger comparison
(evidence/gate/plan.py, evidence/gate/ledger.py): pure Python, no vLLM."""

from __future__ import annotations

import dataclasses
import json
import sys
from collections import Counter
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gate import ledger, plan  # noqa: E402


@pytest.mark.parametrize("dcp", [2, 4])
def test_needle_runs_fault_the_needles_rank(dcp: int) -> None:
    """With a needle checkpoint the fault drops the DCP rank that holds the needle (its
    position modulo DCP), not the last rank; without one, and when a rank is given, the
    configuration keeps what it says."""
    cfg = plan.GateConfig(name="n", model="m", tp=4, dcp=dcp, passes=("clean", "fault"), needle=7)
    assert cfg.fault_rank % dcp == plan.PERTURB_POSITION % dcp == 1
    plain = plan.GateConfig(name="p", model="m", tp=4, dcp=dcp, passes=("clean", "fault"))
    assert plain.fault_rank % dcp == dcp - 1
    given = plan.GateConfig(name="g", model="m", tp=4, dcp=dcp, needle=7, fault_rank=0)
    assert given.fault_rank == 0
    # the resolved rank survives the run record round trip
    assert plan.GateConfig.from_json(cfg.to_json()).fault_rank == cfg.fault_rank


def _run(name: str, prompts: dict[str, str], phases: dict[str, tuple[int, int]]) -> dict:
    layers = {
        f"model.layers.{i}.self_attn.attn": {
            ph: {"calls": c, "wire_bytes": b, "mean_ms": 1.0, "timed_calls": c}
            for ph, (c, b) in phases.items()
        }
        for i in range(2)
    }
    summary = {"capacity": 64, "armed": True, "layers": layers}
    return {
        "name": name,
        "config": {"dcp": 2, "engine_extra": {}},
        "transport": plan.TRANSPORT_EMULATED,
        "passes": {"clean": {k: {"prompt_sha256": v} for k, v in prompts.items()}},
        "ledger": [{"rank": r, "passes": {"clean": summary}} for r in (0, 1)],
    }


def test_ledger_compares_bytes_per_rank_per_layer() -> None:
    """Per rank the ledger sums each phase over layers and gives bytes per layer; ratios are
    to the first entry; the emulation label travels with the times."""
    prompts = {"single/1024": "a", "batch/0/700": "b"}
    query = _run("q", prompts, {"q_gather": (10, 1000), "combine": (10, 600)})
    ckv = _run("c", prompts, {"ckv_gather": (2, 40), "q_gather": (8, 8), "combine": (8, 8)})
    out = ledger.compare({"query": (query, "clean"), "ckv": (ckv, "clean")})
    q0 = out["entries"]["query"]["per_rank"]["0"]
    assert q0["layers"] == 2 and q0["wire_bytes"] == 3200 and q0["wire_bytes_per_layer"] == 1600
    assert out["entries"]["ckv"]["wire_bytes_over_query"]["1"] == pytest.approx(56 * 2 / 3200)
    assert out["timing_label"] == plan.TRANSPORT_EMULATED
    json.dumps(out)  # a result file


def test_ledger_sets_each_transports_memory_outside_torch_beside_the_first() -> None:
    """A rank's non-torch bytes travel with its entry, with the difference to the first
    entry's rank; a run recorded without them has none, and no difference."""
    prompts = {"single/1024": "a"}
    a2a = _run("a", prompts, {"q_gather": (1, 8)})
    b12x = _run("b", prompts, {"q_gather_b12x": (1, 8)})
    a2a["device_memory"] = [{"rank": r, "non_torch_bytes": 500 << 20} for r in (0, 1)]
    b12x["device_memory"] = [{"rank": r, "non_torch_bytes": (500 << 20) + 7 * r} for r in (0, 1)]
    old = _run("o", prompts, {"q_gather": (1, 8)})
    out = ledger.compare({"a2a": (a2a, "clean"), "b12x": (b12x, "clean"), "old": (old, "clean")})
    assert out["entries"]["b12x"]["non_torch_bytes_minus_a2a"] == {"0": 0, "1": 7}
    assert out["entries"]["a2a"]["non_torch_bytes"]["1"] == 500 << 20
    assert out["entries"]["old"]["non_torch_bytes"] == {}
    assert out["entries"]["old"]["non_torch_bytes_minus_a2a"] == {}


def test_ledger_refuses_other_prompts_and_missing_ledgers() -> None:
    """Runs that served other prompts, a pass without a ledger and a disarmed ledger are
    errors, not comparisons."""
    query = _run("q", {"single/1024": "a"}, {"q_gather": (1, 1)})
    other = _run("o", {"single/1024": "DIFFERENT"}, {"q_gather": (1, 1)})
    with pytest.raises(ValueError, match="other prompts"):
        ledger.compare({"query": (query, "clean"), "other": (other, "clean")})
    with pytest.raises(ValueError, match="no 'repeat'"):
        ledger.pass_ledger(query, "repeat")
    with pytest.raises(ValueError, match="no ledger"):
        ledger.pass_ledger({**query, "ledger": []}, "clean")
    query["ledger"][0]["passes"]["clean"]["armed"] = False
    with pytest.raises(ValueError, match="disarmed"):
        ledger.pass_ledger(query, "clean")


def test_calibration_suite_and_the_all_queue_resolve() -> None:
    """The needle calibration varies only the attention output gain, every candidate has
    its noise pairs and a sensitivity run, and the queue of every gate starts with the stock
    needle rows and leaves the calibration out (the CPU forward, gate_ckpt_reference.py,
    predicts a checkpoint's sensitivity)."""
    from gate import plans

    cal = plans.SUITES["needle-calibrate"]
    for g in plans.CALIBRATE_GAINS:
        args = cal["checkpoints"][f"glmn-o{g}"]
        base = ["--arch", "glm", *plans.NEEDLE_ARGS]
        diff = [(a, b) for a, b in zip(args, base, strict=True) if a != b]
        main_gain = plans.NEEDLE_ARGS[plans.NEEDLE_ARGS.index("--o-gain") + 1]
        assert diff == [(g, main_gain)] and args[args.index(g) - 1] == "--o-gain"
        names = {r["name"] for r in cal["runs"]}
        assert {f"glmn-o{g}-tp1-dcp1", f"glmn-o{g}-tp2-dcp1"} <= names
        assert f"glmn-o{g}: TP=2 DCP=1 vs TP=1" in cal["noise"]
    every = plans.QUEUES["all"]
    assert every[0] == "needle-eager" and "needle-calibrate" not in every
    assert set(plans.SUITES) - set(every) <= {
        "needle-calibrate",
        "needle-v32n1m-length",
        "needle-glmns1m-length",
        "smoke",
        "patched-variants",
        # the vLLM 0.34.0 suites (base034-*) run by name, not in the 0.33.0 `all`
        *_base034_suites(),
    } | set(
        n
        for q in (
            "long-prompts",
            "long",
            "issue43",
            "issue43-next",
            "issue43-lease3",
            "issue43-1m",
            "issue43-ortho",
            "nvfp4",
        )
        for n in plans.QUEUES[q]
    )
    assert "answer_logit=7" in plans.NEEDLE_ARGS


def test_the_split_variant_suites_are_the_variant_suite() -> None:
    """patched-merges, patched-mtp and patched-routes hold every run and gate of
    patched-variants exactly once, and the next lease's queue holds all three."""
    from gate import plans

    parts = [plans.SUITES[n] for n in ("patched-merges", "patched-mtp", "patched-routes")]
    whole = plans.SUITES["patched-variants"]
    names = [r["name"] for p in parts for r in p["runs"]]
    assert sorted(names) == sorted(r["name"] for r in whole["runs"])
    assert len(names) == len(set(names))
    gates = [g for p in parts for g in p["gates"]]
    assert sorted(gates) == sorted(whole["gates"]) and len(gates) == len(set(gates))
    assert all(p["runs"] and p["gates"] for p in parts)
    assert {"patched-merges", "patched-mtp", "patched-routes"} <= set(plans.QUEUES["dcp2"])
    merges = [r["name"] for r in plans.SUITES["patched-merges"]["runs"]]
    assert merges[0].endswith("-merge-triton")


def test_multi_rank_runs_switch_the_allreduce_rms_fusion_off() -> None:
    """Runs of more than one rank turn vLLM's all-reduce + RMSNorm fusion off (its FlashInfer
    workspace took 4.6 minutes of a cold start), eager and with graphs alike, without losing
    the graph settings; a single rank keeps vLLM's defaults."""
    from gate import worker

    eager = worker.engine_kwargs(plan.GateConfig(name="e", model="m", tp=2, dcp=2))
    assert eager["compilation_config"] == {"pass_config": {"fuse_allreduce_rms": False}}
    graphs = worker.engine_kwargs(plan.GateConfig(name="g", model="m", tp=4, graphs=True))
    assert graphs["compilation_config"]["pass_config"] == {"fuse_allreduce_rms": False}
    assert graphs["compilation_config"]["cudagraph_mode"] == "FULL_AND_PIECEWISE"
    single = worker.engine_kwargs(plan.GateConfig(name="s", model="m"))
    assert "compilation_config" not in single


def test_merge_spy_catches_a_run_that_merged_with_another_backend(monkeypatch) -> None:
    """The worker notes the backend every DCP merge call receives; a run that asked for the
    torch merge but merged with the default one is a problem, one that merged with torch is
    not, and a run that asked for nothing in particular is never one."""
    import types

    from gate import worker

    calls = []
    fake = types.ModuleType("vllm.model_executor.layers.sparse_attn_indexer")
    fake._merge_dcp_topk_global = lambda *a, **k: calls.append(k.get("backend"))
    monkeypatch.setitem(sys.modules, fake.__name__, fake)
    monkeypatch.setattr(worker, "_MERGES_SEEN", set())
    worker.install_merge_spy()
    worker.install_merge_spy()  # idempotent
    torch_run = plan.GateConfig(
        name="t",
        model="m",
        tp=2,
        dcp=2,
        variant="patched",
        engine_extra={"kernel_config": {"sparse_indexer_dcp_merge_backend": "torch"}},
    )
    fake._merge_dcp_topk_global("logits", "idx")  # the caller passed no backend: "auto"
    assert calls == [None]
    assert worker.merge_problems(torch_run) == [
        "asked for the 'torch' DCP top-k merge, the indexer ran ['auto']"
    ]
    worker._MERGES_SEEN.clear()
    fake._merge_dcp_topk_global("logits", "idx", backend="torch")
    assert worker.merge_problems(torch_run) == []
    plain = plan.GateConfig(name="p", model="m", tp=2, dcp=2)
    fake._merge_dcp_topk_global("logits", "idx", backend="cutedsl")
    assert worker.merge_problems(plain) == []


def test_merged_suites_keep_every_noise_pair() -> None:
    """Uniting the lease's suites keeps each suite's noise pairs: no label of one suite
    names a different pair in another (the eager TP=2 pair of v32n was lost that way)."""
    from gate import plans

    seen: dict[str, list] = {}
    for name in plans.QUEUES["all"]:
        for label, pair in plans.SUITES[name].get("noise", {}).items():
            assert seen.setdefault(label, pair) == pair, (name, label)
    eager = plans.SUITES["needle-eager"]["noise"]
    merged = plans.merge_suites([plans.SUITES[n] for n in plans.QUEUES["all"]])["noise"]
    assert all(merged[k] == v for k, v in eager.items())


def _base034_suites() -> list[str]:
    """The vLLM 0.34.0 suites: named base034-*, run by name (each lease one of them); they
    reuse the 0.33.0 run names with other prompt lengths, so no queue merges them."""
    from gate import plans

    return sorted(n for n in plans.SUITES if n.startswith("base034-"))


def _queue(name: str) -> dict:
    """The named queue of plans.QUEUES as the one suite `dcp_gate.py --suites NAME` runs."""
    from gate import plans

    return plans.merge_suites([plans.SUITES[n] for n in plans.QUEUES[name]])


def _runs_every_reference(q: dict) -> list[str]:
    """The queue's run names, after checking that it runs both sides of every gate, of every
    noise pair and of every distance, and holds the noise group each distance is scaled by."""
    names = [r["name"] for r in q["runs"]]
    for gate, spec in q["gates"].items():
        pair = [spec["ref"], spec["cand"]] if isinstance(spec, dict) else spec
        assert set(pair) <= set(names), gate
    for label, pair in q["noise"].items():
        assert set(pair[1:3]) <= set(names), label
    for name, spec in q.get("distances", {}).items():
        assert {spec["ref"], spec["cand"]} <= set(names), name
        assert spec["noise"] in {pair[0] for pair in q["noise"].values()}, name
    return names


def _check_sensitivity_and_configs(q: dict) -> dict[str, dict]:
    """Checks that each gated checkpoint has a run with a sensitivity pass and that every run
    is a valid engine configuration (GateConfig raises on a bad one); returns the runs by
    name."""
    from gate import plan

    runs = {r["name"]: r for r in q["runs"]}
    for gate, spec in q["gates"].items():
        ref = runs[spec["ref"] if isinstance(spec, dict) else spec[0]]
        same = [r for r in q["runs"] if r["model"] == ref["model"]]
        assert any("sensitivity" in r["passes"] for r in same), gate
    fields = {f.name for f in dataclasses.fields(plan.GateConfig)}
    for run in q["runs"]:
        plan.GateConfig(**{k: v for k, v in run.items() if k in fields})
        assert not plan.engine_extra_problems(
            run.get("engine_extra", {}), run.get("variant", "stock"), run["dcp"]
        ), run["name"]
    return runs


def _negative_control_run(spec: dict | list) -> str:
    """The run whose fault pass is a gate's negative control: its control, or its candidate."""
    import dcp_gate

    return dcp_gate.gate_options(spec)["control"] or dcp_gate.gate_spec(spec)[1]


@pytest.mark.parametrize(
    "name",
    ["all", "dcp2", "dcp4", "graphs", "flashmla-wide-heads", "long-prompts", "long", "nvfp4"],
)
def test_every_queue_runs_every_reference_and_a_sensitivity_pass(name: str) -> None:
    """A queue run alone on a fresh machine can decide every gate it names: it runs both
    sides of each gate and noise pair, a sensitivity pass on each gated checkpoint, a fault
    pass (the negative control) in every DCP > 1 run that is a gate's candidate (or in the
    gate's control run), and every run is a valid engine configuration."""
    import dcp_gate

    q = _queue(name)
    names = _runs_every_reference(q)
    runs = _check_sensitivity_and_configs(q)
    for gate, spec in q["gates"].items():
        _, cand, kind = dcp_gate.gate_spec(spec)
        control = _negative_control_run(spec)
        assert control in names, (name, gate)
        if runs[cand]["dcp"] > 1 and kind in ("dcp", "dcp_pair", "wire"):
            assert "fault" in runs[control]["passes"], (name, gate)


def test_each_base034_suite_decides_its_gates_alone() -> None:
    """Each vLLM 0.34.0 suite, run by name on a fresh machine, runs both sides of every gate
    and noise pair, a sensitivity pass on each gated checkpoint and a fault pass in every
    DCP > 1 candidate (the negative control of every gate kind); its gates are named for the
    release and judged against their own checkpoint's noise; a run name shared by two 0.34.0
    suites means the same engine in both (only its passes and warm-up may differ)."""
    import dcp_gate
    from gate import plans

    engines: dict[str, tuple[str, dict]] = {}
    for name in _base034_suites():
        suite = plans.SUITES[name]
        q = plans.merge_suites([suite])
        _runs_every_reference(q)
        runs = _check_sensitivity_and_configs(q)
        for gate, spec in q["gates"].items():
            ref, cand, _ = dcp_gate.gate_spec(spec)
            assert gate.endswith("-0.34.0"), (name, gate)
            if runs[cand]["dcp"] > 1:
                assert "fault" in runs[cand]["passes"], (name, gate)
            assert spec["noise"] == runs[ref]["model"].removeprefix("@") + "/patched", gate
        for run in suite["runs"]:
            engine = {k: v for k, v in run.items() if k not in ("passes", "warmup")}
            seen = engines.setdefault(run["name"], (name, engine))
            assert seen[1] == engine, (run["name"], seen[0], name)
    assert {"base034-dcp4", "base034-dcp4-eager", "base034-wide-heads"} <= set(_base034_suites())


NVFP4_GROUP = "glmn/patched-nvfp4"


def test_the_nvfp4_queue_gates_dcp2_and_dcp4_on_the_4bit_cache_eager_and_under_graphs() -> None:
    """The nvfp4 queue (issue 45): on an nvfp4_ds_mla cache, the series' Triton backend on the
    patched tree at TP 2 DCP 2 and TP 4 DCP 4, eager and under graphs, each gated against DCP 1
    at the same TP, format and mode; every reference runs its own sensitivity pass (never an
    fp8 run's), every candidate a fault pass; the noise group is the 4-bit cache's own (no pair
    names an fp8 run, so fp8's noise cannot loosen these gates), with TP 2 and TP 4 DCP 1 vs
    TP 1; TP 4 DCP 4 under graphs (what users run) starts first after the warm-up; the
    fp8_ds_mla run differs from the nvfp4 TP 1 run in its cache format only and is compared
    with it as a distance, never a gate; no run shares a name with another suite's."""
    import dcp_gate
    import results_tables
    from gate import plans

    q = _queue("nvfp4")
    names = _runs_every_reference(q)
    runs = _check_sensitivity_and_configs(q)
    fp8 = [n for n, r in runs.items() if r["kv_cache_dtype"] != "nvfp4_ds_mla"]
    assert fp8 == ["p-glmn-tp1-dcp1-fp8"] and runs[fp8[0]]["kv_cache_dtype"] == "fp8_ds_mla"
    for run in runs.values():
        assert run["backend"] == "TRITON_MLA_SPARSE_FP8_DS_MLA" and run["variant"] == "patched"
        assert run["model"] == "@glmn" and run["env"] == {"VLLM_USE_V2_MODEL_RUNNER": "1"}
    gated = set()
    for gate, spec in q["gates"].items():
        ref, cand, kind = dcp_gate.gate_spec(spec)
        r, c = runs[ref], runs[cand]
        assert kind == "dcp" and spec["noise"] == NVFP4_GROUP and gate.endswith("-0.34.0")
        assert (r["tp"], r["dcp"]) == (c["tp"], 1) and c["dcp"] == c["tp"], gate
        assert r["graphs"] == c["graphs"] and r["kv_cache_dtype"] == c["kv_cache_dtype"]
        assert "sensitivity" in r["passes"] and "fault" in c["passes"], gate
        gated.add((c["dcp"], c["graphs"]))
    assert gated == {(2, False), (2, True), (4, False), (4, True)}
    for label, (group, a, b, _, _) in q["noise"].items():
        assert group == NVFP4_GROUP and fp8[0] not in (a, b), label
    pairs = {(a, b) for _, a, b, _, _ in q["noise"].values()}
    tp1 = "p-glmn-tp1-dcp1-nvfp4"
    assert {(tp1, "p-glmn-tp2-dcp1-nvfp4"), (tp1, "p-glmn-tp4-dcp1-nvfp4")} <= pairs
    assert [r["name"] for r in q["runs"] if r.get("warmup")] == [tp1]
    # graphs before eager, and within each DCP 2 before DCP 4: a lease cut short keeps the
    # cheaper gate of the mode users serve with
    gated_runs = [n for n in names if n.startswith(("p-glmn-tp2", "p-glmn-tp4"))]
    assert gated_runs == [
        "p-glmn-tp2-dcp1-nvfp4-graphs",
        "p-glmn-tp2-dcp2-nvfp4-graphs",
        "p-glmn-tp4-dcp1-nvfp4-graphs",
        "p-glmn-tp4-dcp4-nvfp4-graphs",
        "p-glmn-tp2-dcp1-nvfp4",
        "p-glmn-tp2-dcp2-nvfp4",
        "p-glmn-tp4-dcp1-nvfp4",
        "p-glmn-tp4-dcp4-nvfp4",
    ]
    ((name, spec),) = q["distances"].items()
    assert spec == {"ref": fp8[0], "cand": tp1, "noise": NVFP4_GROUP} and name.endswith("-0.34.0")
    a, b = (
        {k: v for k, v in runs[n].items() if k not in ("name", "passes", "warmup")}
        for n in (tp1, fp8[0])
    )
    assert {k for k in a.keys() | b.keys() if a.get(k) != b.get(k)} == {"kv_cache_dtype"}
    for other, suite in plans.SUITES.items():
        if other != "nvfp4-dcp":
            assert not set(names) & {r["name"] for r in suite["runs"]}, other
    for gate in q["gates"]:  # the status table's row: the 4-bit cache in brackets
        m = results_tables._GATE_NAME.match(gate)
        assert m and m["tp"] == m["dcp"], gate
        assert results_tables._gate_subject(m["rest"]) == "DCP vs DCP = 1 (nvfp4_ds_mla cache)"


def test_nvfp4_configs_take_the_patched_triton_backend_only() -> None:
    """nvfp4_ds_mla with DCP > 1 is the series' Triton backend on the patched tree (0014 lifts
    vLLM 0.34.0's refusal for it alone): accepted there; refused on the stock tree, with
    another backend or none, and on the packed-CKV route (it gathers fp8_ds_mla records); at
    DCP = 1 the harness leaves the choice to vLLM."""
    ok = {
        "name": "n",
        "model": "m",
        "tp": 4,
        "dcp": 4,
        "kv_cache_dtype": "nvfp4_ds_mla",
        "backend": "TRITON_MLA_SPARSE_FP8_DS_MLA",
        "variant": "patched",
    }
    plan.GateConfig(**ok)
    for change, message in (
        ({"variant": "stock"}, "exists only in the patched series"),
        ({"backend": "FLASHMLA_SPARSE"}, "needs backend TRITON_MLA_SPARSE_FP8_DS_MLA"),
        ({"backend": None, "variant": "stock"}, "nvfp4_ds_mla with dcp > 1 needs backend"),
        ({"engine_extra": {"dcp_prefill_route": "packed_ckv"}}, "must be 'fp8_ds_mla'"),
    ):
        with pytest.raises(ValueError, match=message):
            plan.GateConfig(**{**ok, **change})
    plan.GateConfig(**{**ok, "tp": 1, "dcp": 1, "backend": "FLASHMLA_SPARSE", "variant": "stock"})


def test_the_nvfp4_queue_fits_one_lease_by_the_estimate() -> None:
    """budget.py's estimate of the nvfp4 queue at --max-ranks 9 on one H100 (4-rank runs
    beside a 4-rank and a 1-rank one, as the issue 43 leases ran) ends within 1,200 s of the
    gates' start, decides the TP 4 DCP 4 graphs gate first among the 4-rank candidates, and is
    what the suite's `what` states."""
    from gate import budget, plans

    rows = budget.suite_rows(plans.merge_suites([plans.SUITES[n] for n in plans.QUEUES["nvfp4"]]))
    ends = budget.queue_estimate(rows, max_ranks=9)
    assert max(ends.values()) <= 1200
    assert ends["p-glmn-tp4-dcp4-nvfp4-graphs"] < ends["p-glmn-tp4-dcp4-nvfp4"]
    minutes = round(max(ends.values()) / 60)
    assert plans.SUITE_RECORDS["nvfp4-dcp"].what.endswith(
        f"estimate {minutes} min for the queue at --max-ranks 9 on one H100 "
        "(evidence/gate/budget.py --suites nvfp4)"
    )


def test_every_committed_gate_is_one_a_current_base_suite_produces() -> None:
    """results/ holds the current base's gates only (the 0.33.0 ones are in git log): every
    gate result there ran on vLLM 0.34.0, is named for it (-0.34.0) and is one a base034-*
    suite, the `long` queue (128k-1M prompts) or the `nvfp4` queue (the 4-bit cache) would
    produce again; so does every noise file, and every distance file (dcp-distance-*.json,
    measured beside the nvfp4 gates)."""
    from gate import plans

    results = Path(__file__).resolve().parents[2] / "results"
    suites034 = [*_base034_suites(), *plans.QUEUES["long"], *plans.QUEUES["nvfp4"]]
    gates034 = {g for n in suites034 for g in plans.SUITES[n]["gates"]}
    kinds: Counter[str | None] = Counter()
    for path in results.glob("dcp-gate-*.json"):
        d = json.loads(path.read_text())
        kinds[d.get("kind")] += 1
        if d.get("kind") in ("dcp_gate", "dcp_gate_noise"):
            assert d["base"]["vllm"] == "0.34.0", path.name
        if d.get("kind") == "dcp_gate":
            assert d["name"].endswith("-0.34.0") and d["name"] in gates034, path.name
    assert kinds["dcp_gate"] and kinds["dcp_gate_noise"], kinds
    distances034 = {k for n in suites034 for k in plans.SUITES[n].get("distances") or {}}
    assert distances034  # the nvfp4 queue states one
    for path in results.glob("dcp-distance-*.json"):
        d = json.loads(path.read_text())
        assert d["kind"] == "dcp_gate_distance" and d["base"]["vllm"] == "0.34.0", path.name
        assert d["name"].endswith("-0.34.0") and d["name"] in distances034, path.name


def test_the_graphs_end_queue_runs_the_open_rows_with_their_references() -> None:
    """The graphs queue runs every reference its gates compare, V3.2 under FULL graphs at
    DCP = 4 first after the warm-up, FlashMLA-sparse (32 local heads) and FA-sparse bf16
    under FULL graphs before the Triton merge at DCP = 4, a fault pass in every DCP > 1 run,
    no run whose gate the 12:35Z lease made meaningful (MTP at DCP = 4, FA-sparse eager at
    DCP = 4), and a sensitivity pass on each checkpoint it gates."""

    q = _queue("graphs")
    names = _runs_every_reference(q)
    after_warmup = [r["name"] for r in q["runs"] if not r.get("warmup")]
    assert after_warmup[:2] == ["v32n-tp4-dcp1-graphs", "v32n-tp4-dcp4-graphs"]
    assert names.index("p-glmn-tp2-dcp2-fa-graphs") < names.index("p-glmn-tp4-dcp4-merge-triton")
    assert names[-1] == "p-glmn-tp4-dcp4-fa-graphs"
    assert all("fault" in r["passes"] for r in q["runs"] if r["dcp"] > 1)
    assert not any("-mtp" in n or n.endswith("-fa") for n in names)
    graphs = {r["name"]: r for r in q["runs"] if r["graphs"]}
    assert graphs["p-glmn-tp2-dcp2-flashmla-graphs"]["backend"] == "FLASHMLA_SPARSE"
    assert graphs["p-glmn-tp2-dcp2-flashmla-graphs"]["variant"] == "patched"
    assert graphs["p-glmn-tp2-dcp2-fa-graphs"]["kv_cache_dtype"] == "auto"
    assert {
        "v32n-tp4-dcp4-graphs",
        "p-glmn-tp2-dcp2-graphs-flashmla_sparse",
        "p-glmn-tp2-dcp2-graphs-flash_attn_mla_sparse-bf16",
        "p-glmn-tp4-dcp4-graphs-flash_attn_mla_sparse-bf16",
        "p-glmn-tp4-dcp4-merge-triton",
    } <= set(q["gates"])
    _check_sensitivity_and_configs(q)


def test_the_wide_heads_queue_gates_flashmla_at_32_and_64_local_heads() -> None:
    """The flashmla-wide-heads queue runs, on the 128-head V3.2 needle checkpoint, the patched
    tree's FlashMLA-sparse at TP = 4 DCP = 4 (32 local heads, 128 gathered) eager and under FULL
    graphs and at TP = 2 DCP = 2 (64 local heads), every reference its gates and noise pairs
    compare, a fault pass in each DCP > 1 run and a sensitivity pass on the checkpoint."""
    from gate import plans

    assert "--heads" in plans.NEEDLE_CKPTS["v32w"]
    assert plans.NEEDLE_CKPTS["v32w"][plans.NEEDLE_CKPTS["v32w"].index("--heads") + 1] == "128"
    q = _queue("flashmla-wide-heads")
    _runs_every_reference(q)
    runs = _check_sensitivity_and_configs(q)
    assert all(r["model"] == "@v32w" for r in runs.values())
    assert all(
        r["variant"] == "patched" and r["backend"] == "FLASHMLA_SPARSE" for r in runs.values()
    )
    assert all("fault" in r["passes"] for r in runs.values() if r["dcp"] > 1)
    local_heads = {128 // r["tp"] for r in runs.values() if r["dcp"] > 1}
    assert local_heads == {32, 64}
    assert {r["graphs"] for r in runs.values() if r["tp"] == 4 and r["dcp"] == 4} == {True, False}
    assert set(q["gates"]) == {
        "p-v32w-tp4-dcp4-flashmla_sparse",
        "p-v32w-tp4-dcp4-graphs-flashmla_sparse",
        "p-v32w-tp2-dcp2-flashmla_sparse",
    }
    assert all(spec["noise"] == "v32w/patched" for spec in q["gates"].values())


def test_the_long_queue_gives_every_light_row_its_32k_prompt() -> None:
    """The long-prompts queue serves the 32k prompt, alone, to every patched glmn configuration
    whose earlier gates served only the 1k and 8k singles and the batch: each such gate has a
    counterpart named with "-32k" after its TP/DCP prefix, of the same kind, whose two runs have
    the light runs' engine settings and serve [32000] with no batch."""
    import re

    import dcp_gate
    from gate import plans

    long_names = set(plans.QUEUES["long-prompts"])
    runs: dict[str, dict] = {}
    for suite_name, suite in plans.SUITES.items():
        if suite_name in _base034_suites():  # 0.34.0 suites reuse run names with other lens
            continue
        for r in suite["runs"]:
            runs.setdefault(r["name"], r)
    q = _queue("long-prompts")
    _runs_every_reference(q)
    qruns = _check_sensitivity_and_configs(q)
    same = ("model", "variant", "tp", "dcp", "graphs", "backend", "kv_cache_dtype")

    def settings(run: dict) -> tuple:
        extra = {
            k: v for k, v in run.get("engine_extra", {}).items() if k != "dcp_comm_ledger_size"
        }
        return tuple(run.get(k) for k in same), json.dumps(extra, sort_keys=True)

    light = {}
    later = {*_base034_suites(), *plans.QUEUES["nvfp4"]}  # 0.34.0: no 32k twins planned yet
    for name, suite in plans.SUITES.items():
        if name in long_names or name in later:
            continue
        for gate, spec in suite["gates"].items():
            ref, cand, kind = dcp_gate.gate_spec(spec)
            c = runs[cand]
            if c["model"] == "@glmn" and c.get("variant") == "patched" and "lens" in c:
                if 32000 not in c["lens"]:
                    light[gate] = (ref, cand, kind)
    assert len(light) >= 20  # the DCP = 2 and DCP = 4 variant rows, FA and graphs at DCP = 4
    for gate, (ref, cand, kind) in light.items():
        twin = re.sub(r"^(p-glmn-tp\d+-dcp\d+)", r"\1-32k", gate)
        assert twin in q["gates"], gate
        lref, lcand, lkind = dcp_gate.gate_spec(q["gates"][twin])
        assert lkind == kind, gate
        for old, new in ((ref, lref), (cand, lcand)):
            assert settings(qruns[new]) == settings(runs[old]), (gate, new)
            assert qruns[new]["lens"] == [32000] and qruns[new]["batch_lens"] == [], new
    candidates = {dcp_gate.gate_spec(spec)[1] for spec in q["gates"].values()}
    assert all("fault" in qruns[c]["passes"] for c in candidates if qruns[c]["dcp"] > 1)


def _served(run: dict, shift: float = 0.0, token: int = 5) -> dict:
    """``run`` with a served clean pass: per prompt two steps whose top-2 log-probs move by
    ``shift`` and whose second greedy token is ``token``."""
    for rec in run["passes"]["clean"].values():
        rec["tokens"] = [3, token]
        rec["steps"] = [
            {"token": 3, "top": [[3, -0.5 + shift], [4, -2.0]]},
            {"token": token, "top": [[token, -0.25], [4, -3.0 - shift]]},
        ]
    return run


def test_ledger_observer_check_compares_with_the_run_without_a_ledger() -> None:
    """The observer check: greedy tokens of the ledger run against the same configuration
    without one, per prompt, and the largest |delta log-prob|; other prompts are refused."""
    prompts = {"single/1024": "a", "batch/0/700": "b"}
    measured = _served(_run("q", prompts, {"q_gather": (1, 1)}))
    same = _served(_run("n", prompts, {}), shift=0.01)
    out = ledger.compare({"query": (measured, "clean")}, control=(same, "clean"))
    check = out["observer_check"]
    assert check["control"] == "n:clean" and check["prompts"] == 2
    assert check["tokens_exact_prompts"] == 2
    assert check["max_abs_logprob_diff"] == pytest.approx(0.01)
    moved = _served(_run("m", prompts, {}), token=6)
    assert ledger.observer_check((measured, "clean"), (moved, "clean"))["tokens_exact_prompts"] == 0
    other = _served(_run("o", {"single/1024": "X", "batch/0/700": "b"}, {}))
    with pytest.raises(ValueError, match="served other prompts"):
        ledger.observer_check((measured, "clean"), (other, "clean"))


def test_an_emulated_dcp1_reference_stays_off_vllm_s_symmetric_memory_token_sharding() -> None:
    """Ranks sharing one GPU cannot rendezvous vLLM's symmetric memory: an emulated TP > 1
    DCP = 1 run turns sparse_mla_shard_q off (its DCP > 1 twin never takes that path); a
    run with one GPU per rank, or with DCP, keeps vLLM's default."""
    from gate import worker

    ref = plan.GateConfig(name="r", model="m", tp=4, dcp=1, backend="FLASHMLA_SPARSE")
    off = {"sparse_mla_shard_q": False}
    assert worker.engine_kwargs(ref, emulated=True)["attention_config"] == off
    assert "attention_config" not in worker.engine_kwargs(ref)
    dcp = plan.GateConfig(name="d", model="m", tp=4, dcp=4, backend="FLASHMLA_SPARSE")
    assert "attention_config" not in worker.engine_kwargs(dcp, emulated=True)
    emulated = plan.rank_envs(4, 1, 29600, "r")
    native = plan.rank_envs(4, 4, 29600, "r")
    assert all(e[plan.EMULATED_ENV] == "1" for e in emulated)
    assert not any(plan.EMULATED_ENV in e for e in native)
