# SPDX-License-Identifier: Apache-2.0
"""CPU proofs of the DCP fp8 wire (vLLM 0.33): the codec (vllm/v1/attention/ops/
dcp_fp8_wire.py), its byte model (dcp_wire_model.py) and the shipped query-gather method
of MLADCPManager (dcp.py, loaded as in the packed-CKV glue proof)."""

from __future__ import annotations

import math
import sys
from types import SimpleNamespace
from unittest import mock

import torch
from conftest import load_leaf
from hypothesis import given, settings
from hypothesis import strategies as st

wire = load_leaf("vllm/v1/attention/ops/dcp_fp8_wire.py")
model = load_leaf("vllm/v1/attention/ops/dcp_wire_model.py")


def _load_dcp():
    import test_dcp_packed_ckv_glue as glue_proof

    return glue_proof._load_glue()[0]


dcp = _load_dcp()

# e4m3: 3 mantissa bits -> relative rounding error <= 2^-4 for normals;
# subnormal spacing 2^-9 -> absolute error <= 2^-10 * scale.
REL = 2.0**-4
ABS_SUB = 2.0**-10


def e4m3_bound(x: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    per_elem = scales.repeat_interleave(wire.QUANT_TILE, dim=-1)
    return x.abs() * REL * (1 + 1e-6) + per_elem * ABS_SUB * (1 + 1e-6)


magnitudes = st.sampled_from([0.0, 1e-30, 1e-8, 1e-3, 1.0, 37.0, 1e4, 1e30, 3e38])


@settings(max_examples=200, deadline=None)
@given(
    rows=st.integers(1, 6),
    magnitude=magnitudes,
    zero_tile=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_round_trip_within_e4m3_bound_per_tile(rows, magnitude, zero_tile, seed):
    """Every decoded value is within the e4m3 rounding bound of its 128-value tile's
    scale, and every scale is finite and non-zero."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, 512, generator=g, dtype=torch.float64) * magnitude
    x = x.clamp(-3.3e38, 3.3e38).float()
    if zero_tile:
        x[:, :128] = 0.0
    codes, scales = wire.quantize_tiles(x)
    assert torch.isfinite(scales).all() and (scales > 0).all()
    y = wire.dequantize_tiles(codes, scales)
    assert torch.isfinite(y).all()
    err = (y.double() - x.double()).abs()
    assert (err <= e4m3_bound(x.double(), scales.double())).all()


@settings(max_examples=50, deadline=None)
@given(
    special=st.sampled_from([float("inf"), float("-inf"), float("nan")]),
    seed=st.integers(0, 1000),
)
def test_scales_stay_finite_on_non_finite_input(special, seed):
    """Non-finite inputs never produce a zero, inf or NaN scale."""
    x = torch.randn(3, 512, generator=torch.Generator().manual_seed(seed))
    x[1, 5] = special
    _, scales = wire.quantize_tiles(x)
    assert torch.isfinite(scales).all() and (scales > 0).all()


def _shipped_manager(rank: int, world: int, wires: list[torch.Tensor]):
    """MLADCPManager from the patched dcp.py on a simulated group whose all_gather
    concatenates the ranks' wire rows (the peers' are given, this rank's is its own)."""
    manager = dcp.MLADCPManager.__new__(dcp.MLADCPManager)

    def all_gather(x: torch.Tensor, dim: int) -> torch.Tensor:
        return torch.cat([x if p == rank else w for p, w in enumerate(wires)], dim=dim)

    manager.group = SimpleNamespace(world_size=world, rank_in_group=rank, all_gather=all_gather)
    manager.padded_num_heads = None
    manager.fp8_query_wire = True
    return manager


@settings(max_examples=30, deadline=None)
@given(
    n=st.sampled_from([2, 3, 4]),
    t=st.integers(1, 5),
    hl=st.integers(1, 3),
    seed=st.integers(0, 2**16),
)
def test_query_gather_keeps_own_heads_exact(n, t, hl, seed):
    """The shipped fp8 query all-gather gives each rank its own heads bit-exact, every
    peer's RoPE part bit-exact and every peer's latent within the e4m3 bound (plus the
    bf16 rounding of the decoded value); each head row costs 656 bytes on the wire."""
    g = torch.Generator().manual_seed(seed)
    qs = [torch.randn(t, hl, 576, generator=g).to(torch.bfloat16) for _ in range(n)]
    wires = [wire.pack_query(q) for q in qs]
    assert all(w.shape == (t, hl, model.FP8_QUERY_ROW_BYTES) for w in wires)
    for rank in range(n):
        manager = _shipped_manager(rank, n, wires)
        with mock.patch.dict(sys.modules, {"vllm.v1.attention.ops.dcp_fp8_wire": wire}):
            full = manager._gather_query_fp8(qs[rank])
        assert full.shape == (t, n * hl, 576) and full.dtype == torch.bfloat16
        for p in range(n):
            part = full[:, p * hl : (p + 1) * hl]
            if p == rank:
                assert torch.equal(part, qs[rank])
                continue
            assert torch.equal(part[..., 512:], qs[p][..., 512:])
            x = qs[p][..., :512].double()
            _, scales = wire.quantize_tiles(qs[p][..., :512])
            e = e4m3_bound(x, scales.double())
            bound = e + (x.abs() + e) * 2.0**-8 + 1e-38
            assert ((part[..., :512].double() - x).abs() <= bound).all()


@settings(max_examples=60, deadline=None)
@given(
    n=st.sampled_from([2, 3, 4]),
    t=st.integers(1, 4),
    hl=st.integers(1, 3),
    empty_rank=st.integers(-1, 3),
    poison=st.sampled_from([None, float("inf"), float("nan")]),
    base_e=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_fp8_merge_matches_exact_lse_merge(n, t, hl, empty_rank, poison, base_e, seed):
    """Merging fp8 partials in fp32 matches the exact LSE merge within the e4m3 bound of
    the peers' partials, uses the own partial exactly, treats +inf/NaN LSEs as -inf (the
    stock guard), gives 0 for rows whose every partial is empty, and sends 532 bytes per
    row and head."""
    g = torch.Generator().manual_seed(seed)
    outs = [torch.randn(t, n * hl, 512, generator=g) for _ in range(n)]
    lses = [torch.randn(t, n * hl, generator=g) * 3 for _ in range(n)]
    if 0 <= empty_rank < n:
        lses[empty_rank][0] = float("-inf")
        outs[empty_rank][0] = 0.0
    if poison is not None:
        lses[n - 1][t - 1] = poison
    sent = [wire.pack_partials(o, lse, n) for o, lse in zip(outs, lses, strict=True)]
    assert all(s.shape == (n, t, hl, model.FP8_PARTIAL_ROW_BYTES) for s in sent)
    log = math.e if base_e else 2.0
    for rank in range(n):
        heads = slice(rank * hl, (rank + 1) * hl)
        received = torch.stack([sent[p][rank] for p in range(n)])  # the all-to-all
        merged = wire.merge_partials(
            received,
            rank=rank,
            own_out=outs[rank][:, heads],
            own_lse=lses[rank][:, heads],
            is_lse_base_on_e=base_e,
            out_dtype=torch.float32,
        )
        lse_stack = torch.stack([lse[:, heads] for lse in lses]).double()
        lse_stack = torch.where(
            torch.isnan(lse_stack) | (lse_stack == math.inf), -math.inf, lse_stack
        )
        glob = torch.logsumexp(lse_stack * math.log(log), 0)
        w = torch.exp(lse_stack * math.log(log) - glob).nan_to_num(0.0)
        exact = (w[..., None] * torch.stack([o[:, heads] for o in outs]).double()).sum(0)
        bound = torch.zeros_like(exact)
        for p in range(n):
            if p == rank:
                continue
            o = outs[p][:, heads]
            _, scales = wire.quantize_tiles(o)
            bound += w[p][..., None] * e4m3_bound(o.double(), scales.double())
        assert torch.isfinite(merged).all()
        assert ((merged.double() - exact).abs() <= bound + 1e-5).all()
    # all partials empty for a row -> zeros and an LSE of -inf
    empty = [
        wire.pack_partials(torch.zeros(1, n, 512), torch.full((1, n), -math.inf), n)
        for _ in range(n)
    ]
    received = torch.stack([empty[p][0] for p in range(n)])
    merged, lse = wire.merge_partials(received, out_dtype=torch.float32, return_lse=True)
    assert torch.equal(merged, torch.zeros(1, 1, 512))
    assert torch.isneginf(lse).all()
