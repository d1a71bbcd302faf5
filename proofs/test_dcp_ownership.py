# SPDX-License-Identifier: Apache-2.0
"""DCP ownership and localisation of the global top-k, on vLLM's shipped filter kernel.

Token ``t`` of a request lives on DCP rank ``(t // I) % N`` at local position
``(t // (N * I)) * I + t % I``. After the global top-k merge every rank holds the same global
winner ids; ``triton_filter_and_convert_dcp_index`` (``sparse_utils.py``, run here under the
Triton interpreter) must keep exactly the winners the rank owns, at the physical slot its block
table gives for the local position, and drop the rest.

On the pinned base (pins.toml) ``sparse_utils.py`` imports much of vLLM (config, JIT warm-up
helpers), so it is loaded with ``load_shipped_triton_with_vllm`` (the installed wheel of the
same release for those imports, the real interpreted Triton for ``vllm.triton_utils``). With one
rank the filter delegates to ``triton_convert_req_index_to_global_index``, which compacts the
kept slots to the front whenever it counts them (0.26.0 kept them in place).
"""

from __future__ import annotations

import random

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from shipped_triton import load_shipped_triton_with_vllm

SPARSE_UTILS = "vllm/v1/attention/backends/mla/sparse_utils.py"
SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def owner(t: int, n: int, interleave: int) -> int:
    return (t // interleave) % n


def local_position(t: int, n: int, interleave: int) -> int:
    return (t // (n * interleave)) * interleave + t % interleave


@st.composite
def dcp_layouts(draw):
    """N ranks, interleave I | block size, requests with lengths, rows of global winners."""
    n = draw(st.integers(1, 5))
    block_size = draw(st.sampled_from([4, 8, 16]))
    interleave = draw(st.sampled_from([i for i in (1, 2, 4, 8) if block_size % i == 0]))
    block_n = 16
    topk = block_n * draw(st.integers(1, 3))
    lengths = draw(st.lists(st.integers(0, 160), min_size=1, max_size=3))
    max_local = max(-(-length // n) + interleave for length in lengths)
    blocks_per_req = -(-max_local // block_size) + 1
    rows = []
    for req, length in enumerate(lengths):
        for _ in range(draw(st.integers(1, 3))):
            count = draw(st.integers(0, min(topk, length)))
            winners = draw(st.permutations(range(length)))[:count] if length else []
            row = list(winners) + [-1] * (topk - count)
            if draw(st.booleans()):
                row = draw(st.permutations(row))
            rows.append((req, row))
    seed = draw(st.integers(0, 2**16))
    return n, interleave, block_size, block_n, topk, lengths, blocks_per_req, rows, seed


def block_tables(n: int, num_reqs: int, blocks_per_req: int, seed: int) -> list[torch.Tensor]:
    """One block table per rank: distinct physical blocks, shuffled, per request."""
    rng = random.Random(seed)
    tables = []
    for _ in range(n):
        physical = list(range(num_reqs * blocks_per_req * 2))
        rng.shuffle(physical)
        table = torch.tensor(physical[: num_reqs * blocks_per_req], dtype=torch.int32)
        tables.append(table.view(num_reqs, blocks_per_req))
    return tables


@SETTINGS
@given(layout=dcp_layouts(), compact=st.booleans())
def test_every_global_winner_is_kept_by_exactly_one_rank_at_its_local_slot(layout, compact):
    """For any N, I, lengths and global winner rows, the shipped filter keeps each winner on
    exactly its owner rank (t // I) % N, at block_table[local // B] * B + local % B with
    local = (t // (N*I))*I + t % I, keeps nothing else, and reports the owned count."""
    su = load_shipped_triton_with_vllm(SPARSE_UTILS)
    n, interleave, block_size, block_n, topk, lengths, blocks_per_req, rows, seed = layout
    tables = block_tables(n, len(lengths), blocks_per_req, seed)
    req_id = torch.tensor([req for req, _ in rows], dtype=torch.int32)
    indices = torch.tensor([row for _, row in rows], dtype=torch.int32)

    kept: list[list[list[int]]] = []
    for rank in range(n):
        result = su.triton_filter_and_convert_dcp_index(
            req_id,
            tables[rank],
            indices,
            n,
            rank,
            interleave,
            BLOCK_SIZE=block_size,
            NUM_TOPK_TOKENS=topk,
            BLOCK_N=block_n,
            return_valid_counts=True,
            compact_valid_to_front=compact,
        )
        out, counts = result
        kept.append(out.tolist())
        for r, (req, row) in enumerate(rows):
            owned = [t for t in row if t >= 0 and owner(t, n, interleave) == rank]
            expected = []
            for t in owned:
                local = local_position(t, n, interleave)
                expected.append(
                    int(tables[rank][req, local // block_size]) * block_size + local % block_size
                )
            got = [s for s in out[r].tolist() if s >= 0]
            assert sorted(got) == sorted(expected)
            assert int(counts[r]) == len(owned)
            if compact or n == 1:
                # Compacted (always for N == 1, which counts): the kept slots are a prefix.
                assert all(s >= 0 for s in out[r, : len(owned)].tolist())
                assert all(s == -1 for s in out[r, len(owned) :].tolist())
            else:
                # In place: column j holds row[j]'s slot or -1.
                for j, t in enumerate(row):
                    if t >= 0 and owner(t, n, interleave) == rank:
                        local = local_position(t, n, interleave)
                        slot = (
                            int(tables[rank][req, local // block_size]) * block_size
                            + local % block_size
                        )
                        assert int(out[r, j]) == slot
                    else:
                        assert int(out[r, j]) == -1

    # Exactly one rank keeps each winner: the kept counts over ranks add up to the winners.
    for r, (_, row) in enumerate(rows):
        total = sum(sum(1 for s in kept[rank][r] if s >= 0) for rank in range(n))
        assert total == sum(1 for t in row if t >= 0)
