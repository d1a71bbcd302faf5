# SPDX-License-Identifier: Apache-2.0
"""The long-prompt gates (128k, 256k, 1M tokens) on CPU: the checkpoint's
``--max-position-embeddings``, prefix caching in a gate run, the gate's candidate pass and
control run, the needle-retrieval report, the KV-cache and time budget (evidence/gate/budget.py)
and the long suites themselves."""

from __future__ import annotations

import hashlib
import json
import re
import sys
from pathlib import Path

import pytest

EVIDENCE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(EVIDENCE))
sys.path.insert(0, str(EVIDENCE / "tests" / "support"))

import make_dsa_gate_ckpt as ck  # noqa: E402
from venv_probe import needs_venv, run_probe  # noqa: E402

# config.json of the default arguments as every checkpoint before --max-position-embeddings
# wrote it (sha256 of json.dumps(config, indent=1) + "\n", taken from that revision, f84b4bb)
DEFAULT_CONFIG_SHA256 = {
    ("glm", None): "cd25b2167d74d67ec2644910efc27aedb3e9066a4737011b9f411d8f2afd223a",
    ("v32", None): "f797ac0ffc6b534c6e74fd16872c40b42cd3d854fb807491e458eb8848cb0e01",
    ("v32", 128): "ab43f20d32bf701363b6c1fb738b5c70e076e693a6faf4a6cacb405130d8f1ee",
}


def _config_text(cfg: dict) -> str:
    return json.dumps(cfg, indent=1) + "\n"  # what make_dsa_gate_ckpt.main writes


@pytest.mark.parametrize("arch, heads", sorted(DEFAULT_CONFIG_SHA256, key=str))
def test_the_default_max_position_embeddings_keeps_every_config_byte_for_byte(arch, heads):
    """Without the flag (and with its default given) config.json is what it always was."""
    for cfg in (
        ck.make_config(arch, heads=heads),
        ck.make_config(arch, heads=heads, max_position_embeddings=65536),
    ):
        digest = hashlib.sha256(_config_text(cfg).encode()).hexdigest()
        assert digest == DEFAULT_CONFIG_SHA256[(arch, heads)]
    args = ck.parser().parse_args(["--arch", arch, "--out", "/nonexistent"])
    assert args.max_position_embeddings == ck.DEFAULT_MAX_POSITIONS == 65536


def test_max_position_embeddings_changes_that_field_only_and_is_validated():
    base = ck.make_config("glm")
    long = ck.make_config("glm", max_position_embeddings=1_114_112)
    assert long["max_position_embeddings"] == 1_114_112
    assert {k for k in base if base[k] != long[k]} == {"max_position_embeddings"}
    assert list(long) == list(base)  # same key order: the text differs in that value only
    for bad in (0, -1):
        with pytest.raises(SystemExit, match="must be >= 1"):
            ck.make_config("glm", max_position_embeddings=bad)
    with pytest.raises(SystemExit, match="must be an int"):
        ck.make_config("glm", max_position_embeddings=True)
    args = ck.parser().parse_args(
        ["--arch", "v32", "--max-position-embeddings", "1114112", "--out", "/x"]
    )
    assert args.max_position_embeddings == 1_114_112


TENSORS_PROBE = r"""
import json
import torch
import make_dsa_gate_ckpt as mk

# one layer keeps it quick; the needle and the answer calibration (gate_refmodel's forward)
# run as for the named checkpoints
base = ["--arch", "glm", "--layers", "1", "--qk-gain", "1", "--o-gain", "3", "--needle", "7",
        "--needle-knob", "answer_logit=7", "--out", "/nonexistent"]
out = {}
for extra in ([], ["--max-position-embeddings", "1114112"]):
    cfg, _, tensors, needle = mk.make_tensors(mk.parser().parse_args(base + extra))
    out[str(cfg["max_position_embeddings"])] = (tensors, needle)
(a, na), (b, nb) = out.values()
same = sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)
print(json.dumps({"same": same, "needles_equal": na == nb, "keys": list(out),
                  "answer": na.get("answer_id")}))
"""


@needs_venv
def test_the_tensors_do_not_depend_on_max_position_embeddings():
    """The seeded init, the needle and the answer calibration give the same tensors with a
    longer max_position_embeddings (so glmn1m's weights are glmn's)."""
    got = run_probe(TENSORS_PROBE, timeout=900)
    assert got == {
        "same": True,
        "needles_equal": True,
        "keys": ["65536", "1114112"],
        "answer": 31999,
    }


# --- prefix caching in a gate run -------------------------------------------------------------


def test_prefix_caching_is_off_by_default_and_reaches_the_engine():
    from gate import plan, worker

    off = plan.GateConfig(name="o", model="m")
    assert off.enable_prefix_caching is False
    assert worker.engine_kwargs(off)["enable_prefix_caching"] is False
    on = plan.GateConfig(
        name="p", model="m", tp=4, dcp=4, passes=("clean", "repeat"), enable_prefix_caching=True
    )
    assert worker.engine_kwargs(on)["enable_prefix_caching"] is True
    assert plan.GateConfig.from_json(on.to_json()) == on


@pytest.mark.parametrize(
    "kw, message",
    [
        (
            {"tp": 2, "dcp": 2, "passes": ("clean", "fault"), "enable_prefix_caching": True},
            "needs enable_prefix_caching false",
        ),
        ({"enable_prefix_caching": 1}, "must be a bool"),
        (
            {
                "tp": 2,
                "dcp": 2,
                "variant": "patched",
                "backend": "TRITON_MLA_SPARSE_FP8_DS_MLA",
                "kv_cache_dtype": "auto",
                "engine_extra": {"dcp_prefill_route": "packed_ckv"},
            },
            "kv_cache_dtype must be 'fp8_ds_mla'",
        ),
        (
            {
                "tp": 2,
                "dcp": 2,
                "variant": "patched",
                "backend": "FLASHINFER_MLA_SPARSE",
                "kv_cache_dtype": "fp8_ds_mla",
                "engine_extra": {"dcp_prefill_route": "packed_ckv"},
            },
            "valid: TRITON_MLA_SPARSE_FP8_DS_MLA, FLASHMLA_SPARSE",
        ),
    ],
)
def test_prefix_caching_and_the_packed_route_are_refused_where_they_cannot_run(kw, message):
    from gate import plan

    with pytest.raises(ValueError, match=message):
        plan.GateConfig(name="x", model="m", **kw)
    # the same configurations without the offending setting are accepted
    fixed = dict(kw)
    if "enable_prefix_caching" in fixed:
        fixed["enable_prefix_caching"] = False
    else:
        fixed.update(kv_cache_dtype="fp8_ds_mla", backend="FLASHMLA_SPARSE")
    plan.GateConfig(name="x", model="m", **fixed)


# --- a gate's candidate pass and control run --------------------------------------------------

ANSWER = 31999


def _prompt(first: int = ANSWER, shift: float = 0.0, cached: int | None = None) -> dict:
    """One prompt's record: two greedy steps, the first one's log-probs moved by ``shift``
    (its runner-up: token 9, or the answer when 9 is first)."""
    second = 9 if first != 9 else ANSWER
    rec = {
        "prompt_len": 8,
        "prompt_sha256": "s",
        "tokens": [first, 5],
        "steps": [
            {"token": first, "top": [[first, -0.1 + shift], [second, -2.5]]},
            {"token": 5, "top": [[5, -0.2], [9, -3.0]]},
        ],
    }
    if cached is not None:
        rec["num_cached_tokens"] = cached
    return rec


def _run(name: str, served: dict[str, dict], **config) -> dict:
    """A finished run record of a needle checkpoint whose answer is ANSWER: ``served`` pass ->
    prompt key -> record, ``config`` over a TP 4 DCP 4 configuration of the 8-token prompt."""
    return {
        "name": name,
        "ok": True,
        "config": {"lens": [8], "batch_lens": [], "tp": 4, "dcp": 4, **config},
        "passes": served,
        "checkpoint": {"needle": {"needle_id": 7, "answer_logit": 7.0, "answer_id": ANSWER}},
    }


def _verdict(ref: dict, cand: dict, **kw) -> dict:
    from gate import verdict

    tol = verdict.derive_tolerance({"n": 0.001})
    sens = {"sufficient": True, "min_first_step_move_lower_bound": 1.0}
    res = verdict.gate_result("g", ref, cand, tol, {"max_abs_logprob_diff": 0.001}, sens, **kw)
    assert verdict.validate(res) == []
    json.dumps(res, allow_nan=False)
    return res


def _prefix_cached(repeat_shift: float, cached: int = 8) -> tuple[dict, dict, dict]:
    """(reference, prefix-cached candidate, its control): the candidate's clean pass equals the
    reference, its repeat pass (served from the cache) moves by ``repeat_shift``; the control
    ran the same engine without the cache and its fault pass moves by 0.5."""
    ref = _run("ref", {"clean": {"single/8": _prompt()}}, dcp=1)
    cand = _run(
        "pc",
        {
            "clean": {"single/8": _prompt(cached=0)},
            "repeat": {"single/8": _prompt(shift=repeat_shift, cached=cached)},
        },
        enable_prefix_caching=True,
        passes=["clean", "repeat"],
    )
    control = _run(
        "plain",
        {"clean": {"single/8": _prompt()}, "fault": {"single/8": _prompt(shift=0.5)}},
        enable_prefix_caching=False,
        passes=["clean", "fault"],
    )
    return ref, cand, control


def test_a_gate_compares_the_candidate_pass_it_names():
    """cand_pass "repeat" judges the candidate's repeat pass (the prefix-cache hit), not its
    clean one, and reports the tokens the cache served."""
    ref, cand, control = _prefix_cached(repeat_shift=0.0)
    res = _verdict(ref, cand, cand_pass="repeat", control=control)
    assert res["cand_pass"] == "repeat" and res["ref_pass"] == "clean"
    assert res["equivalent"] and res["meaningful"]
    assert res["prefix_cache"] == {
        "pass": "repeat",
        "cached_tokens": {"single/8": 8},
        "every_prompt_hit": True,
    }
    drifted = _prefix_cached(repeat_shift=0.05)
    assert not _verdict(*drifted[:2], cand_pass="repeat", control=drifted[2])["equivalent"]
    # the same drifted candidate judged on its clean pass is fine: the pass is what is named
    assert _verdict(*drifted[:2], control=drifted[2])["equivalent"]
    missed = _prefix_cached(repeat_shift=0.0, cached=0)
    res = _verdict(*missed[:2], cand_pass="repeat", control=missed[2])
    assert res["prefix_cache"]["every_prompt_hit"] is False
    # a repeat pass the cache never served tests no cache hit: not meaningful
    assert res["equivalent"] and not res["meaningful"]


def test_the_control_run_is_the_negative_control_only_of_the_same_engine():
    from gate import verdict

    ref, cand, control = _prefix_cached(repeat_shift=0.0)
    res = _verdict(ref, cand, cand_pass="repeat", control=control)
    assert res["negative_control"]["control_run"] == "plain"
    assert res["negative_control_detected"]
    # without a control the candidate's own (absent) fault pass is used: nothing detected
    alone = _verdict(ref, cand, cand_pass="repeat")
    assert not alone["negative_control_detected"] and not alone["meaningful"]
    other = {**control, "config": {**control["config"], "tp": 2}}
    res = _verdict(ref, cand, cand_pass="repeat", control=other)
    assert not res["negative_control_detected"] and not res["meaningful"]
    assert "differs from the candidate's in ['tp']" in res["negative_control"]["problems"][0]
    with pytest.raises(ValueError, match="valid: clean, repeat"):
        _verdict(ref, cand, cand_pass="fault")
    with pytest.raises(ValueError, match="control run serves gates of kind dcp, dcp_pair"):
        _verdict(ref, cand, kind="spec", control=control)
    assert verdict.validate({**_verdict(ref, cand), "cand_pass": "sensitivity"})[-1] == (
        "cand_pass must be one of clean, repeat"
    )


def _suite(runs: list[dict], gates: dict) -> dict:
    return {"what": "t", "checkpoints": {"c": []}, "runs": runs, "noise": {}, "gates": gates}


RUN = {"model": "@c", "tp": 4, "dcp": 4, "lens": [64], "batch_lens": []}
PLAIN = {**RUN, "name": "plain", "passes": ["clean", "fault"]}
PC = {**RUN, "name": "pc", "passes": ["clean", "repeat"], "enable_prefix_caching": True}
REF = {**RUN, "name": "ref", "dcp": 1, "passes": ["clean"]}
GOOD = {"ref": "ref", "cand": "pc", "cand_pass": "repeat", "control": "plain"}


@pytest.mark.parametrize(
    "gate, runs, message",
    [
        ({**GOOD, "bogus": 1}, None, "unknown keys ['bogus']; valid: ref, cand, kind"),
        ({**GOOD, "cand_pass": "fault"}, None, "cand_pass 'fault'; valid: clean, repeat"),
        ({**GOOD, "kind": "spec"}, None, "a control run needs kind dcp or dcp_pair"),
        ({**GOOD, "control": "pc"}, None, "the control must be a run of its own"),
        ({**GOOD, "cand": "plain", "control": "pc"}, None, "serves no 'repeat' pass"),
        (GOOD, [REF, PC, {**PLAIN, "passes": ["clean"]}], "control plain serves no 'fault'"),
        (GOOD, [REF, PC, {**PLAIN, "tp": 2, "dcp": 2}], "is not the engine of candidate pc"),
        ({**GOOD, "control": "nowhere"}, None, "control nowhere is a run no suite defines"),
    ],
)
def test_suites_refuse_gates_whose_pass_or_control_cannot_decide(tmp_path, gate, runs, message):
    from gate import plans

    suite = _suite(runs or [REF, PC, PLAIN], {"g": gate})
    (tmp_path / "s.json").write_text(json.dumps(suite))
    with pytest.raises(ValueError, match=re.escape(message)):
        plans.load_suites(tmp_path)
    (tmp_path / "s.json").write_text(json.dumps(_suite([REF, PC, PLAIN], {"g": GOOD})))
    assert plans.load_suites(tmp_path)["s"].gates == {"g": GOOD}


def test_report_judges_the_named_pass_against_the_control(tmp_path):
    """dcp_gate.report reads cand_pass and control from the suite's gate entry: the gate file
    compares the prefix-cache hit and takes its negative control from the control run."""
    import dcp_gate

    ref, cand, control = _prefix_cached(repeat_shift=0.0)
    ref["passes"]["sensitivity"] = {"single/8~p5": _prompt(first=9)}
    for run in (ref, cand, control):
        run["config"]["model"] = "/ckpt/c"
        (tmp_path / "runs").mkdir(exist_ok=True)
        (tmp_path / "runs" / f"{run['name']}.json").write_text(json.dumps(run))
    suite = {
        "runs": [{"name": n, "model": "@c"} for n in ("ref", "pc", "plain")],
        "noise": {"c: ref repeated": ["c", "ref", "ref", "clean", "clean"]},
        "gates": {"g": {"ref": "ref", "cand": "pc", "cand_pass": "repeat", "control": "plain"}},
    }
    dcp_gate.report(suite, tmp_path, tmp_path / "out")
    got = json.loads((tmp_path / "out" / "dcp-gate-g.json").read_text())
    assert got["cand_pass"] == "repeat" and got["prefix_cache"]["every_prompt_hit"]
    assert got["negative_control"]["control_run"] == "plain"
    assert got["meaningful"] and got["equivalent"]
    (tmp_path / "runs" / "plain.json").unlink()  # a control that never ran decides nothing
    dcp_gate.report(suite, tmp_path, tmp_path / "out")
    got = json.loads((tmp_path / "out" / "dcp-gate-g.json").read_text())
    assert not got["negative_control_detected"] and not got["meaningful"]


# --- needle retrieval ---------------------------------------------------------------------------


def _needle_runs(cand_first: int = ANSWER) -> tuple[dict, dict]:
    """A reference that retrieved the needle (and lost the answer without it) and a candidate
    whose first token is ``cand_first``; both serve one single prompt and a batch prompt."""
    ref = _run(
        "ref",
        {
            "clean": {"single/8": _prompt(), "batch/0/8": _prompt(first=9)},
            "sensitivity": {"single/8~p5": _prompt(first=9)},
        },
        dcp=1,
    )
    cand = _run(
        "cand",
        {
            "clean": {"single/8": _prompt(first=cand_first), "batch/0/8": _prompt(first=9)},
            "fault": {"single/8": _prompt(first=9)},
        },
    )
    return ref, cand


def test_a_calibration_suite_reports_retrieval_and_move_per_prompt(tmp_path):
    """A suite without gates or noise pairs whose runs have a sensitivity pass: `report`
    writes dcp-<suite>.json with each run's retrieval and first-step move per single prompt;
    a run without a finished sensitivity pass is left out; a gated suite writes none."""
    import dcp_gate

    ref, cand = _needle_runs()
    lost = _run(
        "lost",
        {"clean": {"single/8": _prompt(first=9)}, "sensitivity": {"single/8~p5": _prompt(9, -0.3)}},
        dcp=1,
    )
    kept = _run(
        "kept",
        {"clean": {"single/8": _prompt()}, "sensitivity": {"single/8~p5": _prompt(ANSWER, -0.3)}},
        dcp=1,
    )
    (tmp_path / "runs").mkdir()
    for r in (ref, cand, lost, kept):
        (tmp_path / "runs" / f"{r['name']}.json").write_text(json.dumps(r))
    suite = {
        "name": "needle-x",
        "runs": [{"name": n, "model": "@m"} for n in ("ref", "cand", "lost", "kept")],
        "noise": {},
        "gates": {},
    }
    dcp_gate.report(suite, tmp_path, tmp_path / "out")
    got = json.loads((tmp_path / "out" / "dcp-needle-x.json").read_text())
    assert got["kind"] == "dcp_gate_needle_calibration"
    assert set(got["runs"]) == {"ref", "lost", "kept"}
    assert got["runs"]["ref"]["per_prompt"] == {
        "single/8": {
            "needle_retrieved": True,
            "first_token": ANSWER,
            "first_token_without_needle": 9,
            "answer_absent_without_needle": True,
            "first_step_move_lower_bound": pytest.approx(2.4),
        }
    }
    lost = got["runs"]["lost"]["per_prompt"]["single/8"]
    assert lost["needle_retrieved"] is False
    assert lost["first_step_move_lower_bound"] == pytest.approx(0.3)
    # the answer without the needle too: retrieved, but the needle did not decide it
    assert got["runs"]["kept"]["per_prompt"]["single/8"] == {
        "needle_retrieved": True,
        "first_token": ANSWER,
        "first_token_without_needle": ANSWER,
        "answer_absent_without_needle": False,
        "first_step_move_lower_bound": pytest.approx(0.3),
    }
    assert dcp_gate.needle_calibration({**suite, "gates": {"g": ["ref", "cand"]}}, {}) is None
    plain = {**ref, "checkpoint": {}}  # a checkpoint without a needle's answer
    assert dcp_gate.needle_calibration(suite, {"ref": plain}) is None


def test_needle_retrieval_reads_the_first_token_of_each_single_prompt():
    from gate import verdict

    ref, cand = _needle_runs()
    got = verdict.needle_retrieval(ref)
    assert got == {
        "answer_id": ANSWER,
        "clean": {"single/8": {"first_token": ANSWER, "needle_retrieved": True}},
        "sensitivity": {"single/8~p5": {"first_token": 9, "answer_absent": True}},
        "all_retrieved": True,
        "all_absent_without_needle": True,
    }
    lost = verdict.needle_retrieval(_needle_runs(cand_first=9)[1])
    assert lost["clean"]["single/8"] == {"first_token": 9, "needle_retrieved": False}
    assert lost["all_retrieved"] is False and lost["all_absent_without_needle"] is None
    kept = {**ref, "passes": {**ref["passes"], "sensitivity": {"single/8~p5": _prompt()}}}
    assert verdict.needle_retrieval(kept)["all_absent_without_needle"] is False
    # no answer token: a checkpoint without a needle, or a needle without add_answer (the
    # knob's default 31999.0 stays in the record with answer_logit 0)
    assert verdict.needle_retrieval({**ref, "checkpoint": {}}) is None
    no_answer = {"needle": {"needle_id": 7, "answer_logit": 0.0, "answer_id": 31999.0}}
    assert verdict.needle_retrieval({**ref, "checkpoint": no_answer}) is None
    unfinished = {**ref, "ok": False, "passes_complete": []}
    assert verdict.needle_retrieval(unfinished)["clean"] == {}


def test_the_gate_file_reports_both_runs_retrieval_and_keeps_every_other_verdict():
    """needle_retrieval is added for the reference and the candidate; no other field of the
    gate file changes with it (the same records without a checkpoint record judge alike)."""
    ref, cand = _needle_runs(cand_first=ANSWER)
    res = _verdict(ref, cand)
    assert res["needle_retrieval"]["reference"]["all_retrieved"]
    assert res["needle_retrieval"]["candidate"]["clean"]["single/8"]["needle_retrieved"]
    assert res["needle_retrieval"]["candidate"]["sensitivity"] == {}
    bare = _verdict(*({**r, "checkpoint": None} for r in (ref, cand)))
    assert bare["needle_retrieval"]["reference"] is bare["needle_retrieval"]["candidate"] is None
    drop = ("needle_retrieval", "checkpoint")
    assert {k: v for k, v in res.items() if k not in drop} == {
        k: v for k, v in bare.items() if k not in drop
    }


def test_sensitivity_rows_say_whether_the_answer_left_with_the_needle():
    from gate import verdict

    ref, _ = _needle_runs()
    rows = verdict.sensitivity(ref, atol=0.01)["per_prompt"]
    assert rows["single/8~p5"]["answer_absent"] is True
    assert (
        "answer_absent"
        not in verdict.sensitivity({**ref, "checkpoint": {}})["per_prompt"]["single/8~p5"]
    )


@pytest.mark.parametrize(
    "mangle, message",
    [
        (lambda n: n.pop("candidate"), "must hold 'reference' and 'candidate'"),
        (lambda n: n["reference"].update(answer_id="31999"), "answer_id must be an int"),
        (
            lambda n: n["reference"]["clean"]["single/8"].update(needle_retrieved=1),
            "clean rows need a bool 'needle_retrieved'",
        ),
        (
            lambda n: n["reference"]["sensitivity"]["single/8~p5"].pop("answer_absent"),
            "sensitivity rows need a bool 'answer_absent'",
        ),
        (lambda n: n.update(reference=[]), "must be null or a report"),
    ],
)
def test_validate_checks_the_needle_report(mangle, message):
    from gate import verdict

    res = _verdict(*_needle_runs())
    mangle(res["needle_retrieval"])
    assert any(message in e for e in verdict.validate(res)), verdict.validate(res)


# --- the KV-cache and time budget (gate/budget.py) --------------------------------------------


def test_kv_bytes_per_token_follow_vllm_034s_layouts():
    """A 656-byte fp8_ds_mla record (352-byte nvfp4_ds_mla, 1152 bf16 bytes) on every layer, a
    132-byte indexer key on every layer that builds an indexer whatever the record: glm's 4
    layers have 3 ("shared" reuses), v32's 4; docs/memory.md's per-token figures of the real
    GLM-5.2 (78 + 1 layers, 22 indexers) follow."""
    from gate import budget

    glm, v32 = ck.make_config("glm"), ck.make_config("v32")
    assert budget.indexer_layers(glm) == 3 and budget.indexer_layers(v32) == 4
    assert budget.kv_bytes_per_token(glm, "fp8_ds_mla") == 4 * 656 + 3 * 132 == 3020
    assert budget.kv_bytes_per_token(v32, "fp8_ds_mla") == 4 * (656 + 132)
    assert budget.kv_bytes_per_token(glm, "auto") == 4 * 1152 + 3 * 132
    assert budget.kv_bytes_per_token(glm, "nvfp4_ds_mla") == 4 * 352 + 3 * 132 == 1804
    assert budget.kv_bytes_per_token(v32, "nvfp4_ds_mla") == 4 * (352 + 132)
    glm52 = {"num_hidden_layers": 79, "indexer_types": ["full"] * 22 + ["shared"] * 57}
    assert budget.kv_bytes_per_token(glm52, "nvfp4_ds_mla") == 30_712  # docs/memory.md
    assert budget.kv_bytes_per_token(glm52, "fp8_ds_mla") == 54_728
    with pytest.raises(ValueError, match="valid: fp8_ds_mla, nvfp4_ds_mla, auto"):
        budget.kv_bytes_per_token(glm, "fp8")
    # 1/DCP of the tokens, whole 64-token blocks; the plan adds 20 % and rounds up to MiB
    assert budget.kv_cache_bytes_needed(glm, "fp8_ds_mla", 64 * 4 + 1, 4) == 2 * 64 * 3020
    assert budget.kv_cache_bytes_needed(glm, "fp8_ds_mla", 131104, 1) == 2049 * 64 * 3020
    need = budget.kv_cache_bytes_needed(glm, "fp8_ds_mla", 131104, 4)
    planned = budget.kv_cache_bytes_planned(glm, "fp8_ds_mla", 131104, 4)
    assert planned % budget.MIB == 0 and 1.2 * need <= planned < 1.2 * need + budget.MIB


def _cfg(tp: int, dcp: int, route: str = "query", rows: int = 8192, **kw):
    from gate import plan

    extra = {"dcp_prefill_route": route} if route != "query" else {}
    return plan.GateConfig(
        name="x",
        model="m",
        tp=tp,
        dcp=dcp,
        lens=(131072,),
        batch_lens=(),
        max_model_len=131104,
        max_num_batched_tokens=rows,
        backend="TRITON_MLA_SPARSE_FP8_DS_MLA",
        kv_cache_dtype="fp8_ds_mla",
        variant="patched",
        engine_extra=extra,
        **kw,
    )


def test_the_indexer_work_and_the_wire_bytes_scale_as_the_model_says():
    """TP 4 DCP 1 scores the whole context on every rank (4x TP 1's flop), DCP 4 splits it
    (TP 1's flop); the query route's bytes are patch 0007's figure for GLM-5 at TP 4 DCP 4
    (817.5 MiB per rank and layer for an 8192-row step), the packed route's its 3.8 MiB at 8k
    context and 61.5 MiB at 128k, and the packed route is taken only where it moves less."""
    from gate import budget

    glm = ck.make_config("glm")
    one = budget.chunk_cost(glm, _cfg(1, 1), 8192, 65536)
    assert one["socket_bytes"] == 0 and one["route"] is None
    assert budget.chunk_cost(glm, _cfg(4, 1), 8192, 65536)["flop"] == 4 * one["flop"]
    assert budget.chunk_cost(glm, _cfg(4, 4), 8192, 65536)["flop"] == pytest.approx(one["flop"])
    assert one["flop"] == 3 * 2 * 64 * 128 * 8192 * (65536 - 4096)
    assert budget.query_route_bytes(8192, 16, 4, "a2a") == 817.5 * budget.MIB
    assert budget.packed_route_bytes(8192, 4) / budget.MIB == pytest.approx(3.84, abs=0.01)
    assert budget.packed_route_bytes(131072, 4) / budget.MIB == pytest.approx(61.5, abs=0.01)
    assert budget.chunk_cost(glm, _cfg(4, 4, "packed_ckv"), 8192, 131072)["route"] == "packed_ckv"
    # a long context with a short step: the records outweigh the queries, the query route wins
    assert budget.chunk_cost(glm, _cfg(4, 4, "packed_ckv"), 64, 131072)["route"] == "query"
    assert budget.comm_backend(glm) == "a2a" and budget.comm_backend(ck.make_config("v32")) == (
        "ag_rs"
    )


def test_a_prefix_cache_hit_recomputes_only_the_tail():
    from gate import budget

    glm = ck.make_config("glm")
    hit = _cfg(4, 4, passes=("clean", "repeat"), enable_prefix_caching=True)
    miss = _cfg(4, 4, passes=("clean", "repeat"))
    assert budget.cached_prefix(hit, 131072) == 131072 - 256  # short of the last 256-token span
    est_hit, est_miss = budget.run_estimate(glm, hit), budget.run_estimate(glm, miss)
    assert est_hit["passes_s"]["clean"] == est_miss["passes_s"]["clean"]
    assert est_hit["passes_s"]["repeat"] < est_miss["passes_s"]["repeat"] / 3


def test_a_batch_costs_its_prompts_work_in_shared_steps_and_decodes_once():
    """The requests of a batch: each one's prefill work, the step costs of the steps they
    share (29,400 rows in four 8192-row steps, where their own chunks would take seven), one
    decode of max_tokens steps; a single prompt's estimate is its prefill and its decode."""
    from gate import budget, plan

    glm = ck.make_config("glm")
    cfg = plan.GateConfig(
        name="b", model="m", tp=2, dcp=2, lens=(1024, 8192), passes=("clean", "fault")
    )
    m = budget.H100
    keys = plan.pass_groups(cfg, "clean")[-1]
    assert [budget._prompt_len(k) for k in keys] == [700, 2600, 9100, 17000]
    batch = budget.group_estimate(glm, cfg, keys, False)
    alone = [budget.prefill_estimate(glm, cfg, n) for n in (700, 2600, 9100, 17000)]
    assert sum(p["steps"] for p in alone) == 7
    assert batch["socket_s"] == pytest.approx(sum(p["socket_s"] for p in alone))
    decode = cfg.max_tokens * m.decode_step_s[2]
    assert batch["fixed_s"] == pytest.approx(4 * m.step_overhead_s + decode)
    one = budget.group_estimate(glm, cfg, ["single/8192~p5"], False)
    p8k = budget.prefill_estimate(glm, cfg, 8192)
    assert sum(one.values()) == pytest.approx(p8k["seconds"] + decode)
    # every pass's groups: clean serves both singles and the batch, fault the same three
    est = budget.run_estimate(glm, cfg)
    assert est["passes_s"]["clean"] == pytest.approx(est["passes_s"]["fault"])
    assert est["total_s"] == pytest.approx(m.engine_start_s + 2 * est["passes_s"]["clean"])
    with pytest.raises(ValueError, match="no decode rate for 3 ranks"):
        budget.run_estimate(glm, plan.GateConfig(name="t", model="m", tp=3))


def _load(name: str, ranks: int = 1, gpu: float = 0, sockets: float = 0, warmup=False) -> dict:
    return {
        "run": name,
        "ranks": ranks,
        "warmup": warmup,
        "parts": {"gpu_s": gpu, "socket_s": sockets, "fixed_s": 0.0},
    }


def test_the_queue_estimate_starts_runs_as_the_launcher_does_and_shares_what_they_share():
    """Runs start in order while their ranks fit; the first engines start cold, later ones
    warm; two runs on the GPU take twice as long, a GPU run beside a socket run does not;
    the rest waits for the warm-up engine."""
    from gate import budget

    kw = {"cold_start_s": 10, "warmup_hold_s": 0}
    two = [_load("a", gpu=100), _load("b", gpu=100)]
    assert budget.queue_estimate(two, 2, **kw) == {"a": 210, "b": 210}
    warm = budget.H100.engine_start_s
    assert budget.queue_estimate(two, 1, **kw) == {"a": 110, "b": 110 + warm + 100}
    mixed = [_load("a", gpu=100), _load("b", sockets=100)]
    assert budget.queue_estimate(mixed, 2, **kw) == {"a": 110, "b": 110}
    big = [_load("a", ranks=4, sockets=50), _load("b", gpu=50)]
    assert budget.queue_estimate(big, 4, **kw) == {"a": 60, "b": 60 + warm + 50}
    held = [_load("w", gpu=5, warmup=True), _load("b", sockets=5)]
    got = budget.queue_estimate(held, 2, cold_start_s=10, warmup_hold_s=100)
    assert got == {"w": 15, "b": 10 + warm + 5}  # b starts once w's engine is up, warm
    with pytest.raises(ValueError, match="below a run's ranks"):
        budget.queue_estimate(big, 2)


def test_the_socket_rate_is_the_committed_records_calibration():
    """The H100 model's socket rate and step cost are what the committed TP 2 DCP 2 run record
    implies (its 1024- and 8192-token prompts' first-token latencies), within 5 %."""
    from gate import budget

    record = json.loads(
        (
            EVIDENCE.parent
            / "results/dcp-gate-runs/base034-ledger/runs/p-glmn-tp2-dcp2-noledger.json"
        ).read_text()
    )
    got = budget.socket_calibration(record)
    assert got["socket_bytes_s"] == pytest.approx(budget.H100.socket_bytes_s, rel=0.05)
    assert got["step_overhead_s"] == pytest.approx(budget.H100.step_overhead_s, rel=0.05)


# --- the long suites ----------------------------------------------------------------------------

LONG = (
    "long-128k-dcp4",
    "long-1m-dcp4",
    "long-512k-dcp4",
    "long-256k-dcp4",
    "long-v32n-128k-dcp4",
    "long-1m-ortho-dcp4",
)


def _long_runs() -> dict[str, tuple[str, dict]]:
    from gate import plans

    runs: dict[str, tuple[str, dict]] = {}
    for n in LONG:  # a run shared by several suites: the first that lists it
        for r in plans.SUITES[n]["runs"]:
            runs.setdefault(r["name"], (n, r))
    return runs


def test_the_long_checkpoints_are_needle_checkpoints_with_a_1m_position_table():
    from gate import plans

    raised = {"attn_margin=9": "attn_margin=13", "answer_logit=7": "answer_logit=10"}
    ortho = ["--needle-knob", "ortho_embed=1"]
    for name, base, knobs, extra in (
        ("glmn1m", "glmn", {}, []),
        ("glmns1m", "glmn", raised, []),
        ("glmno1m", "glmn", raised, ortho),
        ("v32n1m", "v32n", raised, []),
    ):
        argv = plans.LONG_CKPTS[name]
        want = [knobs.get(a, a) for a in plans.NEEDLE_CKPTS[base]]
        assert argv == [*want, "--max-position-embeddings", "1114112", *extra]
        cfg = ck.make_config(*[argv[argv.index("--arch") + 1]], max_position_embeddings=1114112)
        assert cfg["max_position_embeddings"] >= 1_048_576 + 64
    every = {n: s["checkpoints"] for n, s in plans.SUITES.items() if n in LONG}
    assert {k for c in every.values() for k in c} == {"glmn1m", "glmns1m", "glmno1m", "v32n1m"}
    assert all(c[k] == plans.LONG_CKPTS[k] for c in every.values() for k in c)


def test_the_needle_knobs_are_strict():
    """ortho_embed is 0 or 1 and stays out of the defaults (the records of checkpoints made
    without it keep their bytes); an unknown knob is an error naming every valid one."""
    assert ck.ORTHO_EMBED not in ck.needle_knobs(["attn_margin=13"])
    assert ck.needle_knobs(["ortho_embed=1"])[ck.ORTHO_EMBED] == 1.0
    for bad in ("2", "1.0", "true", ""):
        with pytest.raises(SystemExit, match="ortho_embed is 0 or 1"):
            ck.needle_knobs([f"ortho_embed={bad}"])
    with pytest.raises(SystemExit, match=r"unknown needle knob 'ortho'; valid: .*ortho_embed"):
        ck.needle_knobs(["ortho=1"])


def test_every_run_fits_its_checkpoints_position_table():
    """vLLM refuses a max_model_len above max_position_embeddings: no run of any suite asks
    for one (every run's checkpoint config computed from its arguments)."""
    from gate import budget, plan, plans

    for name, suite in plans.SUITES.items():
        for run in suite["runs"]:
            argv = suite["checkpoints"].get(run["model"].removeprefix("@"))
            if argv is None:
                continue
            cfg = plan.GateConfig.from_json(run)
            limit = budget.checkpoint_config(argv)["max_position_embeddings"]
            assert cfg.max_model_len <= limit, (name, run["name"])


def test_each_long_run_reserves_its_planned_kv_pool_and_serves_one_prompt():
    """Every long run: one single prompt and no batch, max_model_len exactly the prompt plus
    its generated tokens, the KV pool budget.kv_cache_bytes_planned gives for its checkpoint,
    the patched tree, eager, the V2 runner, and the default GPU memory utilization."""
    from gate import budget, plan, plans

    for run_name, (suite, run) in _long_runs().items():
        cfg = plan.GateConfig.from_json(run)
        ckpt = budget.checkpoint_config(plans.LONG_CKPTS[run["model"].removeprefix("@")])
        assert len(cfg.lens) == 1 and cfg.batch_lens == () and not cfg.graphs, run_name
        assert cfg.max_model_len == cfg.lens[0] + cfg.max_tokens, run_name
        assert cfg.kv_cache_memory_bytes == budget.kv_cache_bytes_planned(
            ckpt, cfg.kv_cache_dtype, cfg.max_model_len, cfg.dcp
        ), run_name
        assert "gpu_memory_utilization" not in run and "kv_cache_memory_bytes" in run
        assert cfg.variant == "patched" and cfg.env == {"VLLM_USE_V2_MODEL_RUNNER": "1"}
        assert cfg.lens[0] in (131072, 262144, 524288, 1048576) and suite.split("-")[1] in run_name


def test_each_long_suite_decides_its_gates_alone():
    """Each long suite, run alone, runs both sides of every gate and noise pair, a sensitivity
    pass on its checkpoint and a fault pass in every DCP > 1 candidate or its control; its
    gates are named for the release and judged against their checkpoint's one noise group; a
    run name shared by two long suites means the same run."""
    import dcp_gate
    from gate import plans

    for name in LONG:
        suite = plans.SUITES[name]
        runs = {r["name"]: r for r in suite["runs"]}
        for gate, spec in suite["gates"].items():
            ref, cand, kind = dcp_gate.gate_spec(spec)
            control = dcp_gate.gate_options(spec)["control"] or cand
            assert {ref, cand, control} <= set(runs), (name, gate)
            assert "fault" in runs[control]["passes"], (name, gate)
            assert gate.endswith("-0.34.0") and kind in ("dcp", "dcp_pair"), (name, gate)
            assert spec["noise"] == runs[ref]["model"].removeprefix("@") + "/patched", gate
        for label, pair in suite["noise"].items():
            assert set(pair[1:3]) <= set(runs) and pair[0] in label, (name, label)
        assert any("sensitivity" in r["passes"] for r in runs.values()), name
    for run_name, (suite, run) in _long_runs().items():
        for other in LONG:
            twin = {r["name"]: r for r in plans.SUITES[other]["runs"]}.get(run_name)
            assert twin in (None, run), (run_name, suite, other)


def test_the_long_queue_runs_the_cheap_references_first_and_the_1m_gate_second():
    """The queue: the 128k suite (the checkpoint's noise floor and sensitivity, and the first
    DCP = 4 gate), then the 1M prompt (its own checkpoint's 128k noise runs first), then 512k,
    256k, then V3.2 at 128k, then the 1M gate again on glmno1m; one warm-up run (the TP 1
    128k reference); the 1M candidate on the packed-CKV route; the prefix-cache gate compares
    the cached repeat; FlashMLA-sparse at TP 4 (16 local heads)."""
    import dcp_gate
    from gate import plans

    assert plans.QUEUES["long"] == list(LONG)
    q = plans.merge_suites([plans.SUITES[n] for n in LONG])
    order = [r["name"] for r in q["runs"]]
    assert [r["name"] for r in q["runs"] if r.get("warmup")] == ["p-glmn1m-tp1-dcp1-128k"]
    assert order[:3] == [
        "p-glmn1m-tp1-dcp1-128k",
        "p-glmn1m-tp4-dcp1-128k",
        "p-glmn1m-tp4-dcp4-128k",
    ]
    assert order[5:7] == ["p-glmns1m-tp1-dcp1-1m", "p-glmns1m-tp4-dcp4-1m-ckv"]
    assert order[-7:-4] == [f"p-v32n1m-tp{t}-dcp{d}-128k" for t, d in ((1, 1), (4, 1), (4, 4))]
    assert order[-2:] == ["p-glmno1m-tp1-dcp1-1m", "p-glmno1m-tp4-dcp4-1m-ckv"]
    runs = {r["name"]: r for r in q["runs"]}
    assert runs["p-glmns1m-tp4-dcp4-1m-ckv"]["engine_extra"] == {"dcp_prefill_route": "packed_ckv"}
    pc = q["gates"]["p-glmn1m-tp4-dcp4-256k-prefixcache-0.34.0"]
    assert dcp_gate.gate_options(pc) == {"cand_pass": "repeat", "control": "p-glmn1m-tp4-dcp4-256k"}
    assert runs[pc["cand"]]["enable_prefix_caching"] and "repeat" in runs[pc["cand"]]["passes"]
    flashmla = runs["p-glmn1m-tp4-dcp4-256k-flashmla"]
    assert flashmla["backend"] == "FLASHMLA_SPARSE" and flashmla["tp"] == flashmla["dcp"] == 4


def test_each_long_suite_states_the_estimate_the_budget_gives():
    """Each suite's `what` ends with its runs' estimated minutes, one after another, as
    budget.suite_rows computes them now; every run's estimate stays within a 10-minute call."""
    from gate import budget, plans

    for name in LONG:
        rows = budget.suite_rows(plans.SUITES[name])
        minutes = round(sum(r["seconds"] for r in rows) / 60)
        what = plans.SUITE_RECORDS[name].what
        assert what.endswith(
            f"estimate {minutes} min for its runs one after another on one H100 "
            "(evidence/gate/budget.py)"
        ), name
        assert all(r["seconds"] <= 600 for r in rows), name


def test_the_budget_command_prints_a_queues_runs(capsys):
    from gate import budget

    assert budget.main(["--suites", "long", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["run"] for r in rows][:2] == ["p-glmn1m-tp1-dcp1-128k", "p-glmn1m-tp4-dcp1-128k"]
    with pytest.raises(SystemExit, match=r"unknown suites \['longer'\]; valid: a queue \(.*long"):
        budget.main(["--suites", "longer"])
    assert budget.main(["--suites", "long-128k-dcp4,long-1m-dcp4", "--max-ranks", "5"]) == 0
    table = capsys.readouterr().out.splitlines()
    # the 128k suite's three runs, the 1M suite's two 128k noise runs and two 1M runs, total
    assert "`--max-ranks 5`" in table[0] and len(table) == 2 + 7 + 1


def test_the_status_table_names_what_a_long_gate_compares():
    """The README's status table reads checkpoint, TP, DCP and subject from a gate's name: the
    long gates parse, and their prompt length follows the subject."""
    import results_tables
    from gate import plans

    got = {}
    for name in LONG:
        for gate in plans.SUITES[name]["gates"]:
            m = results_tables._GATE_NAME.match(gate)
            assert m and m["tp"] == m["dcp"] == "4", gate
            got[gate] = results_tables._gate_subject(m["rest"])
    assert got == {
        "p-glmn1m-tp4-dcp4-128k-triton_mla_sparse_fp8_ds_mla-0.34.0": (
            "DCP vs DCP = 1 (128k prompt)"
        ),
        "p-glmns1m-tp4-dcp4-1m-ckv-0.34.0": "packed-CKV prefill route vs DCP = 1 (1M prompt)",
        "p-glmno1m-tp4-dcp4-1m-ckv-0.34.0": "packed-CKV prefill route vs DCP = 1 (1M prompt)",
        "p-glmn1m-tp4-dcp4-512k-ckv-0.34.0": "packed-CKV prefill route vs DCP = 1 (512k prompt)",
        "p-glmn1m-tp4-dcp4-256k-ckv-0.34.0": "packed-CKV prefill route vs DCP = 1 (256k prompt)",
        "p-glmn1m-tp4-dcp4-256k-triton_mla_sparse_fp8_ds_mla-0.34.0": (
            "DCP vs DCP = 1 (256k prompt)"
        ),
        "p-glmn1m-tp4-dcp4-256k-ckv-vs-query-0.34.0": (
            "packed-CKV route vs query route (256k prompt)"
        ),
        "p-glmn1m-tp4-dcp4-256k-prefixcache-0.34.0": "prefix-cache hit vs DCP = 1 (256k prompt)",
        "p-glmn1m-tp4-dcp4-256k-flashmla_sparse-0.34.0": "DCP vs DCP = 1 (256k prompt)",
        "p-v32n1m-tp4-dcp4-128k-triton_mla_sparse_fp8_ds_mla-0.34.0": (
            "DCP vs DCP = 1 (128k prompt)"
        ),
    }
    assert results_tables._gate_subject("32k-triton_mla_sparse_fp8_ds_mla") == (
        "DCP vs DCP = 1 (32k prompt)"
    )


def test_the_readme_shows_the_budgets_table():
    """evidence/README.md's long-suite table is what `python evidence/gate/budget.py --suites
    long` prints (regenerate it with that command when a suite or the model changes)."""
    from gate import budget, plans

    rows = budget.suite_rows(plans.merge_suites([plans.SUITES[n] for n in LONG]))
    table = "\n".join(budget.markdown(rows, max_ranks=9))
    assert table in (EVIDENCE / "README.md").read_text()


def test_a_gate_against_a_reference_of_another_tp_says_so():
    """The 1M gate's reference runs at TP 1: its file says the comparison holds TP's
    reordering too; a same-TP gate's note is the kind's note, unchanged."""
    from gate import verdict

    ref, cand = _needle_runs()
    same = _verdict(ref, cand)["compares"]
    assert same == verdict.GATE_KIND_NOTES["dcp"]
    tp1 = {**ref, "config": {**ref["config"], "tp": 1}}
    note = _verdict(tp1, cand)["compares"]
    assert note.startswith(same) and "reference runs at TP 1 and the candidate at TP 4" in note
    assert _verdict(tp1, cand, kind="dcp_pair")["compares"] == verdict.GATE_KIND_NOTES["dcp_pair"]
