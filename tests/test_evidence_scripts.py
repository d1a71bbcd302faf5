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
from mtp_gpu_common import mtp_spec  # noqa: E402


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
    assert adaptive["adaptive_speculative_tokens_ladder"] == [2, 4, 5]
    assert adaptive["adaptive_speculative_tokens_window"] == [4, 2, 2]
    assert "adaptive_speculative_tokens_window" not in mtp_spec("adaptive")


def phase(depth_runs=None, hist=None) -> dict:
    p: dict = {"metrics": {"vllm:spec_decode_adaptive_depth_steps": hist or {}}}
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


def test_phase_verdict_from_histograms_needs_the_climb_first():
    ok = gpu_mtp_adaptive.phase_verdict(
        [phase(hist={"2": 33, "5": 69}), phase(hist={"2": 90, "5": 29})]
    )
    assert ok["verdict_from"] == "per-phase depth histograms" and ok["fell_to_2_in_prose"]
    never_climbed = gpu_mtp_adaptive.phase_verdict([phase(hist={"2": 120}), phase(hist={"2": 90})])
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
