# SPDX-License-Identifier: Apache-2.0
"""Proof of the shipped packed-CKV glue (vllm/model_executor/layers/attention/
dcp_packed_ckv_prefill.py) across real processes: N gloo ranks run the glue's route
decision and its pack -> all-gather -> remap -> Triton sparse-MLA attention on their own
paged caches, and each rank's output is compared with the stock DCP route simulated with
the same kernel (query all-gather, per-shard attention, LSE merge).

The glue module is executed from the patched tree with stand-ins only for vLLM's process
group accessor and logger; the cores, the ledger and the kernel are the shipped leaves.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

GLUE = "vllm/model_executor/layers/attention/dcp_packed_ckv_prefill.py"


@dataclass(eq=False)
class Metadata:
    """The attention-metadata fields the glue reads (weak-referenceable)."""

    num_decode_tokens: int
    num_prefills: int
    num_actual_tokens: int
    num_reqs: int
    seq_lens: torch.Tensor
    query_start_loc: torch.Tensor
    req_id_per_token: torch.Tensor
    block_table: torch.Tensor


def _load_glue(rank: int, world: int):
    import torch.distributed as dist
    from conftest import load_leaf
    from shipped_triton import load_shipped_triton

    ckv = load_leaf("vllm/v1/attention/ops/dcp_packed_ckv.py")
    ledger = load_leaf("vllm/v1/attention/ops/dcp_comm_ledger.py")
    kernel = load_leaf("vllm/v1/attention/ops/triton_sparse_mla.py")
    group = SimpleNamespace(rank_in_group=rank, world_size=world, device_group=dist.group.WORLD)
    glue = load_shipped_triton(
        GLUE,
        {
            "vllm.distributed": {"get_dcp_group": lambda: group},
            "vllm.logger": {"init_logger": logging.getLogger},
            "vllm.v1.attention.ops.dcp_packed_ckv": vars(ckv),
            "vllm.v1.attention.ops.dcp_comm_ledger": vars(ledger),
            "vllm.v1.attention.ops.triton_sparse_mla": vars(kernel),
        },
    )
    return glue, kernel


def _vllm_config(n: int, interleave: int, route: str):
    return SimpleNamespace(
        parallel_config=SimpleNamespace(
            dcp_prefill_route=route,
            decode_context_parallel_size=n,
            cp_kv_cache_interleave_size=interleave,
            dcp_ckv_workspace_mib=64,
        ),
        scheduler_config=SimpleNamespace(max_num_seqs=4, max_num_batched_tokens=64),
        model_config=SimpleNamespace(
            max_model_len=1024,
            dtype=torch.bfloat16,
            hf_config=SimpleNamespace(index_topk=32),
        ),
    )


def _worker(rank: int, world: int, port: int, geo, results) -> None:
    import torch.distributed as dist

    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    try:
        import test_dcp_packed_ckv as proof

        glue, kernel = _load_glue(rank, world)
        sim = proof.Sim(geo)  # identical on every rank (seeded)
        t = sim.topk.shape[0]
        g = torch.Generator().manual_seed(geo.seed + 3)
        q_local = [
            torch.randn(t, geo.heads_local, 576, generator=g).to(torch.bfloat16)
            for _ in range(world)
        ]
        scale = 576**-0.5
        meta = Metadata(
            num_decode_tokens=0,
            num_prefills=sim.nreq,
            num_actual_tokens=t,
            num_reqs=sim.nreq,
            seq_lens=sim.seq_lens,
            query_start_loc=sim.qsl,
            req_id_per_token=sim.req_id,
            block_table=sim.bt[rank],
        )
        route = glue.DcpPackedCkvPrefill(
            _vllm_config(world, geo.interleave, "ckv"),
            geo.heads_local,
            "fp8_ds_mla",
            torch.device("cpu"),
        )
        state = route.select(meta, t)
        assert state is not None, "an eligible pure-prefill chunk must take ckv"
        assert route.select(meta, t) is state  # one decision per step
        topk_buffer = torch.cat([sim.topk, torch.full_like(sim.topk, -7)])  # oversized
        q = q_local[rank]
        out = route.forward(
            q[..., :512], q[..., 512:], sim.kv[rank], meta, state, topk_buffer, scale
        )
        # stock route with the same kernel: query all-gather, shard, LSE merge
        q_all = torch.cat(q_local, dim=1)
        outs, lses = [], []
        for p in range(world):
            idx = torch.full_like(sim.topk, -1)
            for row in range(t):
                r = int(sim.req_id[row])
                for c, gid in enumerate(sim.topk[row].tolist()):
                    if gid < 0 or gid >= int(sim.causal[row]):
                        continue
                    owner, loc = sim.owner_local(gid)
                    if owner == p:
                        idx[row, c] = (
                            int(sim.bt[p][r, loc // proof.BLOCK_SIZE]) * proof.BLOCK_SIZE
                            + loc % proof.BLOCK_SIZE
                        )
            o, lse = kernel.sparse_mla_fp8_ds_mla_attention(q_all, sim.kv[p], idx, scale)
            outs.append(o.float())
            lses.append(lse)
        lse_stack = torch.stack(lses)
        w = torch.exp(lse_stack - torch.logsumexp(lse_stack, 0)).nan_to_num(0.0)
        stock = (w[..., None] * torch.stack(outs)).sum(0)
        heads = slice(rank * geo.heads_local, (rank + 1) * geo.heads_local)
        err = (out.float() - stock[:, heads]).abs().max().item()
        # a mixed batch (decode rows present) must stay on the query route
        mixed = Metadata(**{**vars(meta), "num_decode_tokens": 1})
        results[rank] = {
            "max_abs_err": err,
            "missing": route.missing_owner_drops(),
            "mixed_route": route.select(mixed, t),
            "plan": state.plan,
        }
    except BaseException as e:  # report to the parent, keep the group from hanging
        results[rank] = {"error": repr(e)}
        raise
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize(
    "n,interleave,seq_lens,query_lens",
    [(2, 1, [70, 9], [5, 9]), (3, 2, [150], [6]), (2, 16, [40, 130], [3, 4])],
)
def test_glue_matches_stock_route_across_processes(n, interleave, seq_lens, query_lens):
    """On every rank of a real process group, the shipped glue's packed-CKV output
    equals the stock route's output within bf16 rounding, with no missing-owner drop,
    one decision per step, the same plan on all ranks, and mixed batches left on the
    query route."""
    import test_dcp_packed_ckv as proof

    geo = proof.Geometry(
        n=n,
        interleave=interleave,
        seq_lens=seq_lens,
        query_lens=query_lens,
        heads_local=2,
        topk=32,
        seed=5,
        missing=set(),
    )
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    results = mp.Manager().dict()
    mp.spawn(_worker, args=(n, port, geo, results), nprocs=n)
    res = [results[r] for r in range(n)]
    assert all("error" not in r for r in res), res
    assert all(r["max_abs_err"] < 2e-2 for r in res), res
    assert all(r["missing"] == 0 for r in res)
    assert all(r["mixed_route"] is None for r in res)
    assert len({r["plan"] for r in res}) == 1
