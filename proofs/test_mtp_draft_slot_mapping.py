# SPDX-License-Identifier: Apache-2.0
"""CPU proofs for vllm/0011: V1 draft steps 2..k place draft KV like the target under DCP.

The shipped Triton kernels run on CPU in Triton's interpreter: vLLM swaps Triton for a
placeholder on a machine without a GPU driver, so this module points ``vllm.triton_utils``
at the real Triton (with ``TRITON_INTERPRET=1``) while it loads, by path from the patched
tree, ``vllm/v1/spec_decode/utils.py`` (the draft-step kernel),
``vllm/v1/worker/block_table.py`` (the target's slot-mapping kernel, the reference rule)
and ``vllm/v1/spec_decode/llm_base_proposer.py`` (the caller). Everything else comes from
the installed vLLM 0.33.0. (The V2 half of the 0.26 patch is gone: 0.33.0's V2 speculator
computes draft slots with the target's kernel and prepares DCP-local seq_lens itself.)
"""

from __future__ import annotations

import os
import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType, SimpleNamespace

import pytest

os.environ["TRITON_INTERPRET"] = "1"

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")
pytest.importorskip("vllm")

from conftest import load_leaf  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

PAD = -1


@contextmanager
def _real_triton() -> Iterator[None]:
    """Make ``from vllm.triton_utils import tl, triton`` give the real (interpreted) Triton."""
    import triton.language as tl
    import triton.language.extra.libdevice as tldevice
    import vllm.triton_utils as stock

    shim = types.ModuleType("vllm.triton_utils")
    shim.__dict__.update(
        HAS_TRITON=True,
        triton=triton,
        tl=tl,
        tldevice=tldevice,
        LOG2E=stock.LOG2E,
        LOGE2=stock.LOGE2,
    )
    saved = sys.modules["vllm.triton_utils"]
    sys.modules["vllm.triton_utils"] = shim
    try:
        yield
    finally:
        sys.modules["vllm.triton_utils"] = saved


@contextmanager
def _as_module(name: str, module: ModuleType) -> Iterator[None]:
    saved = sys.modules.get(name)
    sys.modules[name] = module
    try:
        yield
    finally:
        if saved is None:
            del sys.modules[name]
        else:
            sys.modules[name] = saved


def _import_dependencies_first() -> None:
    """Import the installed modules the loaded files depend on *before* the real Triton is
    swapped in, so that only the loaded files themselves see it (other modules keep vLLM's
    placeholder and other proofs are unaffected)."""
    import vllm.v1.spec_decode.llm_base_proposer  # noqa: F401
    import vllm.v1.worker.block_table  # noqa: F401


@pytest.fixture(scope="module")
def kernels() -> SimpleNamespace:
    _import_dependencies_first()
    with _real_triton():
        spec_utils = load_leaf("vllm/v1/spec_decode/utils.py")
        block_table = load_leaf("vllm/v1/worker/block_table.py")
        with _as_module("vllm.v1.spec_decode.utils", spec_utils):
            proposer = load_leaf("vllm/v1/spec_decode/llm_base_proposer.py")
    from vllm.v1.attention.backends.utils import get_dcp_local_seq_lens

    return SimpleNamespace(
        spec_utils=spec_utils,
        block_table=block_table,
        proposer=proposer,
        get_dcp_local_seq_lens=get_dcp_local_seq_lens,
    )


def _target_slots(k, positions, block_table, block_size, dcp, rank, interleave):
    """Slots the target's own kernel (BlockTable.compute_slot_mapping) gives ``positions``,
    one token per request."""
    num_reqs = positions.shape[0]
    slots = torch.full((num_reqs,), -7, dtype=torch.int64)
    k.block_table.ComputeSlotMappingKernel.kernel[(num_reqs + 1,)](
        num_reqs,
        num_reqs,
        torch.arange(num_reqs + 1, dtype=torch.int32),
        positions,
        block_table,
        block_table.stride(0),
        slots,
        KV_CACHE_BLOCK_SIZE=block_size,
        TOTAL_CP_WORLD_SIZE=dcp,
        TOTAL_CP_RANK=rank,
        CP_KV_CACHE_INTERLEAVE_SIZE=interleave,
        PAD_ID=PAD,
        BLOCK_SIZE=16,
    )
    return slots


@st.composite
def draft_steps(draw):
    dcp = draw(st.sampled_from([1, 2, 4]))
    block_size = draw(st.sampled_from([4, 8, 16]))
    interleave = draw(st.sampled_from([i for i in (1, 2, 4, block_size) if block_size % i == 0]))
    num_reqs = draw(st.integers(1, 4))
    n_blocks = draw(st.integers(1, 6))
    max_model_len = n_blocks * block_size * dcp
    positions = draw(
        st.lists(st.integers(0, max_model_len - 1), min_size=num_reqs, max_size=num_reqs)
    )
    ids = draw(st.permutations(list(range(num_reqs * n_blocks))))
    return dict(
        dcp=dcp,
        block_size=block_size,
        interleave=interleave,
        max_model_len=max_model_len,
        positions=positions,
        block_table=torch.tensor(ids, dtype=torch.int32).reshape(num_reqs, n_blocks),
    )


@settings(max_examples=40, deadline=None)
@given(case=draft_steps())
def test_draft_step_slots_equal_target_slots_on_every_rank(kernels, case):
    """On every DCP rank, the draft-step kernel gives position p+1 the slot the target's
    slot-mapping kernel gives it (PAD where the rank does not own it), exactly one rank owns
    each position, and the local sequence lengths equal ``get_dcp_local_seq_lens``."""
    dcp, bs, inter = case["dcp"], case["block_size"], case["interleave"]
    pos = torch.tensor(case["positions"], dtype=torch.int64)
    bt = case["block_table"]
    n = pos.shape[0]
    seq_lens = (pos + 1).to(torch.int32)
    new_pos = pos + 1
    in_range = new_pos < case["max_model_len"]
    owners = torch.zeros(n, dtype=torch.int64)
    local_total = torch.zeros(n, dtype=torch.int64)
    for rank in range(dcp):
        out_pos = torch.zeros(n, dtype=torch.int64)
        out_slot = torch.full((n + 2,), -7, dtype=torch.int64)
        local = torch.full((n,), -7, dtype=torch.int32)
        lens = seq_lens.clone()
        kernels.spec_utils.eagle_step_update_slot_mapping_and_metadata(
            pos,
            bt,
            lens,
            bs,
            case["max_model_len"],
            out_pos,
            out_slot,
            input_batch_size=n + 2,
            dcp_world_size=dcp,
            dcp_rank=rank,
            cp_kv_cache_interleave_size=inter,
            out_dcp_local_seq_lens=local if dcp > 1 else None,
        )
        expected = _target_slots(
            kernels, torch.where(in_range, new_pos, 0), bt, bs, dcp, rank, inter
        )
        expected = torch.where(in_range, expected, PAD)
        assert out_slot[:n].tolist() == expected.tolist()
        assert out_slot[n:].tolist() == [PAD, PAD]
        owners += (out_slot[:n] != PAD).long()
        if dcp > 1:
            ref = kernels.get_dcp_local_seq_lens(lens, dcp, rank, inter)
            assert local.tolist() == ref.tolist()
            local_total += local.long()
    assert torch.equal(owners, in_range.long())
    if dcp > 1:
        assert torch.equal(local_total, lens.long())


def _proposer(kernels, dcp: int, rank: int, interleave: int, max_model_len: int):
    p = object.__new__(kernels.proposer.SpecDecodeBaseProposer)
    p.uses_mrope = False
    p.uses_xdrope_dim = 0
    p.draft_uses_xdrope_dim = 0
    p.max_model_len = max_model_len
    p.positions = torch.zeros(64, dtype=torch.int64)
    p._slot_mapping_buffer = torch.full((64,), -7, dtype=torch.int64)
    p.dcp_world_size = dcp
    p.dcp_rank = rank
    p.cp_kv_cache_interleave_size = interleave
    p._dcp_local_seq_lens_buffer = torch.zeros(64, dtype=torch.int32) if dcp > 1 else None
    return p


@pytest.mark.parametrize("interleave", [1, 2])
def test_proposer_draft_step_matches_target_under_dcp2(kernels, interleave):
    """With DCP=2, the proposer's next draft step writes each request's draft KV to the slot
    the target's block table assigns that position on this rank, and reports this rank's
    share of the new sequence length to the attention backends."""
    block_size, dcp, max_model_len = 4, 2, 64
    bt = torch.tensor(
        [[3, 5, 7, 9, 11, 13, 15, 17], [2, 4, 6, 8, 10, 12, 14, 16]], dtype=torch.int32
    )
    pos = torch.tensor([4, 9], dtype=torch.int64)
    for rank in range(dcp):
        p = _proposer(kernels, dcp, rank, interleave, max_model_len)
        cad = SimpleNamespace(
            block_table_tensor=bt,
            seq_lens=(pos + 1).to(torch.int32),
            slot_mapping=None,
            max_seq_len=10,
            seq_lens_cpu_upper_bound=None,
            dcp_local_seq_lens=torch.tensor([99, 99]),
            dcp_local_seq_lens_cpu_upper_bound=None,
        )
        p._update_positions_dependent_metadata(pos, cad, 2, 2, block_size)
        expected = _target_slots(kernels, pos + 1, bt, block_size, dcp, rank, interleave)
        assert cad.slot_mapping.tolist() == expected.tolist()
        ref_local = kernels.get_dcp_local_seq_lens(pos + 2, dcp, rank, interleave)
        assert cad.dcp_local_seq_lens.tolist() == ref_local.tolist()
