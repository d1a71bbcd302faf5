# SPDX-License-Identifier: Apache-2.0
"""The gate's DCP comm ledger (gate/comm_ledger.py): exact bytes per phase, the event ring, no
synchronisation on the hot path, refusal under graph capture, disarm on error, install and
uninstall; and, in the test venv (``$PATCHSET_TEST_VENV`` or ``build/testenv``; skipped
without it), that the patched vLLM's MLADCPManager still has what it wraps."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
EVIDENCE = REPO / "evidence"
sys.path.insert(0, str(EVIDENCE))

from gate import comm_ledger, plan, worker  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent / "support"))
from venv_probe import needs_venv, run_probe  # noqa: E402


class FakeEvent:
    clock = 0.0

    def __init__(self) -> None:
        self.t: float | None = None

    def record(self) -> None:
        FakeEvent.clock += 1.5
        self.t = FakeEvent.clock

    def elapsed_time(self, end: FakeEvent) -> float:
        assert self.t is not None and end.t is not None
        return end.t - self.t


class FakeTensor:
    def __init__(self, *shape: int, elem: int = 2) -> None:
        self.shape, self._elem = shape, elem

    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    def element_size(self) -> int:
        return self._elem


def ledger(capacity: int = 4, capturing: bool = False) -> tuple[comm_ledger.CommLedger, list]:
    synced: list[int] = []
    led = comm_ledger.CommLedger(
        capacity,
        event_factory=FakeEvent,
        is_capturing=lambda: capturing,
        synchronize=lambda: synced.append(1),
    )
    return led, synced


class FakeManager:
    """The attributes of vLLM 0.34's MLADCPManager that the ledger wraps."""

    def __init__(self, world: int = 4, use_a2a: bool = True, v_up: bool = True) -> None:
        self.group = SimpleNamespace(world_size=world)
        self.use_a2a = use_a2a
        self.calls: list[str] = []
        self.query_gather = lambda q: self.calls.append("q") or "gathered"
        self.combine = lambda o, lse, **kw: self.calls.append(f"c{kw}") or "combined"
        self.v_up_proj_combine = (
            (lambda o, lse, w, out, **kw: self.calls.append("v")) if v_up else None
        )

    def kv_gather(self, gathered: Any, local: Any) -> object:
        self.calls.append("kv")
        return "kv"


def recording_bytes(seen: list) -> comm_ledger.CombineBytes:
    def combine_bytes(rows, heads, n, backend, *, v_dim, elem_bytes):  # type: ignore[no-untyped-def]
        seen.append((rows, heads, n, backend, v_dim, elem_bytes))
        return rows * heads * v_dim

    return combine_bytes


def test_each_phase_counts_what_one_rank_receives_and_calls_through() -> None:
    led, synced = ledger()
    seen: list = []
    m = FakeManager(world=4)
    comm_ledger.wrap_manager(m, led, recording_bytes(seen), v_up_proj_first_rows=8)
    assert m.query_gather(FakeTensor(3, 16, 576)) == "gathered"
    assert m.combine(FakeTensor(3, 64, 512), None, out=1) == "combined"
    m.v_up_proj_combine(FakeTensor(3, 64, 512), None, FakeTensor(64, 512, 128), None)
    m.v_up_proj_combine(FakeTensor(8, 64, 512), None, FakeTensor(64, 512, 128), None)
    assert m.kv_gather(None, FakeTensor(10, 656, elem=1)) == "kv"
    assert m.calls == ["q", "c{'out': 1}", "v", "v", "kv"]
    assert not synced  # nothing synchronised on the hot path
    # combines: local heads = gathered heads / DCP; v_up moves the latent below 8 rows
    assert seen == [
        (3, 16, 4, "a2a", 512, 2),
        (3, 16, 4, "a2a", 512, 2),
        (8, 16, 4, "a2a", 128, 2),
    ]
    s = led.summary()
    assert synced == [1]
    layer = s["layers"]["mla_dcp.0"]
    assert layer["q_gather"]["wire_bytes"] == 3 * 3 * 16 * 576 * 2
    assert layer["kv_gather"]["wire_bytes"] == 3 * 10 * 656
    assert layer["combine"]["wire_bytes"] == 3 * 16 * 512
    assert layer["v_up_proj_combine"] == {
        "calls": 2,
        "wire_bytes": 3 * 16 * 512 + 8 * 16 * 128,
        "bytes_per_call": (3 * 16 * 512 + 8 * 16 * 128) / 2,
        "timed_calls": 2,
        "mean_ms": 1.5,
        "total_ms": 3.0,
    }
    assert s["armed"] and s["disarm_reason"] is None


def test_ag_rs_managers_name_their_backend_and_absent_collectives_stay_absent() -> None:
    led, _ = ledger()
    seen: list = []
    m = FakeManager(world=2, use_a2a=False, v_up=False)
    m.query_gather = None
    comm_ledger.wrap_manager(m, led, recording_bytes(seen), v_up_proj_first_rows=8)
    assert m.query_gather is None and m.v_up_proj_combine is None
    m.combine(FakeTensor(5, 32, 512), None)
    assert seen == [(5, 16, 2, "ag_rs", 512, 2)]


def test_steps_on_the_b12x_channel_are_named_apart_from_its_nccl_fallback() -> None:
    """A manager with a b12x transport (0015) records 1..capacity rows as ``*_b12x`` phases
    and larger or empty steps under the plain names, with the same byte model."""
    led, _ = ledger()
    seen: list = []
    m = FakeManager(world=2)
    m.b12x = SimpleNamespace(serves=lambda rows: 0 < rows <= 4)  # capacity 4
    comm_ledger.wrap_manager(m, led, recording_bytes(seen), v_up_proj_first_rows=8)
    for rows in (1, 4, 5):
        m.query_gather(FakeTensor(rows, 16, 576))
        m.combine(FakeTensor(rows, 32, 512), None)
    m.query_gather(FakeTensor(0, 16, 576))
    layer = led.summary()["layers"]["mla_dcp.0"]
    assert {k: v["calls"] for k, v in layer.items()} == {
        "q_gather_b12x": 2,
        "combine_b12x": 2,
        "q_gather": 2,
        "combine": 1,
    }
    assert layer["q_gather_b12x"]["wire_bytes"] == (1 + 4) * 16 * 576 * 2
    assert layer["combine_b12x"]["wire_bytes"] == (1 + 4) * 16 * 512
    assert [s[3] for s in seen] == ["a2a"] * 3


def test_the_ring_keeps_the_last_capacity_calls_and_counts_every_call() -> None:
    led, _ = ledger(capacity=2)
    m = FakeManager()
    comm_ledger.wrap_manager(m, led, recording_bytes([]), v_up_proj_first_rows=8)
    for _ in range(5):
        m.kv_gather(None, FakeTensor(1, 1))
    got = led.summary()["layers"]["mla_dcp.0"]["kv_gather"]
    assert got["calls"] == 5 and got["timed_calls"] == 2 and got["wire_bytes"] == 5 * 3 * 2
    led.reset()
    assert led.summary()["layers"] == {}


def test_layers_are_named_in_construction_order() -> None:
    led, _ = ledger()
    a, b = FakeManager(), FakeManager()
    for m in (a, b):
        comm_ledger.wrap_manager(m, led, recording_bytes([]), v_up_proj_first_rows=8)
    b.kv_gather(None, FakeTensor(1))  # the first call comes from the second-built layer
    a.kv_gather(None, FakeTensor(5))
    layers = led.summary()["layers"]
    assert layers["mla_dcp.0"]["kv_gather"]["wire_bytes"] == 3 * 5 * 2  # a, built first
    assert layers["mla_dcp.1"]["kv_gather"]["wire_bytes"] == 3 * 1 * 2


def test_a_phase_under_graph_capture_raises_and_disarms() -> None:
    led, _ = ledger(capturing=True)
    m = FakeManager()
    comm_ledger.wrap_manager(m, led, recording_bytes([]), v_up_proj_first_rows=8)
    with pytest.raises(comm_ledger.CaptureError, match="eager runs only"):
        m.kv_gather(None, FakeTensor(1))
    s = led.summary()
    assert not s["armed"] and "capture" in s["disarm_reason"] and m.calls == []


def test_a_collective_that_raises_disarms_the_ledger_and_propagates() -> None:
    led, _ = ledger()
    m = FakeManager()

    def broken(q: Any) -> Any:
        raise OSError("peer gone")

    m.query_gather = broken
    comm_ledger.wrap_manager(m, led, recording_bytes([]), v_up_proj_first_rows=8)
    with pytest.raises(OSError, match="peer gone"):
        m.query_gather(FakeTensor(1, 1))
    m.kv_gather(None, FakeTensor(1))  # still served, no longer counted
    s = led.summary()
    assert not s["armed"] and "q_gather raised OSError: peer gone" in s["disarm_reason"]
    assert s["layers"] == {} and m.calls == ["kv"]


def test_install_wraps_later_instances_once_and_uninstalls() -> None:
    class Manager(FakeManager):
        pass

    led, _ = ledger()
    before = Manager()
    undo = comm_ledger.install(Manager, led, recording_bytes([]), 8)
    with pytest.raises(RuntimeError, match="already has a comm ledger"):
        comm_ledger.install(Manager, led, recording_bytes([]), 8)
    after = Manager()
    before.kv_gather(None, FakeTensor(1))
    after.kv_gather(None, FakeTensor(1))
    assert list(led.summary()["layers"]) == ["mla_dcp.0"]
    undo()
    Manager().kv_gather(None, FakeTensor(1))
    assert led.summary()["layers"]["mla_dcp.0"]["kv_gather"]["calls"] == 1


@pytest.mark.parametrize("capacity", [0, -1, True, 2.0])
def test_capacity_is_a_positive_int(capacity: Any) -> None:
    with pytest.raises(ValueError, match="capacity must be an int >= 1"):
        comm_ledger.CommLedger(
            capacity, event_factory=FakeEvent, is_capturing=bool, synchronize=int
        )


def _cfg(**over: Any) -> plan.GateConfig:
    base: dict[str, Any] = dict(
        name="x",
        model="/m",
        tp=2,
        dcp=2,
        variant="patched",
        engine_extra={"dcp_comm_ledger_size": 8},
    )
    base.update(over)
    return plan.GateConfig(**base)


def test_the_ledger_key_never_reaches_vllm_and_needs_an_eager_run() -> None:
    assert "dcp_comm_ledger_size" not in worker.engine_kwargs(_cfg())
    assert not [p for p in _cfg().problems() if "ledger" in p]
    with pytest.raises(ValueError, match="dcp_comm_ledger_size needs an eager run"):
        _cfg(graphs=True)


PROBE = r"""
import inspect, json
from vllm.v1.attention.ops import dcp, dcp_b12x
from vllm.v1.attention.ops.dcp_wire_model import combine_bytes
src = inspect.getsource(dcp.MLADCPManager.__init__)
print(json.dumps({
    "assigned": [a for a in ("self.group =", "self.use_a2a =", "self.combine =",
                             "self.query_gather =", "self.v_up_proj_combine",
                             "self.b12x =")
                 if a in src],
    "b12x_serves": callable(getattr(dcp_b12x.B12xDCPTransport, "serves", None)),
    "kv_gather": callable(getattr(dcp.MLADCPManager, "kv_gather", None)),
    "v_up_rows": dcp._V_UP_PROJ_FIRST_MIN_TOKENS,
    "params": list(inspect.signature(combine_bytes).parameters),
}))
"""


@needs_venv
def test_the_patched_vllm_has_what_the_ledger_wraps() -> None:
    got = run_probe(PROBE, timeout=300)
    assert len(got["assigned"]) == 6 and got["kv_gather"] and got["b12x_serves"]
    assert isinstance(got["v_up_rows"], int) and got["v_up_rows"] > 0
    assert got["params"][:4] == ["num_rows", "num_local_heads", "dcp_size", "comm_backend"]
    assert {"v_dim", "elem_bytes"} <= set(got["params"])
