# SPDX-License-Identifier: Apache-2.0
"""The DCP global top-k merge's leaf (``dcp_topk_merge.py``) on vLLM 0.34.0: what patch 0004
added to it for 0.34, beside the properties of proofs/test_dcp_topk_merge.py (which still loads
the leaf unchanged: the row-major ``[rows, num_candidates, 2]`` input and the full 64-bit key
are the defaults).

0.34's CuTe DSL merge all-gathers rank-major, ``[world_size, rows, topk, 2]``, and keys only the
high ``score_bits`` of the ordered score (16 for upcast BF16 logits) and the low ``id_bits`` of
``~id`` (enough for every position below the context length):

    key = top_s(ordered(bits(score))) << (64 - s) | (~uint32(id) & (2**i - 1)) << (64 - s - i),
    0 for id < 0; a selected key of 0 is written as -1.

Properties, one each: the int64 key is that key minus 2**63 for any bits and ids; the torch and
Triton selectors read the rank-major buffer exactly as its row-major concatenation (candidate
order rank, then position); the Triton selector with compact bits writes the documented row of
the compact key (the valid ids of the k largest nonzero keys in candidate order, then -1); on
the inputs the bits are chosen for (BF16-upcast scores, ids below 2**id_bits) the compact key
selects the full key's set.

Run beside dcp-series' proofs (their conftest and shipped_triton), on the patched tree:

    DCP_VLLM_TREE=<patched 0.34 tree> TRITON_INTERPRET=1 \
        python -m pytest -q -p no:cacheprovider test_dcp_topk_merge_rank_major.py
"""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from shipped_triton import load_shipped_triton

TOPK_MERGE = "vllm/model_executor/kernels/attention/dsa/dcp_topk_merge.py"
SETTINGS = settings(max_examples=150, deadline=None)
TRITON_SETTINGS = settings(max_examples=30, deadline=None)
SPECIAL = [0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFFFFFFF, 1]
SMALL = [0x3F800000, 0x3F800001, 0x40000000, 0xBF800000, 0xBF810000, 0x00000000]


def leaf():
    return load_shipped_triton(TOPK_MERGE)


def compact_key(bits: int, token: int, s: int, i: int) -> int:
    """0.34's CuTe DSL stable_key in Python ints."""
    if token < 0:
        return 0
    ordered = bits ^ (0xFFFFFFFF if bits >> 31 else 0x80000000)
    return ((ordered >> (32 - s)) << (64 - s)) | ((~token & ((1 << i) - 1)) << (64 - s - i))


def gathered_from(bits: list[list[int]], ids: list[list[int]]) -> torch.Tensor:
    g = torch.empty((len(bits), len(bits[0]), 2))
    g[..., 0] = torch.tensor(bits, dtype=torch.int64).to(torch.int32).view(torch.float32)
    g[..., 1] = torch.tensor(ids, dtype=torch.float32)
    return g


def rank_major(row_major: torch.Tensor, world: int) -> torch.Tensor:
    rows, candidates, _ = row_major.shape
    return row_major.view(rows, world, candidates // world, 2).transpose(0, 1).contiguous()


def documented_rows(g: torch.Tensor, k: int, s: int, i: int) -> list[list[int]]:
    """With T the k-th largest compact key: the ids of the nonzero keys above T and of T's
    first copies that fit, in candidate order, then -1."""
    out = []
    for bits, ids in zip(
        g[..., 0].contiguous().view(torch.int32).tolist(),
        g[..., 1].to(torch.int32).tolist(),
        strict=True,
    ):
        keys = [compact_key(b & 0xFFFFFFFF, t, s, i) for b, t in zip(bits, ids, strict=True)]
        take = min(k, len(keys))
        kth = sorted(keys, reverse=True)[take - 1]
        left = take - sum(key > kth for key in keys)
        row = []
        for t, key in zip(ids, keys, strict=True):
            if key < kth or (key == kth and left == 0):
                continue
            left -= key == kth
            if key != 0:
                row.append(t)
        out.append(row + [-1] * (k - len(row)))
    return out


KEY_BITS = st.tuples(st.integers(1, 32), st.integers(1, 32))


@SETTINGS
@given(
    bits=st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=48),
    ids=st.lists(st.integers(-1, 2**31 - 1), min_size=48, max_size=48),
    key_bits=KEY_BITS,
)
def test_compact_keys_equal_the_cutedsl_key(bits, ids, key_bits):
    """For any fp32 bit pattern, id and (score_bits, id_bits), the int64 key plus 2**63 is
    0.34's CuTe DSL key, and the torch selector writes the ids of the keys in descending key
    order, each decoded to the id's low id_bits (a zero key to -1)."""
    merge = leaf()
    s, i = key_bits
    scores = torch.tensor(bits, dtype=torch.int64).to(torch.int32).view(torch.float32)
    tokens = torch.tensor(ids[: len(bits)], dtype=torch.int32)
    keys = merge.dcp_topk_stable_keys(scores, tokens, s, i)
    for b, t, key in zip(bits, tokens.tolist(), keys.tolist(), strict=True):
        assert key + 2**63 == compact_key(b, t, s, i)
    # Ids travel as fp32 (exact below 2**24): the selector sees the rounded ones.
    g = torch.stack((scores, tokens.float()), dim=-1).unsqueeze(0)
    sent = g[0, :, 1].to(torch.int32).tolist()
    got = merge.stable_topk_from_gathered_candidates_torch(g, len(bits), score_bits=s, id_bits=i)
    ordered = sorted(
        (compact_key(b, t, s, i) for b, t in zip(bits, sent, strict=True)),
        reverse=True,
    )
    expected = []
    for key in ordered:
        token = (~(key >> (64 - s - i))) & ((1 << i) - 1)
        expected.append(-1 if key == 0 else token - (1 << 32) if token >> 31 else token)
    assert got[0].tolist() == expected


@st.composite
def rank_major_rows(draw):
    world = draw(st.integers(1, 5))
    per_rank = draw(st.integers(1, 12))
    rows = draw(st.integers(1, 3))
    n = world * per_rank
    k = draw(st.integers(1, n + 3))
    bit = st.one_of(st.sampled_from(SPECIAL + SMALL), st.integers(0, 2**32 - 1))
    bits = [draw(st.lists(bit, min_size=n, max_size=n)) for _ in range(rows)]
    ids = [draw(st.lists(st.integers(-1, 300), min_size=n, max_size=n)) for _ in range(rows)]
    key_bits = draw(st.sampled_from([(32, 32), (16, 9), (16, 32), (32, 5)]))
    return world, k, bits, ids, key_bits


@TRITON_SETTINGS
@given(case=rank_major_rows())
def test_rank_major_input_selects_as_its_row_major_concatenation(case):
    """The rank-major [world, rows, topk, 2] buffer gives the torch selector the same rows as
    its row-major concatenation (whatever the row chunking), and the Triton selector the same
    rows in the same candidate order (rank, then position): the documented row."""
    merge = leaf()
    world, k, bits, ids, (s, i) = case
    row_major = gathered_from(bits, ids)
    rm = rank_major(row_major, world)
    kw = dict(score_bits=s, id_bits=i)
    ref = merge.stable_topk_from_gathered_candidates_torch(row_major, k, **kw)
    for chunk in (1, row_major.shape[1], 1 << 22):
        got = merge.stable_topk_from_gathered_candidates_torch(rm, k, max_key_elems=chunk, **kw)
        assert torch.equal(got, ref)
    tri = merge.stable_topk_from_gathered_candidates_triton(rm, k, **kw)
    assert tri.tolist() == documented_rows(row_major, k, s, i)
    assert torch.equal(tri, merge.stable_topk_from_gathered_candidates_triton(row_major, k, **kw))


@st.composite
def in_range_rows(draw):
    """Rows the compact key is chosen for: BF16-upcast scores (any high half: ties, signed
    zeros, infinities, NaNs), distinct ids below 2**id_bits, padding. Left out: the one
    pattern whose compact score word is 0, -NaN 0xFFFF0000, which with the largest id gives
    the zero key of padding (an indexer writes no NaN)."""
    id_bits = draw(st.integers(4, 12))
    n = draw(st.integers(1, min(40, 1 << id_bits)))
    k = draw(st.integers(1, n + 2))
    high = st.one_of(
        st.sampled_from([0x0000, 0x8000, 0x7F80, 0xFF80, 0x3F80, 0xBF80, 0x7FC0, 0xFFC0]),
        st.integers(0, 0xFFFE),
    )
    bits = [[h << 16 for h in draw(st.lists(high, min_size=n, max_size=n))]]
    ids = draw(st.lists(st.integers(0, (1 << id_bits) - 1), min_size=n, max_size=n, unique=True))
    pad = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    ids = [[-1 if p else t for p, t in zip(pad, ids, strict=True)]]
    return id_bits, k, bits, ids


@TRITON_SETTINGS
@given(case=in_range_rows())
def test_compact_key_selects_the_full_key_set(case):
    """On BF16-upcast scores and ids below 2**id_bits, the compact key (16 score bits,
    id_bits) selects the full 64-bit key's set, in the torch and the Triton selector."""
    merge = leaf()
    id_bits, k, bits, ids = case
    g = gathered_from(bits, ids)
    full = merge.stable_topk_from_gathered_candidates_torch(g, k)
    for select in (
        merge.stable_topk_from_gathered_candidates_torch,
        merge.stable_topk_from_gathered_candidates_triton,
    ):
        got = select(g, k, score_bits=16, id_bits=id_bits)
        assert sorted(got[0].tolist()) == sorted(full[0].tolist())


def test_key_bits_outside_1_to_32_are_refused():
    merge = leaf()
    g = torch.zeros((1, 4, 2))
    for s, i in ((0, 32), (33, 32), (32, 0), (32, 33)):
        for select in (
            merge.stable_topk_from_gathered_candidates_torch,
            merge.stable_topk_from_gathered_candidates_triton,
        ):
            try:
                select(g, 2, score_bits=s, id_bits=i)
            except ValueError as e:
                assert "score_bits and id_bits" in str(e)
            else:
                raise AssertionError(f"({s}, {i}) must be refused")
