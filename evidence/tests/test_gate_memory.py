# SPDX-License-Identifier: Apache-2.0
"""The memory test and the capacity table (evidence/gate/memory.py) on synthetic run records;
the rank-side probe's step folding (gate/memory_probe.py) and its wrapping of vLLM's worker
(in the test venv, with a stand-in for torch.cuda)."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

EVIDENCE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(EVIDENCE))
sys.path.insert(0, str(EVIDENCE / "tests" / "support"))
sys.path.insert(0, str(EVIDENCE / "tests"))

from gate import memory, memory_probe, plan  # noqa: E402
from venv_probe import needs_venv, run_probe  # noqa: E402

GIB = 1 << 30


def rank_mem(
    rank: int, profiled: int, kv: int, prefill: int, decode: int, start: int | None = None
) -> dict:
    """A rank's record; the profile starts at 1 GiB; ``start``: allocated when each class's
    peak step started (None: a record from before the probe kept it)."""
    at = {} if start is None else {"peak_step_start_bytes": start}
    return {
        "rank": rank,
        "profile": {"allocated_before_bytes": GIB, "peak_bytes": profiled, "kv_cache_bytes": kv},
        "steps": {
            "prefill": {"steps": 3, "peak_bytes": prefill, "peak_step_tokens": 8192} | at,
            "decode": {"steps": 31, "peak_bytes": decode, "peak_step_tokens": 1} | at,
        },
        "engine": {"num_gpu_blocks": 1000, "block_size": 64, "kv_cache_size_tokens": 123},
    }


def grown_peaks(
    profile_transient: int, kv: int, grown: int, step_transient: int, dcp: int = 2
) -> list[tuple]:
    """``run(peaks=...)`` for ranks whose profile (from 1 GiB) peaks ``profile_transient``
    above its start and whose prefill and decode steps start ``grown`` above the profile's
    start and the pool and peak ``step_transient`` above that."""
    start = GIB + kv + grown
    peak = start + step_transient
    return [(GIB + profile_transient, kv, peak, peak, start)] * dcp


def run(name: str, dcp: int = 2, drop: str = "", ok: bool = True, error=None, **mem) -> dict:
    env = {"VLLM_USE_V2_MODEL_RUNNER": "1"} | ({memory.DROP_ENV: drop} if drop else {})
    peaks = mem.get("peaks", [(3 * GIB, 2 * GIB, 4 * GIB, 3 * GIB + GIB // 2)] * dcp)
    return {
        "name": name,
        "ok": ok,
        "error": error,
        "passes_complete": ["clean"] if ok else [],
        "config": {
            "name": name,
            "model": "/w/ckpt/glmn",
            "tp": dcp,
            "dcp": dcp,
            "kv_cache_memory_bytes": 2 * GIB,
            "lens": [1024, 65536],
            "max_model_len": 65600,
            "memory_probe": True,
            "env": env,
        },
        "memory": [] if not ok else [rank_mem(r, *p) for r, p in enumerate(peaks)],
    }


def test_a_rank_within_its_budget_and_one_over_it():
    """Budget = profiled peak + KV bytes; a step peak one byte over it is flagged."""
    ok = memory.rank_verdict(rank_mem(0, 3 * GIB, 2 * GIB, 5 * GIB, 4 * GIB))
    assert ok["budget_bytes"] == 5 * GIB and ok["within"] is True
    assert ok["prefill"]["margin_bytes"] == 0
    over = memory.rank_verdict(rank_mem(0, 3 * GIB, 2 * GIB, 5 * GIB + 1, 4 * GIB))
    assert over["within"] is False and over["prefill"]["within"] is False
    assert over["decode"]["within"] is True


def test_a_crashed_or_cut_run_or_a_missing_rank_is_never_within():
    """A run that failed after some steps (its records within), one cut before its clean
    pass ended, and one with a rank's record missing are not judged, and fail the headline."""
    crashed = run("m-dcp2")
    crashed["ok"], crashed["error"] = False, "rank 1: torch.OutOfMemoryError: CUDA out of memory"
    crashed["memory"][1]["failed_step"] = {"kind": "prefill", "tokens": 8192, "peak_bytes": 9}
    cut = run("m-dcp2")
    cut["passes_complete"] = []
    lost = run("m-dcp2")
    lost["memory"] = lost["memory"][:1]
    for bad, why in ((crashed, "did not complete"), (cut, "did not complete"), (lost, "[0]")):
        got = memory.run_verdict(bad)
        assert got["within"] is None and why in got["why_not_judged"]
        assert memory.memory_result({"m-dcp2": bad})["all_within"] is False
    assert memory.run_verdict(crashed)["failed_steps"] == [
        {"rank": 1, "kind": "prefill", "tokens": 8192, "peak_bytes": 9}
    ]


def test_the_headline_judges_dcp_runs_and_a_control_needs_a_twin_that_ran():
    """DCP = 1 runs are the baseline; an ``all`` control whose twin was refused too is not
    caught; the twin is found whatever order the configuration's keys were written in."""
    dcp1 = run("m-dcp1", dcp=1, peaks=[(GIB, GIB, 3 * GIB, GIB)])  # over its budget
    doc = memory.memory_result({"m-dcp1": dcp1, "m-dcp2": run("m-dcp2")})
    assert doc["all_within"] is True and doc["baseline_within"] is False
    msg = "DCP headroom check: refused"
    twin = run("m-dcp2", ok=False, error=msg)
    ctl = run("m-dcp2-x", drop="all", ok=False, error=msg)
    assert (
        memory.memory_result({"m-dcp2": twin, "m-dcp2-x": ctl})["controls"]["m-dcp2-x"]["caught"]
        is False
    )
    shuffled = run("m-dcp2-x", drop="all", ok=False, error=msg)
    shuffled["config"] = dict(reversed(list(shuffled["config"].items())))
    shuffled["config"]["env"] = dict(reversed(list(shuffled["config"]["env"].items())))
    doc = memory.memory_result({"m-dcp2": run("m-dcp2"), "m-dcp2-x": shuffled})
    assert doc["controls"]["m-dcp2-x"] == {
        "twin": "m-dcp2",
        "twin_within": True,
        "twin_transient_within": None,  # a record without the steps' start
        "twin_attention_within": None,  # nor the probe's attribution
        "caught": True,
        "caught_by_transient_rule": None,
        "caught_by_attention_rule": None,
    }


def test_nothing_to_judge_is_not_a_pass():
    assert memory.rank_verdict({"steps": {}})["within"] is None
    no_steps = rank_mem(0, GIB, GIB, 0, 0)
    no_steps["steps"] = {}
    assert memory.rank_verdict(no_steps)["within"] is None
    r = run("a")
    r["memory"] = r["memory"][:1]  # rank 1 wrote no record: the run is not judged
    r["memory"].append({"rank": 1, "steps": {}})
    assert memory.run_verdict(r)["within"] is None


def test_the_alloc_control_is_caught_only_when_it_overruns_and_its_twin_does_not():
    twin = run("m-dcp2")
    over = [(2 * GIB, 2 * GIB, 4 * GIB + 5, 3 * GIB)] * 2  # profiled 1 GiB lower, same steps
    ctl = run("m-dcp2-noreserve", drop="alloc", peaks=over)
    doc = memory.memory_result({"m-dcp2": twin, "m-dcp2-noreserve": ctl})
    assert doc["all_within"] is True
    got = doc["controls"]["m-dcp2-noreserve"]
    assert got["caught"] is True and got["twin"] == "m-dcp2"
    assert got["reservation_bytes_by_rank"] == {"0": GIB, "1": GIB}
    assert doc["runs"]["m-dcp2-noreserve"]["largest_overrun_bytes"] == 5
    # a control that stays within is not caught, and then neither are the controls
    quiet = run("m-dcp2-noreserve", drop="alloc")
    doc = memory.memory_result({"m-dcp2": twin, "m-dcp2-noreserve": quiet})
    assert doc["controls"]["m-dcp2-noreserve"]["caught"] is False
    assert doc["controls_caught"] is False
    # a twin over its budget shows nothing either
    bad_twin = run("m-dcp2", peaks=over)
    doc = memory.memory_result({"m-dcp2": bad_twin, "m-dcp2-noreserve": ctl})
    assert doc["controls"]["m-dcp2-noreserve"]["caught"] is False
    assert doc["all_within"] is False


def test_the_all_control_is_caught_by_the_refusal_message():
    twin = run("m-dcp2")
    msg = "rank 0: ValueError: DCP headroom check: the profiling forward reserved ..."
    refused = run("m-dcp2-unreserved", drop="all", ok=False, error=msg)
    crashed = run("m-dcp2-unreserved", drop="all", ok=False, error="rank 0: CUDA out of memory")
    for ctl, caught in ((refused, True), (crashed, False)):
        doc = memory.memory_result({"m-dcp2": twin, "m-dcp2-unreserved": ctl})
        assert doc["controls"]["m-dcp2-unreserved"]["caught"] is caught
    alone = memory.memory_result({"m-dcp2-unreserved": refused})
    assert alone["controls"]["m-dcp2-unreserved"]["caught"] is None
    assert alone["all_within"] is False  # nothing judged is not a pass


def test_capacity_scales_with_dcp_per_checkpoint_and_pool_and_skips_controls():
    runs = {}
    for dcp, blocks in ((1, 4000), (2, 4000), (4, 3990)):
        r = run(f"cap-dcp{dcp}", dcp=dcp)
        for m in r["memory"]:
            m["engine"] = {"num_gpu_blocks": blocks, "block_size": 64}
        runs[r["name"]] = r
    ctl = copy.deepcopy(runs["cap-dcp2"])
    ctl["name"], ctl["config"]["env"] = "cap-dcp2-x", {memory.DROP_ENV: "alloc"}
    runs["cap-dcp2-x"] = ctl
    rows = memory.memory_result(runs)["capacity"]
    assert [(r["dcp"], r["tokens"], r["tokens_vs_dcp1"]) for r in rows] == [
        (1, 256000, 1.0),
        (2, 512000, 2.0),
        (4, 1021440, 3.99),
    ]
    assert rows[0]["longest_prompt_served"] == 65536
    runs["cap-dcp1"]["passes_complete"] = []
    assert memory.capacity_rows([runs["cap-dcp1"]])[0]["longest_prompt_served"] is None


def test_capacity_compares_a_backend_only_with_its_own_dcp1():
    runs = {}
    for name, dcp, backend, blocks in (
        ("t-dcp1", 1, "TRITON_MLA_SPARSE_FP8_DS_MLA", 5555),
        ("t-dcp2", 2, "TRITON_MLA_SPARSE_FP8_DS_MLA", 5555),
        ("fa-dcp2", 2, "FLASH_ATTN_MLA_SPARSE", 3352),
    ):
        r = run(name, dcp=dcp)
        r["config"]["backend"] = backend
        for m in r["memory"]:
            m["engine"] = {"num_gpu_blocks": blocks, "block_size": 64}
        runs[name] = r
    ratio = {r["run"]: r["tokens_vs_dcp1"] for r in memory.capacity_rows(list(runs.values()))}
    # another record layout holds another number of tokens per byte: no DCP = 1 to compare with
    assert ratio == {"t-dcp1": 1.0, "t-dcp2": 2.0, "fa-dcp2": None}


def test_no_probed_run_writes_no_memory_file():
    r = run("a")
    r["config"]["memory_probe"] = False
    r["memory"] = []
    assert memory.memory_result({"a": r}) is None


def test_step_folding_keeps_the_largest_peak_per_class():
    """Each class keeps its largest peak; the sampling after a step raises that step's peak;
    a step that raised is kept apart and never counted as a step."""
    memory_probe._STATE.update(steps={}, last=None, failed_step=None)
    memory_probe.record_step({"a": 8192}, 7, 9)
    memory_probe.record_step({"a": 4000, "b": 1}, 8, 8)
    memory_probe.record_step({"a": 1, "b": 1}, 3, 4)
    memory_probe.fold_sampling(6, 6)  # the decode step's sampling peaked higher
    memory_probe.record_step({"a": 1}, 2, 5)
    memory_probe.record_step({"a": 9000}, 99, 99, failed=True)
    got = memory_probe._STATE["steps"]
    assert got["prefill"] == {
        "steps": 2,
        "peak_bytes": 8,
        "peak_step_tokens": 4001,
        "peak_step_start_bytes": None,  # record_step given no start
        "max_step_tokens": 8192,
        "peak_reserved_bytes": 9,
    }
    assert got["decode"]["peak_bytes"] == 6 and got["decode"]["steps"] == 2
    assert got["decode"]["peak_reserved_bytes"] == 6
    assert memory_probe._STATE["failed_step"] == {
        "kind": "prefill",
        "tokens": 9000,
        "peak_bytes": 99,
        "start_bytes": None,
    }
    assert memory_probe._STATE["last"] is None


def test_prefill_steps_keep_their_seconds_in_order_and_decode_steps_none():
    """Each prefill step's seconds join ``step_seconds`` in the order they ran; decode steps,
    failed steps and steps given no time add none."""
    memory_probe._STATE.update(steps={}, last=None, failed_step=None)
    memory_probe.record_step({"a": 8192}, 7, 9, seconds=2.00004)
    memory_probe.record_step({"a": 1}, 2, 5, seconds=0.5)
    memory_probe.record_step({"a": 4000, "b": 1}, 8, 8, seconds=3.5)
    memory_probe.record_step({"a": 8192}, 9, 9)
    memory_probe.record_step({"a": 9000}, 99, 99, failed=True, seconds=7.0)
    got = memory_probe._STATE["steps"]
    assert got["prefill"]["step_seconds"] == [2.0, 3.5]
    assert got["prefill"]["steps"] == 3 and "step_seconds" not in got["decode"]


@pytest.mark.parametrize("kv_bytes", [None, 0, 1.5])
def test_the_probe_needs_an_explicit_pool(kv_bytes):
    with pytest.raises(ValueError, match="memory_probe needs kv_cache_memory_bytes"):
        plan.GateConfig(
            name="m", model="m", tp=2, dcp=2, memory_probe=True, kv_cache_memory_bytes=kv_bytes
        )
    plan.GateConfig(name="m", model="m", tp=2, dcp=2, kv_cache_memory_bytes=None)


@pytest.mark.parametrize(
    ("env", "probe", "ok"),
    [
        ({plan.DROP_RESERVATION_ENV: "alloc"}, True, True),
        ({plan.DROP_RESERVATION_ENV: "all"}, True, True),
        ({plan.DROP_RESERVATION_ENV: "1"}, True, False),
        ({plan.DROP_RESERVATION_ENV: "alloc"}, False, False),
    ],
)
def test_a_control_needs_a_known_value_and_the_probe(env, probe, ok, monkeypatch):
    kw = dict(name="m", model="m", tp=2, dcp=2, env=env, memory_probe=probe)
    if ok:
        plan.GateConfig(**kw)
    else:
        with pytest.raises(ValueError, match="GATE_DROP_DCP_RESERVATION"):
            plan.GateConfig(**kw)
    monkeypatch.setenv(plan.DROP_RESERVATION_ENV, env[plan.DROP_RESERVATION_ENV])
    if env[plan.DROP_RESERVATION_ENV] in plan.DROP_RESERVATION:
        assert memory_probe.dropped_reservation() == env[plan.DROP_RESERVATION_ENV]
    else:
        with pytest.raises(ValueError, match="valid: alloc, all"):
            memory_probe.dropped_reservation()


WRAP_PROBE = r"""
import inspect, json, os, sys
from types import SimpleNamespace
from gate import memory_probe
from vllm.v1.worker import gpu_worker
from vllm.models.deepseek_v32 import attention

class FakeCuda:
    allocated, peak = 100, 100
    def synchronize(self): pass
    def memory_allocated(self): return self.allocated
    def reset_peak_memory_stats(self): self.peak = self.allocated
    def max_memory_allocated(self): return self.peak
    def max_memory_reserved(self): return self.peak + 1
cuda = FakeCuda()
memory_probe._cuda = lambda: cuda

# the real methods the probe wraps, as it calls them
W = gpu_worker.Worker
signatures = {
    name: list(inspect.signature(fn).parameters)
    for name, fn in (
        ("determine_available_memory", W.determine_available_memory),
        ("execute_model", W.execute_model),
        ("sample_tokens", W.sample_tokens),
        ("_reserve_dcp_step", attention.DeepseekV32Attention._reserve_dcp_step),
    )
}
def sizing(self):
    cuda.peak = 700  # the profiling forward's peak
    return 5000
def step(self, so):
    cuda.peak = 900 if so.total_num_scheduled_tokens > 1 else 300
    if so.total_num_scheduled_tokens == 7:
        cuda.peak = 5555
        raise MemoryError("out of memory")
    return "out"
def sample(self, grammar_output):
    cuda.peak = max(cuda.peak, 400)
    return "sampled"
W.determine_available_memory, W.execute_model, W.sample_tokens = sizing, step, sample
original = attention.DeepseekV32Attention._reserve_dcp_step
memory_probe.install()
memory_probe.install()  # idempotent
w = object.__new__(gpu_worker.Worker)
w.cache_config = SimpleNamespace(kv_cache_memory_bytes=5000)
kv = w.determine_available_memory()
def sched(n):
    return SimpleNamespace(num_scheduled_tokens=n, total_num_scheduled_tokens=sum(n.values()))
outs = [w.execute_model(sched(n)) for n in ({"a": 50}, {"a": 1}, {})]
outs.append(w.sample_tokens(None))  # after a decode step: its peak rises to 400
try:
    w.execute_model(sched({"a": 7}))
except MemoryError:
    outs.append("raised")
layer = SimpleNamespace(dcp_reserved_rows=0)
if os.environ.get(memory_probe.DROP_RESERVATION_ENV):
    attention.DeepseekV32Attention._reserve_dcp_step(layer, 64, None)
print(json.dumps({"kv": kv, "outs": outs, "snap": memory_probe.snapshot(), "sig": signatures,
                  "replaced": attention.DeepseekV32Attention._reserve_dcp_step is not original,
                  "rows": layer.dcp_reserved_rows}))
"""


@needs_venv
@pytest.mark.parametrize("drop", ["", "alloc", "all"])
def test_the_probe_wraps_vllms_worker_and_the_controls_replace_the_reservation(drop):
    """In the patched tree: the sizing and each step pass through unchanged and are measured;
    ``alloc`` keeps 0016's row record without allocating, ``all`` keeps nothing."""
    got = run_probe(WRAP_PROBE, timeout=300, env={plan.DROP_RESERVATION_ENV: drop})
    assert got["sig"] == {
        "determine_available_memory": ["self"],
        "execute_model": ["self", "scheduler_output"],
        "sample_tokens": ["self", "grammar_output"],
        "_reserve_dcp_step": ["self", "rows", "device"],
    }
    assert got["kv"] == 5000 and got["outs"] == ["out", "out", "out", "sampled", "raised"]
    snap = got["snap"]
    assert snap["profile"] == {
        "allocated_before_bytes": 100,
        "peak_bytes": 700,
        "peak_reserved_bytes": 701,
        "kv_cache_bytes": 5000,
    }
    assert snap["steps"]["prefill"]["peak_bytes"] == 900
    assert snap["steps"]["decode"]["peak_bytes"] == 400
    assert snap["steps"]["decode"]["peak_step_start_bytes"] == 100
    assert snap["failed_step"] == {
        "kind": "prefill",
        "tokens": 7,
        "peak_bytes": 5555,
        "start_bytes": 100,
    }
    assert snap["reservation_dropped"] == (drop or None)
    assert got["replaced"] is bool(drop)
    if drop:
        assert got["rows"] == (64 if drop == "alloc" else 0)


def test_a_memory_suite_runs_end_to_end_through_the_launcher(tmp_path: Path):
    """The launcher collects every rank's memory record and the report writes the memory
    test: the run within its budget, the ``alloc`` control over it, the ``all`` control
    refused, capacity per DCP size (the stand-in worker, tests/support/fake_gate_worker.py)."""
    from test_dcp_gate import run_suite

    def mrun(name: str, tp: int, dcp: int, drop: str = "") -> dict:
        env = {plan.DROP_RESERVATION_ENV: drop} if drop else {}
        return {
            "name": name,
            "model": "M/ck",
            "tp": tp,
            "dcp": dcp,
            "passes": ["clean"],
            "lens": [64],
            "batch_lens": [],
            "memory_probe": True,
            "variant": "patched",
            "env": env,
        }

    suite = {
        "checkpoints": {},
        "runs": [
            mrun("m-tp2-dcp1", 2, 1),
            mrun("m-tp2-dcp2", 2, 2),
            mrun("m-tp2-dcp2-noalloc", 2, 2, "alloc"),
            mrun("m-tp2-dcp2-unreserved", 2, 2, "all"),
        ],
        "noise": {},
        "gates": {},
    }
    proc = run_suite(tmp_path, suite)
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads((tmp_path / "out" / "dcp-memory-suite.json").read_text())
    assert doc["kind"] == memory.KIND and doc["all_within"] is True
    assert doc["controls_caught"] is True, doc["controls"]
    assert doc["all_transient_within"] is True
    assert doc["controls_caught_by_transient_rule"] is True, doc["controls"]
    assert doc["runs"]["m-tp2-dcp2"]["within"] is True
    assert [r["rank"] for r in doc["runs"]["m-tp2-dcp2"]["ranks"]] == [0, 1]
    assert doc["runs"]["m-tp2-dcp2-unreserved"]["refused"] is True
    assert doc["controls"]["m-tp2-dcp2-noalloc"]["reservation_bytes_by_rank"] == {
        "0": GIB,
        "1": GIB,
    }
    assert [(r["dcp"], r["tokens"]) for r in doc["capacity"]] == [(1, 999 * 64), (2, 998 * 128)]
    assert doc["revision"]["series"] == "abc123"


def test_a_run_vllm_refused_for_capacity_is_a_capacity_row_not_a_memory_verdict():
    """DCP 1 with the pool that holds the prompt at DCP 4: vLLM refuses max_model_len at
    start-up; the capacity table names the length refused and vLLM's estimate, the memory
    verdict leaves the run out (a start-up refusal of any other kind is not left out)."""
    msg = (
        "rank 0: ValueError: To serve at least one request with the model's max seq len "
        "(131104), (0.37 GiB KV cache is needed, which is larger than the available KV cache "
        "memory (0.11 GiB). Based on the available memory, the estimated maximum model length "
        "is 39488. Try increasing ..."
    )
    served = run("c-dcp2", dcp=2)
    refused = run("c-dcp1-long", dcp=1, ok=False, error=msg)
    doc = memory.memory_result({"c-dcp2": served, "c-dcp1-long": refused})
    assert doc["all_within"] is True
    assert doc["runs"]["c-dcp1-long"]["capacity_refused"] is True
    row = next(r for r in doc["capacity"] if r["run"] == "c-dcp1-long")
    assert row["tokens"] is None and row["tokens_vs_dcp1"] is None
    assert row["vllm_estimated_max_model_len"] == 39488
    other = run("c-dcp1-long", dcp=1, ok=False, error="rank 0: RuntimeError: CUDA error")
    doc = memory.memory_result({"c-dcp2": served, "c-dcp1-long": other})
    assert doc["baseline_within"] is False and doc["all_within"] is True
    assert [r["run"] for r in doc["capacity"]] == ["c-dcp2"]


def test_a_malformed_memory_result_is_named():
    doc = memory.memory_result({"m-dcp2": run("m-dcp2")})
    assert memory.validate(doc | {"command": "c", "revision": {}, "base": {}, "machine": {}}) == []
    assert "missing command" in memory.validate(doc)
    bad = copy.deepcopy(doc) | {"command": "c", "revision": {}, "base": {}, "machine": {}}
    bad["runs"]["m-dcp2"].update(within=None, why_not_judged=None)
    bad["controls"]["ghost"] = {"caught": None}
    assert memory.validate(bad) == [
        "run m-dcp2: not judged, and no reason given",
        "control ghost is not among the runs",
    ]
    typed = memory.memory_result({"m-dcp2": run("m-dcp2", peaks=grown_peaks(GIB, GIB, 0, 9))})
    typed |= {"command": "c", "revision": {}, "base": {}, "machine": {}}
    assert memory.validate(typed) == []
    typed["all_transient_within"] = None
    typed["runs"]["m-dcp2"]["ranks"][0]["prefill"]["grown_bytes"] = 1.5
    typed["runs"]["m-dcp2"]["transient_within"] = "yes"
    assert memory.validate(typed) == [
        "all_transient_within is None, not a verdict",
        "run m-dcp2: transient_within is 'yes'",
        "run m-dcp2 rank 0 prefill: grown_bytes is 1.5, not bytes",
    ]
    del typed["controls_caught_by_transient_rule"]
    assert "missing controls_caught_by_transient_rule" in memory.validate(typed)


BYTES = st.integers(0, 1 << 40)


@settings(max_examples=200, deadline=None)
@given(profile_t=BYTES, kv=BYTES, step_t=BYTES, grown=st.integers(1, 1 << 40), data=st.data())
def test_a_step_over_the_budget_only_by_what_grew_is_transient_within(
    profile_t, kv, step_t, grown, data
):
    """A step whose own transient fits the profile's, over the strict budget only because the
    engine holds more at its start than at the profile's start plus the pool: not ``within``,
    ``transient_within``; per rank and class, margin = transient margin - grown."""
    step_t = min(step_t, profile_t)
    grown = max(grown, profile_t - step_t + 1)  # what grew exceeds the transient margin
    dcp = data.draw(st.sampled_from([1, 2]))
    r = run("m", dcp=dcp, peaks=grown_peaks(profile_t, kv, grown, step_t, dcp))
    v = memory.run_verdict(r)
    assert v["within"] is False and v["transient_within"] is True
    assert v["why_transient_not_judged"] is None
    for rank in v["ranks"]:
        for kind in memory.STEP_CLASSES:
            c = rank[kind]
            assert c["grown_bytes"] == grown and c["transient_margin_bytes"] == profile_t - step_t
            assert c["margin_bytes"] == c["transient_margin_bytes"] - c["grown_bytes"]
    doc = memory.memory_result({"m": r})
    key = "baseline" if dcp == 1 else "all"
    assert doc[f"{key}_within"] is False and doc[f"{key}_transient_within"] is True


@settings(max_examples=200, deadline=None)
@given(profile_t=BYTES, kv=BYTES, excess=st.integers(1, 1 << 30), grown=st.integers(-GIB, GIB))
def test_a_step_transient_above_the_profiles_fails_the_transient_rule(profile_t, kv, excess, grown):
    """Whatever grew (even memory freed since the profile, which can leave the strict rule
    passing): one rank's prefill transient above its profile transient fails the rank, the
    run and ``all_transient_within``."""
    peaks = grown_peaks(profile_t, kv, grown, profile_t)
    over = list(peaks[1])
    over[2] += excess  # rank 1's prefill peak, from the same start
    r = run("m-dcp2", peaks=[peaks[0], tuple(over)])
    v = memory.run_verdict(r)
    assert [x["transient_within"] for x in v["ranks"]] == [True, False]
    assert v["ranks"][1]["prefill"]["transient_margin_bytes"] == -excess
    assert v["ranks"][1]["decode"]["transient_within"] is True
    assert v["transient_within"] is False
    assert memory.memory_result({"m-dcp2": r})["all_transient_within"] is False


@settings(max_examples=100, deadline=None)
@given(
    reservation=st.integers(1, GIB),
    over=st.integers(1, GIB),
    grown=st.integers(1, GIB),
    kv=BYTES,
)
def test_the_alloc_control_is_caught_by_the_transient_rule_against_a_grown_twin(
    reservation, over, grown, kv
):
    """A twin whose steps start above the profile's start and the pool (grown beyond its
    transient margin) and whose transient fits: strictly over, ``transient_within``. The
    ``alloc`` control (its profile lower by the reservation, the same steps) is caught by the
    transient rule; the strict ``caught`` stays False, its twin not being within."""
    over = 1 + (over - 1) % reservation  # the step transient over the control's profile
    step_t = GIB + over
    margin = reservation - over  # the twin's transient margin
    twin = run("m-dcp2", peaks=grown_peaks(GIB + reservation, kv, margin + grown, step_t))
    ctl = run("m-dcp2-x", drop="alloc", peaks=grown_peaks(GIB, kv, margin + grown, step_t))
    doc = memory.memory_result({"m-dcp2": twin, "m-dcp2-x": ctl})
    assert doc["runs"]["m-dcp2"]["within"] is False
    assert doc["runs"]["m-dcp2"]["transient_within"] is True
    got = doc["controls"]["m-dcp2-x"]
    assert got["caught"] is False and doc["controls_caught"] is False
    assert got["caught_by_transient_rule"] is True
    assert doc["controls_caught_by_transient_rule"] is True
    assert got["reservation_bytes_by_rank"] == {"0": reservation, "1": reservation}
    # the ``all`` control: the refusal counts against the same twin by the transient rule
    msg = "rank 0: ValueError: DCP headroom check: the profiling forward reserved ..."
    refused = run("m-dcp2-x", drop="all", ok=False, error=msg)
    got = memory.memory_result({"m-dcp2": twin, "m-dcp2-x": refused})["controls"]["m-dcp2-x"]
    assert got["caught"] is False and got["caught_by_transient_rule"] is True


@settings(max_examples=50, deadline=None)
@given(old_ranks=st.sets(st.integers(0, 1), min_size=1), dcp1=st.booleans())
def test_a_record_without_the_step_start_is_not_judged_by_the_transient_rule(old_ranks, dcp1):
    """Records from before the probe kept the step's start (any rank of a run): no transient
    verdict (None, with the reason), never a pass of the headline, the baseline or a
    control."""
    new = grown_peaks(GIB, GIB, 0, GIB // 2)  # transient_within when recorded
    old = [p[:4] for p in new]
    peaks = [old[i] if i in old_ranks else new[i] for i in range(2)]
    dcp = 1 if dcp1 else 2
    r = run("m", dcp=dcp, peaks=peaks[:dcp])
    v = memory.run_verdict(r)
    recorded = dcp == 1 and 0 not in old_ranks
    assert v["within"] is True
    assert v["transient_within"] is (True if recorded else None)
    if not recorded:
        assert v["why_transient_not_judged"] == memory.UNRECORDED
        assert None in [x["transient_within"] for x in v["ranks"]]
        for kind in memory.STEP_CLASSES:
            c = v["ranks"][min(old_ranks)][kind]
            assert c["transient_within"] is None
            assert all(c[f] is None for f in memory.TRANSIENT_FIELDS)
        ctl = copy.deepcopy(r)
        ctl["name"], ctl["config"]["env"][memory.DROP_ENV] = "m-x", "alloc"
        doc = memory.memory_result({"m": r, "m-x": ctl})
        assert doc["all_transient_within"] is False
        assert doc["baseline_transient_within"] is (False if dcp == 1 else None)
        assert doc["controls"]["m-x"]["caught_by_transient_rule"] is None
        assert doc["controls_caught_by_transient_rule"] is False
        assert memory.validate(doc | {"command": "", "revision": 0, "base": 0, "machine": 0}) == []


RESERVATION_PROBE = r"""
import json
import torch.nn as nn
from gate import memory_probe
from vllm.v1.attention.ops.dcp_memory import query_route_plan

class Layer(nn.Module):
    def __init__(self, rows, reserved):
        super().__init__()
        self.dcp_step_plan = query_route_plan(rows, 16, 4, "a2a", topk=512)
        self.dcp_reserved_rows = reserved

model = nn.Sequential(Layer(8192, 8192), Layer(4096, 2048), nn.Linear(2, 2))
print(json.dumps({
    "got": memory_probe.dcp_reservation(model),
    "none": memory_probe.dcp_reservation(nn.Linear(2, 2)),
    "peak": query_route_plan(8192, 16, 4, "a2a", topk=512).peak_bytes,
}))
"""


@needs_venv
def test_the_reservation_record_reads_0016s_plans_through_its_own_largest_plan():
    """The largest plan (0016's largest_plan) and the fewest rows any layer reserved."""
    got = run_probe(RESERVATION_PROBE, timeout=300)
    assert got["none"] is None
    assert got["got"] == {
        "layers": 2,
        "reserved_rows": 2048,
        "plan_rows": 8192,
        "plan_peak_phase": "combine",
        "plan_peak_bytes": got["peak"],
    }


# --- the attention rule -------------------------------------------------------------------


def with_layer(r: dict, profile_t: int, step_t: int, cls: str = "DeepseekV32Attention") -> dict:
    """``r`` with each rank's attribution: the DSA layer's segment ``profile_t`` above its
    entry in the profile and ``step_t`` in the prefill step (decode: 1 KiB), beside an MLP
    segment that peaks higher in each."""

    def sites(t: int) -> list[dict]:
        layer = {"module": "model.layers.*.self_attn", "class": cls, "entry_bytes": GIB}
        mlp = {"module": "model.layers.*.mlp", "class": "DeepseekV2MLP", "entry_bytes": 0}
        return [mlp | {"peak_bytes": 4 * GIB}, layer | {"peak_bytes": GIB + t}]

    out = copy.deepcopy(r)
    for m in out["memory"]:
        m["attribution"] = {"profile": sites(profile_t), "prefill": sites(step_t)}
        m["attribution"]["decode"] = sites(1024)
    return out


@pytest.mark.parametrize("cls", ["DeepseekV32Attention", "Indexer"])
def test_the_attention_rule_holds_the_layer_to_its_profile_within_the_slack(cls):
    """A DSA layer (an attention or indexer segment) whose step transient is at most
    LAYER_SLACK_BYTES above its profile's is within; one byte more is not, whatever the
    strict and transient rules say of the rank."""
    slack = memory.LAYER_SLACK_BYTES
    fits = with_layer(run("m-dcp2"), GIB, GIB + slack, cls)
    over = with_layer(run("m-dcp2"), GIB, GIB + slack + 1, cls)
    got = memory.memory_result({"m-dcp2": fits})
    assert got["runs"]["m-dcp2"]["attention_within"] is True and got["all_attention_within"]
    rank = got["runs"]["m-dcp2"]["ranks"][0]["prefill"]
    assert (rank["layer_step_bytes"], rank["layer_profile_bytes"]) == (GIB + slack, GIB)
    got = memory.memory_result({"m-dcp2": over})
    assert got["runs"]["m-dcp2"]["attention_within"] is False
    assert got["runs"]["m-dcp2"]["within"] is True  # the strict rule sees nothing
    assert got["all_attention_within"] is False and memory.validate(got) == [
        f"missing {k}" for k in ("command", "revision", "base", "machine")
    ]


def test_the_attention_rule_needs_the_layers_segments():
    """Without attribution, or with no attention or indexer segment among a class's sites,
    a run is not judged by the attention rule (None, with the reason), never a pass."""
    bare = memory.memory_result({"m-dcp2": run("m-dcp2")})
    v = bare["runs"]["m-dcp2"]
    assert v["attention_within"] is None and v["why_attention_not_judged"] == (
        memory.NO_ATTRIBUTION
    )
    assert bare["all_attention_within"] is False
    no_layer = with_layer(run("m-dcp2"), GIB, GIB, cls="DeepseekV2MLP")
    v = memory.memory_result({"m-dcp2": no_layer})["runs"]["m-dcp2"]
    assert v["attention_within"] is None
    doc = memory.memory_result({"m-dcp2": run("m-dcp2")})
    doc["runs"]["m-dcp2"]["why_attention_not_judged"] = None
    assert "run m-dcp2: not judged by the attention rule, and no reason given" in (
        memory.validate(doc)
    )


def test_the_alloc_control_is_caught_by_the_attention_rule_against_a_twin_within():
    """The ``alloc`` control's layer takes in its step what its profile never allocated: caught
    when its twin's layer is within, not when the twin's is over too or unrecorded."""
    twin = with_layer(run("m-dcp2"), 2 * GIB, 2 * GIB)
    ctl = with_layer(run("m-dcp2-noalloc", drop="alloc"), 0, 2 * GIB)
    got = memory.memory_result({"m-dcp2": twin, "m-dcp2-noalloc": ctl})
    assert got["controls"]["m-dcp2-noalloc"]["caught_by_attention_rule"] is True
    assert got["controls_caught_by_attention_rule"] is True
    bad_twin = with_layer(run("m-dcp2"), 0, 2 * GIB)
    got = memory.memory_result({"m-dcp2": bad_twin, "m-dcp2-noalloc": ctl})
    assert got["controls"]["m-dcp2-noalloc"]["caught_by_attention_rule"] is False
    got = memory.memory_result({"m-dcp2": run("m-dcp2"), "m-dcp2-noalloc": ctl})
    assert got["controls"]["m-dcp2-noalloc"]["caught_by_attention_rule"] is None


def test_the_attention_rule_compares_each_layer_class_with_itself():
    """An attention segment in the step is not held to an indexer segment of the profile:
    with no class in both the rank is not judged; with both classes in both, each is held
    to its own (a step whose indexer grew fails though its attention stayed)."""
    r = with_layer(run("m-dcp2"), GIB, GIB)
    for m in r["memory"]:
        m["attribution"]["profile"][1]["class"] = "Indexer"
    v = memory.memory_result({"m-dcp2": r})["runs"]["m-dcp2"]
    assert v["attention_within"] is None
    r = with_layer(run("m-dcp2"), GIB, GIB)
    idx = {"module": "model.layers.*.self_attn.indexer", "class": "Indexer", "entry_bytes": 0}
    for m in r["memory"]:
        m["attribution"]["profile"].append(idx | {"peak_bytes": GIB // 2})
        m["attribution"]["prefill"].append(idx | {"peak_bytes": GIB})
    v = memory.memory_result({"m-dcp2": r})["runs"]["m-dcp2"]
    assert v["attention_within"] is False
    assert v["ranks"][0]["prefill"]["layer_step_bytes"] == GIB


def test_memory_result_is_named_for_its_suite_without_a_second_memory():
    """A memory result is named for the suite or queue it reports, without the suite name's
    own leading "memory-" (dcp-memory-dcp.json, not dcp-memory-memory-dcp.json)."""
    assert memory.result_name("memory-dcp") == "dcp-memory-dcp.json"
    assert memory.result_name("memory-v32n-dcp4") == "dcp-memory-v32n-dcp4.json"
    assert memory.result_name("capacity-dcp") == "dcp-memory-capacity-dcp.json"
    assert memory.result_name("long") == "dcp-memory-long.json"
    assert memory.result_name(None) == "dcp-memory-suite.json"


class _Proc:
    def __init__(self, pid: int, used: int | None) -> None:
        self.pid, self.usedGpuMemory = pid, used


class _FakeNvml:
    """pynvml's few calls the probe makes: two devices, each with its processes."""

    def __init__(self, procs: list[list[_Proc]], fail: bool = False) -> None:
        self.procs, self.fail, self.shut = procs, fail, 0

    def nvmlInit(self) -> None:
        if self.fail:
            raise RuntimeError("NVML Shared Library Not Found")

    def nvmlShutdown(self) -> None:
        self.shut += 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.procs)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[_Proc]:
        return self.procs[handle]


class _Cuda:
    def memory_reserved(self) -> int:
        return 3 << 30

    def memory_allocated(self) -> int:
        return 2 << 30


def test_memory_outside_torch_is_the_process_figure_less_torchs_reserve(monkeypatch):
    """NVML's figure for this process (its entries on every device summed, other processes'
    ignored) less torch's reserved bytes; unknown, not zero, without NVML or an entry."""
    import os

    me = os.getpid()
    nvml = _FakeNvml([[_Proc(me + 1, 9 << 30), _Proc(me, 3 << 30)], [_Proc(me, 600 << 20)]])
    monkeypatch.setattr(memory_probe, "_nvml", lambda: nvml)
    monkeypatch.setattr(memory_probe, "_cuda", lambda: _Cuda())
    mem = memory_probe.process_memory()
    assert mem["process_bytes"] == (3 << 30) + (600 << 20)
    assert mem["non_torch_bytes"] == 600 << 20
    assert mem["torch_allocated_bytes"] == 2 << 30 and nvml.shut == 1
    monkeypatch.setattr(memory_probe, "_nvml", lambda: _FakeNvml([[_Proc(me + 1, 1)]]))
    assert memory_probe.process_memory()["non_torch_bytes"] is None
    monkeypatch.setattr(memory_probe, "_nvml", lambda: _FakeNvml([], fail=True))
    assert memory_probe.process_memory()["process_bytes"] is None

    def no_vllm() -> None:
        raise ImportError("No module named 'vllm'")

    monkeypatch.setattr(memory_probe, "_nvml", no_vllm)
    assert memory_probe.process_memory()["non_torch_bytes"] is None
