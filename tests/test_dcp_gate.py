# SPDX-License-Identifier: Apache-2.0
"""The DCP gate's judgements and plumbing (scripts/dcp_gate.py, scripts/gate/) on CPU: the
comparison, the tolerance from the noise floor, sensitivity, the negative-control verdict, the
result schema, the per-rank launch environments, and a whole suite driven through the real
launcher with a stand-in for vLLM (tests/support/fake_gate_worker.py)."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

import results_tables  # noqa: E402
from gate import plan, verdict  # noqa: E402


def step(*pairs: tuple[int, float]) -> dict:
    return {"token": pairs[0][0], "top": [list(p) for p in pairs]}


def record(steps: list[dict], sha: str = "s1") -> dict:
    return {
        "prompt_len": 8,
        "prompt_sha256": sha,
        "tokens": [s["token"] for s in steps],
        "steps": steps,
    }


REF = record([step((5, -0.1), (9, -2.5), (4, -3.0)), step((6, -0.2), (1, -2.0), (2, -4.0))])


def run_of(rec: dict, ok: bool = True, **passes: dict) -> dict:
    return {"ok": ok, "config": {}, "passes": {"clean": {"single/8": rec}, **passes}}


def shifted(rec: dict, delta: float, at_step: int = 1) -> dict:
    out = copy.deepcopy(rec)
    out["steps"][at_step]["top"] = [[t, lp + delta] for t, lp in out["steps"][at_step]["top"]]
    return out


def test_identical_prompts_are_equivalent():
    got = verdict.compare_prompt(REF, copy.deepcopy(REF), atol=0.01)
    assert got["equivalent"] and got["max_abs_logprob_diff"] == 0.0
    assert got["first_token_difference"] is None and got["compared_steps"] == 2


def test_drift_past_the_tolerance_fails_and_within_passes():
    assert verdict.compare_prompt(REF, shifted(REF, 0.005), atol=0.01)["equivalent"]
    bad = verdict.compare_prompt(REF, shifted(REF, 0.05), atol=0.01)
    assert not bad["equivalent"]
    assert bad["max_abs_logprob_diff"] == pytest.approx(0.05)
    assert any("atol" in r for r in bad["reasons"])


def test_a_divergence_is_accepted_only_as_a_near_tie():
    ref = record([step((5, -0.1), (9, -2.5)), step((6, -0.690), (1, -0.695)), step((3, -0.1))])
    flipped = record([step((5, -0.1), (9, -2.5)), step((1, -0.692), (6, -0.694)), step((8, -0.1))])
    tie = verdict.compare_prompt(ref, flipped, atol=0.01)
    assert tie["first_token_difference"] == 1 and tie["divergence_is_near_tie"]
    assert tie["equivalent"] and tie["compared_steps"] == 2
    far = record([step((5, -0.1), (9, -2.5)), step((1, -0.1), (6, -3.0)), step((8, -0.1))])
    assert not verdict.compare_prompt(ref, far, atol=0.01)["equivalent"]


def test_disjoint_top_ids_and_other_prompts_fail():
    other_ids = copy.deepcopy(REF)
    other_ids["steps"][1]["top"] = [[77, -0.2], [78, -2.0]]
    got = verdict.compare_prompt(REF, other_ids, atol=1.0)
    assert not got["equivalent"] and any("no common" in r for r in got["reasons"])
    assert not verdict.compare_prompt(REF, record(REF["steps"], sha="s2"), 1.0)["equivalent"]


def test_nan_log_probs_are_never_within_the_tolerance():
    nan = copy.deepcopy(REF)
    nan["steps"][1]["top"][0][1] = float("nan")
    got = verdict.compare_prompt(REF, nan, atol=10.0)
    assert not got["equivalent"] and any("NaN" in r for r in got["reasons"])


def test_missing_prompts_and_failed_runs_are_not_equivalent():
    ref = run_of(REF)
    empty = {"ok": True, "passes": {"clean": {}}}
    assert not verdict.compare_passes(ref, empty, 1.0)["equivalent"]
    crashed = {"ok": False, "error": "boom", "passes": {}}
    got = verdict.compare_passes(ref, crashed, 1.0)
    assert not got["equivalent"] and "boom" in got["problems"][0]


def test_tolerance_is_derived_from_the_largest_noise_pair():
    tol = verdict.derive_tolerance({"tp2 vs tp1": 0.01, "repeat": 0.0, "unmeasured": None})
    assert tol["noise_floor"] == 0.01
    assert tol["atol_logprob"] == pytest.approx(verdict.TOLERANCE_FACTOR * 0.01)
    assert verdict.derive_tolerance({"repeat": 0.0})["atol_logprob"] == verdict.TOLERANCE_MIN
    with pytest.raises(ValueError):
        verdict.derive_tolerance({"a": None})


def test_pair_noise_is_measured_without_a_tolerance():
    value, _ = verdict.pair_noise(run_of(REF), run_of(shifted(REF, 0.3)))
    assert value == pytest.approx(0.3)
    assert verdict.pair_noise(run_of(REF), {"ok": False})[0] is None


def test_sensitivity_is_the_smallest_first_step_move():
    moved = {"single/8~p5": shifted(REF, 0.4, at_step=0) | {"prompt_sha256": "p"}}
    sens = verdict.sensitivity(run_of(REF, sensitivity=moved), atol=0.01)
    assert sens["min_first_step_max_abs_logprob_diff"] == pytest.approx(0.4)
    assert sens["sufficient"] and sens["over_tolerance"] == pytest.approx(40)
    weak = {"single/8~p5": shifted(REF, 0.02, at_step=0)}
    assert not verdict.sensitivity(run_of(REF, sensitivity=weak), atol=0.01)["sufficient"]
    assert verdict.sensitivity(run_of(REF))["measured"] is False


def test_negative_control_is_detected_only_when_the_fault_breaks_the_comparison():
    ref = run_of(REF)
    caught = run_of(REF, fault={"single/8": shifted(REF, 0.5)})
    neg = verdict.negative_control(ref, caught, atol=0.01)
    assert neg["ran"] and neg["detected"] and neg["prompts_failing"] == ["single/8"]
    missed = run_of(REF, fault={"single/8": copy.deepcopy(REF)})
    assert not verdict.negative_control(ref, missed, atol=0.01)["detected"]
    assert verdict.negative_control(ref, run_of(REF), atol=0.01) == {
        "ran": False,
        "detected": False,
    }
    crashed = run_of(REF, fault={})
    crashed["ok"] = False
    assert not verdict.negative_control(ref, crashed, atol=0.01)["detected"]


def test_gate_result_carries_the_schema_and_validate_catches_gaps():
    tol = verdict.derive_tolerance({"n": 0.001})
    sens = verdict.sensitivity(
        run_of(REF, sensitivity={"single/8~p5": shifted(REF, 1.0, at_step=0)}), tol["atol_logprob"]
    )
    cand = run_of(shifted(REF, 0.001), fault={"single/8": shifted(REF, 0.5)})
    res = verdict.gate_result("g", run_of(REF), cand, tol, {"max_abs_logprob_diff": 0.001}, sens)
    assert verdict.validate(res) == []
    assert res["equivalent"] and res["negative_control_detected"] and res["meaningful"]
    json.dumps(res, allow_nan=False)  # strict JSON: no inf/nan anywhere
    broken = {k: v for k, v in res.items() if k != "noise_floor"}
    assert "missing 'noise_floor'" in verdict.validate(broken)


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"tp": 2, "dcp": 4}, "multiple of dcp"),
        ({"dcp": 1, "passes": ("clean", "fault")}, "dcp >= 2"),
        ({"max_tokens": 8}, ">= 32"),
        ({"passes": ("repeat",)}, "'clean' pass"),
        ({"passes": ("clean", "bogus")}, "unknown passes"),
        ({"lens": (40000,)}, "max_model_len"),
    ],
)
def test_gate_config_rejects_bad_configurations(kw, message):
    with pytest.raises(ValueError, match=message):
        plan.GateConfig(name="x", model="m", **kw)


def test_rank_envs_one_gpu_emulation_and_one_rank_per_gpu():
    one = plan.rank_envs(4, 1, 29600, "t")
    assert [e["LOCAL_RANK"] for e in one] == ["0"] * 4
    assert len({e["NCCL_HOSTID"] for e in one}) == 4
    assert all(e["NCCL_SOCKET_IFNAME"] == "lo" and e["NCCL_NVLS_ENABLE"] == "0" for e in one)
    native = plan.rank_envs(4, 4, 29600, "t")
    assert [e["LOCAL_RANK"] for e in native] == ["0", "1", "2", "3"]
    assert not any("NCCL_HOSTID" in e for e in native)
    assert plan.rank_envs(1, 1, 29600, "t")[0]["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert plan.transport(4, 1) == plan.TRANSPORT_EMULATED
    with pytest.raises(ValueError):
        plan.rank_envs(2, 0, 29600, "t")


def test_prompts_are_seeded_and_the_perturbation_changes_one_token():
    cfg = plan.GateConfig(name="x", model="m", lens=(64, 128), batch_lens=(10, 20))
    a, b = plan.make_prompts(cfg), plan.make_prompts(cfg)
    assert a == b and sorted(a) == ["batch/0/10", "batch/1/20", "single/128", "single/64"]
    p = plan.prompt_for("single/64~p5", a)
    assert [i for i, (x, y) in enumerate(zip(p, a["single/64"], strict=True)) if x != y] == [5]
    assert plan.pass_groups(cfg, "clean")[-1] == ["batch/0/10", "batch/1/20"]
    assert plan.pass_groups(cfg, "sensitivity") == [["single/64~p5"], ["single/128~p5"]]


SUITE = {
    "checkpoints": {},
    "runs": [
        {
            "name": "f-tp1",
            "model": "M/f",
            "tp": 1,
            "dcp": 1,
            "lens": [64, 128],
            "batch_lens": [16, 32],
            "passes": ["clean", "repeat", "sensitivity"],
        },
        {
            "name": "f-tp2",
            "model": "M/f",
            "tp": 2,
            "dcp": 1,
            "lens": [64, 128],
            "batch_lens": [16, 32],
            "passes": ["clean"],
        },
        {
            "name": "f-tp2-dcp2",
            "model": "M/f",
            "tp": 2,
            "dcp": 2,
            "lens": [64, 128],
            "batch_lens": [16, 32],
            "passes": ["clean", "fault"],
            "backend": "FLASHMLA_SPARSE",
        },
    ],
    "noise": {
        "f: tp2 vs tp1": ["f", "f-tp1", "f-tp2", "clean", "clean"],
        "f: repeat": ["f", "f-tp1", "f-tp1", "clean", "repeat"],
    },
    "gates": {"f-dcp2": ["f-tp2", "f-tp2-dcp2"]},
}


def run_suite(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    suite = tmp_path / "suite.json"
    suite.write_text(json.dumps(SUITE))
    full = dict(
        os.environ,
        GATE_GPUS="1",
        GATE_WORKER_MODULE="fake_gate_worker",
        PYTHONPATH=str(ROOT / "tests" / "support"),
        DCP_GIT_REV="abc123",
        **env,
    )
    return subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "dcp_gate.py"),
            "suite",
            "--suite",
            str(suite),
            "--work",
            str(tmp_path / "work"),
            "--out",
            str(tmp_path / "out"),
            "--deadline-s",
            "60",
        ],
        env=full,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_suite_runs_end_to_end_through_the_launcher(tmp_path: Path):
    proc = run_suite(tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    gate = json.loads((tmp_path / "out" / "dcp-gate-f-dcp2.json").read_text())
    assert verdict.validate(gate) == []
    assert gate["equivalent"] and gate["negative_control_detected"] and gate["meaningful"]
    assert gate["dcp"]["candidate"]["transport"] == plan.TRANSPORT_EMULATED
    assert gate["revision"]["series"] == "abc123"
    run = json.loads((tmp_path / "work" / "runs" / "f-tp2-dcp2.json").read_text())
    hosts = {r["layers"][0]["backend"] for r in run["attention_layers"]}
    assert hosts == {"FLASHMLA_SPARSE"} and len(run["attention_layers"]) == 2
    noise = json.loads((tmp_path / "out" / "dcp-gate-noise-f.json").read_text())
    assert noise["tolerance"]["noise_floor"] > 0


def test_a_wrong_candidate_fails_its_gate(tmp_path: Path):
    proc = run_suite(tmp_path, GATE_FAKE_BROKEN="f-tp2-dcp2")
    assert proc.returncode == 0, proc.stderr[-2000:]
    gate = json.loads((tmp_path / "out" / "dcp-gate-f-dcp2.json").read_text())
    assert not gate["equivalent"]


def test_results_tables_render_gate_files(tmp_path: Path, monkeypatch):
    assert run_suite(tmp_path).returncode == 0
    monkeypatch.setattr(results_tables, "RESULTS", tmp_path / "out")
    text = "\n".join(results_tables.dcp_gate_section())
    assert "f-dcp2" in text and "one-GPU emulation" in text
    assert "| f |" in text  # the noise / tolerance table


def test_committed_gate_results_are_well_formed_and_render():
    files = sorted((ROOT / "results").glob("dcp-gate-*.json"))
    docs = [json.loads(p.read_text()) for p in files]
    gates = [d for d in docs if d.get("kind") == verdict.GATE_KIND]
    assert gates, "no committed gate result"
    for g in gates:
        assert verdict.validate(g) == [], g["name"]
        # a gate whose sensitivity does not clear the margin is never called meaningful
        if not g["sensitivity"].get("sufficient"):
            assert g["meaningful"] is False
    for p in files:
        if p.name.startswith("dcp-gate-noise"):
            d = json.loads(p.read_text())
            assert (
                d["tolerance"]["atol_logprob"]
                >= verdict.TOLERANCE_FACTOR * d["tolerance"]["noise_floor"] - 1e-12
            )
    assert results_tables.dcp_gate_section()


def test_needle_prompts_carry_the_needle_once_and_the_perturbation_removes_it():
    cfg = plan.GateConfig(name="x", model="m", lens=(64,), batch_lens=(16, 32), needle=7)
    prompts = plan.make_prompts(cfg)
    for ids in prompts.values():
        assert ids[plan.PERTURB_POSITION] == 7 and ids.count(7) == 1
    assert 7 not in plan.prompt_for(f"single/64~p{plan.PERTURB_POSITION}", prompts)
    with pytest.raises(ValueError, match="needle"):
        plan.GateConfig(name="x", model="m", needle=40000)


def test_checkpoint_configs_have_the_gate_geometry():
    import make_dsa_gate_ckpt as ck

    glm = ck.make_config("glm")
    assert glm["architectures"] == ["GlmMoeDsaForCausalLM"] and glm["num_attention_heads"] == 64
    assert glm["kv_lora_rank"] + glm["qk_rope_head_dim"] == 576
    assert glm["index_topk"] < min(plan.SINGLE_LENS) and {"full", "shared"} <= set(
        glm["indexer_types"]
    )
    assert glm["num_nextn_predict_layers"] == 1
    assert ck.make_config("v32")["architectures"] == ["DeepseekV32ForCausalLM"]
    plan_ = ck.tensor_plan(glm, "omit")
    assert "model.layers.2.self_attn.indexer.wk.weight" not in plan_  # a shared layer
    assert "model.layers.1.self_attn.indexer.wk.weight" in plan_


def test_the_needle_tops_every_indexer_row_and_draws_attention():
    pytest.importorskip("torch")
    import make_dsa_gate_ckpt as ck

    cfg = ck.make_config("glm", layers=1) | {
        "vocab_size": 512,
        "hidden_size": 256,
        "q_lora_rank": 128,
        "intermediate_size": 64,
    }
    gains = {"qk": 1.0, "o": 1.0, "down": 0.25, "head": 1.0}
    plain = ck.build(cfg, 0, gains, "include")
    base = ck.check_layer0(plain, cfg, None, 0, keys=1024, queries=32)
    knobs = dict(ck.NEEDLE_DEFAULTS, attn_margin=9.0)
    ck.add_needle(plain, cfg, 0, 7, knobs)
    got = ck.check_layer0(plain, cfg, 7, 0, keys=1024, queries=32)
    assert got["indexer_rank_of_key0"]["max"] == 0
    assert base["indexer_rank_of_key0"]["in_topk_fraction"] < 1.0
    weight = got["attention_weight_of_key0"]["mean"]
    assert weight > 50 * got["attention_weight_of_key0"]["uniform_would_be"]
    assert (
        base["attention_weight_of_key0"]["mean"]
        < 3 * base["attention_weight_of_key0"]["uniform_would_be"]
    )
