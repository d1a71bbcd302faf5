# SPDX-License-Identifier: Apache-2.0
"""The DCP global top-k merge (``dcp_topk_merge.py``: the exact torch reference and the Triton
pack + select kernels) is the top-k over the concatenated scores, with ties broken as the
CuteDSL stable top-k breaks them.

Order (that of the CuteDSL selector's 64-bit key ``ordered(bits(score)) << 32 | ~id``): score
descending as a total order on fp32 bit patterns (``+0.0`` above ``-0.0``), then token id
ascending; invalid candidates (id -1) after every valid one, valid ``-inf`` scores included.
Exactness needs each rank's local top-k to use the same order on its own tokens (then a global
winner is always among its owner's local candidates). With any other local tie order the merged
row still holds the global top-k's multiset of scores, only the ids among equal scores at the
boundary may differ; and the ranks agree on the result whatever their local order, because the
selection depends only on the multiset of gathered candidates. The Triton selector (a radix
select over the key's 8-bit digits) writes the valid ids of the k largest keys in candidate
order (of a duplicated k-th key's copies, the first ones that fit), then -1. (Its comparison
choices, 4-bit digits, bisection and the score-range first pass with or without the pairwise
ranking, left the patch after the 2026-12-02 09:59Z H200 timing; their proofs with them.) The
Triton kernels run under the Triton interpreter
(``TRITON_INTERPRET=1``), loaded from the patched tree by ``shipped_triton.load_shipped_triton``.
"""

from __future__ import annotations

import random
import struct

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from shipped_triton import load_shipped_triton

TOPK_MERGE = "vllm/model_executor/kernels/attention/dsa/dcp_topk_merge.py"
SETTINGS = settings(max_examples=150, deadline=None)
# Each interpreted Triton launch costs ~0.1-0.5 s on the 2-core machine.
TRITON_SETTINGS = settings(max_examples=40, deadline=None)


def load_leaf(relpath: str):
    """The shipped merge module, its Triton kernels on the interpreter."""
    return load_shipped_triton(relpath)


# Scores with many ties, signed zeros and infinities.
SCORES = st.sampled_from([float("-inf"), -2.0, -0.5, -0.0, 0.0, 0.5, 1.0, 3.0, float("inf")])


def f32_order(x: float) -> int:
    """Total order of an fp32 bit pattern (monotone in the float value, -0.0 < +0.0)."""
    bits = struct.unpack("<I", struct.pack("<f", x))[0]
    return (bits ^ 0xFFFFFFFF) if bits >> 31 else (bits | 0x80000000)


def rank_order(score: float, token: int) -> tuple[int, int]:
    """Sort key: better candidates first."""
    return (-f32_order(score), token)


def owner(t: int, n: int, interleave: int) -> int:
    return (t // interleave) % n


@st.composite
def sharded_rows(draw):
    n = draw(st.integers(1, 5))
    interleave = draw(st.sampled_from([1, 2, 3]))
    k = draw(st.integers(1, 12))
    width = draw(st.integers(0, 48))
    num_rows = draw(st.integers(1, 4))
    rows = [draw(st.lists(SCORES, min_size=width, max_size=width)) for _ in range(num_rows)]
    lengths = [draw(st.integers(0, width)) for _ in range(num_rows)]
    row_offsets = draw(st.booleans())
    return n, interleave, k, width, rows, lengths, row_offsets


def local_topk(
    scores: list[float], local_tokens: list[int], k: int, ties: random.Random | None = None
) -> list[int]:
    """A rank's local top-k positions in its shard, -1 padded; ties to the smaller position
    (the merge's order), or in a random order when ``ties`` is given."""
    salt = [ties.random() if ties else p for p in range(len(local_tokens))]
    order = sorted(range(len(local_tokens)), key=lambda p: (-f32_order(scores[p]), salt[p]))
    order = order[:k]
    return order + [-1] * (k - len(order))


def gather_candidates(
    merge,
    n,
    interleave,
    k,
    width,
    rows,
    lengths,
    row_offsets,
    ties: random.Random | None = None,
    pack: str = "torch",
):
    """Every rank's packed (score, global id) candidates, concatenated in rank order."""
    packed = []
    for rank in range(n):
        owned = [t for t in range(width) if owner(t, n, interleave) == rank]
        local_scores = [[row[t] for t in owned] for row in rows]
        topk = torch.tensor(
            [
                local_topk(ls, [t for t in owned if t < length], k, ties)
                for ls, length in zip(local_scores, lengths, strict=True)
            ],
            dtype=torch.int32,
        )
        logits = torch.tensor(local_scores, dtype=torch.float32).view(len(rows), len(owned))
        starts = None
        if row_offsets:
            # Rows at distinct column offsets of one logits buffer, as in a prefill chunk.
            shift = 2
            wide = torch.full((len(rows), len(owned) + shift * len(rows)), 7.0)
            for r in range(len(rows)):
                wide[r, r * shift : r * shift + len(owned)] = logits[r]
            logits = wide
            starts = torch.arange(len(rows), dtype=torch.int32) * shift
        buf = torch.empty((len(rows), k, 2))
        getattr(merge, f"pack_dcp_topk_candidates_{pack}")(
            logits, topk, buf, rank, n, interleave, starts
        )
        packed.append(buf)
    return torch.cat(packed, dim=1)


@SETTINGS
@given(case=sharded_rows())
def test_merge_equals_topk_over_concatenated_scores(case):
    """For generated rank counts, interleaves, k, tie-heavy scores with +-0 and +-inf, short
    rows (-1 candidates) and row offsets, merging the ranks' local top-k candidates gives
    exactly the first k tokens of the whole row in (score desc, id asc) order, then -1."""
    merge = load_leaf(TOPK_MERGE)
    n, interleave, k, width, rows, lengths, row_offsets = case
    gathered = gather_candidates(merge, n, interleave, k, width, rows, lengths, row_offsets)
    merged = merge.stable_topk_from_gathered_candidates_torch(gathered, k)
    for r, (row, length) in enumerate(zip(rows, lengths, strict=True)):
        best = sorted(range(length), key=lambda t: rank_order(row[t], t))[:k]
        assert merged[r].tolist() == best + [-1] * (k - len(best))


@SETTINGS
@given(case=sharded_rows(), seed=st.integers(0, 2**32 - 1))
def test_any_local_tie_order_keeps_the_global_top_k_scores(case, seed):
    """Whatever order the ranks' local top-k kernels break ties in, the merged row selects the
    same multiset of scores (and the same number of -1) as the top-k of the whole row."""
    merge = load_leaf(TOPK_MERGE)
    n, interleave, k, width, rows, lengths, row_offsets = case
    gathered = gather_candidates(
        merge, n, interleave, k, width, rows, lengths, row_offsets, random.Random(seed)
    )
    merged = merge.stable_topk_from_gathered_candidates_torch(gathered, k)
    for r, (row, length) in enumerate(zip(rows, lengths, strict=True)):
        best = sorted(range(length), key=lambda t: rank_order(row[t], t))[:k]
        got = [t for t in merged[r].tolist() if t >= 0]
        assert len(got) == len(best)
        assert sorted(f32_order(row[t]) for t in got) == sorted(f32_order(row[t]) for t in best)


@SETTINGS
@given(case=sharded_rows(), data=st.data())
def test_merge_depends_only_on_the_candidate_multiset(case, data):
    """Permuting the gathered candidates (any gather order, any local top-k order) does not
    change the merged row, so every rank selects the same ids."""
    merge = load_leaf(TOPK_MERGE)
    n, interleave, k, width, rows, lengths, row_offsets = case
    gathered = gather_candidates(merge, n, interleave, k, width, rows, lengths, row_offsets)
    perm = data.draw(st.permutations(range(gathered.shape[1])))
    permuted = gathered[:, torch.tensor(perm, dtype=torch.long)]
    a = merge.stable_topk_from_gathered_candidates_torch(gathered, k)
    b = merge.stable_topk_from_gathered_candidates_torch(permuted.contiguous(), k)
    assert torch.equal(a, b)


@SETTINGS
@given(
    bits=st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=64),
    ids=st.lists(st.integers(-1, 2**24), min_size=64, max_size=64),
)
def test_keys_equal_the_cutedsl_stable_key(bits, ids):
    """For any fp32 bit pattern (NaNs included) and id, the int64 key plus 2**63 equals the
    CuteDSL selector's unsigned key: ordered(bits) << 32 | ~uint32(id), and 0 for id < 0."""
    merge = load_leaf(TOPK_MERGE)
    scores = torch.tensor(bits, dtype=torch.int64).to(torch.int32).view(torch.float32)
    token_ids = torch.tensor(ids[: len(bits)], dtype=torch.int32)
    keys = merge.dcp_topk_stable_keys(scores, token_ids).tolist()
    for b, i, key in zip(bits, token_ids.tolist(), keys, strict=True):
        mask = 0xFFFFFFFF if b >> 31 else 0x80000000
        expected = 0 if i < 0 else ((b ^ mask) << 32) | (~i & 0xFFFFFFFF)
        assert key + 2**63 == expected


@SETTINGS
@given(
    rows=st.integers(1, 6),
    candidates=st.integers(1, 40),
    k=st.integers(1, 48),
    chunk=st.integers(1, 200),
    seed=st.integers(0, 2**16),
)
def test_row_chunking_and_short_candidate_lists(rows, candidates, k, chunk, seed):
    """The result does not depend on the row-chunk bound, and k above the candidate count
    pads with -1 after the sorted candidates."""
    merge = load_leaf(TOPK_MERGE)
    gen = torch.Generator().manual_seed(seed)
    gathered = torch.empty((rows, candidates, 2))
    gathered[..., 0] = torch.randint(-3, 3, (rows, candidates), generator=gen).float()
    ids = torch.randperm(rows * candidates, generator=gen).view(rows, candidates)
    ids[torch.rand((rows, candidates), generator=gen) < 0.2] = -1
    gathered[..., 1] = ids.float()
    whole = merge.stable_topk_from_gathered_candidates_torch(gathered, k)
    chunked = merge.stable_topk_from_gathered_candidates_torch(gathered, k, max_key_elems=chunk)
    assert torch.equal(whole, chunked)
    for r in range(rows):
        cands = [(float(s), int(i)) for s, i in gathered[r].tolist() if int(i) >= 0]
        best = [i for _, i in sorted(cands, key=lambda c: rank_order(c[0], c[1]))]
        expected = (best + [-1] * k)[:k]
        assert whole[r].tolist() == expected


def assert_triton_row_layout(triton_row: list[int], torch_row: list[int]) -> None:
    """The Triton selector writes the torch selection's ids (as a set), then -1."""
    valid = [t for t in triton_row if t >= 0]
    assert triton_row == valid + [-1] * (len(triton_row) - len(valid))
    assert sorted(valid) == sorted(t for t in torch_row if t >= 0)


def cutedsl_key(bits: int, token: int) -> int:
    """The CuteDSL selector's unsigned 64-bit key of an fp32 bit pattern and an id."""
    if token < 0:
        return 0
    return ((bits ^ (0xFFFFFFFF if bits >> 31 else 0x80000000)) << 32) | (~token & 0xFFFFFFFF)


def triton_rows(gathered: torch.Tensor, k: int) -> list[list[int]]:
    """The rows the Triton selector must write, from the keys in Python ints: with T the k-th
    largest key, the valid ids of the keys above T and of T's first copies (as many as fit)
    in candidate order, then -1."""
    rows = []
    for bits, ids in zip(
        gathered[..., 0].contiguous().view(torch.int32).tolist(),
        gathered[..., 1].to(torch.int32).tolist(),
        strict=True,
    ):
        keys = [cutedsl_key(b & 0xFFFFFFFF, i) for b, i in zip(bits, ids, strict=True)]
        take = min(k, len(keys))
        kth = sorted(keys, reverse=True)[take - 1] if take else None
        copies_left = take - sum(1 for key in keys if take and key > kth)
        row = []
        for i, key in zip(ids, keys, strict=True):
            if not take or key < kth or (key == kth and copies_left == 0):
                continue
            copies_left -= key == kth
            if i >= 0:
                row.append(i)
        rows.append(row + [-1] * (k - len(row)))
    return rows


@TRITON_SETTINGS
@given(case=sharded_rows())
def test_triton_merge_equals_topk_over_concatenated_scores(case):
    """With the Triton pack and the Triton selector, merging the ranks' local
    top-k candidates selects exactly the first k tokens of the whole row in (score desc, id
    asc) order (as a set, valid ids first, in the selector's documented order), for generated
    ranks, interleaves, k, tie-heavy scores with +-0 and +-inf, short rows and row offsets; the
    Triton pack equals the torch pack bit for bit."""
    merge = load_leaf(TOPK_MERGE)
    n, interleave, k, width, rows, lengths, row_offsets = case
    gathered = gather_candidates(
        merge, n, interleave, k, width, rows, lengths, row_offsets, pack="triton"
    )
    reference = gather_candidates(merge, n, interleave, k, width, rows, lengths, row_offsets)
    assert torch.equal(gathered.view(torch.int32), reference.view(torch.int32))
    merged = merge.stable_topk_from_gathered_candidates_triton(gathered, k)
    assert merged.tolist() == triton_rows(gathered, k)
    for r, (row, length) in enumerate(zip(rows, lengths, strict=True)):
        best = sorted(range(length), key=lambda t: rank_order(row[t], t))[:k]
        assert_triton_row_layout(merged[r].tolist(), best + [-1] * (k - len(best)))


@st.composite
def raw_candidates(draw):
    """Gathered rows straight from bit patterns: NaNs, signed zeros, infinities, denormals,
    duplicated (score, id) pairs, padding anywhere, k above or below the candidate count."""
    rows = draw(st.integers(1, 3))
    candidates = draw(st.integers(1, 70))
    k = draw(st.integers(1, 80))
    special = [0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFFFFFFF, 1]
    bit = st.one_of(st.sampled_from(special), st.integers(0, 2**32 - 1))
    small = st.sampled_from([0x3F800000, 0x40000000, 0xBF800000, 0x00000000])
    bits = [
        draw(st.lists(st.one_of(bit, small), min_size=candidates, max_size=candidates))
        for _ in range(rows)
    ]
    ids = [
        draw(st.lists(st.integers(-1, 40), min_size=candidates, max_size=candidates))
        for _ in range(rows)
    ]
    return rows, candidates, k, bits, ids


@TRITON_SETTINGS
@given(case=raw_candidates())
def test_triton_select_equals_the_torch_reference_on_any_bits(case):
    """For any fp32 bit patterns and ids (duplicates and -1 anywhere), the Triton selector
    picks the same multiset of ids as the torch reference, i.e. the k largest
    CuteDSL keys, and writes them in its documented order."""
    merge = load_leaf(TOPK_MERGE)
    rows, candidates, k, bits, ids = case
    gathered = torch.empty((rows, candidates, 2))
    gathered[..., 0] = torch.tensor(bits, dtype=torch.int64).to(torch.int32).view(torch.float32)
    gathered[..., 1] = torch.tensor(ids, dtype=torch.float32)
    ref = merge.stable_topk_from_gathered_candidates_torch(gathered, k)
    got = merge.stable_topk_from_gathered_candidates_triton(gathered, k)
    assert got.tolist() == triton_rows(gathered, k)
    for r in range(rows):
        assert_triton_row_layout(got[r].tolist(), ref[r].tolist())
        # The reference itself is the k largest keys, written in key order.
        keys = sorted(
            (
                0
                if i < 0
                else ((b ^ (0xFFFFFFFF if b >> 31 else 0x80000000)) << 32) | (~i & 0xFFFFFFFF)
                for b, i in zip(bits[r], ids[r], strict=True)
            ),
            reverse=True,
        )[:k]
        expected = [-1 if key == 0 else (~key) & 0xFFFFFFFF for key in keys]
        assert ref[r].tolist() == expected + [-1] * (k - len(expected))


@TRITON_SETTINGS
@given(case=sharded_rows(), data=st.data())
def test_triton_merge_depends_only_on_the_candidate_multiset(case, data):
    """Permuting the gathered candidates changes at most the order of the Triton selector's
    valid ids, never the selected set, so every rank selects the same ids."""
    merge = load_leaf(TOPK_MERGE)
    n, interleave, k, width, rows, lengths, row_offsets = case
    gathered = gather_candidates(merge, n, interleave, k, width, rows, lengths, row_offsets)
    perm = data.draw(st.permutations(range(gathered.shape[1])))
    permuted = gathered[:, torch.tensor(perm, dtype=torch.long)].contiguous()
    a = merge.stable_topk_from_gathered_candidates_triton(gathered, k)
    b = merge.stable_topk_from_gathered_candidates_triton(permuted, k)
    assert torch.equal(a.sort(dim=1).values, b.sort(dim=1).values)


def test_triton_select_writes_a_strided_view_and_rejects_oversized_rows():
    """The selector writes into a column slice of a wider buffer (the indexer's top-k buffer)
    without touching the other columns, and refuses rows beyond its register budget."""
    merge = load_leaf(TOPK_MERGE)
    gathered = torch.randn((3, 24, 2))
    gathered[..., 1] = torch.arange(24).float()
    buffer = torch.full((3, 12), 123, dtype=torch.int32)
    merge.stable_topk_from_gathered_candidates_triton(gathered, 8, out=buffer[:, :8])
    assert (buffer[:, 8:] == 123).all()
    ref = merge.stable_topk_from_gathered_candidates_torch(gathered, 8)
    for r in range(3):
        assert_triton_row_layout(buffer[r, :8].tolist(), ref[r].tolist())
    too_many = torch.zeros((1, merge.TRITON_MAX_CANDIDATES + 1, 2))
    try:
        merge.stable_topk_from_gathered_candidates_triton(too_many, 8)
    except ValueError as e:
        assert "at most" in str(e)
    else:
        raise AssertionError("oversized rows must be refused")


# Ids that differ in one byte each, so ties on the score run the radix passes of every byte of
# the id word; the fp32 patterns at the ends of the order (-NaN 0xFFFFFFFF shares its high word
# with padding), signed zeros, infinities and a denormal.
SPREAD_IDS = [0, 1, 255, 256, 257, 65535, 65536, 65537, 2**24 - 1, 2**24, -1]
EDGE_BITS = [
    0x00000000,
    0x80000000,
    0x7F800000,
    0xFF800000,
    0x7FC00000,
    0x7FFFFFFF,
    0xFFFFFFFF,
    0x00000001,
    0x3F800000,
    0xBF800000,
]


def gathered_from(bits: list[list[int]], ids: list[list[int]]) -> torch.Tensor:
    gathered = torch.empty((len(bits), len(bits[0]), 2))
    gathered[..., 0] = torch.tensor(bits, dtype=torch.int64).to(torch.int32).view(torch.float32)
    gathered[..., 1] = torch.tensor(ids, dtype=torch.float32)
    return gathered


@st.composite
def tie_groups(draw):
    """Rows of few distinct edge-case scores and byte-spread ids (duplicates and -1)."""
    candidates = draw(st.integers(1, 160))
    k = draw(st.integers(1, candidates + 4))
    scores = draw(st.lists(st.sampled_from(EDGE_BITS), min_size=1, max_size=3))
    bits = draw(st.lists(st.sampled_from(scores), min_size=candidates, max_size=candidates))
    ids = draw(st.lists(st.sampled_from(SPREAD_IDS), min_size=candidates, max_size=candidates))
    return k, [bits], [ids]


@TRITON_SETTINGS
@given(case=tie_groups())
def test_radix_select_writes_the_documented_rows_on_tie_groups(case):
    """On rows where most keys tie on the score word (so the radix select runs the id word's
    passes), with duplicated (score, id) pairs at the boundary, padding and k above the
    candidate count, the Triton selector writes exactly the documented row."""
    merge = load_leaf(TOPK_MERGE)
    k, bits, ids = case
    gathered = gathered_from(bits, ids)
    got = merge.stable_topk_from_gathered_candidates_triton(gathered, k)
    assert got.tolist() == triton_rows(gathered, k)


F_ONE, F_TWO, F_THREE = 0x3F800000, 0x40000000, 0x40400000
NEG_NAN, POS_NAN, POS_INF, NEG_INF = 0xFFFFFFFF, 0x7FC00000, 0x7F800000, 0xFF800000

# (name, score bits, ids, k, the row the Triton selector must write)
EDGE_CASES = [
    # One score: the id word decides, smaller id first; ids differ in every byte.
    ("one_score", [F_ONE] * 6, [65536, 256, 1, 65537, 257, 0], 4, [256, 1, 257, 0]),
    ("one_score_k1", [F_ONE] * 6, [65536, 256, 1, 65537, 257, 0], 1, [0]),
    # +0.0 ranks above -0.0.
    ("signed_zeros", [0x80000000, 0, 0x80000000, 0], [0, 1, 2, 3], 3, [0, 1, 3]),
    # +NaN > +inf > ... > -inf > -NaN(0xFFFFFFFF) > padding (same high word as -NaN).
    (
        "nan_inf_padding",
        [NEG_NAN, 0, NEG_INF, POS_NAN, POS_INF, NEG_NAN],
        [4, -1, 3, 1, 2, -1],
        5,
        [4, 3, 1, 2, -1],
    ),
    (
        "nan_inf_order",
        [NEG_NAN, 0, NEG_INF, POS_NAN, POS_INF, NEG_NAN],
        [4, -1, 3, 1, 2, -1],
        3,
        [3, 1, 2],
    ),
    ("neg_nan_above_padding", [NEG_NAN, NEG_NAN, 0], [-1, 9, -1], 1, [9]),
    ("padding_only", [F_ONE, F_TWO, 0], [-1, -1, -1], 2, [-1, -1]),
    ("k_above_candidates", [F_ONE, F_THREE, F_TWO], [5, 6, 7], 5, [5, 6, 7, -1, -1]),
    # A (score, id) pair offered three times straddles the boundary: its first copies that
    # fit are taken, in candidate order with the keys above it.
    ("duplicate_at_boundary", [F_TWO, F_THREE, F_TWO, F_ONE, F_TWO], [7, 1, 7, 2, 7], 3, [7, 1, 7]),
    (
        "duplicate_all_fit",
        [F_TWO, F_THREE, F_TWO, F_ONE, F_TWO],
        [7, 1, 7, 2, 7],
        5,
        [7, 1, 7, 2, 7],
    ),
    # The k-th key is unique: it is written in candidate order with the keys above it.
    ("unique_kth_in_order", [F_ONE, F_TWO, F_THREE], [0, 1, 2], 2, [1, 2]),
    # Scores of one sign with a narrow spread, and a row spanning both signs, where the k-th
    # key sat inside one value bin of the (removed) range first pass.
    (
        "narrow_range",
        [0x3F800000, 0x3F800001, 0x3F800002, 0x3F800003, 0x3F800004],
        [0, 1, 2, 3, 4],
        2,
        [3, 4],
    ),
    (
        "both_signs",
        [0xBF800000, 0x3F800000, 0x80000001, 0x00000001, 0x40000000],
        [0, 1, 2, 3, 4],
        3,
        [1, 3, 4],
    ),
    # Nearby scores (one value bin of the removed range first pass) hold a key above the k-th
    # and three copies of the k-th key, of which one fits.
    (
        "duplicate_straddles_one_bin",
        [0x40000000, 0x41200000, 0x40000001, 0x40000000, 0x41100000, 0x40000000, 0xC2C80000],
        [7, 9, 1, 7, 8, 7, 3],
        4,
        [7, 9, 1, 8],
    ),
]


@pytest.mark.parametrize(
    "name,bits,ids,k,expected", EDGE_CASES, ids=[case[0] for case in EDGE_CASES]
)
def test_triton_select_edge_cases(name, bits, ids, k, expected):
    """Stated rows (ties decided by id in every byte, +0.0 above -0.0, NaN and infinities,
    -NaN against padding, padding only, k above the candidate count, a duplicated key at the
    boundary) are written exactly, by the Triton selector and by the Python model of the order."""
    merge = load_leaf(TOPK_MERGE)
    gathered = gathered_from([bits], [ids])
    assert triton_rows(gathered, k) == [expected]
    got = merge.stable_topk_from_gathered_candidates_triton(gathered, k)
    assert got.tolist() == [expected]


@pytest.mark.parametrize("candidates,k", [(1024, 512), (1024, 1), (4096, 2048)])
def test_radix_select_on_a_decode_sized_row(candidates, k):
    """On decode-sized rows (DCP 2 x top-k 512, DCP 2 x top-k 2048) of random scores, some tied,
    with padding, the radix select writes exactly the documented row."""
    merge = load_leaf(TOPK_MERGE)
    gen = torch.Generator().manual_seed(candidates + k)
    gathered = torch.empty((1, candidates, 2))
    gathered[..., 0] = torch.randn((1, candidates), generator=gen)
    gathered[0, ::5, 0] = 0.25
    gathered[..., 1] = torch.randperm(candidates, generator=gen).float().view(1, -1)
    gathered[0, ::7, 1] = -1.0
    radix = merge.stable_topk_from_gathered_candidates_triton(gathered, k)
    assert radix.tolist() == triton_rows(gathered, k)


@pytest.mark.parametrize(
    "cluster,k", [(300, 200), (100, 2), (100, 60), (20, 10)], ids=lambda v: str(v)
)
def test_radix_select_on_a_cluster_holding_the_kth_key(cluster, k):
    """When the k-th key lies among ``cluster`` nearly equal scores (narrower than 1/256 of the
    row's range, with a duplicated key and padding beside them), the radix select writes the
    documented row."""
    # (The cluster sizes were chosen around the removed range_rank choice's RANK_BLOCK.)
    merge = load_leaf(TOPK_MERGE)
    gen = torch.Generator().manual_seed(cluster * 7 + k)
    spread = 200
    scores = torch.cat(
        [
            torch.full((cluster,), 1.0) + torch.randint(0, 64, (cluster,), generator=gen) * 1e-6,
            torch.linspace(-100.0, 100.0, spread) + 3.0,
        ]
    )
    ids = torch.randperm(cluster + spread, generator=gen).float()
    ids[cluster // 3] = ids[cluster // 2]  # a duplicated (score, id) pair, maybe in the group
    scores[cluster // 3] = scores[cluster // 2]
    ids[-5:] = -1.0
    perm = torch.randperm(cluster + spread, generator=gen)
    gathered = torch.stack([scores[perm], ids[perm]], dim=-1).unsqueeze(0)
    above_cluster = int((torch.linspace(-100.0, 100.0, spread)[:-5] + 3.0 > 1.0).sum())
    topk = above_cluster + k
    assert above_cluster < topk < above_cluster + cluster  # the k-th key is in the cluster
    expected = triton_rows(gathered, topk)
    got = merge.stable_topk_from_gathered_candidates_triton(gathered, topk)
    assert got.tolist() == expected


def test_every_triton_launch_compiles_for_sm90():
    """Every launch the Triton merge makes (the pack, and the radix select at 64-16384
    candidates) compiles for sm_90: the interpreter runs code that the
    compiler refuses, so the proofs above alone do not show it (Triton's own compiler and
    ptxas, offline, in a process without ``TRITON_INTERPRET``)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from conftest import REPO, patched_tree

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    script = Path(REPO) / "proofs" / "dcp_topk_merge_sm90_compile.py"
    run = subprocess.run(
        [sys.executable, str(script), "--tree", str(patched_tree())],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    assert run.stdout.strip().splitlines()[-1].endswith("launches compiled for sm_90")
