# SPDX-License-Identifier: Apache-2.0
# ruff: noqa: B023, F821  (the timed closures run inside the iteration that binds their names; the
# iteration ends with `del` of the large tensors, which ruff reads as undefined names)
"""GPU decision run for patch 0008 (fp8 DCP wire) on vLLM 0.34.0, one GPU.

Question: does ``dcp_wire_dtype="fp8"`` beat 0.34's default bf16 paths for the
DSA layer of GLM-5 / DeepSeek-V3.2? Compared per layer and per DCP rank, for
T rows (prefill chunk or decode batch):

  query gather (the DSA layer calls MLADCPManager.query_gather):
    q-bf16   0.34 NCCL path ``MLADCPManager._gather_query`` (all-gather, dim 1)
    q-fp8    0008 ``_gather_query_fp8`` (pack 656-B rows, all-gather, unpack)
  combine + W_UV (the DSA layer calls ``combine``, then bmm by its W_UV):
    c-a2a        0.34 ``dcp_a2a_lse_reduce`` (bf16, LSE in 2 slots) + bmm
    c-ag_rs      0.34 ``cp_lse_ag_out_rs`` + bmm
    c-vup-bf16   0.34 ``dcp_a2a_v_up_proj_lse_reduce`` (dense MLA's A2A of
                 W_UV-projected rows; what the DSA layer would get from
                 ``v_up_proj_combine`` if it used it)
    c-fp8        0008 ``_fp8_combine`` (532-B rows) + bmm
    c-vup-fp8    0008 ``_fp8_v_up_proj_combine`` (136-B rows at V=128)

One-GPU emulation: the shipped functions run on the GPU with a simulated DCP
group of N ranks (this process is rank 0); every collective is replaced by a
device copy of exactly the bytes the real one would deliver to this rank
(all-gather: N copies of the local shard; all-to-all: recv = send; reduce-
scatter: this rank's slice). So the times are codec + local kernels + one
memcpy of the received size, NOT fabric time. The wire figures are the bytes
each rank receives from its N - 1 peers (from the buffer sizes, checked
against dcp_wire_model). To project a fabric, add bytes / bandwidth
(``--link-gbps``, default 0 = not projected). Transient memory = peak CUDA
allocation during the call above what was allocated before it (inputs
excluded, outputs included).

0008 was dropped on this measurement (design/upstreaming.md). To run it again, apply the
series as it was at revision a242594 (the last with 0008) and point ``--vllm-tree`` at that
tree. Run on one GPU with the patched 0.34 tree shadowing the installed 0.34 wheel:

    python bench_dcp_fp8_wire_1gpu.py --vllm-tree /path/to/vllm034-p0007 \\
        --out results/dcp-fp8-wire-1gpu.json

Defaults: 64 heads (GLM-5 / DeepSeek-V3.2 at TP = DCP), latent 512, rope 64,
v_head_dim 128 (DeepSeek-V3.2; run again with the GLM-5 checkpoint's
v_head_dim from its config.json), DCP 2/4/8, T in 1, 8, 64, 512, 2048, 8192;
bf16 activations. ``--device cpu`` runs the same code on CPU (a smoke run:
wall-clock times, no memory figures).

Decision rule (for the report; the script prints it per row): 0008 stays only
if, on the DSA path, q-fp8 + c-fp8 is faster than q-bf16 + c-a2a (0.34's GLM
default) at the projected fabric AND its transient memory is not larger; the
byte ratio alone does not decide it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace


def shadow_tree(tree: Path) -> str:
    """A symlink farm of the installed vllm with the tree's differing .py
    files copied in (as dcp-series scripts/tree_pytest.sh does)."""
    import filecmp
    import importlib.util
    import shutil
    import sysconfig

    spec = importlib.util.find_spec("vllm")  # the importable vllm (site or PYTHONPATH)
    site = (
        Path(spec.origin).parent
        if spec and spec.origin
        else (Path(sysconfig.get_paths()["purelib"]) / "vllm")
    )
    root = Path(tempfile.mkdtemp(prefix="vllm-shadow-"))
    dst = root / "vllm"
    for src in site.rglob("*"):
        rel = src.relative_to(site)
        if src.is_dir():
            (dst / rel).mkdir(parents=True, exist_ok=True)
        else:
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            os.symlink(src, dst / rel)
    for f in (tree / "vllm").rglob("*.py"):
        rel = f.relative_to(tree / "vllm")
        t = dst / rel
        if not t.exists() or not filecmp.cmp(f, t, shallow=False):
            t.parent.mkdir(parents=True, exist_ok=True)
            if t.is_symlink() or t.exists():
                t.unlink()
            shutil.copy(f, t)
    return str(root)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--vllm-tree", type=Path, required=True)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--heads", type=int, default=64)
    ap.add_argument("--v-head-dim", type=int, default=128)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dcp", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 8, 64, 512, 2048, 8192])
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--link-gbps", type=float, default=0.0)
    args = ap.parse_args()

    sys.path.insert(0, shadow_tree(args.vllm_tree.resolve()))
    import torch
    from vllm.v1.attention.ops import dcp as dcp_ops
    from vllm.v1.attention.ops import dcp_fp8_wire as fp8
    from vllm.v1.attention.ops import dcp_wire_model as model

    assert "vllm-shadow-" in dcp_ops.__file__, dcp_ops.__file__
    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    lat, rope, v = 512, 64, args.v_head_dim
    received: dict[str, int] = {"bytes": 0}

    def fake_a2a(recv, send, group=None, async_op=False):
        n = fake_a2a.world
        recv.copy_(send)
        received["bytes"] += send.numel() * send.element_size() * (n - 1) // n
        return SimpleNamespace(wait=lambda: None)

    dcp_ops.dist.all_to_all_single = fake_a2a

    def make_group(n):
        def all_gather(x, dim):
            received["bytes"] += x.numel() * x.element_size() * (n - 1)
            return torch.cat([x] * n, dim=dim)

        def reduce_scatter(x, dim):
            part = x.shape[dim] // n
            received["bytes"] += x.numel() * x.element_size() * (n - 1) // n
            return x.narrow(dim, 0, part).clone()

        return SimpleNamespace(
            world_size=n,
            rank_in_group=0,
            device_group=None,
            all_gather=all_gather,
            reduce_scatter=reduce_scatter,
        )

    def manager(n, fp8_wire, use_a2a=True):
        m = dcp_ops.MLADCPManager.__new__(dcp_ops.MLADCPManager)
        m.group = make_group(n)
        m.padded_num_heads = None
        m.use_a2a = use_a2a
        m.fp8_query_wire = fp8_wire
        m.fp8_combine_wire = fp8_wire
        m.v_up_proj_combine = None
        return m

    def measure(fn):
        for _ in range(args.warmup):
            fn()
        sync = torch.cuda.synchronize if cuda else (lambda: None)
        sync()
        times = []
        for _ in range(args.iters):
            received["bytes"] = 0
            if cuda:
                a, b = (torch.cuda.Event(enable_timing=True) for _ in range(2))
                a.record()
                fn()
                b.record()
                sync()
                times.append(a.elapsed_time(b) * 1e3)  # us
            else:
                t0 = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t0) * 1e6)
        wire = received["bytes"]
        peak = -1
        if cuda:
            sync()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            keep = fn()
            sync()
            peak = torch.cuda.max_memory_allocated() - base
            del keep
        return statistics.median(times), wire, peak

    rows_out = []
    for n in args.dcp:
        hl = args.heads // n
        fake_a2a.world = n
        for t in args.rows:
            g = torch.Generator(device=dev).manual_seed(0)
            q = torch.randn(t, hl, lat + rope, device=dev, generator=g).bfloat16()
            part = torch.randn(t, n * hl, lat, device=dev, generator=g).bfloat16()
            lse = torch.randn(t, n * hl, device=dev, generator=g)
            w_uv_local = torch.randn(hl, lat, v, device=dev, generator=g).bfloat16()
            w_uv_all = torch.randn(n * hl, lat, v, device=dev, generator=g).bfloat16()
            out_v = torch.empty(t, hl * v, device=dev, dtype=torch.bfloat16)

            def up(latent):
                o = torch.empty(t, hl, v, device=dev, dtype=torch.bfloat16)
                torch.bmm(latent.transpose(0, 1), w_uv_local, out=o.transpose(0, 1))
                return o

            m16, m8 = manager(n, False), manager(n, True)
            m8._init_combine(n * hl, lat, torch.bfloat16, True, False)
            assert m8.v_up_proj_combine is not None
            grp = m16.group
            cases = {
                "q-bf16": lambda: m16._gather_query(q),
                "q-fp8": lambda: m8._gather_query_fp8(q),
                "c-a2a": lambda: up(
                    dcp_ops.dcp_a2a_lse_reduce(part, lse, grp, is_lse_base_on_e=True)
                ),
                "c-ag_rs": lambda: up(
                    dcp_ops.cp_lse_ag_out_rs(part, lse, grp, is_lse_base_on_e=True)
                ),
                "c-vup-bf16": lambda: dcp_ops.dcp_a2a_v_up_proj_lse_reduce(
                    part, lse, w_uv_all, out_v, grp, is_lse_base_on_e=True
                ),
                "c-fp8": lambda: up(m8._fp8_combine(part, lse, True)),
                "c-vup-fp8": lambda: m8.v_up_proj_combine(part, lse, w_uv_all, out_v),
            }
            res = {}
            for name, fn in cases.items():
                try:
                    us, wire, peak = measure(fn)
                except (TypeError, AttributeError):
                    if cuda:
                        raise
                    # CPU smoke run: vLLM's Triton kernels need a GPU here.
                    us, wire, peak = float("nan"), -1, -1
                proj = us + (wire / (args.link_gbps * 1e3) if args.link_gbps else 0.0)
                res[name] = dict(us=us, wire_bytes=wire, transient_bytes=peak, projected_us=proj)
            # byte model cross-check (received per rank)
            qb = model.query_route_bytes(t, hl, n, "a2a")
            qf = model.query_route_bytes(t, hl, n, "a2a", wire_dtype="fp8")
            checks = {
                "q-bf16": qb.query_gather,
                "q-fp8": qf.query_gather,
                "c-a2a": qb.combine,
                "c-fp8": qf.combine,
            }
            if t >= dcp_ops._V_UP_PROJ_FIRST_MIN_TOKENS:
                checks["c-vup-bf16"] = model.v_up_proj_combine_bytes(t, hl, n, v)
                checks["c-vup-fp8"] = model.v_up_proj_combine_bytes(t, hl, n, v, wire_dtype="fp8")
            mism = {
                k: (res[k]["wire_bytes"], b)
                for k, b in checks.items()
                if res[k]["wire_bytes"] not in (b, -1)
            }
            stock = res["q-bf16"]["projected_us"] + res["c-a2a"]["projected_us"]
            fp8_dsa = res["q-fp8"]["projected_us"] + res["c-fp8"]["projected_us"]
            row = dict(
                dcp=n,
                heads_local=hl,
                rows=t,
                cases=res,
                byte_model_mismatch=mism,
                dsa_stock_us=stock,
                dsa_fp8_us=fp8_dsa,
                fp8_beats_stock=fp8_dsa < stock
                and (
                    res["q-fp8"]["transient_bytes"] + res["c-fp8"]["transient_bytes"]
                    <= res["q-bf16"]["transient_bytes"] + res["c-a2a"]["transient_bytes"]
                ),
            )
            rows_out.append(row)
            print(
                f"DCP{n} T={t:5d} "
                + " ".join(
                    f"{k}={r['us']:.0f}us/{r['wire_bytes'] / 2**20:.2f}MiB/"
                    f"{r['transient_bytes'] / 2**20:.1f}MiB"
                    for k, r in res.items()
                )
                + f" | DSA stock {stock:.0f}us fp8 {fp8_dsa:.0f}us"
                + (f" MISMATCH {mism}" if mism else ""),
                flush=True,
            )
            del q, part, lse, w_uv_local, w_uv_all, out_v
            if cuda:
                torch.cuda.empty_cache()

    doc = dict(
        script="bench_dcp_fp8_wire_1gpu.py",
        argv=sys.argv,
        when=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        device=torch.cuda.get_device_name() if cuda else platform.processor(),
        torch=torch.__version__,
        python=platform.python_version(),
        emulation="one GPU, collectives replaced by device copies of the "
        "received bytes; times are not fabric times",
        fp8_scratch_bytes=fp8.SCRATCH_BYTES,
        rows=rows_out,
    )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(doc, indent=1))
        print("wrote", args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
