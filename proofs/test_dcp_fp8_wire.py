# SPDX-License-Identifier: Apache-2.0
"""CPU proofs of the DCP fp8 wire codec (vllm/v1/attention/ops/dcp_fp8_wire.py)."""

from __future__ import annotations

import math

import torch
from conftest import load_leaf
from hypothesis import given, settings
from hypothesis import strategies as st

wire = load_leaf("vllm/v1/attention/ops/dcp_fp8_wire.py")

# e4m3: 3 mantissa bits -> relative rounding error <= 2^-4 for normals;
# subnormal spacing 2^-9 -> absolute error <= 2^-10 * scale.
REL = 2.0**-4
ABS_SUB = 2.0**-10


def e4m3_bound(x: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    per_elem = scales.repeat_interleave(wire.FP8_WIRE_BLOCK, dim=-1)[..., : x.shape[-1]]
    return x.abs() * REL * (1 + 1e-6) + per_elem * ABS_SUB * (1 + 1e-6)


magnitudes = st.sampled_from([0.0, 1e-30, 1e-8, 1e-3, 1.0, 37.0, 1e4, 1e30, 3e38])


@settings(max_examples=200, deadline=None)
@given(
    dim=st.sampled_from([1, 64, 127, 128, 129, 512, 576]),
    rows=st.integers(1, 6),
    magnitude=magnitudes,
    zero_block=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_round_trip_within_e4m3_bound_per_block(dim, rows, magnitude, zero_block, seed):
    """Every decoded value is within the e4m3 rounding bound of its 128-block
    scale, and every scale is finite and non-zero."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, dim, generator=g, dtype=torch.float64) * magnitude
    x = x.clamp(-3.3e38, 3.3e38).float()
    if zero_block:
        x[:, : min(dim, wire.FP8_WIRE_BLOCK)] = 0.0
    buf = wire.pack_fp8_wire(x)
    assert buf.shape == (rows, wire.wire_row_bytes(dim))
    scales = wire._bytes_as_f32(buf[:, dim:])
    assert torch.isfinite(scales).all() and (scales > 0).all()
    y = wire.unpack_fp8_wire(buf, dim)
    assert torch.isfinite(y).all()
    err = (y.double() - x.double()).abs()
    assert (err <= e4m3_bound(x.double(), scales.double())).all()


@settings(max_examples=50, deadline=None)
@given(
    special=st.sampled_from([float("inf"), float("-inf"), float("nan")]), seed=st.integers(0, 1000)
)
def test_scales_stay_finite_on_non_finite_input(special, seed):
    """Non-finite inputs never produce a zero, inf or NaN scale."""
    x = torch.randn(3, 576, generator=torch.Generator().manual_seed(seed))
    x[1, 5] = special
    scales = wire.fp8_wire_scales(x)
    assert torch.isfinite(scales).all() and (scales > 0).all()


@settings(max_examples=60, deadline=None)
@given(
    n=st.sampled_from([2, 3, 4]),
    t=st.integers(1, 5),
    hl=st.integers(1, 3),
    seed=st.integers(0, 2**16),
)
def test_query_gather_keeps_own_slice_exact(n, t, hl, seed):
    """The fp8 query all-gather gives each rank its own heads bit-exact and every
    other rank's heads within the e4m3 bound."""
    g = torch.Generator().manual_seed(seed)
    qs = [torch.randn(t, hl, 576, generator=g).to(torch.bfloat16) for _ in range(n)]
    gathered = torch.stack([wire.pack_fp8_wire(q) for q in qs])  # the all-gather
    for rank in range(n):
        full = wire.assemble_gathered_queries(gathered, rank, qs[rank])
        assert full.shape == (t, n * hl, 576) and full.dtype == torch.bfloat16
        for p in range(n):
            part = full[:, p * hl : (p + 1) * hl]
            if p == rank:
                assert torch.equal(part, qs[rank])
            else:
                x = qs[p].double()
                scales = wire.fp8_wire_scales(qs[p]).double()
                # plus the bf16 rounding (2^-9 relative) of the decoded value
                e = e4m3_bound(x, scales)
                bound = e + (x.abs() + e) * 2.0**-9 + 1e-38
                assert ((part.double() - x).abs() <= bound).all()


@settings(max_examples=60, deadline=None)
@given(
    n=st.sampled_from([2, 3, 4]),
    t=st.integers(1, 4),
    hl=st.integers(1, 3),
    empty_rank=st.integers(-1, 3),
    seed=st.integers(0, 2**16),
)
def test_fp8_merge_matches_exact_lse_merge(n, t, hl, empty_rank, seed):
    """Merging fp8 partials in fp32 matches the exact LSE merge within the e4m3
    bound of the partials, uses the own partial exactly, and gives 0 for rows
    whose every partial is empty."""
    g = torch.Generator().manual_seed(seed)
    v = 512
    outs = [torch.randn(t, n * hl, v, generator=g) for _ in range(n)]
    lses = [torch.randn(t, n * hl, generator=g) * 3 for _ in range(n)]
    if 0 <= empty_rank < n:
        lses[empty_rank][0] = float("-inf")
        outs[empty_rank][0] = 0.0
    sent = [wire.pack_partials(o, lse, n) for o, lse in zip(outs, lses, strict=True)]
    for rank in range(n):
        heads = slice(rank * hl, (rank + 1) * hl)
        received = torch.stack([sent[p][rank] for p in range(n)])  # the all-to-all
        merged = wire.merge_partials(received, rank, outs[rank][:, heads], lses[rank][:, heads], v)
        lse_stack = torch.stack([lse[:, heads] for lse in lses]).double()
        glob = torch.logsumexp(lse_stack, 0)
        w = torch.exp(lse_stack - glob).nan_to_num(0.0)
        exact = (w[..., None] * torch.stack([o[:, heads] for o in outs]).double()).sum(0)
        bound = torch.zeros_like(exact)
        for p in range(n):
            if p == rank:
                continue
            o = outs[p][:, heads].double()
            bound += w[p][..., None] * e4m3_bound(o, wire.fp8_wire_scales(o).double())
        assert ((merged.double() - exact).abs() <= bound + 1e-5).all()
    # all partials empty for a row -> zeros
    empty = [
        wire.pack_partials(torch.zeros(1, n, v), torch.full((1, n), -math.inf), n) for _ in range(n)
    ]
    received = torch.stack([empty[p][0] for p in range(n)])
    merged = wire.merge_partials(
        received, 0, torch.zeros(1, 1, v), torch.full((1, 1), -math.inf), v
    )
    assert torch.equal(merged, torch.zeros(1, 1, v))
