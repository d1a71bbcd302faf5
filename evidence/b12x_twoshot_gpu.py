"""GPU check of b12x/0001 (FP8 two-shot launcher programs): stock b12x 1.5.1 vs patched.

Runs ``TwoShotReduceScatter.reduce_scatter_fp8`` and ``all_gather_fp8`` (b12x.comm.pcie) with
world sizes 2 and 4, the ranks as processes sharing ONE GPU (CUDA IPC between processes of one
device; the host-side exchange over a Gloo group on loopback). Each variant imports b12x from its
own tree, unpacked here from the pinned sdist (sha256-checked) with, for ``patched``, the series'
b12x patches applied by ``git apply``; each rank asserts that ``import b12x`` loaded that tree.

Per rank and operation it records the exception (type, message) or, when the collective ran,
the largest error against a host reference built from every rank's quantized inputs:
  reduce-scatter: out[r] == sum over ranks s of dequant(payload_s)[shard r]  (bf16 output, fp32
                  accumulation: tolerance 2**-7 relative + 1e-4)
  all-gather:     out == concat over s of dequant(payload_s) rounded to bf16 (tolerance 2**-7
                  relative + 1e-4)
and a negative control per check (the same comparison against the neighbouring rank's shard,
which must exceed the tolerance). ``ITERS`` calls per operation alternate the runtime's two
eager slots. Expected: stock fails on every rank before any launch with the launcher-contract
TypeError (``executable carrier has no explicit dependencies: function`` from load_programs, or
``compile factory returned an unannotated function`` from compile planning, whichever
preparation reaches first); patched passes every check.

Usage (on the GPU machine, after ``source .gpu/device-env.sh``):
    python3 twoshot_gpu.py --sdist <b12x-1.5.1.tar.gz> --patches <dir with b12x patches> \
        --out $OUT/b12x-twoshot.json [--worlds 2,4] [--variants stock,patched]
The ranks share one GPU: any time printed is "one-GPU emulation", not a PCIe figure.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
from patchset.safetar import extract  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import provenance  # noqa: E402

SDIST_SHA256 = "dfda8b15c3dd45cd1e54bbec1b4b02530aba73a777dc35aa9bc36fe5f918f109"
TOP_DIR = "b12x-1.5.1"
OPERATIONS = ("reduce_scatter_fp8", "all_gather_fp8")
ROW_ELEMS = 1024
ROWS = 256  # rows reduced by reduce-scatter (divisible by every world size); all-gather: per rank
ITERS = 4
RANK_TIMEOUT_S = 480  # per world: a rank that waits for a failed peer is killed, not hung
REL_TOL = 2.0**-7
ABS_TOL = 1e-4


# --------------------------------------------------------------------------- driver


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _tree(sdist: Path, patches: list[Path], dest: Path) -> Path:
    with tarfile.open(sdist) as tf:
        # checked and extracted as `patchset fetch` does, on every Python (safetar: the `data`
        # filter of PEP 706 is missing before 3.11.4, e.g. on Debian 12's 3.11.2)
        extract(tf, tf.getmembers(), dest)
    root = dest / TOP_DIR
    for patch in patches:
        # git apply outside a repository is a plain patch; `patch` where git is absent
        if shutil.which("git"):
            cmds = (["git", "apply", "--check", str(patch)], ["git", "apply", str(patch)])
        else:
            cmds = (
                ["patch", "-p1", "--dry-run", "-i", str(patch)],
                ["patch", "-p1", "-i", str(patch)],
            )
        for cmd in cmds:
            subprocess.run(cmd, cwd=root, check=True, stdout=subprocess.DEVNULL)
    return root


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run_world(variant: str, tree: Path, world: int, work: Path, timeout_s: float) -> dict:
    port = _free_port()
    procs = []
    for rank in range(world):
        env = {
            **os.environ,
            "RANK": str(rank),
            "WORLD_SIZE": str(world),
            "LOCAL_RANK": "0",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "B12X_TREE": str(tree),
            "PYTHONPATH": f"{tree}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
            "RANK_OUT": str(work / f"{variant}-w{world}-r{rank}.json"),
        }
        log = (work / f"{variant}-w{world}-r{rank}.log").open("w")
        procs.append(
            (
                subprocess.Popen(
                    [sys.executable, __file__, "--rank-worker"],
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                ),
                log,
            )
        )
    start = time.monotonic()
    codes = []
    for proc, log in procs:
        left = max(1.0, timeout_s - (time.monotonic() - start))
        try:
            codes.append(proc.wait(timeout=left))
        except subprocess.TimeoutExpired:
            proc.kill()
            codes.append("timeout")
        log.close()
    ranks = []
    for rank in range(world):
        out = work / f"{variant}-w{world}-r{rank}.json"
        entry = json.loads(out.read_text()) if out.is_file() else {"rank": rank, "no_result": True}
        entry["exit"] = codes[rank]
        entry["log_tail"] = (work / f"{variant}-w{world}-r{rank}.log").read_text()[-3000:]
        ranks.append(entry)
    return {
        "variant": variant,
        "world_size": world,
        "ranks": ranks,
        "wall_s_one_gpu_emulation": round(time.monotonic() - start, 1),
    }


# b12x 1.5.1's bare launcher breaks both readers of the compile result: compile planning
# (program_keys) and the plan's materialize (load_programs). b12x re-raises them wrapped
# ("RuntimeError: ... TypeError: ..."), so they are looked for anywhere in the message.
LAUNCH_CONTRACT_ERRORS = (
    "executable carrier has no explicit dependencies",
    "compile factory returned an unannotated function",
)


def _verdict(world_result: dict) -> str:
    """``passed``; ``failed-before-launch(<contract messages>)`` when every operation of every
    rank stopped on the launcher contract; ``no-result`` when a rank wrote nothing; else
    ``failed``."""
    ranks = world_result["ranks"]
    if any("operations" not in r for r in ranks):
        return "no-result"
    ops = [op for r in ranks for op in r["operations"].values()]
    if all(op.get("passed") for op in ops):
        return "passed"
    found = set()
    for op in ops:
        hits = [c for c in LAUNCH_CONTRACT_ERRORS if c in op.get("error", "")]
        if not hits:
            return "failed"
        found.update(hits)
    return f"failed-before-launch({' | '.join(sorted(found))})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sdist", type=Path, required=True)
    parser.add_argument("--patches", type=Path, required=True, help="directory of b12x/*.patch")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--worlds", default="2,4")
    parser.add_argument("--variants", default="stock,patched")
    parser.add_argument("--rank-timeout", type=float, default=RANK_TIMEOUT_S, help="s per world")
    args = parser.parse_args()
    if _sha256(args.sdist) != SDIST_SHA256:
        print(f"error: {args.sdist} is not the pinned b12x 1.5.1 sdist", file=sys.stderr)
        return 2
    # absolute: `git apply` runs inside the unpacked tree
    patches = sorted(args.patches.resolve().glob("*.patch"))
    if "patched" in args.variants.split(",") and not patches:
        # a wrong --patches folder once ran "patched" as stock without a word: refuse instead
        raise SystemExit(
            f"--patches {args.patches}: no *.patch there; the patched variant needs one"
        )
    import torch

    result = {
        "what": "b12x TwoShotReduceScatter FP8 collectives, ranks as processes on one GPU",
        "device": torch.cuda.get_device_name(0),
        "capability": list(torch.cuda.get_device_capability(0)),
        "torch": torch.__version__,
        "sdist_sha256": SDIST_SHA256,
        "patches": [{"name": p.name, "sha256": _sha256(p)} for p in patches],
        "row_elems": ROW_ELEMS,
        "rows": ROWS,
        "iters": ITERS,
        "tolerance": {"relative": REL_TOL, "absolute": ABS_TOL},
        "runs": [],
    }
    with tempfile.TemporaryDirectory(prefix="b12x-twoshot-") as tmp:
        work = Path(tmp)
        for variant in args.variants.split(","):
            tree = _tree(args.sdist, patches if variant == "patched" else [], work / variant)
            for world in (int(w) for w in args.worlds.split(",")):
                run = _run_world(variant, tree, world, work, args.rank_timeout)
                run["verdict"] = _verdict(run)
                print(f"{variant} world={world}: {run['verdict']}", flush=True)
                result["runs"].append(run)
    # command, revision (DCP_GIT_REV on a device copy) and machine, as every result has them
    provenance.write_result(args.out, result)
    print(f"wrote {args.out}")
    return 0


# --------------------------------------------------------------------------- one rank


def _check(actual, expected, control) -> dict:
    err = (actual.float() - expected).abs()
    bound = REL_TOL * expected.abs() + ABS_TOL
    control_err = (actual.float() - control).abs()
    return {
        "max_abs_err": float(err.max()),
        "max_err_over_bound": float((err / bound).max()),
        "within_tolerance": bool((err <= bound).all()),
        "control_max_err_over_bound": float((control_err / bound).max()),
        "control_caught": bool((control_err > bound).any()),
    }


def rank_worker() -> int:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    out = {"rank": rank, "world_size": world, "operations": {}}
    try:
        import b12x
        import torch
        import torch.distributed as dist

        tree = Path(os.environ["B12X_TREE"]).resolve()
        out["b12x_file"] = b12x.__file__
        if not Path(b12x.__file__).resolve().is_relative_to(tree):
            raise RuntimeError(f"import b12x loaded {b12x.__file__}, not the tree {tree}")
        from b12x.comm.pcie import TwoShotReduceScatter, plan, query_from_runtime
        from b12x.comm.pcie.pcie_twoshot import quantize_per_row

        torch.cuda.set_device(0)
        device = torch.device("cuda", 0)
        dist.init_process_group("gloo", rank=rank, world_size=world)
        group = dist.group.WORLD
        runtime = TwoShotReduceScatter.from_exchange_group(
            exchange_group=group, device=device, max_rows=ROWS * world, row_elems=ROW_ELEMS
        )
        for index, operation in enumerate(OPERATIONS):
            rows = ROWS if operation == "reduce_scatter_fp8" else ROWS // world * 2
            record: dict = {"rows": rows}
            try:
                gen = torch.Generator().manual_seed(1000 * index + rank)
                x = torch.randn(rows, ROW_ELEMS, generator=gen) * (1.0 + rank)
                payload, scale = quantize_per_row(x.to(device=device, dtype=torch.bfloat16))
                deq = payload.float().cpu() * scale.cpu()[:, None]
                gathered: list = [None] * world
                dist.all_gather_object(gathered, deq)
                if operation == "reduce_scatter_fp8":
                    shard = rows // world
                    total = sum(gathered)
                    expected = total[rank * shard : (rank + 1) * shard]
                    neighbour = (rank + 1) % world
                    control = total[neighbour * shard : (neighbour + 1) * shard]
                    out_t = torch.empty(shard, ROW_ELEMS, dtype=torch.bfloat16, device=device)
                else:
                    expected = torch.cat(gathered).to(torch.bfloat16).float()
                    control = torch.cat(gathered[1:] + gathered[:1]).to(torch.bfloat16).float()
                    out_t = torch.empty(
                        rows * world, ROW_ELEMS, dtype=torch.bfloat16, device=device
                    )
                query = query_from_runtime(
                    runtime,
                    surface=f"TwoShotReduceScatter.{operation}",
                    call={"payload": payload, "scale": scale, "out": out_t},
                )
                op_plan = plan(query, runtime=runtime)
                checks = []
                for _ in range(ITERS):
                    out_t.zero_()
                    getattr(runtime, operation)(payload, scale, out_t, plan=op_plan)
                    torch.cuda.synchronize()
                    checks.append(_check(out_t.cpu(), expected, control))
                record["iterations"] = checks
                record["passed"] = all(
                    c["within_tolerance"] and c["control_caught"] for c in checks
                )
            except Exception as exc:  # recorded per operation, then the ranks stay in step
                record["error"] = f"{type(exc).__name__}: {exc}"
                record["traceback"] = traceback.format_exc()[-4000:]
                record["passed"] = False
            out["operations"][operation] = record
            dist.barrier()
        runtime.close()
        dist.destroy_process_group()
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
        out["traceback"] = traceback.format_exc()[-4000:]
    Path(os.environ["RANK_OUT"]).write_text(json.dumps(out, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--rank-worker"]:
        sys.exit(rank_worker())
    sys.exit(main())
