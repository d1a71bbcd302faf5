# SPDX-License-Identifier: Apache-2.0
"""The gate harness's DCP communication ledger: per MLA layer and phase, the calls, the exact
wire bytes and CUDA-event times of the collectives vLLM's ``MLADCPManager`` owns.

Until vLLM 0.34.0 the series carried this as patch 0009 (``dcp_comm_ledger_size``); it left the
series (design/upstreaming.md says why) and lives here, outside vLLM: ``install`` wraps every
``MLADCPManager`` built afterwards in this process. The gate engines run in the worker's own
process (external_launcher), so the worker installs it before it builds the engine.

Guarantees:
- bytes are what one rank receives per call, from the tensors' shapes (the byte model of the
  packed-CKV patch, ``dcp_wire_model.combine_bytes``, for the combines); nothing is synchronised
  on the hot path (two event records per call; ``summary`` synchronises);
- eager runs only: a FULL CUDA graph replays no Python, so a ledger could only miss those
  calls. A phase recorded while a stream captures raises instead of returning a partial count;
- a wrapped collective that raises disarms the ledger with the reason (its summary says so and
  ``gate/ledger.py`` refuses it), the exception propagates unchanged.

Phases: ``q_gather``, ``combine``, ``v_up_proj_combine`` and ``kv_gather``, the collectives the
manager exposes. A manager on b12x's channel (0015, ``dcp_comm_backend="b12x"``) records the
steps the channel serves as ``q_gather_b12x`` and ``combine_b12x`` and the larger ones, which
take its NCCL fallback, under the plain names; the channel moves what the NCCL all-gather and
the a2a combine move (each rank reads its peers' query slices, and their partial outputs and
LSE for its own heads), so the bytes use the same model and the two sit side by side. A
phase's time includes what wrapped the collective before the ledger did (in the gate worker,
the fault hook's LSE shift on ``combine``). The packed-CKV route's steps
(0007), which 0009 also timed, run inside one method and are not recorded.
"""

from __future__ import annotations

import collections
import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

PHASES = (
    "q_gather",
    "combine",
    "v_up_proj_combine",
    "kv_gather",
    "q_gather_b12x",
    "combine_b12x",
)
CombineBytes = Callable[..., int]


class CaptureError(RuntimeError):
    """A ledger phase ran while a CUDA graph was being captured."""


class CommLedger:
    """Calls and bytes per (layer, phase); the last ``capacity`` calls' event pairs."""

    def __init__(
        self,
        capacity: int,
        *,
        event_factory: Callable[[], Any] | None = None,
        is_capturing: Callable[[], bool] | None = None,
        synchronize: Callable[[], None] | None = None,
    ) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"capacity must be an int >= 1, got {capacity!r}")
        if event_factory is None or is_capturing is None or synchronize is None:
            import torch

            event_factory = event_factory or functools.partial(torch.cuda.Event, enable_timing=True)
            is_capturing = is_capturing or torch.cuda.is_current_stream_capturing
            synchronize = synchronize or torch.cuda.synchronize
        self.capacity = capacity
        self._event = event_factory
        self._capturing = is_capturing
        self._synchronize = synchronize
        self._layers: list[str] = []
        self.reset()

    def register_layer(self) -> str:
        """A new layer's name, ``mla_dcp.<n>`` in construction order (the order of the model's
        attention layers)."""
        name = f"mla_dcp.{len(self._layers)}"
        self._layers.append(name)
        return name

    def reset(self) -> None:
        self.armed = True
        self.disarm_reason: str | None = None
        self._calls: dict[tuple[str, str], int] = collections.Counter()
        self._bytes: dict[tuple[str, str], int] = collections.Counter()
        self._events: dict[tuple[str, str], collections.deque] = {}

    @contextmanager
    def phase(self, layer: str, name: str, nbytes: int) -> Iterator[None]:
        if name not in PHASES:
            raise ValueError(f"unknown phase {name!r}; valid: {', '.join(PHASES)}")
        if not self.armed:
            yield
            return
        if self._capturing():
            self.armed = False
            self.disarm_reason = f"{layer}/{name} ran under CUDA-graph capture"
            raise CaptureError(
                "the gate's comm ledger records eager runs only (a FULL graph replays no "
                f"Python): {layer}/{name} ran under CUDA-graph capture"
            )
        start, end = self._event(), self._event()
        start.record()
        try:
            yield
        except BaseException as e:
            self.armed = False
            self.disarm_reason = f"{layer}/{name} raised {type(e).__name__}: {e}"
            raise
        end.record()
        key = (layer, name)
        self._calls[key] += 1
        self._bytes[key] += int(nbytes)
        ring = self._events.setdefault(key, collections.deque(maxlen=self.capacity))
        ring.append((start, end))

    def summary(self) -> dict[str, Any]:
        """Per layer and phase: calls, wire bytes, bytes per call and the mean / total ms of
        the timed (last ``capacity``) calls. Synchronises the device first."""
        self._synchronize()
        layers: dict[str, dict[str, Any]] = {}
        for key in sorted(self._calls):
            layer, name = key
            calls, wire = self._calls[key], self._bytes[key]
            times = [s.elapsed_time(e) for s, e in self._events.get(key, ())]
            layers.setdefault(layer, {})[name] = {
                "calls": calls,
                "wire_bytes": wire,
                "bytes_per_call": wire / calls if calls else 0.0,
                "timed_calls": len(times),
                "mean_ms": sum(times) / len(times) if times else None,
                "total_ms": sum(times),
            }
        return {
            "capacity": self.capacity,
            "armed": self.armed,
            "disarm_reason": self.disarm_reason,
            "layers": layers,
        }


def wrap_manager(
    manager: Any, ledger: CommLedger, combine_bytes: CombineBytes, v_up_proj_first_rows: int
) -> None:
    """Route one manager's collectives through ``ledger`` (instance attributes only)."""
    layer = ledger.register_layer()
    n = manager.group.world_size
    backend = "a2a" if manager.use_a2a else "ag_rs"
    b12x = getattr(manager, "b12x", None)

    def on_channel(name: str, rows: int) -> str:
        # the b12x transport's own branch (B12xDCPTransport.serves)
        return f"{name}_b12x" if b12x is not None and b12x.serves(rows) else name

    if manager.query_gather is not None:
        gather = manager.query_gather

        def query_gather(query: Any) -> Any:
            nbytes = (n - 1) * query.numel() * query.element_size()
            with ledger.phase(layer, on_channel("q_gather", query.shape[0]), nbytes):
                return gather(query)

        manager.query_gather = query_gather

    combine = manager.combine

    def ledgered_combine(partial_output: Any, partial_lse: Any, **kwargs: Any) -> Any:
        rows, heads = partial_output.shape[0], partial_output.shape[1] // n
        nbytes = combine_bytes(
            rows,
            heads,
            n,
            backend,
            v_dim=partial_output.shape[-1],
            elem_bytes=partial_output.element_size(),
        )
        with ledger.phase(layer, on_channel("combine", rows), nbytes):
            return combine(partial_output, partial_lse, **kwargs)

    manager.combine = ledgered_combine

    if manager.v_up_proj_combine is not None:
        v_up = manager.v_up_proj_combine

        def v_up_proj_combine(out_: Any, lse: Any, w_uv: Any, out: Any, **kwargs: Any) -> None:
            rows, heads = out_.shape[0], out_.shape[1] // n
            # from v_up_proj_first_rows rows the a2a moves W_UV-projected rows, below it the
            # latent partials (vLLM merges them first)
            width = w_uv.shape[-1] if rows >= v_up_proj_first_rows else out_.shape[-1]
            nbytes = combine_bytes(
                rows, heads, n, "a2a", v_dim=width, elem_bytes=out_.element_size()
            )
            with ledger.phase(layer, "v_up_proj_combine", nbytes):
                v_up(out_, lse, w_uv, out, **kwargs)

        manager.v_up_proj_combine = v_up_proj_combine

    kv_gather = manager.kv_gather

    def ledgered_kv_gather(gathered_kv: Any, local_kv: Any) -> object:
        with ledger.phase(layer, "kv_gather", (n - 1) * local_kv.numel() * local_kv.element_size()):
            return kv_gather(gathered_kv, local_kv)

    manager.kv_gather = ledgered_kv_gather


def install(
    manager_cls: type,
    ledger: CommLedger,
    combine_bytes: CombineBytes,
    v_up_proj_first_rows: int,
) -> Callable[[], None]:
    """Wrap every ``manager_cls`` instance built from now on; returns the uninstaller.
    Refuses a class that is already wrapped."""
    original = manager_cls.__init__
    if getattr(original, "_comm_ledger", False):
        raise RuntimeError(f"{manager_cls.__name__} already has a comm ledger installed")

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        wrap_manager(self, ledger, combine_bytes, v_up_proj_first_rows)

    __init__._comm_ledger = True  # type: ignore[attr-defined]
    manager_cls.__init__ = __init__  # type: ignore[method-assign]

    def uninstall() -> None:
        manager_cls.__init__ = original  # type: ignore[method-assign]

    return uninstall


def install_in_vllm(capacity: int) -> CommLedger:
    """The worker's entry: a ledger on vLLM's ``MLADCPManager`` of the imported tree, with the
    byte model of the packed-CKV patch (0007). Fails when the tree lacks either."""
    from vllm.v1.attention.ops import dcp
    from vllm.v1.attention.ops.dcp_wire_model import combine_bytes

    ledger = CommLedger(capacity)
    install(dcp.MLADCPManager, ledger, combine_bytes, dcp._V_UP_PROJ_FIRST_MIN_TOKENS)
    return ledger
