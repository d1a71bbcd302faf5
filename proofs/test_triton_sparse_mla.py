# SPDX-License-Identifier: Apache-2.0
"""CPU proofs for the Triton sparse-MLA kernel over ``fp8_ds_mla`` records.

Shipped code: ``vllm/v1/attention/ops/triton_sparse_mla.py`` (patch
``vllm/0002-kernel-triton-sparse-mla-fp8-ds-mla.patch`` on the pinned vLLM base, pins.toml), run
under Triton's interpreter (``TRITON_INTERPRET=1``) on small shapes.

The reference here is independent of the module: records are decoded bit by bit
(e4m3 table built from the format definition, fp32 scales and bf16 RoPE read with
numpy), attention is computed in float64.

Tolerances (stated once, used everywhere):
  * The kernel rounds q, the dequantised keys/values and the softmax weights to
    bf16 for the matrix products and writes a bf16 output. The reference mirrors
    the first two roundings (q and keys are rounded to bf16 exactly as the kernel
    does), so what remains is the bf16 rounding of P and of the output plus fp32
    accumulation: |out - ref| <= OUT_ATOL + OUT_RTOL * max|V over the row| and
    |lse - ref| <= LSE_ATOL.
  * Splitting the top-k range (split-KV + combine) changes only fp32 summation
    order: compared with the unsplit kernel at SPLIT_ATOL on the fp32 LSE.
"""

from __future__ import annotations

import math
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from shipped_triton import load_shipped_triton  # noqa: E402

LEAF = "vllm/v1/attention/ops/triton_sparse_mla.py"
RECORD = 656
OUT_ATOL = 2e-3
OUT_RTOL = 1e-2
LSE_ATOL = 2e-3
SPLIT_ATOL = 1e-4

SETTINGS = settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@pytest.fixture(scope="module")
def tsm():
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.fail("these proofs need TRITON_INTERPRET=1 set before triton is imported")
    # The module imports Triton through vllm.triton_utils (vLLM's pre-commit requires
    # it); load_shipped_triton resolves that to the real, interpreted Triton.
    return load_shipped_triton(LEAF)


# ---------------------------------------------------------------------------
# Independent reference
# ---------------------------------------------------------------------------


def _e4m3fn_table() -> np.ndarray:
    """float8_e4m3fn value of every byte, from the format definition (bias 7)."""
    table = np.empty(256, dtype=np.float64)
    for b in range(256):
        sign = -1.0 if b & 0x80 else 1.0
        exp = (b >> 3) & 0xF
        man = b & 0x7
        if exp == 0xF and man == 0x7:
            table[b] = np.nan
        elif exp == 0:
            table[b] = sign * (man / 8.0) * 2.0**-6
        else:
            table[b] = sign * (1.0 + man / 8.0) * 2.0 ** (exp - 7)
    return table


E4M3 = _e4m3fn_table()


def _bf16_bits_to_f64(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def _round_bf16(x: np.ndarray) -> np.ndarray:
    t = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
    return t.to(torch.bfloat16).to(torch.float64).numpy()


def ref_decode(records: np.ndarray) -> np.ndarray:
    """[N, 656] uint8 -> [N, 576] float64: e4m3 * per-128 fp32 scale, bf16 RoPE."""
    n = records.shape[0]
    nope = E4M3[records[:, :512]].reshape(n, 4, 128)
    scales = np.ascontiguousarray(records[:, 512:528]).view(np.float32).astype(np.float64)
    nope = (nope * scales[:, :, None]).reshape(n, 512)
    rope = _bf16_bits_to_f64(np.ascontiguousarray(records[:, 528:656]).view(np.uint16))
    return np.concatenate([nope, rope], axis=1)


def ref_attention(
    q: np.ndarray,  # [T, H, 576] float64 (already bf16 values)
    keys: np.ndarray,  # [S, 576] float64
    indices: np.ndarray,  # [T, topk]
    counts: np.ndarray | None,
    sm_scale: float,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """float64 attention; returns out [T,H,512], lse [T,H], max|V| per row [T]."""
    t_rows, heads, _ = q.shape
    num_slots = keys.shape[0]
    out = np.zeros((t_rows, heads, 512))
    lse = np.full((t_rows, heads), -np.inf)
    vmax = np.zeros(t_rows)
    for t in range(t_rows):
        row = indices[t] if counts is None else indices[t, : counts[t]]
        sel = row[(row >= 0) & (row < num_slots)]
        if sel.size == 0:
            continue
        k = keys[sel]
        s = (q[t] @ k.T) * sm_scale  # [H, n]
        m = s.max(axis=1, keepdims=True)
        w = np.exp(s - m)
        lse[t] = m[:, 0] + np.log(w.sum(axis=1))
        out[t] = (w / w.sum(axis=1, keepdims=True)) @ k[:, :512]
        vmax[t] = np.abs(k[:, :512]).max()
    return out, lse, vmax


# ---------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------


def make_kv(rng: np.random.Generator, n: int) -> torch.Tensor:
    """[n, 576] fp32 latent+RoPE with per-token magnitudes over two decades, some zero tiles."""
    kv = rng.standard_normal((n, 576)) * rng.uniform(0.1, 3.0, size=(n, 1))
    zero_tiles = rng.random((n, 4)) < 0.1
    for tile in range(4):
        kv[zero_tiles[:, tile], tile * 128 : (tile + 1) * 128] = 0.0
    return torch.from_numpy(kv.astype(np.float32))


def cache_layout(records: torch.Tensor, block_size: int, layout: str) -> torch.Tensor:
    """Place [N, 656] records (N a multiple of block_size) in a cache of the given layout."""
    n = records.shape[0]
    blocks = records.view(n // block_size, block_size, RECORD)
    if layout == "flat":
        return records
    if layout == "paged":
        return blocks
    if layout == "flashmla4d":
        return blocks.unsqueeze(2)
    # "strided": every block lives inside a larger allocation (block stride > bs*656)
    padded = torch.zeros((n // block_size, block_size + 3, RECORD), dtype=torch.uint8)
    padded[:, :block_size] = blocks
    return padded[:, :block_size]


def launch(tsm, topk: int, heads: int, num_splits: int | None, block_n: int = 16, **variant):
    """A launch of BLOCK_H as the default plan's, ``block_n`` records per tile and at most
    ``num_splits`` splits (None: the default plan, ``plan_sparse_mla``'s)."""
    if num_splits is None:
        return None
    return tsm.SparseMLAPlan.for_launch(
        topk,
        block_h=tsm._default_block_h(heads),
        block_n=block_n,
        num_warps=4,
        num_stages=1,
        num_splits=num_splits,
        **variant,
    )


def run_and_compare(tsm, q, cache, indices, counts, sm_scale, keys, **kw):
    out, lse = tsm.sparse_mla_fp8_ds_mla_attention(
        q,
        cache,
        torch.from_numpy(indices),
        sm_scale,
        valid_counts=None if counts is None else torch.from_numpy(counts),
        **kw,
    )
    q64 = q.to(torch.float64).numpy()
    ref_out, ref_lse, vmax = ref_attention(q64, keys, indices, counts, sm_scale)
    out64 = out.to(torch.float64).numpy()
    lse64 = lse.to(torch.float64).numpy()
    empty = np.isneginf(ref_lse)
    assert np.array_equal(np.isneginf(lse64), empty), "empty-row pattern differs"
    assert np.all(out64[empty] == 0.0), "empty rows must give out == 0"
    assert np.all(np.abs(lse64[~empty] - ref_lse[~empty]) <= LSE_ATOL), (
        f"lse err {np.abs(lse64[~empty] - ref_lse[~empty]).max()}"
    )
    bound = OUT_ATOL + OUT_RTOL * vmax[:, None, None]
    err = np.abs(out64 - ref_out)
    assert np.all(err <= bound), f"out err {err.max()} > bound {bound.max()}"
    return out, lse


@st.composite
def problems(draw):
    seed = draw(st.integers(0, 2**32 - 1))
    t_rows = draw(st.integers(1, 3))
    heads = draw(st.sampled_from([1, 3, 16, 20]))
    topk = draw(st.integers(1, 80))
    block_size = draw(st.sampled_from([1, 4, 16]))
    num_blocks = draw(st.integers(1, 6))
    layout = draw(st.sampled_from(["flat", "paged", "flashmla4d", "strided"]))
    empty_frac = draw(st.sampled_from([0.0, 0.3, 1.0]))
    dup_pool = draw(st.sampled_from([None, 3]))  # draw slots from 3 values -> duplicates
    empty_row = draw(st.booleans())
    use_counts = draw(st.booleans())
    num_splits = draw(st.sampled_from([None, 1, 2, 3, 7]))
    block_n = draw(st.sampled_from([16, 32]))
    return dict(
        seed=seed,
        t_rows=t_rows,
        heads=heads,
        topk=topk,
        block_size=block_size,
        num_blocks=num_blocks,
        layout=layout,
        empty_frac=empty_frac,
        dup_pool=dup_pool,
        empty_row=empty_row,
        use_counts=use_counts,
        num_splits=num_splits,
        block_n=block_n,
    )


def build(p: dict, tsm):
    rng = np.random.default_rng(p["seed"])
    n = p["block_size"] * p["num_blocks"]
    records = tsm.quantize_fp8_ds_mla(make_kv(rng, n))
    keys = ref_decode(records.numpy())
    # The kernel feeds dequantised bf16 keys to the dot: mirror that rounding.
    keys = _round_bf16(keys)
    cache = cache_layout(records, p["block_size"], p["layout"])
    pool = np.arange(n) if p["dup_pool"] is None else rng.integers(0, n, p["dup_pool"])
    indices = rng.choice(pool, size=(p["t_rows"], p["topk"])).astype(np.int32)
    indices[rng.random(indices.shape) < p["empty_frac"]] = -1
    if p["empty_row"]:
        indices[rng.integers(0, p["t_rows"])] = -1
    counts = None
    if p["use_counts"]:
        counts = rng.integers(0, p["topk"] + 1, size=p["t_rows"]).astype(np.int32)
    q = torch.from_numpy(rng.standard_normal((p["t_rows"], p["heads"], 576)))
    q = q.to(torch.bfloat16)
    return records, keys, cache, indices, counts, q


# ---------------------------------------------------------------------------
# Kernel proofs
# ---------------------------------------------------------------------------


@SETTINGS
@given(p=problems())
def test_kernel_matches_float64_reference(tsm, p):
    """For any rows, heads, top-k, -1 padding, empty rows, duplicates, valid_counts, cache
    layout and split factor, the kernel's out/LSE equal float64 attention over the decoded
    records within the stated bf16 tolerances (empty rows: out = 0, lse = -inf)."""
    _, keys, cache, indices, counts, q = build(p, tsm)
    sm_scale = 1.0 / math.sqrt(576)
    run_and_compare(
        tsm,
        q,
        cache,
        indices,
        counts,
        sm_scale,
        keys,
        plan=launch(tsm, p["topk"], p["heads"], p["num_splits"], p["block_n"]),
    )


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), splits=st.sampled_from([2, 3, 5]))
def test_split_kv_equals_single_pass(tsm, seed, splits):
    """Splitting the top-k range over programs and combining by LSE gives the single-pass
    result: same empty rows, LSE within SPLIT_ATOL, outputs within the out tolerance."""
    rng = np.random.default_rng(seed)
    records = tsm.quantize_fp8_ds_mla(make_kv(rng, 64))
    indices = rng.integers(-1, 64, size=(2, 96)).astype(np.int32)
    q = torch.from_numpy(rng.standard_normal((2, 16, 576))).to(torch.bfloat16)
    idx = torch.from_numpy(indices)
    o1, l1 = tsm.sparse_mla_fp8_ds_mla_attention(q, records, idx, 0.05, plan=launch(tsm, 96, 16, 1))
    o2, l2 = tsm.sparse_mla_fp8_ds_mla_attention(
        q, records, idx, 0.05, plan=launch(tsm, 96, 16, splits)
    )
    assert torch.equal(torch.isneginf(l1), torch.isneginf(l2))
    finite = torch.isfinite(l1)
    assert torch.allclose(l1[finite], l2[finite], atol=SPLIT_ATOL, rtol=0)
    # Per-split maxima change where P is rounded to bf16: bound relative to the row's values.
    vmax = o1.float().abs().amax(dim=(1, 2), keepdim=True)
    assert torch.all((o1.float() - o2.float()).abs() <= OUT_ATOL + OUT_RTOL * vmax)


def test_duplicates_count_as_separate_keys(tsm):
    """A slot listed twice in a row gets twice the softmax weight of a slot listed once,
    exactly as attention over the multiset [a, a, b] (and unlike the set {a, b})."""
    rng = np.random.default_rng(7)
    records = tsm.quantize_fp8_ds_mla(make_kv(rng, 8))
    keys = _round_bf16(ref_decode(records.numpy()))
    q = torch.from_numpy(rng.standard_normal((1, 16, 576))).to(torch.bfloat16)
    q64 = q.double().numpy()
    dup = np.array([[2, 5, 2, -1]], dtype=np.int32)
    out, lse = tsm.sparse_mla_fp8_ds_mla_attention(q, records, torch.from_numpy(dup), 0.05)
    ref_out, ref_lse, _ = ref_attention(q64, keys, np.array([[2, 2, 5]]), None, 0.05)
    set_out, set_lse, _ = ref_attention(q64, keys, np.array([[2, 5]]), None, 0.05)
    s = (q64[0] @ keys[[2, 5]].T) * 0.05
    assert np.allclose(ref_lse[0], np.log(2 * np.exp(s[:, 0]) + np.exp(s[:, 1])))
    assert np.all(np.abs(lse.double().numpy() - ref_lse) <= LSE_ATOL)
    assert np.all(np.abs(out.double().numpy() - ref_out) <= OUT_ATOL + OUT_RTOL * 4)
    # log 2 apart at least somewhere: the definition is observable.
    assert np.abs(lse.double().numpy() - set_lse).max() > 0.1


@pytest.mark.parametrize("splits", [1, 4])
def test_empty_rows_give_zero_and_minus_inf(tsm, splits):
    """Rows with only -1 entries, or with valid_counts = 0, or whose valid entries lie past
    valid_counts, produce out == 0 and lse == -inf, with and without split-KV."""
    rng = np.random.default_rng(3)
    records = tsm.quantize_fp8_ds_mla(make_kv(rng, 16))
    idx = torch.tensor([[-1] * 64, list(range(16)) * 4, [-1] * 8 + [3] * 56], dtype=torch.int32)
    counts = torch.tensor([64, 0, 8], dtype=torch.int32)
    q = torch.from_numpy(rng.standard_normal((3, 20, 576))).to(torch.bfloat16)
    out = torch.full((3, 20, 512), float("nan"), dtype=torch.bfloat16)
    out, lse = tsm.sparse_mla_fp8_ds_mla_attention(
        q, records, idx, 0.1, valid_counts=counts, out=out, plan=launch(tsm, 64, 20, splits)
    )
    assert torch.all(out == 0)
    assert torch.all(torch.isneginf(lse))


def test_entries_past_valid_counts_are_never_read(tsm):
    """Entries after valid_counts[t] do not influence the result even when they point to a
    poisoned record (NaN scales) that would turn any read into NaN."""
    rng = np.random.default_rng(11)
    records = tsm.quantize_fp8_ds_mla(make_kv(rng, 16))
    records[15, 512:528] = torch.tensor([float("nan")] * 4).view(torch.uint8)
    keys = _round_bf16(ref_decode(records.numpy()))
    indices = np.concatenate(
        [rng.integers(0, 15, size=(2, 20)), np.full((2, 12), 15)], axis=1
    ).astype(np.int32)
    counts = np.array([20, 7], dtype=np.int32)
    q = torch.from_numpy(rng.standard_normal((2, 16, 576))).to(torch.bfloat16)
    out, _ = run_and_compare(tsm, q, records, indices, counts, 0.05, keys)
    assert torch.isfinite(out.float()).all()
    # Control: without valid_counts the poisoned record is read.
    poisoned, _ = tsm.sparse_mla_fp8_ds_mla_attention(q, records, torch.from_numpy(indices), 0.05)
    assert torch.isnan(poisoned.float()).any()


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), ranks=st.sampled_from([2, 4]))
def test_lse_merge_of_partitions_equals_union(tsm, seed, ranks):
    """Partitioning a row's selected slots over N ranks (-1 elsewhere), attending per rank
    and merging with out = sum_r exp(lse_r - lse) out_r, lse = logsumexp_r lse_r (vLLM's
    DCP merge with natural-log LSE) equals attention over the union."""
    rng = np.random.default_rng(seed)
    records = tsm.quantize_fp8_ds_mla(make_kv(rng, 48))
    indices = rng.integers(0, 48, size=(2, 64)).astype(np.int32)
    q = torch.from_numpy(rng.standard_normal((2, 16, 576))).to(torch.bfloat16)
    full_out, full_lse = tsm.sparse_mla_fp8_ds_mla_attention(
        q, records, torch.from_numpy(indices), 0.05
    )
    outs, lses = [], []
    for r in range(ranks):
        local = np.where(indices % ranks == r, indices, -1).astype(np.int32)
        o, lse = tsm.sparse_mla_fp8_ds_mla_attention(q, records, torch.from_numpy(local), 0.05)
        outs.append(o.double())
        lses.append(lse.double())
    lse_stack = torch.stack(lses)
    merged_lse = torch.logsumexp(lse_stack, dim=0)
    w = torch.exp(lse_stack - merged_lse).nan_to_num(0.0)
    merged = (w.unsqueeze(-1) * torch.stack(outs)).sum(0)
    assert torch.allclose(merged_lse, full_lse.double(), atol=LSE_ATOL, rtol=0)
    vmax = float(np.abs(ref_decode(records.numpy())[:, :512]).max())
    err = (merged - full_out.double()).abs().max().item()
    assert err <= OUT_ATOL + OUT_RTOL * vmax, err


# ---------------------------------------------------------------------------
# Codec proofs
# ---------------------------------------------------------------------------


@settings(max_examples=50, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 9), dtype=st.sampled_from(["bf16", "f32"]))
def test_codec_layout_and_round_trip(tsm, seed, n, dtype):
    """quantize writes vLLM's fp8_ds_mla layout (e4m3 NoPE; per 128 values the fp32 scale is the
    smallest power of two >= max(amax/448, 1e-4); bf16 RoPE), never writes a NaN code, and
    dequantize(quantize(x)) is within e4m3 rounding: |err| <= 2^-4 |x| + 2^-10 scale on
    NoPE, exact bf16 on RoPE."""
    rng = np.random.default_rng(seed)
    kv = make_kv(rng, n)
    if dtype == "bf16":
        kv = kv.to(torch.bfloat16)
    rec = tsm.quantize_fp8_ds_mla(kv)
    assert rec.dtype == torch.uint8 and rec.shape == (n, RECORD)
    nope_bytes = rec[:, :512].numpy()
    assert not np.isin(nope_bytes, [0x7F, 0xFF]).any()

    x = kv.double().numpy()
    amax = np.abs(x[:, :512].reshape(n, 4, 128)).max(axis=2)
    need = np.maximum(
        (amax.astype(np.float32) / np.float32(448.0)).astype(np.float32), np.float32(1e-4)
    )
    mant, expo = np.frexp(need)
    want_scale = np.where(mant == 0.5, need, np.ldexp(np.float32(1.0), expo)).astype(np.float32)
    scales = np.ascontiguousarray(rec[:, 512:528].numpy()).view(np.float32)
    # The writer takes exp2(ceil(log2(need))) in fp32: where need lies within fp32 rounding
    # of log2 above a power of two, that power itself is also the writer's answer.
    just_above = np.ldexp(np.float32(1.0), expo - 1) * (1 + 2.0**-18) >= need
    ok = (scales == want_scale) | (just_above & (scales == want_scale / 2))
    assert ok.all()
    rope_bits = np.ascontiguousarray(rec[:, 528:].numpy()).view(np.uint16)
    assert np.array_equal(rope_bits, kv[:, 512:].to(torch.bfloat16).view(torch.uint16).numpy())

    decoded = ref_decode(rec.numpy())
    err = np.abs(decoded[:, :512] - x[:, :512]).reshape(n, 4, 128)
    bound = 2.0**-4 * np.abs(x[:, :512]).reshape(n, 4, 128) + 2.0**-10 * scales[:, :, None]
    assert np.all(err <= bound * (1 + 1e-6))
    assert np.array_equal(decoded[:, 512:], _round_bf16(x[:, 512:]))

    # The module's own decoder agrees with the bitwise one; leading dims are kept.
    mine = tsm.dequantize_fp8_ds_mla(rec.view(1, n, RECORD))
    assert mine.shape == (1, n, 576) and mine.dtype == torch.float32
    assert np.array_equal(mine[0].numpy(), decoded.astype(np.float32))


def test_dequantize_matches_bitwise_decoder_for_every_code(tsm):
    """dequantize_fp8_ds_mla decodes every finite e4m3 code as the format defines it, times
    its tile's scale (scale 2 on tile 1 only)."""
    codes = np.array([c for c in range(256) if c not in (0x7F, 0xFF)], dtype=np.uint8)
    rec = np.zeros((2, RECORD), dtype=np.uint8)
    rec[0, : codes.size] = codes  # tiles 0 and 1
    rec[1, 128 : 128 + codes.size] = codes  # tiles 1 and 2
    rec[:, 512:528] = np.array([1.0, 2.0, 1.0, 1.0], dtype=np.float32).view(np.uint8)
    got = tsm.dequantize_fp8_ds_mla(torch.from_numpy(rec)).numpy()
    assert np.array_equal(got, ref_decode(rec).astype(np.float32))
    assert got[0, 130] == 2.0 * E4M3[codes[130]]
    assert got[1, 130] == 2.0 * E4M3[codes[2]]


def test_rejects_wrong_shapes(tsm):
    """The launcher refuses inputs it cannot serve instead of reading out of bounds."""
    q = torch.zeros((2, 4, 576), dtype=torch.bfloat16)
    cache = torch.zeros((4, 16, RECORD), dtype=torch.uint8)
    idx = torch.zeros((2, 8), dtype=torch.int32)
    with pytest.raises(ValueError, match="656"):
        tsm.sparse_mla_fp8_ds_mla_attention(
            q, torch.zeros((4, 16, 576), dtype=torch.uint8), idx, 1.0
        )
    with pytest.raises(ValueError, match="int32"):
        tsm.sparse_mla_fp8_ds_mla_attention(q, cache, idx.long(), 1.0)
    with pytest.raises(ValueError, match="576"):
        tsm.sparse_mla_fp8_ds_mla_attention(q[..., :512], cache, idx, 1.0)
    with pytest.raises(ValueError, match="valid_counts"):
        tsm.sparse_mla_fp8_ds_mla_attention(
            q, cache, idx, 1.0, valid_counts=torch.zeros(3, dtype=torch.int32)
        )


class ReservedWorkspace:
    """Stand-in for vLLM's WorkspaceManager after warm-up: one flat buffer reserved up
    front, then locked; ``get_simultaneous`` hands out views of it (256-byte aligned, as
    the manager does) and fails instead of growing."""

    def __init__(self, specs):
        self.capacity = self._layout(specs)[-1]
        self.buffer = torch.full((self.capacity,), 0xFF, dtype=torch.uint8)  # NaN fill
        self.requests = []

    @staticmethod
    def _layout(specs):
        ends, offset = [], 0
        for shape, dtype in specs:
            offset = -(-offset // 256) * 256
            offset += math.prod(shape) * dtype.itemsize
            ends.append(offset)
        return ends or [0]

    def get_simultaneous(self, *specs):
        self.requests.append(list(specs))
        assert self._layout(specs)[-1] <= self.capacity, "locked workspace would grow"
        views, offset = [], 0
        for shape, dtype in specs:
            offset = -(-offset // 256) * 256
            size = math.prod(shape) * dtype.itemsize
            views.append(self.buffer[offset : offset + size].view(dtype).view(shape))
            offset += size
        return views


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1),
    num_tokens=st.integers(1, 9),
    num_heads=st.sampled_from([4, 16, 20]),
    topk=st.sampled_from([64, 128, 200]),
)
def test_reserved_workspace_serves_every_default_launch(tsm, seed, num_tokens, num_heads, topk):
    """With scratch reserved once by max_split_workspace_specs (then locked), every
    default launch of up to the reserved row count takes its split-KV partials from that
    reservation without growing it, and returns exactly what a launch with freshly
    allocated scratch returns."""
    with pytest.MonkeyPatch.context() as mp:
        # A 4-SM device: rows 1..7 of <= 16 heads split the top-k range.
        mp.setattr(tsm, "_device_info", lambda device: (4, 0))
        _check_reserved_workspace(tsm, seed, num_tokens, num_heads, topk)


def _check_reserved_workspace(tsm, seed, num_tokens, num_heads, topk):
    rng = np.random.default_rng(seed)
    records = tsm.quantize_fp8_ds_mla(make_kv(rng, 96))
    q = torch.from_numpy(rng.standard_normal((num_tokens, num_heads, 576))).to(torch.bfloat16)
    idx = torch.from_numpy(rng.integers(-1, 96, size=(num_tokens, topk)).astype(np.int32))
    cpu = torch.device("cpu")
    workspace = ReservedWorkspace(tsm.max_split_workspace_specs(9, num_heads, topk, cpu))
    plan = tsm.plan_sparse_mla(num_tokens, num_heads, topk, cpu)
    o1, l1 = tsm.sparse_mla_fp8_ds_mla_attention(
        q, records, idx, 0.05, get_workspace=workspace.get_simultaneous
    )
    o2, l2 = tsm.sparse_mla_fp8_ds_mla_attention(q, records, idx, 0.05)
    expected = [tsm.split_workspace_specs(num_tokens, num_heads, plan.num_splits)]
    assert workspace.requests == (expected if plan.num_splits > 1 else [])
    assert torch.equal(o1, o2)
    assert torch.equal(l1, l2)


def test_reserved_workspace_proof_covers_split_launches(tsm):
    """The device the workspace proof fakes does split small launches (so that proof is
    not vacuous) and stops splitting once the rows fill it."""
    cpu = torch.device("cpu")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tsm, "_device_info", lambda device: (4, 0))
        assert tsm.plan_sparse_mla(1, 16, 128, cpu).num_splits == 2
        assert tsm.plan_sparse_mla(8, 16, 128, cpu).num_splits == 1
        assert tsm.max_split_workspace_specs(9, 16, 128, cpu) != []


def test_split_query_reads_the_same_bits(tsm):
    """The query as (q_nope, q_pe) parts with their own strides, as the MLA layer passes it
    without DCP, gives exactly the result of the concatenated [T, H, 576] query."""
    rng = np.random.default_rng(7)
    records = tsm.quantize_fp8_ds_mla(make_kv(rng, 64))
    q = torch.from_numpy(rng.standard_normal((3, 20, 576))).to(torch.bfloat16)
    idx = torch.from_numpy(rng.integers(-1, 64, size=(3, 80)).astype(np.int32))
    q_nope = q[..., :512].transpose(0, 1).contiguous().transpose(0, 1)  # heads-major
    q_pe = q[..., 512:].clone()
    for splits in (1, 3):
        plan = launch(tsm, 80, 20, splits)
        o1, l1 = tsm.sparse_mla_fp8_ds_mla_attention(q, records, idx, 0.05, plan=plan)
        o2, l2 = tsm.sparse_mla_fp8_ds_mla_attention((q_nope, q_pe), records, idx, 0.05, plan=plan)
        assert torch.equal(o1, o2) and torch.equal(l1, l2)


# ---------------------------------------------------------------------------
# Kernel variants (SparseMLAPlan fields; the default plans use them on large GPUs)
# ---------------------------------------------------------------------------


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(p=problems())
def test_flat_record_addressing_is_bit_identical(tsm, p):
    """On every cache whose blocks are contiguous (flat, paged, FlashMLA 4-D) addressing a
    record as slot * 656 returns exactly the bits of the block // and % addressing; a
    cache with padded blocks is rejected instead of read at the wrong offsets."""
    _, _, cache, indices, counts, q = build(p, tsm)
    counts_t = None if counts is None else torch.from_numpy(counts)
    splits = p["num_splits"] or 1
    base = launch(tsm, p["topk"], p["heads"], splits, p["block_n"])
    flat = launch(tsm, p["topk"], p["heads"], splits, p["block_n"], flat_records=True)
    idx = torch.from_numpy(indices)
    if p["layout"] == "strided" and p["num_blocks"] > 1:
        with pytest.raises(ValueError, match="flat_records"):
            tsm.sparse_mla_fp8_ds_mla_attention(q, cache, idx, 0.05, counts_t, plan=flat)
        return
    o1, l1 = tsm.sparse_mla_fp8_ds_mla_attention(q, cache, idx, 0.05, counts_t, plan=base)
    o2, l2 = tsm.sparse_mla_fp8_ds_mla_attention(q, cache, idx, 0.05, counts_t, plan=flat)
    assert torch.equal(o1, o2) and torch.equal(l1, l2)


def test_split_rules(tsm):
    """The "fill" rule splits a launch that does not fill two programs per SM into up to
    one BLOCK_N tile per split (not a power of two) and never splits once the rows fill the
    device; the "occupancy" rule keeps two tiles per split and powers of two. The default
    plan of one 16-head row on a paged cache of an H200 stand-in is the "fill" one."""
    cpu = torch.device("cpu")
    assert tsm._fill_num_splits(1, 2048, 64, 132) == 32
    assert tsm._occupancy_num_splits(1, 2048, 16, 64, 132) == 16
    assert tsm._fill_num_splits(64, 2048, 64, 132) == 5
    assert tsm._fill_num_splits(264, 2048, 64, 132) == 1
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tsm, "_device_info", lambda device: (132, 227 * 1024))
        one = tsm.plan_sparse_mla(1, 16, 2048, cpu)
        assert (one.block_n, one.num_splits, one.split_len) == (64, 32, 64)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1),
    num_tokens=st.integers(1, 9),
    num_heads=st.sampled_from([4, 16]),
    topk=st.sampled_from([64, 200]),
)
def test_reserved_workspace_serves_large_gpu_launches(tsm, seed, num_tokens, num_heads, topk):
    """On a (stand-in) large-shared-memory GPU, where the default plans of a contiguous
    cache take the "fill" rule and the flat and prefetch variants, scratch reserved by
    max_split_workspace_specs serves every default launch of up to the reserved rows
    without growing (and the results equal a launch with fresh scratch)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tsm, "_device_info", lambda device: (4, 227 * 1024))
        rng = np.random.default_rng(seed)
        records = tsm.quantize_fp8_ds_mla(make_kv(rng, 96))
        q = torch.from_numpy(rng.standard_normal((num_tokens, num_heads, 576)))
        q = q.to(torch.bfloat16)
        idx = rng.integers(-1, 96, size=(num_tokens, topk)).astype(np.int32)
        idx = torch.from_numpy(idx)
        cpu = torch.device("cpu")
        specs = tsm.max_split_workspace_specs(9, num_heads, topk, cpu, contiguous=True)
        workspace = ReservedWorkspace(specs)
        plan = tsm.plan_sparse_mla(num_tokens, num_heads, topk, cpu, contiguous=True)
        assert plan.flat_records
        o1, l1 = tsm.sparse_mla_fp8_ds_mla_attention(
            q, records, idx, 0.05, get_workspace=workspace.get_simultaneous
        )
        o2, l2 = tsm.sparse_mla_fp8_ds_mla_attention(q, records, idx, 0.05)
        expected = [tsm.split_workspace_specs(num_tokens, num_heads, plan.num_splits)]
        assert workspace.requests == (expected if plan.num_splits > 1 else [])
        assert torch.equal(o1, o2) and torch.equal(l1, l2)


@pytest.mark.parametrize("layout", ["flat", "paged", "strided"])
@pytest.mark.parametrize(("num_tokens", "num_heads"), [(1, 16), (9, 16), (2, 64), (9, 64)])
def test_default_launch_picks_variants_only_on_a_contiguous_cache(
    tsm, layout, num_tokens, num_heads
):
    """On a large-shared-memory GPU (stand-in device info) the default launch over a
    contiguous cache (flat or paged) is the flat prefetch variant ``plan_sparse_mla`` names
    for a contiguous cache, over a cache with padded blocks the base launch (flat addressing
    would read the wrong offsets there); either way the outputs are the reference's."""
    rng = np.random.default_rng(num_tokens * 100 + num_heads)
    records = tsm.quantize_fp8_ds_mla(make_kv(rng, 96))
    keys = ref_decode(records.numpy())
    cache = cache_layout(records, 16, layout)
    idx = rng.integers(-1, 96, size=(num_tokens, 128)).astype(np.int32)
    q = torch.from_numpy(rng.standard_normal((num_tokens, num_heads, 576))).to(torch.bfloat16)
    cpu = torch.device("cpu")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tsm, "_device_info", lambda device: (132, 227 * 1024))
        plans = []
        real = tsm.plan_sparse_mla
        mp.setattr(
            tsm, "plan_sparse_mla", lambda *a, **kw: plans.append(real(*a, **kw)) or plans[-1]
        )
        run_and_compare(tsm, q, cache, idx, None, 0.05, keys)
        contiguous = layout != "strided"
        assert plans == [real(num_tokens, num_heads, 128, cpu, contiguous=contiguous)]
        picked = plans[0]
        assert picked.flat_records == contiguous
        assert (picked.prefetch or picked.prefetch_slots) == contiguous


@pytest.mark.parametrize("capability", [90, 120])
def test_every_default_launch_compiles(capability):
    """Every launch ``plan_sparse_mla`` chooses by default (rows 1-4096 x 8-128 heads, paged and
    contiguous caches) on a stand-in H200 (sm_90) and RTX PRO 6000 (sm_120, 99 KiB per block)
    compiles with Triton's own compiler and ptxas, offline: the interpreter, which the proofs
    above use, accepts code the compiler refuses."""
    import subprocess
    import sys
    from pathlib import Path

    from conftest import REPO, patched_tree

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    script = Path(REPO) / "proofs" / "sparse_mla_sm90_compile_stats.py"
    run = subprocess.run(
        [
            sys.executable,
            str(script),
            "--kernel-path",
            str(patched_tree() / LEAF),
            "--plans",
            "--capability",
            str(capability),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    last = run.stdout.strip().splitlines()[-1]
    assert last.endswith(f"launches compiled for sm_{capability}"), last
