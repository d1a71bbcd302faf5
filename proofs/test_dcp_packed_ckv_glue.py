# SPDX-License-Identifier: Apache-2.0
"""Proof of the shipped packed-CKV glue (``MLADCPPackedCKVPrefill`` in
vllm/v1/attention/ops/dcp.py) across real processes: N gloo ranks build the step plan
(``plan_step``) from replicated metadata and run ``attend_prefill`` (pack -> all-gather ->
vLLM's prefill-workspace remap -> Triton sparse-MLA attention over the local heads) on
their own paged caches; each rank's output is compared with the stock DCP route simulated
with the same kernel (query all-gather, per-shard attention, LSE merge).

dcp.py is executed from the patched tree with vLLM's real kernel-launch helpers and
stand-ins only for names it uses at start-up (config, logger, process-group accessor,
direct symmetric-memory workspaces); the cores, the remap kernel and the attention kernel
it calls are the shipped files.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
from pathlib import Path
from types import SimpleNamespace

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

GLUE = "vllm/v1/attention/ops/dcp.py"


class _DirectCPWorkspace:
    """Stand-in base class of the direct symmetric-memory workspaces (not used here)."""


def _init_logger(name: str) -> logging.Logger:
    """Stand-in for vLLM's logger factory (with its ``*_once`` methods)."""
    logger = logging.getLogger(name)
    for level in ("debug", "info", "warning"):
        setattr(logger, f"{level}_once", getattr(logger, level))
    return logger


def _load_glue():
    import test_dcp_packed_ckv as proof
    import triton
    import triton.language as tl
    from shipped_triton import load_shipped_triton

    jit_warmup, helper = proof.load_jit_helpers()
    glue = load_shipped_triton(
        GLUE,
        {
            "vllm.triton_utils": {"triton": triton, "tl": tl, "HAS_TRITON": True},
            "vllm.envs": {},
            "vllm.config": {"VllmConfig": object},
            "vllm.distributed": {"get_dcp_group": None},
            "vllm.logger": {"init_logger": _init_logger},
            "vllm.model_executor.warmup.jit_warmup": vars(jit_warmup),
            "vllm.model_executor.warmup.jit_warmup_triton_helper": vars(helper),
            "vllm.v1.attention.backend": {"max_decode_query_len": None},
            "vllm.v1.attention.ops.cp_common": {
                "DirectCPWorkspace": _DirectCPWorkspace,
                "direct_cp_enabled": None,
                "direct_cp_multicast_enabled": None,
            },
            "vllm.v1.worker.ubatching": {"dbo_current_ubatch_id": lambda: 0},
        },
    )
    return glue, proof


def lazy_imports() -> dict[str, object]:
    """The glue imports its cores at call time: the names of the shipped files the
    caller must put into ``sys.modules`` while it runs the glue."""
    import test_dcp_packed_ckv as proof
    from shipped_triton import load_shipped_triton

    return {
        "vllm.v1.attention.ops.dcp_packed_ckv": proof.ckv,
        "vllm.v1.attention.ops.dcp_wire_model": proof.wire,
        "vllm.v1.attention.backends.mla.sparse_utils": proof.su,
        "vllm.v1.attention.ops.triton_sparse_mla": load_shipped_triton(
            "vllm/v1/attention/ops/triton_sparse_mla.py"
        ),
        "vllm.v1.worker.workspace": SimpleNamespace(
            is_workspace_manager_initialized=lambda: False,
            current_workspace_manager=None,
        ),
    }


def _vllm_config(n: int, interleave: int, route: str = "packed_ckv"):
    return SimpleNamespace(
        parallel_config=SimpleNamespace(
            dcp_prefill_route=route,
            decode_context_parallel_size=n,
            cp_kv_cache_interleave_size=interleave,
        ),
        scheduler_config=SimpleNamespace(max_num_seqs=4),
        model_config=SimpleNamespace(max_model_len=1024, dtype=torch.bfloat16),
    )


def _worker(rank, world, port, geo, num_decodes, results) -> None:
    import torch.distributed as dist

    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    try:
        glue, proof = _load_glue()
        sys.modules.update(lazy_imports())  # this worker process only
        kernel = sys.modules["vllm.v1.attention.ops.triton_sparse_mla"]
        sim = proof.Sim(geo)  # identical on every rank (seeded)
        t = sim.topk.shape[0]
        g = torch.Generator().manual_seed(geo.seed + 3)
        q_local = [
            torch.randn(t, geo.heads_local, 576, generator=g).to(torch.bfloat16)
            for _ in range(world)
        ]
        scale = 576**-0.5
        group = SimpleNamespace(rank_in_group=rank, world_size=world, device_group=dist.group.WORLD)
        handle = glue.MLADCPPackedCKVPrefill(
            _vllm_config(world, geo.interleave),
            group,
            torch.device("cpu"),
            num_heads=geo.heads_local,
            kv_cache_dtype="fp8_ds_mla",
            can_split_decode_rows=True,
            comm_backend="a2a",
        )
        nd = sum(geo.query_lens[:num_decodes])
        step = dict(
            seq_lens_cpu=sim.seq_lens,
            seq_lens=sim.seq_lens,
            req_id_per_token=sim.req_id,
            num_decodes=num_decodes,
            num_prefills=sim.nreq - num_decodes,
            num_decode_tokens=nd,
            num_actual_tokens=t,
        )
        plan = handle.plan_step(**step)
        if plan is None:  # the byte model kept the query route
            results[rank] = {"route": "query"}
            return
        rows = sim.kv[rank]
        nb = rows.shape[0] // proof.BLOCK_STRIDE_ROWS
        kv_cache = rows.as_strided(
            (nb, proof.BLOCK_SIZE, proof.RB), (proof.BLOCK_STRIDE_ROWS * proof.RB, proof.RB, 1)
        )
        out = torch.empty(t - nd, geo.heads_local, 512, dtype=torch.bfloat16)
        handle.attend_prefill(
            q_local[rank][nd:],
            kv_cache,
            sim.bt[rank],
            proof.BLOCK_SIZE,
            sim.req_id[nd:],
            sim.topk[nd:],
            plan,
            scale,
            out=out,
        )

        def attend(q, kv_rows, idx):
            return kernel.sparse_mla_fp8_ds_mla_attention(q, kv_rows, idx, scale)

        stock, _ = proof.stock_route(sim, q_local, attend)
        heads = slice(rank * geo.heads_local, (rank + 1) * geo.heads_local)
        err = (out.double() - stock[nd:, heads]).abs().max().item()
        results[rank] = {
            "route": "packed_ckv",
            "max_abs_err": err,
            "layout": (plan.layout.starts, plan.layout.rank_rows),
            "starts": plan.starts.tolist(),
            "prefill_request": plan.prefill_request.tolist(),
            "unsplit_query_route": glue.MLADCPPackedCKVPrefill(
                _vllm_config(world, geo.interleave),
                group,
                torch.device("cpu"),
                num_heads=geo.heads_local,
                kv_cache_dtype="fp8_ds_mla",
                can_split_decode_rows=False,
                comm_backend="a2a",
            ).plan_step(**step)
            is None,
        }
    except BaseException as e:  # report to the parent, keep the group from hanging
        results[rank] = {"error": repr(e)}
        raise
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize(
    "n,interleave,seq_lens,query_lens,num_decodes,route",
    [
        (2, 1, [70, 9], [5, 9], 0, "packed_ckv"),
        (3, 2, [150], [12], 0, "packed_ckv"),
        (2, 16, [40, 130], [1, 12], 1, "packed_ckv"),
        # 100 records per rank outweigh 2 rows of 2 heads' queries and partials
        (2, 1, [200], [2], 0, "query"),
    ],
)
def test_glue_matches_stock_route_across_processes(
    n, interleave, seq_lens, query_lens, num_decodes, route
):
    """On every rank of a real process group, the shipped glue takes the same route, and
    where the byte model picks the packed route its output for the prefill rows equals
    the stock route's output within bf16 rounding, with the same plan on all ranks, and a
    mixed step stays on the query route when the backend cannot split off its decode
    rows."""
    import test_dcp_packed_ckv as proof

    geo = proof.Geometry(
        n=n,
        interleave=interleave,
        seq_lens=seq_lens,
        query_lens=query_lens,
        heads_local=2,
        topk=128,
        seed=5,
    )
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    results = mp.Manager().dict()
    mp.spawn(_worker, args=(n, port, geo, num_decodes, results), nprocs=n)
    res = [results[r] for r in range(n)]
    assert all("error" not in r for r in res), res
    assert all(r["route"] == route for r in res), res
    if route == "query":
        return
    assert all(r["max_abs_err"] < 2e-2 for r in res), res
    assert len({(r["layout"], tuple(r["starts"])) for r in res}) == 1
    assert len({tuple(r["prefill_request"]) for r in res}) == 1
    assert all(r["unsplit_query_route"] == (num_decodes > 0) for r in res)
