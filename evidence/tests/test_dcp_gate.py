# SPDX-License-Identifier: Apache-2.0
"""The DCP gate's judgements and plumbing (evidence/dcp_gate.py, evidence/gate/) on CPU: the
comparison, the tolerance from the noise floor, sensitivity, the negative-control verdict, the
result schema, the per-rank launch environments, and a whole suite driven through the real
launcher with a stand-in for vLLM (evidence/tests/support/fake_gate_worker.py)."""

from __future__ import annotations

import copy
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EVIDENCE = ROOT / "evidence"
sys.path.insert(0, str(EVIDENCE))

import dcp_gate  # noqa: E402
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


def test_the_largest_difference_is_located_and_the_entries_counted():
    """The comparison names the step, id and both log-probs of its largest difference, and
    counts the compared and the equal (step, id) entries; NaN entries count, never win."""
    cand = copy.deepcopy(REF)
    cand["steps"][1]["top"][1][1] += 0.0625  # id 1 at step 1
    cand["steps"][0]["top"][2][1] += 0.03125  # id 4 at step 0
    got = verdict.compare_prompt(REF, cand, atol=0.1)["largest_difference"]
    assert got["at"] == {"step": 1, "id": 1, "ref": -2.0, "cand": -2.0 + 0.0625}
    assert got["entries_compared"] == 6 and got["entries_equal"] == 4
    same = verdict.compare_prompt(REF, copy.deepcopy(REF), atol=0.1)["largest_difference"]
    assert same["entries_equal"] == same["entries_compared"] == 6
    assert same["at"]["step"] == 0  # all equal: the first entry compared
    nan = copy.deepcopy(cand)
    nan["steps"][0]["top"][0][1] = math.nan
    got = verdict.largest_difference(REF["steps"], nan["steps"])
    assert got["at"]["id"] == 1 and got["entries_compared"] == 6 and got["entries_equal"] == 3


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


def test_runs_of_different_checkpoint_bytes_are_never_compared():
    """Two runs whose records name different checkpoint weights (a run reused from another
    lease whose seeded checkpoint came out different) fail the comparison and give no
    noise figure; the same digest, or a run that names none, compares as before."""
    same = {"checkpoint": {"safetensors_sha256": "aa"}}
    ref, cand = {**run_of(REF), **same}, {**run_of(copy.deepcopy(REF)), **same}
    assert verdict.compare_passes(ref, cand, 0.01)["equivalent"]
    other = {**cand, "checkpoint": {"safetensors_sha256": "bb"}}
    got = verdict.compare_passes(ref, other, 0.01)
    assert not got["equivalent"] and "different checkpoints" in got["problems"][0]
    assert verdict.pair_noise(ref, other)[0] is None
    assert verdict.compare_passes(ref, run_of(copy.deepcopy(REF)), 0.01)["equivalent"]


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
    assert sens["min_first_step_move_lower_bound"] == pytest.approx(0.4)
    assert sens["min_first_step_max_abs_logprob_diff"] == pytest.approx(0.4)
    assert sens["sufficient"] and sens["over_tolerance"] == pytest.approx(40)
    weak = {"single/8~p5": shifted(REF, 0.02, at_step=0)}
    assert not verdict.sensitivity(run_of(REF, sensitivity=weak), atol=0.01)["sufficient"]
    assert verdict.sensitivity(run_of(REF))["measured"] is False


def test_step_move_lower_bound_counts_ids_that_leave_the_top_k():
    """An id in one top-k list only moved at least its log-prob minus the other list's
    smallest; ids in both count exactly; the bound never exceeds the true largest move."""
    a = step((5, -0.1), (9, -2.5), (4, -3.0))
    b = step((7, -0.3), (4, -3.2), (8, -3.5))  # 5 and 9 left (now <= -3.5), 7 and 8 entered
    assert verdict.step_difference(a, b) == (pytest.approx(0.2), 1)  # only id 4 in both
    assert verdict.step_move_lower_bound(a, b) == pytest.approx(3.4)  # id 5: -0.1 - (-3.5)
    assert verdict.step_move_lower_bound(a, copy.deepcopy(a)) == 0.0
    full_a = {5: -0.1, 9: -2.5, 4: -3.0, 7: -4.0, 8: -6.0}
    full_b = {5: -3.6, 9: -3.9, 4: -3.2, 7: -0.3, 8: -3.5}  # consistent with both lists
    assert verdict.step_move_lower_bound(a, b) <= max(abs(full_a[t] - full_b[t]) for t in full_a)
    nan = step((5, float("nan")), (9, -2.5))
    assert math.isnan(verdict.step_move_lower_bound(nan, a))
    replaced = {"single/8~p5": record([b, REF["steps"][1]])}
    sens = verdict.sensitivity(run_of(REF, sensitivity=replaced), atol=0.1)
    assert sens["min_first_step_move_lower_bound"] == pytest.approx(3.4)
    assert sens["min_first_step_max_abs_logprob_diff"] == pytest.approx(0.2)
    assert sens["sufficient"] and sens["over_tolerance"] == pytest.approx(34)


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
        ({"max_num_seqs": 3}, "max_num_seqs"),
        ({"max_num_seqs": True}, "max_num_seqs"),
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


def fake_trees(tmp_path: Path) -> dict[str, str]:
    """Two stand-in vLLM trees (stock, patched) and the environment that names them."""
    env = {}
    for variant in plan.VARIANTS:
        pkg = tmp_path / f"tree-{variant}" / "vllm"
        pkg.mkdir(parents=True, exist_ok=True)
        (pkg / "__init__.py").write_text(f"__version__ = 'fake-{variant}'\n")
        env[f"GATE_VLLM_{variant.upper()}"] = str(pkg.parent)
    return env


def gate_env(tmp_path: Path, **env: str) -> dict[str, str]:
    trees = fake_trees(tmp_path)
    return {
        **os.environ,
        "GATE_GPUS": "1",
        "GATE_WORKER_MODULE": "fake_gate_worker",
        # the stock tree first, as device-env.sh leaves it: the launcher must swap it per run
        "PYTHONPATH": f"{trees['GATE_VLLM_STOCK']}:{EVIDENCE / 'tests' / 'support'}",
        "DCP_GIT_REV": "abc123",
        **trees,
        **env,
    }


def gate_cmd(*args: str) -> list[str]:
    return [sys.executable, str(EVIDENCE / "dcp_gate.py"), *args]


def run_gate(*args: str, env: dict[str, str], timeout: int = 60, check: bool = False):
    """dcp_gate.py with these arguments, output captured as text."""
    return subprocess.run(
        gate_cmd(*args), env=env, capture_output=True, text=True, timeout=timeout, check=check
    )


def run_suite(tmp_path: Path, suite: dict | None = None, **env: str) -> subprocess.CompletedProcess:
    path = tmp_path / "suite.json"
    path.write_text(json.dumps(SUITE if suite is None else suite))
    return run_gate(
        "suite",
        "--suite",
        str(path),
        "--work",
        str(tmp_path / "work"),
        "--out",
        str(tmp_path / "out"),
        "--deadline-s",
        "60",
        env=gate_env(tmp_path, **env),
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


@pytest.mark.parametrize(
    "gpus, gib, rank_gib, expected",
    [
        (1, 79.2, 6.5, 12),
        (1, 139.8, 6.5, 16),
        (2, 79.2, 6.5, 16),
        (1, None, 6.5, 16),
        (1, 4.0, 6.5, 1),
        (1, 79.2, 0.0, 16),
    ],
)
def test_ranks_at_once_are_bounded_by_the_gpus_memory(gpus, gib, rank_gib, expected):
    assert dcp_gate.ranks_that_fit(16, gpus, gib, rank_gib) == expected


def test_a_suite_on_a_small_gpu_runs_fewer_ranks_at_once(tmp_path: Path):
    proc = run_suite(tmp_path, GATE_GPU_GIB="13")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "2 rank processes at once, not 16" in proc.stdout


def test_a_wrong_candidate_fails_its_gate(tmp_path: Path):
    proc = run_suite(tmp_path, GATE_FAKE_BROKEN="f-tp2-dcp2")
    assert proc.returncode == 0, proc.stderr[-2000:]
    gate = json.loads((tmp_path / "out" / "dcp-gate-f-dcp2.json").read_text())
    assert not gate["equivalent"]


def test_a_distance_is_measured_and_stated_never_judged():
    """A distance (two KV-cache formats, say) is the gates' comparison without a tolerance:
    the largest difference over shared-context steps, the first step's, the tokens; scaled by
    the noise floor, the tolerance and the sensitivity; the file carries no verdict, and the
    validator refuses one."""
    tol = verdict.derive_tolerance({"n": 0.01})
    sens = verdict.sensitivity(
        run_of(REF, sensitivity={"single/8~p5": shifted(REF, 2.0, at_step=0)}), tol["atol_logprob"]
    )
    noise = {"max_abs_logprob_diff": 0.01, "group": "g"}
    res = verdict.distance_result("d", run_of(REF), run_of(shifted(REF, 0.2)), tol, noise, sens)
    assert verdict.validate_distance(res) == [] and res["kind"] == verdict.DISTANCE_KIND
    assert res["max_abs_logprob_diff"] == pytest.approx(0.2)
    assert res["max_first_step_abs_logprob_diff"] == 0.0  # the shift starts at step 1
    assert res["tokens_exact"]["all_exact"]
    scale = res["scale"]
    assert scale["ratio_to_noise_floor"] == pytest.approx(20.0)
    assert scale["ratio_to_tolerance"] == pytest.approx(5.0) and scale["within_tolerance"] is False
    assert scale["ratio_to_sensitivity"] == pytest.approx(0.1)
    assert not {"equivalent", "meaningful", "negative_control_detected"} & set(res)
    near = verdict.distance_result("d", run_of(REF), run_of(shifted(REF, 0.02)), tol, noise, sens)
    assert near["scale"]["within_tolerance"] is True
    json.dumps(res, allow_nan=False)
    assert "a distance is not a gate: no equivalent" in verdict.validate_distance(
        {**res, "equivalent": True}
    )
    assert "missing 'scale'" in verdict.validate_distance(
        {k: v for k, v in res.items() if k != "scale"}
    )


def test_a_suites_distance_is_reported_beside_its_gates(tmp_path: Path):
    """Through the launcher: a distance between the TP 1 run and another TP 1 run (another KV
    format, shifted by 0.3 from step 1 on) lands in dcp-distance-<name>.json, scaled by its
    noise group; the gate beside it is unchanged."""
    suite = copy.deepcopy(SUITE)
    suite["runs"].append(
        {
            "name": "f-tp1-nvfp4",
            "model": "M/f",
            "tp": 1,
            "dcp": 1,
            "lens": [64, 128],
            "batch_lens": [16, 32],
            "passes": ["clean", "sensitivity"],
            "kv_cache_dtype": "nvfp4_ds_mla",
        }
    )
    suite["distances"] = {"f-nvfp4-vs-fp8": {"ref": "f-tp1", "cand": "f-tp1-nvfp4", "noise": "f"}}
    proc = run_suite(tmp_path, suite, GATE_FAKE_SHIFT="f-tp1-nvfp4:0.3")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "DISTANCE f-nvfp4-vs-fp8" in proc.stdout and "(measured, not gated)" in proc.stdout
    d = json.loads((tmp_path / "out" / "dcp-distance-f-nvfp4-vs-fp8.json").read_text())
    assert verdict.validate_distance(d) == []
    assert d["max_abs_logprob_diff"] == pytest.approx(0.3)
    assert d["backend"]["candidate_kv_cache_dtype"] == "nvfp4_ds_mla"
    assert d["scale"]["noise_floor"]["group"] == "f" and d["scale"]["within_tolerance"] is False
    assert d["scale"]["sensitivity"]["run"] == "f-tp1-nvfp4"  # the candidate's own
    assert d["scale"]["ratio_to_noise_floor"] > 1 and d["tokens_exact"]["all_exact"]
    gate = json.loads((tmp_path / "out" / "dcp-gate-f-dcp2.json").read_text())
    assert gate["equivalent"] and gate["meaningful"]


def test_a_distance_names_two_runs_and_its_own_noise_group(tmp_path: Path) -> None:
    """A suite's distances are checked as its gates are: the keys ref, cand and noise, two
    different runs that some suite defines, a noise group of the suite's own pairs, a name no
    gate of the suite has."""
    from gate import plans

    run = {"model": "m", "passes": ["clean", "repeat"]}
    suite = {
        "what": "w",
        "checkpoints": {},
        "runs": [{"name": "a", **run}, {"name": "b", **run}],
        "noise": {"g: a repeated": ["g", "a", "a", "clean", "repeat"]},
        "gates": {},
        "distances": {"d": {"ref": "a", "cand": "b", "noise": "g"}},
    }

    def load(**distances: dict) -> dict:
        folder = tmp_path / str(len(list(tmp_path.iterdir())))
        folder.mkdir()
        (folder / "s.json").write_text(json.dumps({**suite, **distances}))
        return plans.load_suites(folder)

    assert load()["s"].distances == suite["distances"]
    assert plans.merge_suites([load()["s"].as_dict()])["distances"] == suite["distances"]
    for distances, message in (
        ({"d": {"ref": "a", "cand": "b"}}, "want ref, cand, noise"),
        ({"d": {"ref": "a", "cand": "a", "noise": "g"}}, "one run"),
        ({"d": {"ref": "a", "cand": "b", "noise": "h"}}, "none of this suite's noise pairs"),
        ({"d": {"ref": "a", "cand": "z", "noise": "g"}}, "a run no suite defines"),
    ):
        with pytest.raises(ValueError, match=message):
            load(distances=distances)


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
    # --heads: DeepSeek-V3.2's real 128 query heads (the wide-heads FlashMLA gates)
    wide = ck.make_config("v32", heads=128)
    assert wide["num_attention_heads"] == wide["num_key_value_heads"] == 128
    assert ck.make_config("v32")["num_attention_heads"] == 32
    shapes = ck.layer_shapes(wide, with_indexer=True)
    assert shapes["self_attn.q_b_proj.weight"][0] == (128 * (128 + 64), 768)
    with pytest.raises(SystemExit, match="--heads must be >= 1"):
        ck.make_config("v32", heads=0)
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


# --- per-run variant, engine extras, the variant verdicts, the lease plan, detached mode ----


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"variant": "nightly"}, "valid: stock, patched"),
        ({"variant": "patched", "dcp": 1, "engine_extra": {"bogus": 1}}, "valid: dcp_comm"),
        (
            {"variant": "patched", "tp": 2, "dcp": 2, "engine_extra": {"dcp_comm_backend": "x"}},
            "valid: ag_rs, a2a, b12x",
        ),
        ({"tp": 2, "dcp": 2, "engine_extra": {"dcp_comm_backend": "b12x"}}, "patched series"),
        ({"variant": "patched", "engine_extra": {"dcp_comm_backend": "b12x"}}, "dcp >= 2"),
        (
            {"variant": "patched", "tp": 2, "dcp": 2, "engine_extra": {"dcp_prefill_route": "x"}},
            "valid: query, packed_ckv, ckv, auto",
        ),
        ({"tp": 2, "dcp": 2, "engine_extra": {"dcp_wire_dtype": "fp8"}}, "patched series"),
        ({"variant": "patched", "engine_extra": {"dcp_comm_ledger_size": 8}}, "dcp >= 2"),
        (
            {
                "variant": "patched",
                "tp": 2,
                "dcp": 2,
                "engine_extra": {"kernel_config": {"sparse_indexer_dcp_merge_backend": "cuda"}},
            },
            "valid: auto, cutedsl, triton, torch",
        ),
        (
            {
                "engine_extra": {
                    "speculative_config": {"method": "eagle", "num_speculative_tokens": 1}
                }
            },
            "valid: mtp",
        ),
        (
            {
                "variant": "patched",
                "engine_extra": {
                    "speculative_config": {
                        "method": "mtp",
                        "num_speculative_tokens": 4,
                        "adaptive_speculative_tokens": "acceptance",
                        "adaptive_speculative_tokens_ladder": [2, 4, 5],
                    }
                },
            },
            "must equal 4",
        ),
        ({"backend": "TRITON_MLA_SPARSE_FP8_DS_MLA"}, "only in the patched"),
    ],
)
def test_engine_extra_and_variant_are_validated_strictly(kw, message):
    with pytest.raises(ValueError, match=message):
        plan.GateConfig(name="x", model="m", **kw)


def test_valid_extras_pass_and_round_trip():
    cfg = plan.GateConfig(
        name="x",
        model="m",
        tp=2,
        dcp=2,
        variant="patched",
        engine_extra={
            "dcp_prefill_route": "ckv",
            "dcp_comm_ledger_size": 16,
            "speculative_config": {"method": "mtp", "num_speculative_tokens": 2},
        },
    )
    assert cfg.speculative and plan.GateConfig.from_json(cfg.to_json()) == cfg
    # MTP with a fixed depth exists in stock 0.33 too
    plan.GateConfig(
        name="s",
        model="m",
        engine_extra={"speculative_config": {"method": "mtp", "num_speculative_tokens": 1}},
    )


def test_worker_merges_the_extras_into_the_engine_arguments():
    from gate import worker

    cfg = plan.GateConfig(
        name="x",
        model="m",
        tp=2,
        dcp=2,
        variant="patched",
        engine_extra={
            "dcp_wire_dtype": "fp8",
            "kernel_config": {"sparse_indexer_dcp_merge_backend": "torch"},
        },
    )
    kw = worker.engine_kwargs(cfg)
    assert kw["dcp_wire_dtype"] == "fp8" and kw["decode_context_parallel_size"] == 2
    assert kw["kernel_config"] == {"sparse_indexer_dcp_merge_backend": "torch"}
    assert kw["distributed_executor_backend"] == "external_launcher"


def test_max_num_seqs_reaches_the_engine_and_defaults_to_the_batch():
    from gate import worker

    assert worker.engine_kwargs(plan.GateConfig(name="d", model="m"))["max_num_seqs"] == 8
    cfg = plan.GateConfig(name="s", model="m", tp=2, dcp=2, max_num_seqs=256)
    assert worker.engine_kwargs(cfg)["max_num_seqs"] == 256
    assert plan.GateConfig.from_json(cfg.to_json()) == cfg


def test_each_variant_puts_its_own_tree_first_on_the_path():
    env = {"HOME": "/h", "PYTHONPATH": "/h/gpu-vllm:/h/gpu-deps/site:/x"}
    assert plan.variant_pythonpath("patched", env) == "/h/gpu-vllm-patched:/h/gpu-deps/site:/x"
    assert plan.variant_pythonpath("stock", env) == "/h/gpu-vllm:/h/gpu-deps/site:/x"
    env2 = {"GPU_ROOT": "/g", "PYTHONPATH": "/g/gpu-vllm-patched"}
    assert plan.variant_pythonpath("stock", env2) == "/g/gpu-vllm"
    with pytest.raises(ValueError, match="valid"):
        plan.vllm_tree("other", env)


def test_lighter_prompt_sets_get_the_same_prompts():
    full = plan.make_prompts(plan.GateConfig(name="a", model="m"))
    light = plan.make_prompts(plan.GateConfig(name="b", model="m", lens=(1024, 8192)))
    assert all(full[k] == v for k, v in light.items()) and "single/32000" not in light


def test_every_named_suite_is_valid_and_the_all_queue_runs_warmups_first():
    from gate import plans

    for name, suite in plans.SUITES.items():
        names = {r["name"] for r in suite["runs"]}
        for r in suite["runs"]:
            plan.GateConfig.from_json({**r, "model": "m"})
        for gate, spec in suite["gates"].items():
            import dcp_gate

            ref, cand, kind = dcp_gate.gate_spec(spec)
            assert kind in verdict.GATE_KINDS, gate
            everything = {r["name"] for s in plans.SUITES.values() for r in s["runs"]}
            assert {ref, cand} <= everything, (name, gate)
        assert names
    queue = plans.merge_suites([plans.SUITES[n] for n in plans.QUEUES["all"]])
    warm = [r.get("warmup", False) for r in queue["runs"]]
    assert warm[0] and warm == sorted(warm, reverse=True)  # every warm-up run first
    order = [r["name"] for r in queue["runs"]]
    # priority: stock needle rows, then the series' backend, before the graphs rows
    assert order.index("glmn-tp4-dcp2") < order.index("p-glmn-tp2-dcp2")
    assert order.index("p-glmn-tp2-dcp2") < order.index("glmn-tp4-dcp2-graphs")
    kinds = {dcp_gate.gate_spec(s)[2] for s in queue["gates"].values()}
    assert kinds == set(verdict.GATE_KINDS)
    every = {dcp_gate.gate_spec(g)[2] for s in plans.SUITES.values() for g in s["gates"].values()}
    assert every == set(verdict.GATE_KINDS)


def _runs(cfg_extra: dict | None = None, **passes: dict) -> dict:
    run = run_of(REF, **passes)
    run["config"] = {"lens": [8], "batch_lens": [], **(cfg_extra or {})}
    return run


def _gate(ref: dict, cand: dict, kind: str, floor: float = 0.001, move: float = 10.0) -> dict:
    tol = verdict.derive_tolerance({"n": floor})
    sens = {
        "sufficient": move >= verdict.SENSITIVITY_MARGIN * tol["atol_logprob"],
        "min_first_step_move_lower_bound": move,
        "min_first_step_max_abs_logprob_diff": move / 4,
    }
    res = verdict.gate_result("g", ref, cand, tol, {"max_abs_logprob_diff": floor}, sens, kind)
    assert verdict.validate(res) == []
    json.dumps(res, allow_nan=False)
    return res


def test_spec_gate_needs_every_token_exact():
    ref = _runs()
    good = _runs(fault={"single/8": shifted(REF, 0.5)})
    res = _gate(ref, good, "spec")
    assert res["equivalent"] and res["spec"]["tokens_exact"]["all_exact"]
    assert res["negative_control_detected"] and "draft" in res["negative_control"]["applies"]
    flipped = copy.deepcopy(REF)
    flipped["tokens"][-1] += 1  # one differing token at the last step: no near-tie excuse
    bad = _runs(fault={"single/8": shifted(REF, 0.5)})
    bad["passes"]["clean"]["single/8"] = flipped
    res = _gate(ref, bad, "spec")
    assert not res["equivalent"] and not res["spec"]["tokens_exact"]["all_exact"]


def test_route_pair_fails_past_the_tolerance():
    ref = _runs()
    res = _gate(ref, _runs(clean={"single/8": shifted(REF, 0.0005)}), "dcp_pair")
    assert res["equivalent"] and res["gate_kind"] == "dcp_pair"
    res = _gate(ref, _runs(clean={"single/8": shifted(REF, 0.05)}), "dcp_pair")
    assert not res["equivalent"]


def test_wire_gate_reports_its_own_tolerance_and_never_borrows_the_bf16_one():
    ref = _runs()
    lossy = _runs(clean={"single/8": shifted(REF, 0.01)}, fault={"single/8": shifted(REF, 0.5)})
    res = _gate(ref, lossy, "wire", floor=0.001)
    wire = res["wire"]
    assert not res["equivalent"] and not wire["within_bf16_tolerance"]
    assert wire["equivalent_under_wire_tolerance"]  # 0.01 <= 16 x 0.001
    assert wire["ratio_to_noise_floor"] == pytest.approx(10.0)
    assert res["negative_control_detected"]
    far = _runs(clean={"single/8": shifted(REF, 0.05)})
    assert not _gate(ref, far, "wire")["wire"]["equivalent_under_wire_tolerance"]


def test_a_wire_within_the_bf16_tolerance_is_judged_there():
    """A wire that stayed within the bf16 tolerance is judged at it: sensitivity and negative
    control at the bf16 tolerance (meaningful although the sensitivity is below 5x the wider
    wire tolerance); one outside it is judged at the wire tolerance, by the same sensitivity
    figure the bf16 verdict uses (the move lower bound)."""
    ref = _runs()
    fault = {"single/8": shifted(REF, 0.01)}  # 2.5x the bf16 tolerance, within 16 x floor
    close = _runs(clean={"single/8": shifted(REF, 0.0005)}, fault=fault)
    res = _gate(ref, close, "wire", move=0.03)  # 7.5x the bf16 tolerance, 1.9x the wire one
    assert res["equivalent"] and res["wire"]["judged_at"] == "bf16 tolerance"
    assert res["negative_control"]["atol_logprob"] == pytest.approx(0.004)
    assert res["negative_control_detected"] and res["meaningful"]
    assert res["wire"]["sensitivity_over_wire_tolerance"] == pytest.approx(0.03 / 0.016)
    lossy = _runs(clean={"single/8": shifted(REF, 0.01)}, fault={"single/8": shifted(REF, 0.5)})
    res = _gate(ref, lossy, "wire", move=0.03)
    assert not res["equivalent"] and res["wire"]["judged_at"] == "wire tolerance"
    assert res["negative_control_detected"] and not res["meaningful"]
    assert _gate(ref, lossy, "wire", move=0.1)["meaningful"]  # 6.25x the wire tolerance


def _spec(run: dict, **passes: tuple[int, int]) -> dict:
    """The run with spec-decode counters (draft tokens, accepted tokens) per pass."""
    run["spec"] = {
        name: {
            "metrics": {
                "vllm:spec_decode_num_draft_tokens": drafted,
                "vllm:spec_decode_num_accepted_tokens": accepted,
            }
        }
        for name, (drafted, accepted) in passes.items()
    }
    return run


def test_acceptance_gate_needs_the_same_acceptance_and_a_draft_that_is_accepted():
    """An acceptance gate (DCP > 1 against DCP = 1, the same speculative configuration) is
    equivalent only with every token exact and exactly the reference's accepted drafts, and
    meaningful only where the reference accepts drafts and the fault pass loses at least half
    of that acceptance."""
    fault = {"single/8": shifted(REF, 0.5)}
    ref = _spec(_runs(), clean=(64, 60))
    res = _gate(ref, _spec(_runs(fault=fault), clean=(64, 60), fault=(64, 3)), "accept")
    assert res["equivalent"] and res["meaningful"] and res["accept"]["acceptance_equal"]
    assert res["accept"]["reference"]["rate"] == pytest.approx(60 / 64)
    assert res["accept"]["candidate_fault"]["accepted_tokens"] == 3
    lost = _gate(ref, _spec(_runs(fault=fault), clean=(64, 41)), "accept")
    assert not lost["equivalent"] and not lost["accept"]["acceptance_equal"]
    unrecorded = _gate(ref, _runs(fault=fault), "accept")
    assert not unrecorded["equivalent"] and unrecorded["accept"]["candidate"] is None
    never = _spec(_runs(), clean=(64, 0))
    res = _gate(never, _spec(_runs(fault=fault), clean=(64, 0), fault=(64, 0)), "accept")
    assert res["equivalent"] and res["negative_control_detected"] and not res["meaningful"]


def test_acceptance_gate_is_meaningful_when_the_fault_takes_the_acceptance_away():
    """The 2026-12-02 glmnm shape: 66 of 252 draft tokens accepted at DCP = 1 and DCP = 2, none
    under the fault: meaningful (a low rate that the fault removes shows the draft's DCP
    attention). The same rate kept under the fault, or no fault pass, is not."""
    fault = {"single/8": shifted(REF, 0.5)}
    ref = _spec(_runs(), clean=(252, 66))
    res = _gate(ref, _spec(_runs(fault=fault), clean=(252, 66), fault=(372, 0)), "accept")
    assert res["equivalent"] and res["meaningful"]
    kept = _gate(ref, _spec(_runs(fault=fault), clean=(252, 66), fault=(252, 60)), "accept")
    assert kept["equivalent"] and not kept["meaningful"]
    unfaulted = _gate(ref, _spec(_runs(fault=fault), clean=(252, 66)), "accept")
    assert not unfaulted["meaningful"]
    few = _spec(_runs(), clean=(252, 8))
    res = _gate(few, _spec(_runs(fault=fault), clean=(252, 8), fault=(252, 0)), "accept")
    assert res["equivalent"] and not res["meaningful"]


def test_a_light_candidate_is_compared_on_what_it_served_and_must_serve_it_all():
    ref = _runs({"lens": [8, 16]})
    ref["passes"]["clean"]["single/16"] = copy.deepcopy(REF) | {"prompt_sha256": "x"}
    cand = _runs({"lens": [8]})
    assert _gate(ref, cand, "dcp")["equivalent"]
    hollow = _runs({"lens": [8]})
    hollow["passes"]["clean"] = {}
    assert not _gate(ref, hollow, "dcp")["equivalent"]
    with pytest.raises(ValueError, match="valid"):
        _gate(ref, cand, "nonsense")


def test_ledger_totals_per_rank_and_whether_the_ranks_agree():
    def ledger(rank, nbytes):
        return {
            "rank": rank,
            "passes": {
                "clean": {"armed": True, "layers": {"l0": {"q_gather": {"wire_bytes": nbytes}}}}
            },
        }

    run = {"ledger": [ledger(0, 100), ledger(1, 100)]}
    got = verdict.ledger_totals(run)["clean"]
    assert got["ranks_agree"] and got["ranks"]["1"]["wire_bytes_by_phase"] == {"q_gather": 100}
    assert "emulation" in got["time_label"]
    assert not verdict.ledger_totals({"ledger": [ledger(0, 100), ledger(1, 99)]})["clean"][
        "ranks_agree"
    ]


def _variant_suite() -> dict:
    light = {"lens": [64], "batch_lens": [16, 32], "model": "M/f"}
    runs = [
        dict(SUITE["runs"][0], variant="patched"),
        dict(SUITE["runs"][1], variant="patched", passes=["clean", "repeat"]),
        dict(
            SUITE["runs"][2],
            variant="patched",
            engine_extra={"dcp_comm_ledger_size": 4},
            passes=["clean", "repeat", "fault"],
        ),
    ]
    for name, extra in (
        ("f-ckv", {"dcp_prefill_route": "ckv", "dcp_comm_ledger_size": 4}),
        ("f-fp8", {"dcp_wire_dtype": "fp8", "dcp_comm_ledger_size": 4}),
        ("f-mtp2", {"speculative_config": {"method": "mtp", "num_speculative_tokens": 2}}),
    ):
        runs.append(
            {
                "name": name,
                "tp": 2,
                "dcp": 2,
                "variant": "patched",
                "passes": ["clean", "fault"],
                "engine_extra": extra,
                **light,
            }
        )
    runs.append({"name": "f-stock-dcp2", "tp": 2, "dcp": 2, "passes": ["clean", "fault"], **light})
    return {
        "checkpoints": {},
        "runs": runs,
        "noise": {k: ["f/patched", *v[1:]] for k, v in SUITE["noise"].items()},
        "gates": {
            "f-dcp2": {"ref": "f-tp2", "cand": "f-tp2-dcp2", "noise": "f/patched"},
            "f-ckv-vs-query": {
                "ref": "f-tp2-dcp2",
                "cand": "f-ckv",
                "kind": "dcp_pair",
                "noise": "f/patched",
            },
            "f-fp8-vs-auto": {
                "ref": "f-tp2-dcp2",
                "cand": "f-fp8",
                "kind": "wire",
                "noise": "f/patched",
            },
            "f-mtp2-vs-nospec": {
                "ref": "f-tp2-dcp2",
                "cand": "f-mtp2",
                "kind": "spec",
                "noise": "f/patched",
            },
            "f-stock-vs-patched": {
                "ref": "f-tp2-dcp2",
                "cand": "f-stock-dcp2",
                "kind": "dcp_pair",
                "noise": "f/patched",
            },
        },
    }


def _gate_file(tmp_path: Path, name: str) -> dict:
    return json.loads((tmp_path / "out" / f"dcp-gate-{name}.json").read_text())


def test_stock_and_patched_runs_share_one_wave_each_from_its_own_tree(tmp_path: Path):
    proc = run_suite(tmp_path, _variant_suite(), GATE_FAKE_WIRE_NOISE="0.01")
    assert proc.returncode == 0, proc.stderr[-2000:]
    runs = tmp_path / "work" / "runs"
    patched = json.loads((runs / "f-ckv.json").read_text())
    stock = json.loads((runs / "f-stock-dcp2.json").read_text())
    assert patched["ok"] and stock["ok"]
    assert patched["base"]["variant"] == "patched" and patched["base"]["vllm"] == "fake-patched"
    assert stock["base"]["vllm"] == "fake-stock" and "tree-stock" in stock["base"]["vllm_path"]
    assert patched["rank_env"][0]["PYTHONPATH"].split(":")[0].endswith("tree-patched")
    assert "overlay_manifest_sha256" in patched["base"]  # None here: no overlay carried
    for name in ("f-dcp2", "f-ckv-vs-query", "f-fp8-vs-auto", "f-mtp2-vs-nospec"):
        g = _gate_file(tmp_path, name)
        assert verdict.validate(g) == [] and g["negative_control_detected"], name
    assert _gate_file(tmp_path, "f-ckv-vs-query")["equivalent"]
    assert _gate_file(tmp_path, "f-ckv-vs-query")["ledger"]["candidate"]["clean"]["ranks_agree"]
    wire = _gate_file(tmp_path, "f-fp8-vs-auto")
    assert wire["wire"]["ratio_to_noise_floor"] > 1 and not wire["wire"]["within_bf16_tolerance"]
    spec = _gate_file(tmp_path, "f-mtp2-vs-nospec")
    assert spec["equivalent"] and spec["spec"]["acceptance"]["clean"]["depths"] == [2, 2]
    assert spec["spec"]["reference_repeat_tokens_exact"] is True


def test_one_flipped_speculative_token_fails_the_spec_gate(tmp_path: Path):
    proc = run_suite(tmp_path, _variant_suite(), GATE_FAKE_FLIP="f-mtp2")
    assert proc.returncode == 0, proc.stderr[-2000:]
    spec = _gate_file(tmp_path, "f-mtp2-vs-nospec")
    assert not spec["equivalent"] and not spec["spec"]["tokens_exact"]["all_exact"]


def test_a_route_shifted_past_the_tolerance_fails(tmp_path: Path):
    proc = run_suite(tmp_path, _variant_suite(), GATE_FAKE_SHIFT="f-ckv:0.5")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert not _gate_file(tmp_path, "f-ckv-vs-query")["equivalent"]


def test_a_missing_variant_tree_is_a_failed_run_never_the_other_tree(tmp_path: Path):
    env = {"GATE_VLLM_PATCHED": str(tmp_path / "nowhere")}
    proc = run_suite(tmp_path, _variant_suite(), **env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rec = json.loads((tmp_path / "work" / "runs" / "f-ckv.json").read_text())
    assert not rec["ok"] and "does not exist" in rec["error"]
    assert json.loads((tmp_path / "work" / "runs" / "f-stock-dcp2.json").read_text())["ok"]


def test_detached_start_wait_collect(tmp_path: Path):
    suite = tmp_path / "suite.json"
    suite.write_text(json.dumps(SUITE))
    env = gate_env(tmp_path, GATE_FAKE_SLEEP="2")
    work = tmp_path / "work"
    start = gate_cmd("start", "--suite", str(suite), "--work", str(work), "--deadline-s", "60")
    first = subprocess.run(start, env=env, capture_output=True, text=True, timeout=60)
    assert first.returncode == 0, first.stderr
    again = subprocess.run(start, env=env, capture_output=True, text=True, timeout=60)
    assert again.returncode == 2 and "already runs" in again.stdout
    dest = tmp_path / "dest"
    wait = run_gate(
        "wait", "--work", str(work), "--seconds", "90", "--dest", str(dest), env=env, timeout=120
    )
    assert wait.returncode == 0, wait.stdout + wait.stderr
    assert "GATE f-dcp2" in wait.stdout and "f-tp2-dcp2: ok=True" in wait.stdout
    assert (dest / "results" / "dcp-gate-f-dcp2.json").is_file()
    assert (dest / "runs" / "f-tp1.json").is_file() and (dest / "rank-logs.tgz").is_file()
    # a second start resumes: every run is reused, nothing reruns
    subprocess.run(start, env=env, capture_output=True, text=True, timeout=60, check=True)
    run_gate("wait", "--work", str(work), "--seconds", "60", env=env, timeout=90, check=True)
    assert (work / "daemon.log").read_text().count("reusing") == 3
    # the lease's end never moves later when the suite is started again
    end = float((work / "deadline_epoch").read_text())
    later = [*start[:-1], "9999"]
    subprocess.run(later, env=env, capture_output=True, text=True, timeout=60, check=True)
    assert float((work / "deadline_epoch").read_text()) == end


def test_wait_times_out_and_reports_a_killed_suite(tmp_path: Path):
    suite = tmp_path / "suite.json"
    suite.write_text(json.dumps(SUITE))
    env = gate_env(tmp_path, GATE_FAKE_SLEEP="30")
    work = tmp_path / "work"
    run_gate("start", "--suite", str(suite), "--work", str(work), env=env, check=True)
    short = run_gate("wait", "--work", str(work), "--seconds", "8", env=env)
    assert short.returncode == 3, short.stdout
    pid = json.loads((work / "daemon.pid").read_text())["pid"]
    os.killpg(pid, 9)
    gone = run_gate("wait", "--work", str(work), "--seconds", "20", env=env)
    assert gone.returncode == 4, gone.stdout
    # started again: the orphaned ranks of the killed suite are ended, the suite resumes
    fast = gate_env(tmp_path, GATE_FAKE_SLEEP="0")
    run_gate("start", "--suite", str(suite), "--work", str(work), env=fast, check=True)
    done = run_gate("wait", "--work", str(work), "--seconds", "60", env=fast, timeout=90)
    assert done.returncode == 0, done.stdout
    log = (work / "daemon.log").read_text()
    assert "ended rank processes a killed suite left" in log
    killed = [json.loads(x) for x in (work / "killed.jsonl").read_text().splitlines()]
    assert {k["name"] for k in killed} <= {r["name"] for r in SUITE["runs"]} and killed
    assert not list((work / "ranks").glob("*.pgids"))


def test_the_deadline_kills_and_records_timed_out_and_unstarted_runs(tmp_path: Path):
    path = tmp_path / "suite.json"
    path.write_text(json.dumps(SUITE))
    proc = run_gate(
        "suite",
        "--suite",
        str(path),
        "--work",
        str(tmp_path / "work"),
        "--out",
        str(tmp_path / "out"),
        "--deadline-s",
        "4",
        "--max-ranks",
        "1",
        env=gate_env(tmp_path, GATE_FAKE_SLEEP="30"),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    runs = tmp_path / "work" / "runs"
    killed = json.loads((runs / "f-tp1.json").read_text())
    assert not killed["ok"] and killed["timed_out"] and "timed out" in killed["error"]
    unstarted = json.loads((runs / "f-tp2-dcp2.json").read_text())
    assert not unstarted["ok"] and unstarted["not_started"]
    assert not (tmp_path / "out" / "dcp-gate-f-dcp2.json").exists()  # no tolerance: no verdict


def test_warmup_runs_start_first_and_the_rest_wait_for_their_engines(tmp_path: Path):
    suite = copy.deepcopy(SUITE)
    suite["runs"][0]["warmup"] = True  # f-tp1
    proc = run_suite(tmp_path, suite, GATE_FAKE_SLEEP="2", GATE_FAKE_PASS_SLEEP="2")
    assert proc.returncode == 0, proc.stderr[-2000:]
    runs = {p.stem: json.loads(p.read_text()) for p in (tmp_path / "work" / "runs").glob("*")}
    warm = runs["f-tp1"]["started_at"]
    later = [runs[n]["started_at"] for n in ("f-tp2", "f-tp2-dcp2")]
    # started once the warm-up engine was up (~2 s), before the warm-up run ended (~4 s)
    assert all(warm + 1.5 <= t < warm + runs["f-tp1"]["wall_s"] for t in later), (warm, later)


# --- partial runs: a rank records every finished pass; a killed run keeps them -------------
def _suite_until(tmp_path: Path, suite: dict, deadline_s: str, **env: str) -> Path:
    """Run ``suite`` through the launcher with a deadline; the work folder."""
    path = tmp_path / "suite.json"
    path.write_text(json.dumps(suite))
    work = tmp_path / "work"
    proc = run_gate(
        "suite",
        "--suite",
        str(path),
        "--work",
        str(work),
        "--out",
        str(tmp_path / "out"),
        "--deadline-s",
        deadline_s,
        env=gate_env(tmp_path, **env),
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return work


def _keys(cfg: dict, pass_name: str) -> set[str]:
    c = plan.GateConfig.from_json({**cfg, "model": "M/f"})
    return {k for keys in plan.pass_groups(c, pass_name) for k in keys}


def test_a_run_killed_mid_pass_keeps_its_finished_passes_and_its_gate_is_computed(
    tmp_path: Path,
):
    # f-tp2-dcp2 hangs in its fault pass after one of three groups; f-tp1 in sensitivity
    hang = "f-tp2-dcp2:fault:1,f-tp1:sensitivity:1"
    work = _suite_until(tmp_path, SUITE, "8", GATE_FAKE_HANG=hang)
    run = json.loads((work / "runs" / "f-tp2-dcp2.json").read_text())
    assert not run["ok"] and not run["complete"] and run["timed_out"]
    assert run["passes_complete"] == ["clean"] and set(run["passes"]) == {"clean"}
    assert run["rank_passes_complete"] == [["clean"], ["clean"]]
    assert "incomplete after passes ['clean']" in run["error"]
    assert set(run["passes"]["clean"]) == _keys(SUITE["runs"][2], "clean")
    # the interrupted pass is absent from the rank record itself, not half there
    rank0 = json.loads((work / "ranks" / "f-tp2-dcp2.rank0.json").read_text())
    assert rank0["complete"] is False and "fault" not in rank0["passes"]
    assert not list((work / "ranks").glob("*.tmp"))
    tp1 = json.loads((work / "runs" / "f-tp1.json").read_text())
    assert tp1["passes_complete"] == ["clean", "repeat"] and "sensitivity" not in tp1["passes"]
    noise = json.loads((tmp_path / "out" / "dcp-gate-noise-f.json").read_text())
    assert noise["noise_pairs"]["f: repeat"]["incomplete_runs"] == ["f-tp1"]
    assert noise["noise_pairs"]["f: repeat"]["max_abs_logprob_diff"] == 0.0
    assert noise["sensitivity"] == {}  # its pass was cut off: not measured from half of it
    gate = _gate_file(tmp_path, "f-dcp2")
    assert verdict.validate(gate) == []
    assert gate["equivalent"] and gate["incomplete_runs"] == ["f-tp2-dcp2"]
    ref = json.loads((work / "runs" / "f-tp2.json").read_text())
    assert gate["prompts_compared"] == sorted(ref["passes"]["clean"])
    assert gate["negative_control"]["ran"] is False and not gate["meaningful"]
    assert gate["dcp"]["candidate"]["passes_complete"] == ["clean"]


def test_a_candidate_killed_after_its_fault_pass_still_gates_meaningfully(tmp_path: Path):
    suite = copy.deepcopy(SUITE)
    for r in suite["runs"]:
        r["variant"] = "patched"  # the ledger is the series' (patched tree only)
    suite["runs"][2]["passes"] = ["clean", "fault", "repeat"]
    suite["runs"][2]["engine_extra"] = {"dcp_comm_ledger_size": 4}
    work = _suite_until(tmp_path, suite, "8", GATE_FAKE_HANG="f-tp2-dcp2:repeat:0")
    run = json.loads((work / "runs" / "f-tp2-dcp2.json").read_text())
    assert not run["ok"] and run["passes_complete"] == ["clean", "fault"]
    # every rank's ledger of the finished passes comes from its partial record
    assert [sorted(e["passes"]) for e in run["ledger"]] == [["clean", "fault"]] * 2
    gate = _gate_file(tmp_path, "f-dcp2")
    assert gate["incomplete_runs"] == ["f-tp2-dcp2"] and gate["equivalent"]
    assert gate["negative_control_detected"] and gate["meaningful"]
    assert gate["negative_control"]["prompts"] == sorted(_keys(suite["runs"][2], "fault"))


def test_a_rank_that_raises_mid_pass_keeps_the_passes_before_it(tmp_path: Path):
    work = _suite_until(tmp_path, SUITE, "60", GATE_FAKE_CRASH="f-tp2-dcp2:fault:2")
    run = json.loads((work / "runs" / "f-tp2-dcp2.json").read_text())
    assert not run["ok"] and not run["timed_out"] and run["exit_codes"] == [1, 1]
    assert "fake crash in fault group 2" in run["error"]
    assert run["passes_complete"] == ["clean"] and "fault" not in run["passes"]
    gate = _gate_file(tmp_path, "f-dcp2")
    assert gate["equivalent"] and gate["incomplete_runs"] == ["f-tp2-dcp2"]
    assert not gate["negative_control_detected"] and not gate["meaningful"]


def test_a_gate_against_a_run_without_the_clean_pass_has_no_verdict_of_equivalence():
    cand = run_of(REF, ok=False) | {"passes_complete": [], "error": "killed"}
    got = verdict.compare_passes(run_of(REF), cand, 1.0)
    assert not got["equivalent"] and "without a finished 'clean' pass: killed" in got["problems"][0]
    half = run_of(REF, ok=False, fault={"single/8": REF}) | {"passes_complete": ["fault"]}
    assert verdict.finished_passes(half) == {"fault": {"single/8": REF}}
    assert verdict.negative_control(run_of(REF), half, 0.01)["incomplete_runs"] == ["candidate"]
    assert not verdict.compare_passes(run_of(REF), half, 1.0)["equivalent"]


def test_records_written_before_partial_records_still_report(tmp_path: Path):
    proc = run_suite(tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    before = _gate_file(tmp_path, "f-dcp2")
    runs = tmp_path / "work" / "runs"
    for p in runs.glob("*.json"):  # the old lease's records: no complete / passes_complete
        d = json.loads(p.read_text())
        for key in ("complete", "passes_complete", "rank_passes_complete"):
            d.pop(key)
        p.write_text(json.dumps(d))
    out = tmp_path / "old"
    rep = run_gate(
        "report",
        "--suite",
        str(tmp_path / "suite.json"),
        "--work",
        str(tmp_path / "work"),
        "--out",
        str(out),
        env=gate_env(tmp_path),
    )
    assert rep.returncode == 0, rep.stderr[-2000:]
    after = json.loads((out / "dcp-gate-f-dcp2.json").read_text())
    for key in ("equivalent", "meaningful", "negative_control_detected", "max_abs_logprob_diff"):
        assert after[key] == before[key], key
    assert (
        after["incomplete_runs"] == [] and after["prompts_compared"] == before["prompts_compared"]
    )
    # an old timed-out record (ok false, no passes) gives no verdict over it
    d = json.loads((runs / "f-tp2-dcp2.json").read_text())
    d.update(ok=False, passes={}, error="rank 0: no record (exit code -9, timed out)")
    (runs / "f-tp2-dcp2.json").write_text(json.dumps(d))
    run_gate(
        "report",
        "--suite",
        str(tmp_path / "suite.json"),
        "--work",
        str(tmp_path / "work"),
        "--out",
        str(out),
        env=gate_env(tmp_path),
        check=True,
    )
    gate = json.loads((out / "dcp-gate-f-dcp2.json").read_text())
    assert not gate["equivalent"] and "no record" in gate["problems"][0]


class _FakeOut:
    def __init__(self, ids: list[int]) -> None:
        lp = type("LP", (), {})
        tokens = [ids[-1] % 97 + i for i in range(3)]
        logprobs = []
        for t in tokens:
            one = lp()
            one.logprob = -0.5
            logprobs.append({t: one})
        self.outputs = [type("C", (), {"token_ids": tokens, "logprobs": logprobs})()]
        self.metrics = None


class _FakeLLM:
    """generate() answers until call number ``fail_at``, which raises."""

    def __init__(self, fail_at: int) -> None:
        self.calls, self.fail_at = 0, fail_at

    def generate(self, prompts: list[dict], params, use_tqdm: bool = False) -> list:
        self.calls += 1
        if self.calls == self.fail_at:
            raise RuntimeError("engine died")
        return [_FakeOut(p["prompt_token_ids"]) for p in prompts]


def test_the_worker_records_a_pass_only_when_all_its_generate_calls_returned(
    tmp_path: Path, monkeypatch
):
    import types

    from gate import worker

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(SamplingParams=dict))
    cfg = plan.GateConfig.from_json({**SUITE["runs"][0], "model": "M/f"})  # clean,repeat,sens
    n_clean = len(plan.pass_groups(cfg, "clean"))
    rec = worker.RankRecord(tmp_path, cfg.name, 0)
    extras: dict = {}

    def done(passes, fault):
        rec.pass_done(passes, extras, fault, keep_tokens=True)

    llm = _FakeLLM(fail_at=n_clean + 2)  # the second generate() of the repeat pass
    with pytest.raises(RuntimeError, match="engine died"):
        worker.run_passes(llm, cfg, lambda msg: None, extras, on_pass=done)
    got = json.loads((tmp_path / f"{cfg.name}.rank0.json").read_text())
    assert got["complete"] is False and got["passes_complete"] == ["clean"]
    assert set(got["passes"]) == {"clean"} and set(got["passes"]["clean"]) == _keys(
        SUITE["runs"][0], "clean"
    )
    rec.fail("RuntimeError: engine died", "tb")
    got = json.loads((tmp_path / f"{cfg.name}.rank0.json").read_text())
    assert (
        got["ok"] is False and got["passes_complete"] == ["clean"] and "engine died" in got["error"]
    )
    rec2 = worker.RankRecord(tmp_path, "all", 0)
    worker.run_passes(
        _FakeLLM(fail_at=0),
        cfg,
        lambda msg: None,
        {},
        on_pass=lambda p, f: rec2.pass_done(p, {}, f, keep_tokens=True),
    )
    rec2.finish()
    got = json.loads((tmp_path / "all.rank0.json").read_text())
    assert got["ok"] and got["complete"] and got["passes_complete"] == list(cfg.passes)


_STANDIN_VLLM = """
import os, time
__version__ = "standin"
SamplingParams = dict


class _LP:
    logprob = -0.5


class _C:
    def __init__(self, ids):
        self.token_ids = [ids[-1] % 97 + i for i in range(3)]
        self.logprobs = [{t: _LP()} for t in self.token_ids]


class _Out:
    def __init__(self, ids):
        self.outputs = [_C(ids)]
        self.metrics = None


class LLM:
    calls = 0

    def __init__(self, **kw):
        pass

    def apply_model(self, fn):
        return [[]]

    def generate(self, prompts, params, use_tqdm=False):
        LLM.calls += 1
        if LLM.calls == int(os.environ["STANDIN_STOP_AT"]):
            if os.environ.get("STANDIN_RAISE"):
                raise RuntimeError("engine died")
            time.sleep(600)
        return [_Out(p["prompt_token_ids"]) for p in prompts]
"""
_STANDIN_TORCH = """
__version__ = "standin"
class version:
    cuda = None
class cuda:
    @staticmethod
    def device_count():
        return 0

    @staticmethod
    def is_available():
        return False
"""


@pytest.mark.parametrize("how", ["killed", "raises"])
def test_the_real_worker_leaves_the_passes_it_finished(tmp_path: Path, how: str):
    """gate.worker.main, started as Launch starts it, with stand-in vllm and torch modules:
    generate() hangs (then SIGKILL, as the deadline does) or raises in the second call of the
    repeat pass."""
    import signal
    import time

    for name, text in (("vllm", _STANDIN_VLLM), ("torch", _STANDIN_TORCH)):
        (tmp_path / "mods" / name).mkdir(parents=True)
        (tmp_path / "mods" / name / "__init__.py").write_text(text)
    cfg = {**SUITE["runs"][0], "model": "M/f"}  # clean, repeat, sensitivity
    (tmp_path / "cfg.json").write_text(json.dumps(cfg))
    stop_at = len(plan.pass_groups(plan.GateConfig.from_json(cfg), "clean")) + 2
    env = dict(os.environ, PYTHONPATH=str(tmp_path / "mods"), RANK="0")
    env.pop("GATE_WORKER_MODULE", None)  # the real gate.worker
    env["STANDIN_STOP_AT"] = str(stop_at)
    if how == "raises":
        env["STANDIN_RAISE"] = "1"
    proc = subprocess.Popen(
        gate_cmd("_rank", str(tmp_path / "cfg.json"), str(tmp_path)),  # as Launch starts it
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    path = tmp_path / f"{cfg['name']}.rank0.json"
    if how == "killed":
        t0 = time.time()
        while time.time() - t0 < 30:
            if path.is_file() and json.loads(path.read_text())["passes_complete"] == ["clean"]:
                break
            time.sleep(0.1)
        time.sleep(0.5)  # inside the hanging generate() of the repeat pass
        proc.send_signal(signal.SIGKILL)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == (-9 if how == "killed" else 1), out
    got = json.loads(path.read_text())
    assert got["complete"] is False and got["ok"] is False and got["passes_complete"] == ["clean"]
    assert set(got["passes"]) == {"clean"} and set(got["passes"]["clean"]) == _keys(cfg, "clean")
    assert got["machine"]["vllm"] == "standin"
    if how == "raises":
        assert "engine died" in got["error"]


def test_decode_rates_report_each_runs_rates_and_how_crowded_the_gpu_was() -> None:
    """decode_rates lists every run with recorded rates (clean pass), the median over its
    single requests, and the ranks of all runs alive while it ran; a run without rates or
    without a start time is left out."""
    from gate import verdict

    def run(name, tp, start, wall, rates):
        clean = {k: {"timing": {"decode_tok_per_s": v}} for k, v in rates.items()}
        return {
            "name": name,
            "config": {"tp": tp, "dcp": 2, "backend": "B"},
            "started_at": start,
            "wall_s": wall,
            "passes": {"clean": clean},
        }

    runs = {
        "a": run("a", 2, 0.0, 10.0, {"single/1024": 3.0, "single/8192": 5.0, "batch/0/7": 1.0}),
        "b": run("b", 4, 5.0, 10.0, {"single/1024": 2.0}),
        "c": run("c", 1, 100.0, 1.0, {}),
        "d": {"name": "d", "config": {"tp": 1}, "passes": {"clean": {}}},
    }
    doc = verdict.decode_rates(runs)
    assert "one-GPU emulation" in doc["label"]
    rows = {r["run"]: r for r in doc["rows"]}
    assert set(rows) == {"a", "b"}
    assert rows["a"]["single_request_median"] == 4.0
    assert rows["a"]["decode_tok_per_s"]["batch/0/7"] == 1.0
    # a: 2 ranks alone for 5 s, then 6 with b; b: 6 ranks, then 4 alone
    assert rows["a"]["ranks_alive_max"] == 6 and rows["b"]["ranks_alive_max"] == 6
    assert 2 < rows["a"]["ranks_alive_mean"] < 6 and 4 < rows["b"]["ranks_alive_mean"] < 6
