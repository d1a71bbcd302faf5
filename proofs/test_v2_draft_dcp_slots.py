# SPDX-License-Identifier: Apache-2.0
"""Evidence for dropping vllm/0011 on vLLM 0.34: Model Runner V2 draft steps place draft KV
under DCP like the target.

0.34 removed Model Runner V1 (and with it the V1 draft-step kernel 0011 fixed). V2 draft
steps after the first (``_multi_step_decode`` / ``_run_fused_multi_step_decode`` /
``_fused_multi_step_decode`` in ``vllm/v1/worker/gpu/spec_decode/autoregressive/
speculator.py``) take slots from the target runner's ``BlockTables.compute_slot_mappings``
at the advanced draft positions, and rebuild the DCP-local sequence lengths from the
advanced ``seq_lens`` with ``prepare_dcp_local_seq_lens`` (``_build_attn_metadata`` /
``_update_draft_decode_metadata`` in ``spec_decode/speculator.py``). This proof runs those
two shipped pieces on CPU in Triton's interpreter (``vllm/v1/worker/gpu/block_table.py`` and
``vllm/v1/worker/gpu/cp_utils.py`` of the tree, the rest from the installed vLLM) over a
chain of draft steps (position + 1 and seq_len + 1 per step, as
``_update_draft_inputs_kernel`` advances them) and checks them against an independent
statement of the DCP layout, not against each other.
"""

from __future__ import annotations

import os
import sys

import pytest

os.environ["TRITON_INTERPRET"] = "1"

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
pytest.importorskip("vllm")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from shipped_triton import (  # noqa: E402
    load_shipped_triton,
    load_shipped_triton_with_vllm,
)

PAD = -1
BUFFER_UTILS = "vllm.v1.worker.gpu.buffer_utils"


@pytest.fixture(scope="module")
def v2():
    # block_table.py reads block-table addresses with buffer_utils' Triton helper _load_ptr:
    # load that module with the real Triton too, and let block_table.py import it, even if
    # another proof imported the installed one (with vLLM's placeholder) before.
    buffer_utils = load_shipped_triton_with_vllm("vllm/v1/worker/gpu/buffer_utils.py")
    saved = sys.modules.get(BUFFER_UTILS)
    sys.modules[BUFFER_UTILS] = buffer_utils
    try:
        block_table = load_shipped_triton_with_vllm("vllm/v1/worker/gpu/block_table.py")
    finally:
        if saved is None:
            sys.modules.pop(BUFFER_UTILS, None)
        else:
            sys.modules[BUFFER_UTILS] = saved
    cp_utils = load_shipped_triton("vllm/v1/worker/gpu/cp_utils.py")
    return block_table, cp_utils


def _owner_and_local_slot(p, block_row, block_size, dcp, interleave):
    """The DCP layout, stated directly: in a virtual block of block_size * dcp positions,
    offset o belongs to rank (o // interleave) % dcp, at local offset
    (o // (dcp * interleave)) * interleave + o % interleave of the block
    block_row[p // (block_size * dcp)]."""
    virtual = block_size * dcp
    o = p % virtual
    owner = (o // interleave) % dcp
    local = (o // (dcp * interleave)) * interleave + o % interleave
    return owner, int(block_row[p // virtual]) * block_size + local


def _target_block_tables(module, block_table, block_size, dcp, rank, interleave, width):
    """The target runner's BlockTables for one KV cache group, without the UVA staging
    buffers (compute_slot_mappings reads only these fields)."""
    tables = object.__new__(module.BlockTables)
    tables.num_kv_cache_groups = 1
    tables.cp_size, tables.cp_rank, tables.cp_interleave = dcp, rank, interleave
    tables.slot_mappings = torch.full((1, width), -7, dtype=torch.int64)
    tables.block_table_ptrs = torch.tensor([block_table.data_ptr()], dtype=torch.uint64)
    tables.block_table_strides = torch.tensor([block_table.stride(0)], dtype=torch.int64)
    tables.block_sizes_tensor = torch.tensor([block_size], dtype=torch.int32)
    tables.slot_mapping_enabled = torch.tensor([True])
    tables.dcp_sharded = torch.tensor([True])
    return tables


@st.composite
def draft_chains(draw):
    dcp = draw(st.sampled_from([2, 4]))
    block_size = draw(st.sampled_from([4, 8, 16]))
    interleave = draw(st.sampled_from([i for i in (1, 2, 4, block_size) if block_size % i == 0]))
    num_reqs = draw(st.integers(1, 4))
    n_blocks = draw(st.integers(1, 5))
    steps = draw(st.integers(2, 5))
    max_len = n_blocks * block_size * dcp
    # First draft position of each request (after the verified and rejected tokens).
    first = draw(st.lists(st.integers(0, max_len - steps), min_size=num_reqs, max_size=num_reqs))
    ids = draw(st.permutations(list(range(num_reqs * n_blocks))))
    return dict(
        dcp=dcp,
        block_size=block_size,
        interleave=interleave,
        steps=steps,
        first=first,
        block_table=torch.tensor(ids, dtype=torch.int32).reshape(num_reqs, n_blocks),
    )


@settings(max_examples=30, deadline=None)
@given(case=draft_chains())
def test_v2_draft_steps_follow_the_dcp_layout_on_every_rank(v2, case) -> None:
    """At every draft step, on every DCP rank: compute_slot_mappings gives each request's
    draft position the slot the DCP layout assigns it on that rank and PAD elsewhere
    (exactly one owner per position, PAD past the tokens), and prepare_dcp_local_seq_lens
    gives the number of positions below seq_len that the rank holds."""
    block_table_mod, cp_utils = v2
    dcp, bs, inter = case["dcp"], case["block_size"], case["interleave"]
    bt = case["block_table"]
    n = bt.shape[0]
    width = n + 3
    idx_mapping = torch.arange(n, dtype=torch.int32)
    query_start_loc = torch.arange(n + 1, dtype=torch.int32)
    for step in range(case["steps"]):
        positions = torch.tensor([f + step for f in case["first"]], dtype=torch.int64)
        seq_lens = (positions + 1).to(torch.int32)
        owners = [0] * n
        local_total = [0] * n
        for rank in range(dcp):
            tables = _target_block_tables(block_table_mod, bt, bs, dcp, rank, inter, width)
            slots = tables.compute_slot_mappings(idx_mapping, query_start_loc, positions, n)
            assert tables.slot_mappings[0, n:].tolist() == [PAD] * (width - n)
            local_lens = torch.full((n + 2,), -7, dtype=torch.int32)
            cp_utils.prepare_dcp_local_seq_lens(local_lens, seq_lens, n, dcp, rank, inter)
            assert local_lens[n:].tolist() == [0, 0]
            for r in range(n):
                p = int(positions[r])
                owner, slot = _owner_and_local_slot(p, bt[r], bs, dcp, inter)
                assert int(slots[0, r]) == (slot if owner == rank else PAD)
                owners[r] += owner == rank
                held = sum(
                    _owner_and_local_slot(q, bt[r], bs, dcp, inter)[0] == rank
                    for q in range(int(seq_lens[r]))
                )
                assert int(local_lens[r]) == held
                local_total[r] += int(local_lens[r])
        assert owners == [1] * n
        assert local_total == seq_lens.tolist()
