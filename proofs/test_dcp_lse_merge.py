# SPDX-License-Identifier: Apache-2.0
"""Merging DCP ranks' partial attention outputs by their LSEs, with vLLM's shipped kernels.

Under DCP each rank attends (all heads) over the records it owns and returns a partial output
and its softmax LSE; an empty rank returns LSE -inf. The merge must equal attention over the
union of the records. Both shipped merges are run on CPU under the Triton interpreter, from
``vllm/v1/attention/ops/dcp.py`` (of the pinned base, pins.toml; the merges moved there in
vLLM 0.33.0): AG+RS
(``CorrectAttnCPOutKernel``: every rank rescales its own output with the all-gathered LSEs, the
reduce-scatter sums) and A2A (``_dcp_a2a_pack_send`` / ``_dcp_a2a_unpack_combine`` around a
simulated all-to-all).

The pinned base launches the AG+RS kernel through ``VllmTritonJitKernel`` (JIT warm-up
machinery) whose launcher reads ``JITFunction.constexprs``, which the interpreter's function
lacks; the proof launches the shipped ``CorrectAttnCPOutKernel.kernel`` with the arguments that
``CorrectAttnCPOutKernel.__call__`` and ``correct_attn_out`` compute (``correct_attn_out``
below).
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from shipped_triton import load_shipped_triton_with_vllm

DCP = "vllm/v1/attention/ops/dcp.py"
SETTINGS = settings(max_examples=20, deadline=None)


def load_dcp():
    return load_shipped_triton_with_vllm(DCP)


def correct_attn_out(dcp, out, lses, cp_rank, is_lse_base_on_e=True):
    """``dcp.correct_attn_out`` for 3-D inputs, launching the shipped kernel directly."""
    num_tokens, num_heads, head_dim = out.shape
    _, l_sb, l_sh = lses.stride()
    lse = torch.empty_strided((num_tokens, num_heads), (l_sb, l_sh), dtype=lses.dtype)
    dcp.CorrectAttnCPOutKernel.kernel[(num_tokens, num_heads, 1)](
        out,
        out,
        lses,
        lse,
        *out.stride(),
        *lses.stride(),
        cp_rank,
        HEAD_DIM=head_dim,
        N_ROUNDED=lses.shape[0],
        IS_BASE_E=is_lse_base_on_e,
    )
    return out, lse


@st.composite
def sharded_attention(draw):
    """N ranks, B query rows, H heads, D head dim; per row and rank a (maybe empty) record set."""
    n = draw(st.sampled_from([2, 4, 8]))
    b = draw(st.integers(1, 3))
    h = n * draw(st.integers(1, 2))
    d = draw(st.sampled_from([4, 8, 16]))
    records_per_rank = draw(st.integers(1, 6))
    scale = draw(st.sampled_from([0.1, 1.0, 8.0, 40.0]))
    seed = draw(st.integers(0, 2**16))
    # mask[b, rank, j]: row b attends to record j of that rank. Some rows leave ranks empty.
    mask = [
        [
            [draw(st.booleans()) for _ in range(records_per_rank)]
            if draw(st.integers(0, 3)) > 0
            else [False] * records_per_rank
            for _ in range(n)
        ]
        for _ in range(b)
    ]
    return n, b, h, d, records_per_rank, scale, seed, torch.tensor(mask)


def partial_attention(case, base_e: bool, empty_out: float):
    """Each rank's (out [B,H,D], lse [B,H]) over its records, and the union reference (fp64)."""
    n, b, h, d, r, scale, seed, mask = case
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn((b, h, d), generator=gen, dtype=torch.float64)
    k = torch.randn((n, r, d), generator=gen, dtype=torch.float64)
    v = torch.randn((n, r, d), generator=gen, dtype=torch.float64)
    scores = torch.einsum("bhd,nrd->bhnr", q, k) * scale / math.sqrt(d)
    allowed = mask.view(b, 1, n, r)
    scores = scores.masked_fill(~allowed, float("-inf"))
    to_base = 1.0 if base_e else 1.0 / math.log(2.0)

    outs, lses = [], []
    for rank in range(n):
        s = scores[:, :, rank]
        lse = torch.logsumexp(s, dim=-1)
        p = torch.softmax(s, dim=-1)
        out = torch.einsum("bhr,rd->bhd", p, v[rank])
        empty = ~mask[:, rank].any(dim=-1)
        out[empty] = empty_out
        lses.append((lse * to_base).float())
        outs.append(out.float())

    flat = scores.reshape(b, h, n * r)
    ref_lse = torch.logsumexp(flat, dim=-1)
    ref_out = torch.einsum("bhm,md->bhd", torch.softmax(flat, dim=-1), v.reshape(n * r, d))
    none = ~mask.view(b, n * r).any(dim=-1)
    ref_out[none] = 0.0
    return outs, lses, ref_out, ref_lse * to_base


def check(out, lse, ref_out, ref_lse, atol=2e-5):
    torch.testing.assert_close(out.double(), ref_out, atol=atol, rtol=1e-4)
    finite = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), finite)
    assert (lse[~finite] == float("-inf")).all()
    torch.testing.assert_close(lse[finite].double(), ref_lse[finite], atol=1e-5, rtol=1e-5)


@SETTINGS
@given(case=sharded_attention(), base_e=st.booleans(), empty_out=st.sampled_from([0.0, "nan"]))
def test_ag_rs_merge_equals_attention_over_the_union(case, base_e, empty_out):
    """For generated N, rows, heads and record sets with empty ranks (LSE -inf, any output,
    even NaN), correcting each rank's output with the gathered LSEs (shipped
    correct_attn_out) and summing over ranks equals attention over the union of the records,
    and the returned LSE is the union's (base e or 2)."""
    dcp = load_dcp()
    fill = float("nan") if empty_out == "nan" else empty_out
    outs, lses, ref_out, ref_lse = partial_attention(case, base_e, fill)
    gathered = torch.stack(lses)
    total = torch.zeros_like(outs[0])
    rank_lses = []
    for rank, out in enumerate(outs):
        corrected, lse = correct_attn_out(dcp, out.clone(), gathered, rank, base_e)
        total += corrected  # the reduce-scatter's sum over ranks
        rank_lses.append(lse)
    for lse in rank_lses:
        check(total, lse, ref_out, ref_lse)


@SETTINGS
@given(case=sharded_attention(), base_e=st.booleans())
def test_a2a_merge_equals_attention_over_the_union(case, base_e):
    """For generated N, rows, heads and record sets with empty ranks (LSE -inf, output 0),
    the shipped A2A pack -> all-to-all -> unpack-combine gives every rank, for its head slice,
    attention over the union of the records and the union's LSE."""
    # Unlike AG+RS, the A2A combine multiplies an empty rank's output by a zero weight, so a NaN
    # there propagates: attention kernels must write 0 (not garbage) for rows with no records.
    a2a = load_dcp()
    outs, lses, ref_out, ref_lse = partial_attention(case, base_e, 0.0)
    n = len(outs)
    b, h, d = outs[0].shape
    hpr = h // n
    pack_dim = a2a._dcp_a2a_lse_pack_dim(outs[0].dtype)
    sends = []
    for out, lse in zip(outs, lses, strict=True):
        send = torch.empty((n, b, hpr, d + pack_dim))
        a2a._dcp_a2a_pack_send(out, lse, send, n, hpr, d, pack_dim)
        sends.append(send)
    for dst in range(n):
        recv = torch.stack([sends[src][dst] for src in range(n)])
        out, lse = a2a._dcp_a2a_unpack_combine(recv, d, pack_dim, True, base_e)
        heads = slice(dst * hpr, (dst + 1) * hpr)
        check(out, lse, ref_out[:, heads], ref_lse[:, heads])


def test_all_ranks_empty_gives_zero_output_and_minus_inf_lse():
    """A row no rank has records for merges to output 0 and LSE -inf (AG+RS)."""
    dcp = load_dcp()
    lses = torch.full((4, 2, 3), float("-inf"))
    out = torch.full((2, 3, 8), float("nan"))
    corrected, lse = correct_attn_out(dcp, out, lses, 1)
    assert (corrected == 0).all()
    assert (lse == float("-inf")).all()


@pytest.mark.parametrize("base_e", [True, False])
def test_single_nonempty_rank_passes_through(base_e):
    """With one non-empty rank the merged output is that rank's output, bit for bit."""
    dcp = load_dcp()
    gen = torch.Generator().manual_seed(0)
    lses = torch.full((2, 3, 4), float("-inf"))
    lses[1] = torch.randn((3, 4), generator=gen)
    out = torch.randn((3, 4, 8), generator=gen)
    corrected, lse = correct_attn_out(dcp, out.clone(), lses, 1, base_e)
    assert torch.equal(corrected, out)
    assert torch.equal(lse, lses[1])
