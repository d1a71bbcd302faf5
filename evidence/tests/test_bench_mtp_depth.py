# SPDX-License-Identifier: Apache-2.0
"""evidence/bench_mtp_depth.py without a GPU: its workloads on the checkpoint's tables, the
controllers it forces (0012's leaf, in the test venv), the merge of its parts and its CLI."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

EVIDENCE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(EVIDENCE))
sys.path.insert(0, str(Path(__file__).resolve().parent / "support"))

import bench_mtp_depth as bench  # noqa: E402
import mtp_acceptance as acc  # noqa: E402
from venv_probe import needs_venv, run_probe  # noqa: E402


@pytest.fixture(scope="module")
def tables() -> acc.Tables:
    return acc.build_tables(16384, 0)


def test_workloads_decode_the_content_they_are_named_for(tables: acc.Tables) -> None:
    """Every request's generated tokens stay on its cycle's profile: prose and code on their
    own, the stream in four phases (code, prose, code, prose), the mixed batch half and half
    with no two requests sharing a token."""
    for name, spec in bench.WORKLOADS.items():
        prompts = bench.workload_prompts(tables, name)
        assert len(prompts) == len(spec["requests"])
        seen: set[int] = set()
        for (cycle, _), prompt in zip(spec["requests"], prompts, strict=True):
            assert len(prompt) == bench.PROMPT_LEN
            out = bench.expected_tokens(tables, prompt, spec["tokens"])
            pos = [tables.position(cycle, t) for t in out]
            profiles = [tables.phase_of[cycle][p] for p in pos]
            if cycle == "stream":
                phase = acc.Layout().phase_len
                assert [profiles[i * phase] for i in range(4)] == ["code", "prose"] * 2
            else:
                assert set(profiles) == {cycle}
            assert seen.isdisjoint(prompt + out)
            seen |= set(prompt + out)
    kinds = [c for c, _ in bench.WORKLOADS["mixed_batch"]["requests"]]
    assert kinds.count("prose") == kinds.count("code") == 4


CONTROLLER_PROBE = r"""
import json
import bench_mtp_depth as bench

run = object.__new__(bench._Run)
trace = {}
for mode, accepted in (("k3", 0), ("k3", 3), ("adaptive", None)):
    ctl = run.controller(mode)
    depths = []
    for step in range(200):
        d = ctl.depth
        depths.append(d)
        ctl.drafts_proposed("r", ctl.epoch)
        ctl.verify("r", d, d if accepted is None else accepted)
        ctl.end_step()
    trace[f"{mode}-{accepted}"] = sorted(set(depths))
    trace[f"{mode}-{accepted}-verifications"] = len(ctl.verifications)
print(json.dumps(trace))
"""


@needs_venv
def test_forced_controllers_hold_their_depth_and_adaptive_climbs() -> None:
    """``kN`` is 0012's controller on the one-rung ladder (N,): it stays at N whatever is
    accepted; ``adaptive`` is the default 2/4/5 controller and climbs when all is accepted.
    Both record every verification the scheduler hands them."""
    res = run_probe(CONTROLLER_PROBE, timeout=300)
    assert res["k3-0"] == [3] and res["k3-3"] == [3]
    assert res["adaptive-None"] == [2, 4, 5]
    assert res["k3-0-verifications"] == 200


def _part(mode_runs: dict[str, list[float]], workload: str) -> list[dict]:
    return [
        {
            "workload": workload,
            "mode": m,
            "repeat": r,
            "tokens": 512,
            "wall_s": 512 / v,
            "steps": 100,
            "exact": True,
        }
        for m, vs in mode_runs.items()
        for r, v in enumerate(vs)
    ]


def test_merge_reports_goals_curve_memory_and_completeness() -> None:
    ckpt = {
        "geometry": {},
        "seed": 0,
        "profiles": {},
        "weight_bytes": {},
        "file_bytes": 1,
    }
    runs = []
    for w in bench.WORKLOADS:
        runs += _part({"k2": [100, 101], "k5": [90, 95], "adaptive": [99, 100]}, w)
    bench_part = {"runs": runs, "complete": True, "memory": {"graph_capture_gib": 1.2}}
    nospec = {
        "runs": _part({"nospec": [50, 50]}, "code") + _part({"nospec": [200]}, "mixed_batch"),
        "complete": True,
        "memory": {"graph_capture_gib": 0.3},
    }
    res = bench.merge(ckpt, bench_part, {"nospec": nospec})
    assert res["complete"] and res["exact"]
    assert res["bench_engine"]["repeats"] == 2
    assert res["workloads"]["prose"]["best_fixed"] == "k2"
    assert res["adaptive_over_best_fixed"]["code"] == pytest.approx((99 / 100 + 100 / 101) / 2)
    assert set(res["step_curve"]["batch_1"]["step_ms"]) == {"1", "3", "6"}
    assert res["stock_engines"]["nospec"]["memory"]["graph_capture_gib"] == 0.3
    bad = dict(nospec, complete=False)
    assert bench.merge(ckpt, bench_part, {"nospec": bad})["complete"] is False
    runs[0]["exact"] = False
    assert bench.merge(ckpt, bench_part, {"nospec": nospec})["exact"] is False


def test_unknown_engine_is_refused_naming_the_valid_ones(capsys) -> None:
    with pytest.raises(SystemExit):
        bench.main(["run", "--ckpt", "x", "--work", "w", "--out", "o", "--engines", "k3"])
    err = capsys.readouterr().err
    assert "nospec,k2,k4,k5,adaptive" in err.replace(", ", ",")


def _args(tmp_path: Path, left_s: float) -> object:
    from bench_timing import Deadline

    return type(
        "Args",
        (),
        {
            "ckpt": tmp_path,
            "gpu_mem": 0.5,
            "compile": "none",
            "child_timeout_s": 60.0,
            "min_child_s": 30.0,
            "deadline": Deadline(left_s),
        },
    )()


def test_a_complete_part_is_kept_and_no_child_starts_without_time(tmp_path: Path) -> None:
    """A part a previous call finished is reused as it is; with less than --min-child-s left
    no child starts and the part stays incomplete (nothing is run in either case: a child
    would need vLLM)."""
    done = tmp_path / "engine-k2.json"
    done.write_text('{"runs": [], "complete": true, "memory": {"graph_capture_gib": 0.5}}')
    rec = bench._child(_args(tmp_path, 1000), "engine", done, ["--mode", "k2"])
    assert rec["reused"] and rec["memory"] == {"graph_capture_gib": 0.5}
    rec = bench._child(_args(tmp_path, 10), "engine", tmp_path / "engine-k4.json", [])
    assert rec["complete"] is False and "left" in rec["skipped"]
    assert not (tmp_path / "engine-k4.log").exists()


def test_a_cut_bench_part_keeps_its_runs_and_plans_only_the_rest(tmp_path: Path) -> None:
    """The bench child resumes a part a deadline cut: the runs it finished are kept and
    skipped, nothing else is (the engine itself cannot start here, so the child stops at the
    LLM and records why, with the kept runs)."""
    part = tmp_path / "bench.json"
    kept = {"workload": "prose", "mode": "k2", "repeat": 0, "tokens": 1, "wall_s": 1.0}
    dropped = dict(kept, repeat=5)
    part.write_text(json.dumps({"runs": [kept, dropped], "complete": False}))
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    args = type(
        "A", (), {"ckpt": ckpt, "part": part, "repeats": 2, "gpu_mem": 0.5, "compile": "none"}
    )()
    import make_mtp_cost_ckpt

    real = make_mtp_cost_ckpt.load_tables
    make_mtp_cost_ckpt.load_tables = lambda _: ({}, acc.build_tables(16384, 0))
    try:
        assert bench.child_bench(args) == 1
    finally:
        make_mtp_cost_ckpt.load_tables = real
    rec = json.loads(part.read_text())
    assert rec["runs"] == [kept] and rec["resumed"] == 1 and "error" in rec


def test_remerge_recomputes_the_result_and_keeps_the_gpu_runs_provenance(tmp_path: Path) -> None:
    """From the parts a GPU run left and the result it wrote, `remerge` recomputes the same
    summaries (with the raw runs inside), keeps that run's command, revision and machine, and
    names itself in `summarized_by`."""
    ckpt = {"geometry": {}, "seed": 0, "profiles": {}, "weight_bytes": {}, "file_bytes": 1}
    runs = []
    for w in bench.WORKLOADS:
        runs += _part({"k2": [100, 101], "k5": [90, 95], "adaptive": [99, 100]}, w)
    bench_part = {"runs": runs, "complete": True, "memory": {"graph_capture_gib": 1.2}}
    k2 = {"runs": _part({"k2": [100]}, "code"), "complete": True, "memory": None}
    (tmp_path / "bench.json").write_text(json.dumps(bench_part))
    (tmp_path / "engine-k2.json").write_text(json.dumps(k2))
    gpu = bench.merge(ckpt, bench_part, {"k2": k2}) | {
        "command": "python3 evidence/bench_mtp_depth.py run ...",
        "git_revision": "f" * 40,
        "machine": {"gpus": [{"name": "NVIDIA H100 80GB HBM3"}]},
        "base": "0.34.0",
    }
    gpu["adaptive_over_best_fixed"] = "stale"
    (tmp_path / "result.json").write_text(json.dumps(gpu))
    out = tmp_path / "again.json"
    rc = bench.main(
        [
            "remerge",
            "--work",
            str(tmp_path),
            "--result",
            str(tmp_path / "result.json"),
            "--out",
            str(out),
        ]
    )
    again = json.loads(out.read_text())
    assert rc == 0 and again["complete"]
    assert (
        again["adaptive_over_best_fixed"]
        == bench.merge(ckpt, bench_part, {"k2": k2})["adaptive_over_best_fixed"]
    )
    assert again["machine"] == gpu["machine"] and again["git_revision"] == "f" * 40
    assert again["command"] == gpu["command"] and again["base"] == "0.34.0"
    assert "remerge" in again["summarized_by"]["command"]
    assert len(again["runs"]["bench"]) == len(runs) and again["runs"]["engines"]["k2"]
