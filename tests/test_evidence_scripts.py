# SPDX-License-Identifier: Apache-2.0
"""The judgements the MTP evidence scripts write into results/: equal or not, baseline
accepted or refused, depth climbed or not. They run on the GPU machine, so they are checked
here, without vLLM or torch."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))

import gpu_mtp_adaptive  # noqa: E402
import gpu_mtp_exactness  # noqa: E402
import results_tables  # noqa: E402
from mtp_gpu_common import DEFAULT_SCHEDULE, mode_key, mtp_spec  # noqa: E402


def run(tokens: list[list[int]], logprobs: list[list[dict[str, float]]]) -> dict:
    return {"tokens": tokens, "logprobs": logprobs}


BASE = run([[5, 6, 7]], [[{"5": 0.0, "9": -3.0}, {"6": 0.0, "1": -2.0}, {"7": 0.0, "2": -4.0}]])


def test_compare_identical_runs_are_ok():
    verdict = gpu_mtp_exactness.compare(BASE, json.loads(json.dumps(BASE)), topk=2, tol=0.05)
    assert verdict == {
        "tokens_equal": True,
        "first_mismatch": None,
        "topk_ids_equal": True,
        "max_logprob_abs_diff": 0.0,
        "ok": True,
    }


def test_compare_reports_the_first_token_mismatch():
    other = run([[5, 8, 7]], BASE["logprobs"])
    verdict = gpu_mtp_exactness.compare(BASE, other, topk=2, tol=0.05)
    assert not verdict["ok"] and verdict["first_mismatch"] == [0, 1]


def test_compare_fails_on_logprob_drift_and_on_other_topk_ids():
    drift = json.loads(json.dumps(BASE))
    drift["logprobs"][0][2]["2"] = -3.9
    verdict = gpu_mtp_exactness.compare(BASE, drift, topk=2, tol=0.05)
    assert verdict["tokens_equal"] and not verdict["ok"]
    assert verdict["max_logprob_abs_diff"] == pytest.approx(0.1)
    swapped = json.loads(json.dumps(BASE))
    swapped["logprobs"][0][0] = {"5": 0.0, "4": -3.0}
    verdict = gpu_mtp_exactness.compare(BASE, swapped, topk=2, tol=0.05)
    assert not verdict["topk_ids_equal"] and not verdict["ok"]


PAYLOAD = {
    "prompt_lens": [64, 1500],
    "max_tokens": 32,
    "weights": "/tmp/ckpt/agree",
    "arch": "glm_moe_dsa",
    "dcp": 1,
    "tp": 1,
}


def write(tmp_path: Path, **changes) -> Path:
    earlier = dict(PAYLOAD, runs={"no_spec": BASE}) | changes
    path = tmp_path / "baseline.json"
    path.write_text(json.dumps(earlier))
    return path


def test_baseline_of_the_same_prompts_is_used(tmp_path: Path):
    assert gpu_mtp_exactness.load_baseline(write(tmp_path), PAYLOAD) == BASE


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"prompt_lens": [64]}, "prompt_lens"),
        ({"weights": "dummy"}, "weights"),
        ({"runs": {"no_spec": {"error": "boom"}}}, "no successful no_spec"),
        ({"runs": {}}, "no successful no_spec"),
    ],
)
def test_baseline_of_other_runs_is_refused(tmp_path: Path, changes, message):
    with pytest.raises(SystemExit, match=message):
        gpu_mtp_exactness.load_baseline(write(tmp_path, **changes), PAYLOAD)


def test_mtp_spec():
    assert mtp_spec(0) is None and mtp_spec("0") is None
    assert mtp_spec(4) == {"method": "mtp", "num_speculative_tokens": 4}
    adaptive = mtp_spec("adaptive", windows=[4, 2, 2])
    # vLLM 0.33 patch 0012: a Literal switch, not a bool
    assert adaptive["adaptive_speculative_tokens"] == "acceptance"
    assert adaptive["adaptive_speculative_tokens_ladder"] == [2, 4, 5]
    assert adaptive["adaptive_speculative_tokens_window"] == [4, 2, 2]
    assert "adaptive_speculative_tokens_window" not in mtp_spec("adaptive")
    schedule = mtp_spec("schedule")
    assert schedule["num_speculative_tokens_per_batch_size"] == DEFAULT_SCHEDULE
    assert schedule["num_speculative_tokens"] == 5
    assert mtp_spec("schedule", schedule=[[1, 4, 3]])["num_speculative_tokens"] == 3
    assert [mode_key(m) for m in ("0", "2", "schedule", "adaptive")] == [
        "no_spec",
        "k2",
        "schedule",
        "adaptive",
    ]


def test_negative_control_is_caught_and_all_ok_needs_it():
    control = gpu_mtp_exactness.negative_control(BASE, topk=2, tol=0.05)
    assert control["caught"] and control["verdict"]["first_mismatch"] == [0, 0]
    ok_run = {"vs_no_spec": {"ok": True}}
    assert gpu_mtp_exactness.all_ok(
        {"runs": {"no_spec": BASE, "k2": ok_run}, "negative_control": control}
    )
    assert not gpu_mtp_exactness.all_ok(
        {"runs": {"no_spec": BASE, "k2": ok_run}, "negative_control": {"caught": False}}
    )
    assert not gpu_mtp_exactness.all_ok({"runs": {"no_spec": BASE}})
    assert not gpu_mtp_exactness.all_ok(
        {"runs": {"no_spec": BASE, "k2": ok_run, "adaptive": {"error": "boom"}}}
    )


def test_mixed_prompts_stay_in_their_region():
    prompts = gpu_mtp_exactness.region_of_prompts(1000, [64, 3000, 7], "mixed")
    code, prose, code2 = (p["prompt_token_ids"] for p in prompts)
    assert all(2 <= t < 500 for t in code + code2) and all(500 <= t < 1000 for t in prose)
    assert len(prose) == 3000
    random_prompts = gpu_mtp_exactness.region_of_prompts(1000, [64], None)
    assert len(random_prompts[0]["prompt_token_ids"]) == 64


def entry(tps: float, gib: float | None = 0.5) -> dict:
    return {"decode_tok_per_s": tps, "graph_memory_gib": gib}


def test_summary_ratio_to_best_fixed_and_goals():
    entries = {"k2": entry(444.3), "k4": entry(490.1), "k5": entry(515.8, 0.7)}
    agree = gpu_mtp_adaptive.summarize("agree", entries | {"adaptive": entry(503.0, 1.4)})
    assert agree["best_fixed"] == "k5"
    assert agree["adaptive_over_best_fixed"] == round(503.0 / 515.8, 4)
    assert agree["goal_met"]  # 0.975 >= 0.97
    assert agree["graph_memory_per_ladder_depth_gib"] == {"2": 0.5, "4": 0.5, "5": 0.7}
    assert agree["graph_memory_gib"]["adaptive"] == 1.4
    slow = gpu_mtp_adaptive.summarize("agree", entries | {"adaptive": entry(372.6)})
    assert slow["adaptive_over_best_fixed"] == 0.7224 and not slow["goal_met"]
    # mixed content: adaptive must beat every fixed depth, ties do not count
    mixed = gpu_mtp_adaptive.summarize("mixed", entries | {"adaptive": entry(515.8)})
    assert not mixed["goal_met"]
    assert gpu_mtp_adaptive.summarize("mixed", entries | {"adaptive": entry(516.0)})["goal_met"]
    with_schedule = entries | {"adaptive": entry(500.0), "schedule": entry(480.0)}
    assert gpu_mtp_adaptive.summarize("disagree", with_schedule)["schedule_over_best_fixed"] == (
        round(480.0 / 515.8, 4)
    )


def test_summary_without_adaptive_or_fixed_has_no_verdict():
    failed = {"k2": entry(100.0), "adaptive": {"error": "ValueError('...')"}}
    summary = gpu_mtp_adaptive.summarize("agree", failed)
    assert summary["goal_met"] is None and summary["adaptive_over_best_fixed"] is None
    assert summary["missing"] == ["adaptive", "k4", "k5"]
    table = gpu_mtp_adaptive.goals_table(
        {"agree/b1": {"summary": summary}, "disagree/b1": {"summary": {"goal_met": True}}}
    )
    assert table["all_goals_met"] is None
    ok = gpu_mtp_adaptive.goals_table({"agree/b1": {"summary": {"goal_met": True}}})
    assert ok["all_goals_met"] is True
    assert (
        gpu_mtp_adaptive.goals_table({"a/b1": {"error": "child exited 1"}})["all_goals_met"] is None
    )


@pytest.mark.parametrize(
    "spec, expected",
    [
        ("agree:1", ("agree", 1)),
        ("mixed:8", ("mixed", 8)),
        ("mixed_in_batch:8", ("mixed_in_batch", 8)),
    ],
)
def test_parse_comparison(spec, expected):
    assert gpu_mtp_adaptive.parse_comparison(spec) == expected


@pytest.mark.parametrize("spec", ["agree", "code:1", "agree:0", "agree:x", "mixed_in_batch:1"])
def test_parse_comparison_refuses(spec):
    with pytest.raises(ValueError, match="comparison"):
        gpu_mtp_adaptive.parse_comparison(spec)


def test_call_plan_and_default_comparisons():
    assert gpu_mtp_adaptive.call_plan("agree", 2) == [["code", "code"], ["prose", "prose"]]
    assert gpu_mtp_adaptive.call_plan("mixed_in_batch", 4) == [["code", "prose"] * 2] * 2
    parsed = [
        gpu_mtp_adaptive.parse_comparison(c)
        for c in gpu_mtp_adaptive.DEFAULT_COMPARISONS.split(",")
    ]
    assert {k for k, _ in parsed} == {"agree", "disagree", "mixed", "mixed_in_batch"}
    assert {b for _, b in parsed} == {1, 8}


def test_graph_memory_from_the_log_line():
    lines = [
        "Loading weights took 0.1 GiB",
        "Graph capturing finished in 12 secs, took 0.84 GiB",
    ]
    assert gpu_mtp_adaptive.graph_memory_gib(lines) == 0.84
    assert gpu_mtp_adaptive.graph_memory_gib(lines[:1]) is None


def test_child_command_passes_the_comparison_options():
    args = gpu_mtp_adaptive.argparse.Namespace(
        ckpt_root=Path("/ck"),
        arch="glm_moe_dsa",
        modes="2,adaptive",
        schedule="[[1, 2, 5]]",
        decode_tokens=512,
        max_model_len=4096,
        gpu_mem=0.5,
        max_num_seqs=8,
        dcp=1,
        tp=1,
        cudagraph_mode=None,
        eager=False,
    )
    cmd = gpu_mtp_adaptive.child_command(args, "agree:8", Path("/tmp/o.json"))
    assert cmd[2:6] == ["--one", "agree:8", "--json-out", "/tmp/o.json"]
    assert cmd[cmd.index("--modes") + 1] == "2,adaptive"
    assert "--eager" not in cmd and "--cudagraph-mode" not in cmd


def phase(depth_runs=None, hist=None) -> dict:
    p: dict = {"metrics": {"vllm:spec_decode_adaptive_depth": hist or {}}}
    if depth_runs is not None:
        p["depth_runs"] = depth_runs
    return p


def test_phase_verdict_from_the_depth_trace():
    climbed = gpu_mtp_adaptive.phase_verdict(
        [phase([[2, 34], [4, 18], [5, 70]]), phase([[5, 30], [2, 90]])]
    )
    assert climbed["climbed_to_5_in_code"] and climbed["fell_to_2_in_prose"]
    stuck = gpu_mtp_adaptive.phase_verdict([phase([[2, 34], [4, 88]]), phase([[4, 30], [5, 9]])])
    assert not stuck["climbed_to_5_in_code"] and not stuck["fell_to_2_in_prose"]


def cumulative(at2: int, at4: int, at5: int) -> dict:
    """Prometheus histogram buckets (cumulative, keyed by upper bound) of steps per depth."""
    return {"2.0": at2, "4.0": at2 + at4, "5.0": at2 + at4 + at5, "+Inf": at2 + at4 + at5}


def test_phase_verdict_from_histograms_needs_the_climb_first():
    ok = gpu_mtp_adaptive.phase_verdict(
        [phase(hist=cumulative(33, 18, 69)), phase(hist=cumulative(90, 0, 29))]
    )
    assert ok["verdict_from"] == "per-phase depth histograms" and ok["fell_to_2_in_prose"]
    assert ok["climbed_to_5_in_code"]
    never_climbed = gpu_mtp_adaptive.phase_verdict(
        [phase(hist=cumulative(102, 18, 0)), phase(hist=cumulative(90, 0, 0))]
    )
    assert not never_climbed["climbed_to_5_in_code"]
    assert not never_climbed["fell_to_2_in_prose"]


def test_runs_of():
    assert gpu_mtp_adaptive.runs_of([2, 2, 4, 5, 5, 5, 2]) == [[2, 2], [4, 1], [5, 3], [2, 1]]
    assert gpu_mtp_adaptive.runs_of([]) == []


def test_tree_variant_reads_the_import_path_of_older_runs():
    older = {"variant": "stock", "vllm_path": "/root/gpu-vllm-patched/vllm"}
    assert results_tables.tree_variant(older) == "patched"
    assert results_tables.tree_variant({"variant": "stock", "vllm_path": "/root/gpu-vllm"}) == (
        "stock"
    )


def _schema2_kernel_benches() -> list[tuple[str, dict]]:
    return [
        (n, d)
        for n, d in results_tables.load("kernel-bench-*.json")
        if d.get("schema_version", 1) >= 2
    ]


def test_policy_split_counts_equal_the_launches_the_kernel_bench_recorded():
    """The split counts results_tables computes for "fill" and "occupancy" are the ones the
    kernel's own planner chose in every committed sweep point recorded under that policy."""
    files = _schema2_kernel_benches()
    assert files, "no schema-2 kernel bench committed"
    checked = 0
    for _, d in files:
        sms = d["machine"]["sms"]
        for e in d["decode"] + d["extend"]:
            rows = e.get("batch", e.get("rows"))
            for p in e["points"]:
                if p["splits_arg"] not in ("fill", "occupancy"):
                    continue
                block_h, block_n = p["tiling"][:2]
                programs = rows * -(-e["heads"] // block_h)
                got = results_tables.policy_num_splits(
                    p["splits_arg"], programs, e["topk"], block_h, block_n, sms
                )
                assert got == p["num_splits"], (rows, e["heads"], p)
                checked += 1
    assert checked > 100


def test_auto_rule_is_timed_on_every_row_and_follows_the_thresholds():
    for _, d in _schema2_kernel_benches():
        for e in d["decode"] + d["extend"]:
            rule, point = results_tables.auto_rule(e, d["machine"]["sms"])
            assert point is not None, (e["kind"], e.get("batch", e.get("rows")), e["heads"], rule)
            assert point["variant"] == "base"
            programs = e.get("batch", e.get("rows")) * -(
                -e["heads"] // e["default_plan"]["block_h"]
            )
            plan = e["default_plan"]
            default = [plan["block_h"], plan["block_n"], plan["num_warps"], plan["num_stages"]]
            if programs <= results_tables.AUTO_FEW_PROGRAMS:
                assert point["tiling"] == [plan["block_h"], 64, 8, 2] and "fill" in rule
            elif programs <= results_tables.AUTO_FILL_PROGRAMS:
                assert point["tiling"] == default and "fill" in rule
            else:
                assert point["tiling"] == default and "occupancy" in rule


def test_render_keeps_the_old_schemas_labelled_with_their_base():
    text = results_tables.render()
    assert "vllm 0.26.0, `kernel-bench-h200.json`" in text
    assert "vllm 0.26.0, `dcp-topk-h200.json`" in text
    assert "vllm 0.33.0, `kernel-bench-h200-0.33.0.json`" in text
    assert "vllm 0.33.0, `dcp-topk-merge-h200-0.33.0.json`" in text
    assert "`topk-order-h200-0.33.0.json`" in text
    assert "not timed" not in text  # every auto launch of the committed sweep was timed


def test_gate_problems_are_shortened_and_counted():
    assert results_tables._problems({}) == "-"
    long = {"problems": ["a | b " + "x" * 200, "second"]}
    cell = results_tables._problems(long)
    assert "|" not in cell and cell.endswith("… (+1 more)") and len(cell) < 110
