# SPDX-License-Identifier: Apache-2.0
"""The memory probe's per-module peak attribution (gate/memory_probe.py ``attribution``) and
its way into the memory test (gate/memory.py ``peak_at``) and the results tables, on CPU:
a stand-in for torch.cuda whose peak statistic behaves as torch's, stand-in modules that
run their forward hooks as ``torch.nn.Module.__call__`` does, and a stand-in vLLM worker
whose methods the probe wraps (tests/test_gate_memory.py checks the real ones' signatures)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

EVIDENCE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(EVIDENCE))
sys.path.insert(0, str(EVIDENCE / "tests"))
sys.path.insert(0, str(EVIDENCE / "tests" / "support"))

import results_tables  # noqa: E402
from gate import memory, memory_probe  # noqa: E402
from test_gate_memory import grown_peaks, rank_mem, run  # noqa: E402
from venv_probe import needs_venv, run_probe  # noqa: E402

KV = 5000


class FakeCuda:
    """torch.cuda's allocator counters: the peak statistic is the largest allocated since
    its last reset, which restarts it at what is allocated."""

    def __init__(self) -> None:
        self.allocated = self.peak = 1000
        self.capturing = False
        self.resets = 0

    def alloc(self, n: int) -> None:
        self.allocated += n
        self.peak = max(self.peak, self.allocated)

    def free(self, n: int) -> None:
        self.allocated -= n

    def synchronize(self) -> None:
        pass

    def memory_allocated(self) -> int:
        return self.allocated

    def max_memory_allocated(self) -> int:
        return self.peak

    def max_memory_reserved(self) -> int:
        return self.peak + 7

    def reset_peak_memory_stats(self) -> None:
        self.peak = self.allocated
        self.resets += 1

    def is_current_stream_capturing(self) -> bool:
        return self.capturing


class Module:
    """A stand-in nn.Module. Its forward runs ``plan`` with ``n`` tokens: a child's name
    calls it, an int allocates that many bytes per token and frees them, ``("hold", b)``
    keeps b bytes per token until the forward returns."""

    def __init__(self, cuda: FakeCuda, plan: tuple, children: dict[str, Module]) -> None:
        self.cuda, self.plan, self.children = cuda, plan, children
        self.pre: list = []
        self.post: list = []

    def named_modules(self, prefix: str = ""):
        yield prefix, self
        for name, child in self.children.items():
            yield from child.named_modules(f"{prefix}.{name}" if prefix else name)

    def register_forward_pre_hook(self, hook: Any) -> None:
        self.pre.append(hook)

    def register_forward_hook(self, hook: Any) -> None:
        self.post.append(hook)

    def __call__(self, n: int) -> None:
        for hook in self.pre:
            hook(self, (n,))
        self.forward(n)
        for hook in self.post:
            hook(self, (n,), None)

    def forward(self, n: int) -> None:
        held = 0
        for item in self.plan:
            if isinstance(item, str):
                self.children[item](n)
            elif isinstance(item, tuple):
                held += item[1] * n
                self.cuda.alloc(item[1] * n)
            else:
                self.cuda.alloc(item * n)
                self.cuda.free(item * n)
        self.cuda.free(held)


def toy_model(cuda: FakeCuda, sizes: dict[str, int] | None = None) -> Module:
    """Two decoder layers of self_attn (holding a buffer around its indexer and attention
    op), MoE and a norm; an embedding transient outside any hooked module; the logits."""
    s = {
        "embed": 3,
        "norm": 20,
        "attn_hold": 100,
        "attn_own": 10,
        "indexer": 300,
        "attn_op": 50,
        "moe": 80,
        "logits": 40,
    } | (sizes or {})

    def mod(cls: str, *plan: Any, **children: Module) -> Module:
        return type(cls, (Module,), {})(cuda, plan, children)

    def layer() -> Module:
        attn = mod(
            "DeepseekV2MLAAttention",
            s["attn_own"],
            ("hold", s["attn_hold"]),
            "indexer",
            "attn",
            s["attn_own"],
            indexer=mod("Indexer", s["indexer"]),
            attn=mod("MLAAttention", s["attn_op"]),
        )
        return mod(
            "DeepseekV2DecoderLayer",
            "input_layernorm",
            "self_attn",
            "mlp",
            input_layernorm=mod("RMSNorm", s["norm"]),
            self_attn=attn,
            mlp=mod("DeepseekV2MoE", s["moe"]),
        )

    layers = mod("ModuleList", "0", "1", **{"0": layer(), "1": layer()})
    return mod(
        "ToyForCausalLM",
        "model",
        model=mod("DeepseekV2Model", s["embed"], "layers", layers=layers),
        logits_processor=mod("LogitsProcessor", s["logits"]),
    )


class Worker:
    """vLLM's Worker as the probe sees it: the profiling forward at 8 tokens in
    ``determine_available_memory``, the model in ``execute_model``, logits and a sampler
    transient in ``sample_tokens``. ``exposed=False`` hides the model from the probe (the
    probe without attribution)."""

    def __init__(self, model: Module, cuda: FakeCuda, exposed: bool = True) -> None:
        self.net, self.cuda = model, cuda
        self.model_runner = SimpleNamespace(get_model=lambda: model) if exposed else None
        self.cache_config = SimpleNamespace(kv_cache_memory_bytes=KV)
        self.capture_in: str | None = None

    def determine_available_memory(self) -> int:
        self.net(8)
        self.net.children["logits_processor"](8)
        return KV

    def execute_model(self, scheduler_output: Any) -> str:
        self.net(max(scheduler_output.num_scheduled_tokens.values()))
        return "out"

    def sample_tokens(self, grammar_output: Any) -> str:
        self.net.children["logits_processor"](grammar_output)
        self.cuda.alloc(70)  # the sampler
        self.cuda.free(70)
        return "sampled"


@pytest.fixture
def fresh_probe(monkeypatch: pytest.MonkeyPatch):
    """A probe with fresh state wrapping a fresh stand-in Worker class (vLLM not imported)."""
    return lambda: _install(monkeypatch)


def _install(mp: pytest.MonkeyPatch) -> FakeCuda:
    cuda = FakeCuda()
    mp.setattr(memory_probe, "_cuda", lambda: cuda)
    mp.setattr(memory_probe, "_STATE", {**memory_probe._STATE, "steps": {}, "attribution": {}})
    mp.delenv(memory_probe.DROP_RESERVATION_ENV, raising=False)
    gpu_worker = ModuleType("vllm.v1.worker.gpu_worker")
    gpu_worker.Worker = type("Worker", (Worker,), {})
    for name in ("vllm", "vllm.v1", "vllm.v1.worker"):
        mp.setitem(sys.modules, name, ModuleType(name))
    sys.modules["vllm.v1.worker"].gpu_worker = gpu_worker
    mp.setitem(sys.modules, "vllm.v1.worker.gpu_worker", gpu_worker)
    memory_probe.install()
    return cuda


def serve(cuda: FakeCuda, exposed: bool = True, sizes: dict | None = None) -> dict:
    """Start-up (the profiling forward), a prefill of 4 and 2 tokens, two decode steps;
    the rank's snapshot."""
    from vllm.v1.worker import gpu_worker

    w = gpu_worker.Worker(toy_model(cuda, sizes), cuda, exposed)
    assert w.determine_available_memory() == KV
    for n in (4, 2, 1, 1):
        assert w.execute_model(SimpleNamespace(num_scheduled_tokens={"a": n})) == "out"
        assert w.sample_tokens(n) == "sampled"
    return memory_probe.snapshot()


def untimed(snap: dict) -> dict:
    """A snapshot's step classes without their wall times (``step_seconds``)."""
    return {
        k: {f: v for f, v in c.items() if f != "step_seconds"} for k, c in snap["steps"].items()
    }


SIZES = st.fixed_dictionaries(
    {
        k: st.integers(0, 400)
        for k in ("embed", "norm", "attn_hold", "attn_own", "indexer", "attn_op", "moe", "logits")
    }
)


@settings(max_examples=60, deadline=None)
@given(sizes=SIZES)
def test_step_peaks_are_the_largest_segment_and_as_without_attribution(sizes):
    """(a) Whatever module allocates most: every profile and step-class peak the probe
    records with hooks is the one it records without them, and the largest segment's."""
    with pytest.MonkeyPatch.context() as mp:
        plain = serve(_install(mp), exposed=False, sizes=sizes)
    with pytest.MonkeyPatch.context() as mp:
        got = serve(_install(mp), sizes=sizes)
    assert got["profile"] == plain["profile"] and untimed(got) == untimed(plain)
    assert plain["attribution"]["profile"][0]["module"] == "outside modules"
    for kind, peak in (
        ("profile", got["profile"]["peak_bytes"]),
        ("prefill", got["steps"]["prefill"]["peak_bytes"]),
        ("decode", got["steps"]["decode"]["peak_bytes"]),
    ):
        sites = got["attribution"][kind]
        assert sites[0]["peak_bytes"] == peak == max(s["peak_bytes"] for s in sites)
        assert len({s["module"].replace(".1.", ".0.") for s in sites}) == len(sites) <= 3


@settings(max_examples=60, deadline=None)
@given(
    steps=st.lists(
        st.tuples(st.integers(1, 6), st.integers(0, 5000), st.integers(0, 3)), min_size=1
    )
)
def test_each_class_keeps_the_start_of_the_step_that_set_its_peak(steps):
    """Steps of (tokens, bytes the engine keeps from then on, sampler bytes per token) with
    the sampling folded in: each class's ``peak_step_start_bytes`` is the allocated bytes at
    the start of the (first) step with the class's largest peak, not of a later step, and its
    transient is that step's own; a failed step records where it started."""
    with pytest.MonkeyPatch.context() as mp:
        cuda = _install(mp)
        from vllm.v1.worker import gpu_worker  # the stand-in _install put there

        w = gpu_worker.Worker(toy_model(cuda), cuda)
        w.determine_available_memory()
        seen: dict[str, list[tuple[int, int]]] = {}  # class -> (peak, start) per step
        for tokens, kept, sampler in steps:
            cuda.alloc(kept)  # between steps: what the engine allocates and keeps
            start, high = cuda.allocated, cuda.allocated

            def watch(n: int, alloc=cuda.alloc) -> None:
                nonlocal high
                alloc(n)
                high = max(high, cuda.allocated)

            cuda.alloc = watch  # the step's own high-water mark, apart from the probe's
            w.execute_model(SimpleNamespace(num_scheduled_tokens={"a": tokens}))
            w.sample_tokens(tokens * sampler)
            del cuda.alloc
            kind = "prefill" if tokens > 1 else "decode"
            seen.setdefault(kind, []).append((high, start))
        snap = memory_probe.snapshot()
        for kind, got in seen.items():
            peak, start = max(got, key=lambda x: x[0])  # the first of the largest
            step = snap["steps"][kind]
            assert (step["peak_bytes"], step["peak_step_start_bytes"]) == (peak, start)
        cuda.alloc(7)
        start = cuda.allocated
        dict(w.net.named_modules())["model.layers.0.mlp"].forward = boom
        with pytest.raises(MemoryError):
            w.execute_model(SimpleNamespace(num_scheduled_tokens={"a": 3}))
        assert memory_probe.snapshot()["failed_step"]["start_bytes"] == start


def test_a_transient_in_a_nested_module_is_the_inner_modules(fresh_probe, monkeypatch):
    """(b) The indexer's transient, allocated while its parent holds a buffer, is the
    indexer's (its entry includes the parent's buffer), not its parent's, which keeps its
    own; a norm's (not hooked) is its decoder layer's; the sampler's is outside modules."""
    monkeypatch.setattr(memory_probe, "TOP_SITES", 10)
    cuda = fresh_probe()
    base = cuda.allocated
    got = serve(cuda)["attribution"]["prefill"]  # the 4-token step
    assert [(s["module"], s["class"], s["peak_bytes"] - s["entry_bytes"]) for s in got] == [
        ("model.layers.0.self_attn.indexer", "Indexer", 300 * 4),
        ("model.layers.0.self_attn.attn", "MLAAttention", 50 * 4),
        ("model.layers.0.self_attn", "DeepseekV2MLAAttention", 10 * 4),
        ("model.layers.0.mlp", "DeepseekV2MoE", 80 * 4),
        ("logits_processor", "LogitsProcessor", 40 * 4),
        ("model.layers.0", "DeepseekV2DecoderLayer", 20 * 4),
        ("outside modules", "", 70),
    ]
    assert got[0]["entry_bytes"] == base + 100 * 4


def boom(n: int) -> None:
    raise MemoryError("CUDA out of memory")


def test_the_profiling_forward_is_attributed_and_a_failed_step_names_its_module(fresh_probe):
    """(c) The profiling forward's peak (8 tokens) is named with its transient; a step that
    raised inside the attention op keeps that module, and closes its span."""
    cuda = fresh_probe()
    snap = serve(cuda)
    top = snap["attribution"]["profile"][0]
    assert top["module"] == "model.layers.0.self_attn.indexer"
    assert top["peak_bytes"] == snap["profile"]["peak_bytes"]
    assert top["peak_bytes"] - top["entry_bytes"] == 300 * 8
    from vllm.v1.worker import gpu_worker

    w = gpu_worker.Worker(toy_model(cuda), cuda)
    w.determine_available_memory()
    dict(w.net.named_modules())["model.layers.1.self_attn.attn"].forward = boom
    with pytest.raises(MemoryError):
        w.execute_model(SimpleNamespace(num_scheduled_tokens={"a": 9}))
    snap = memory_probe.snapshot()
    assert snap["failed_step"]["tokens"] == 9
    assert snap["attribution"]["failed_step"]["raised_in"] == "model.layers.1.self_attn.attn"
    assert memory_probe._STATE["span"] is None


def test_the_hooks_are_inert_outside_a_measured_span_and_during_capture(fresh_probe):
    """(e) A forward outside the profile and the steps (vLLM's warm-up), or while a CUDA
    graph is being captured, neither resets the peak statistic nor moves the attribution."""
    cuda = fresh_probe()
    serve(cuda)
    from vllm.v1.worker import gpu_worker

    w = gpu_worker.Worker(toy_model(cuda), cuda)
    w.net(3)  # a model other than the hooked one: no hooks at all
    hooked = memory_probe.model_of(w)
    assert memory_probe.install_hooks(hooked) > 0 and memory_probe.install_hooks(hooked) == 0
    before, resets = memory_probe.snapshot(), cuda.resets
    w.net(50)  # no span open
    assert cuda.resets == resets
    memory_probe.open_span(cuda)
    cuda.capturing = True
    w.net(50)
    cuda.capturing = False
    span = memory_probe.close_span()
    assert cuda.resets == resets + 2  # the span's open and close only
    assert [s["module"] for s in span.top()] == ["outside modules"]
    assert span.peak_bytes == cuda.allocated + 300 * 50 + 100 * 50
    assert memory_probe.snapshot() == before


def test_the_memory_test_and_the_tables_carry_where_the_peak_was(tmp_path, monkeypatch):
    """(d) Each rank's attribution reaches the memory test as ``peak_at`` (with the
    transient) and the failed step's module; the table names the module of the rank with
    the largest peak; a record without attribution reads "-"."""
    gib = 1 << 30

    def site(module: str, peak: int, entry: int) -> dict:
        return {"module": module, "class": "X", "peak_bytes": peak, "entry_bytes": entry}

    r = run(
        "m-dcp2",
        peaks=[(3 * gib, 2 * gib, 4 * gib, 3 * gib), (3 * gib, 2 * gib, 4 * gib + 1, 3 * gib)],
    )
    for rank, m in enumerate(r["memory"]):
        m["attribution"] = {
            "profile": [site("model.layers.2.self_attn.indexer", 3 * gib, 2 * gib)],
            "prefill": [
                site(f"model.layers.{rank}.self_attn.attn", 4 * gib + rank, 3 * gib),
                site("outside modules", gib, gib),
            ],
            "failed_step": {"raised_in": "model.layers.1.mlp", "top": []},
        }
    r["memory"][1]["failed_step"] = {"kind": "prefill", "tokens": 9, "peak_bytes": 1}
    verdict = memory.run_verdict(r)
    at = verdict["ranks"][1]["peak_at"]
    assert at["prefill"][0]["transient_bytes"] == gib + 1 and at["decode"] is None
    assert at["profile"][0]["module"] == "model.layers.2.self_attn.indexer"
    assert verdict["failed_steps"][0]["raised_in"] == "model.layers.1.mlp"
    assert memory.rank_verdict(rank_mem(0, gib, gib, gib, gib))["peak_at"] is None
    ranks = verdict["ranks"]
    prefill = results_tables.peak_site(ranks, "prefill", lambda v: v["prefill"]["peak_bytes"])
    assert prefill == "self_attn.attn (L1) +1.00"  # rank 1 peaked higher
    assert results_tables.peak_site(ranks, "profile", lambda v: v["profiled_peak_bytes"]) == (
        "self_attn.indexer (L2) +1.00"
    )
    assert results_tables.peak_site(ranks, "decode", lambda v: 0) == "-"
    doc = memory.memory_result({"m-dcp2": r, "m-old": run("m-old")})
    (tmp_path / "dcp-memory.json").write_text(json.dumps(doc))
    monkeypatch.setattr(results_tables, "RESULTS", tmp_path)
    rows = [x for x in results_tables.memory_section() if x.startswith("| `m-")]
    assert rows[0].endswith("| self_attn.attn (L1) +1.00 | self_attn.indexer (L2) +1.00 |")
    assert rows[1].startswith("| `m-old` |") and rows[1].endswith("| 1.50 | - | - | - | - | - |")


def test_the_table_shows_the_transient_margin_and_what_grew(tmp_path, monkeypatch):
    """The transient rule's columns (the smallest transient margin, the largest growth since
    the profile, over ranks and step classes) and its verdicts in the header sentence."""
    gib = 1 << 30
    r = run("m-dcp2", peaks=grown_peaks(gib, gib, 3 * gib // 4, gib // 2))  # over by 0.25
    r["memory"][1]["steps"]["decode"]["peak_bytes"] += gib // 4  # transient margin 0.25
    prefill = r["memory"][0]["steps"]["prefill"]
    prefill["peak_bytes"] += gib // 4  # the same transient from a start 0.25 GiB higher
    prefill["peak_step_start_bytes"] += gib // 4
    doc = memory.memory_result({"m-dcp2": r})
    (tmp_path / "dcp-memory.json").write_text(json.dumps(doc))
    monkeypatch.setattr(results_tables, "RESULTS", tmp_path)
    out = results_tables.memory_section()
    header = next(x for x in out if x.startswith("| run |")).split(" | ")
    row = next(x for x in out if x.startswith("| `m-dcp2`")).split(" | ")
    got = dict(zip(header, row, strict=True))
    assert got["transient margin"] == "0.25" and got["grown since profile"] == "1.00"
    assert got["within"] == "False"
    sentence = next(x for x in out if x.startswith("Rule:"))
    assert "All DCP runs transient-within: True (DCP = 1 baseline: None)" in sentence
    assert "negative controls caught by it: False" in sentence


TORCH_PROBE = r"""
import json
import torch.nn as nn
from gate import memory_probe

class Cuda:
    allocated = peak = 0
    def alloc(self, n):
        self.allocated += n
        self.peak = max(self.peak, self.allocated)
        self.allocated -= n
    def memory_allocated(self): return self.allocated
    def max_memory_allocated(self): return self.peak
    def max_memory_reserved(self): return self.peak
    def reset_peak_memory_stats(self): self.peak = self.allocated
    def is_current_stream_capturing(self): return False
cuda = Cuda()

class Indexer(nn.Module):
    def forward(self, x):
        cuda.alloc(300)
        return x

class DeepseekV2MLAAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.indexer = Indexer()
    def forward(self, x):
        cuda.alloc(10)
        return self.indexer(x) + 1

class DeepseekV2DecoderLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.self_attn = DeepseekV2MLAAttention()
    def forward(self, x):
        cuda.alloc(5)
        return self.self_attn(x)

model = nn.Module()
model.layers = nn.ModuleList([DeepseekV2DecoderLayer() for _ in range(2)])
hooked = memory_probe.install_hooks(model)
span = memory_probe.open_span(cuda)
for layer in model.layers:
    layer(1)
memory_probe.close_span()
print(json.dumps({"hooked": hooked, "top": span.top()}))
"""


@needs_venv
def test_real_torch_modules_fire_the_hooks_the_probe_registers():
    """With torch.nn.Module (the test venv): each hooked module's pre and post hook fire
    around its forward, the inner module owning its own transient."""
    got = run_probe(TORCH_PROBE, timeout=300)
    assert got["hooked"] == 6
    assert [(s["module"], s["peak_bytes"]) for s in got["top"]] == [
        ("layers.0.self_attn.indexer", 300),
        ("layers.0.self_attn", 10),
        ("layers.0", 5),
    ]


def test_a_profiled_pool_is_refused_before_any_cut(fresh_probe):
    """vLLM sizes a pool without kv_cache_memory_bytes from torch's peak inside
    determine_available_memory: the cuts would reset it, so the probe refuses."""
    cuda = fresh_probe()
    from vllm.v1.worker import gpu_worker

    w = gpu_worker.Worker(toy_model(cuda), cuda)
    w.cache_config.kv_cache_memory_bytes = None
    with pytest.raises(RuntimeError, match="kv_cache_memory_bytes"):
        w.determine_available_memory()
