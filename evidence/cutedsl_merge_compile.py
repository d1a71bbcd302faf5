#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Compile vLLM 0.34.0's own DCP top-k merge (CuTe DSL) for Hopper, Blackwell and SM12x on a
machine without a GPU: does the merge that ``auto`` takes on CUDA build for RTX PRO 6000
(sm_120a) and DGX Spark (sm_121a)?

The kernels are vLLM's, unmodified, compiled as ``VllmCuTeDSLJitKernel.compile`` does (the
kernel of a compile key, its warm-up inputs, a fake stream, ``--enable-tvm-ffi``), with the
target named by ``CUTE_DSL_ARCH`` and ``--gpu-arch`` and the PTX and cubin kept:

* ``StableTopKFromGatheredCandidatesKernel`` (``dcp_indexer_cutedsl.py``): the selector over
  all-gathered candidates;
* ``StableTopKFromPingPongCandidatesKernel`` (``dcp_topk_pingpong_cutedsl.py``): the selector of
  the direct (symmetric-memory) exchange, with and without PDL.

Each target compiles in its own process (no JIT cache). A compile says the code generator
accepts the target; it does not say the kernel runs there (nothing is launched). Writes
``results/dcp-topk-merge-cutedsl-compile-cpu.json``.

    <python with vLLM 0.34.0 and nvidia-cutlass-dsl> evidence/cutedsl_merge_compile.py
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ARCHS = ("sm_90a", "sm_100a", "sm_120a", "sm_121a")
GATHERED = (
    # (index_topk, DCP size, score bits, id bits): fp32 and bf16 scores of the models' top-k
    # 2048, and the smallest top-k vLLM accepts
    (2048, 8, 32, 18),
    (2048, 4, 16, 18),
    (512, 2, 32, 32),
)


def ptx_target(text: str) -> str | None:
    """The ``.target`` a PTX file was generated for."""
    m = re.search(r"^\.target\s+([\w.]+)", text, re.MULTILINE)
    return m.group(1) if m else None


def cubin_targets(cuobjdump_sass: str) -> list[str]:
    """The SASS targets ``cuobjdump -sass`` reports (``code for sm_120a``)."""
    return sorted(set(re.findall(r"code for (sm_\w+)", cuobjdump_sass)))


def registers(res_usage: str) -> list[int]:
    """Registers per thread of every function ``cuobjdump -res-usage`` lists."""
    return [int(x) for x in re.findall(r"\bREG:(\d+)", res_usage)]


def local_bytes(res_usage: str) -> list[int]:
    """Local (spill) memory bytes per thread of every function ``cuobjdump -res-usage`` lists."""
    return [int(x) for x in re.findall(r"\bLOCAL:(\d+)", res_usage)]


def _cuobjdump() -> str | None:
    found = shutil.which("cuobjdump")
    if found:
        return found
    try:
        import triton

        bundled = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
        return str(bundled) if bundled.is_file() else None
    except ImportError:
        return None


def _artefacts(folder: Path) -> dict[str, Any]:
    """What the compile left in ``folder``: the PTX target, the cubin's SASS targets and
    registers (cuobjdump, where one is installed)."""
    out: dict[str, Any] = {
        "ptx_target": None,
        "cubin_targets": None,
        "registers": None,
        "local_bytes": None,
    }
    for ptx in folder.glob("*.ptx"):
        out["ptx_target"] = ptx_target(ptx.read_text())
    tool = _cuobjdump()
    for cubin in folder.glob("*.cubin"):
        if tool is None:
            break
        sass = subprocess.run([tool, "-sass", str(cubin)], capture_output=True, text=True)
        res = subprocess.run([tool, "-res-usage", str(cubin)], capture_output=True, text=True)
        out["cubin_targets"] = cubin_targets(sass.stdout)
        out["registers"] = registers(res.stdout)
        out["local_bytes"] = local_bytes(res.stdout)
    return out


def compile_all(arch: str, scratch: Path) -> list[dict[str, Any]]:
    """Every case for one target (run in a process of its own: the target is process-wide)."""
    import cutlass.cute as cute
    from cutlass import Float32, Int32, Int64
    from quack.compile_utils import make_fake_tensor
    from vllm.model_executor.kernels.attention.dsa import dcp_indexer_cutedsl as gathered
    from vllm.model_executor.kernels.attention.dsa import dcp_topk_pingpong_cutedsl as pingpong

    def options(folder: Path) -> str:
        folder.mkdir(parents=True, exist_ok=True)
        return f"--enable-tvm-ffi --gpu-arch {arch} --keep-ptx --keep-cubin --dump-dir {folder}"

    def attempt(case: dict[str, Any], build: Any, folder: Path) -> dict[str, Any]:
        t0 = time.time()
        try:
            build(options(folder))
            case |= {"ok": True, "error": None} | _artefacts(folder)
        except Exception as exc:  # noqa: BLE001 - reported per case
            case |= {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:600]}
        case["seconds"] = round(time.time() - t0, 2)
        return case

    stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
    cases = []
    K = gathered.StableTopKFromGatheredCandidatesKernel
    for topk, dcp, score_bits, id_bits in GATHERED:
        key = K.CompileKey(
            topk=topk, num_candidates=topk * dcp, score_bits=score_bits, id_bits=id_bits
        )
        case = {"arch": arch, "kernel": K.__name__, "topk": topk, "dcp": dcp,
                "score_bits": score_bits, "id_bits": id_bits}  # fmt: skip
        cases.append(
            attempt(
                case,
                lambda o, key=key: cute.compile(
                    K.kernel(key), *K().warmup_inputs(key), stream, options=o
                ),
                scratch / f"gathered-{topk}-{dcp}-{score_bits}",
            )
        )
    P = pingpong.StableTopKFromPingPongCandidatesKernel
    topk, dcp, rows = 2048, 8, 64
    for use_pdl in (False, True):
        candidates = topk * dcp
        inboxes = cute.runtime.make_fake_tensor(
            Float32,
            (2, rows, candidates, 2),
            stride=(rows * candidates * 2, candidates * 2, 2, 1),
            assumed_align=8,
        )
        seq = make_fake_tensor(Int64, (1,), divisibility=1)
        out = make_fake_tensor(Int32, (cute.sym_int(), topk), divisibility=1)
        kernel = P(topk, candidates, use_pdl, 32, 18)
        case = {"arch": arch, "kernel": P.__name__, "topk": topk, "dcp": dcp, "pdl": use_pdl}
        cases.append(
            attempt(
                case,
                lambda o, k=kernel, i=inboxes, s=seq, t=out: cute.compile(
                    k, i, s, t, stream, options=o
                ),
                scratch / f"pingpong-pdl{int(use_pdl)}",
            )
        )
    return cases


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", help="(internal) compile for this target and print JSON")
    ap.add_argument("--out", type=Path, default=HERE.parent / "results")
    args = ap.parse_args()
    if args.arch:
        os.environ["CUTE_DSL_ARCH"] = args.arch
        os.environ["CUTE_DSL_DISABLE_FILE_CACHING"] = "1"
        with tempfile.TemporaryDirectory() as scratch:
            print("CASES " + json.dumps(compile_all(args.arch, Path(scratch))))
        return 0

    sys.path.insert(0, str(HERE))
    import provenance

    cases: list[dict[str, Any]] = []
    for arch in ARCHS:
        proc = subprocess.run(
            [sys.executable, __file__, "--arch", arch], capture_output=True, text=True
        )
        found = [line for line in proc.stdout.splitlines() if line.startswith("CASES ")]
        if not found:
            cases.append({"arch": arch, "ok": False, "error": (proc.stderr or proc.stdout)[-800:]})
            continue
        cases += json.loads(found[-1][len("CASES ") :])
    by_arch = {
        arch: all(c["ok"] and c.get("ptx_target") == arch for c in cases if c["arch"] == arch)
        for arch in ARCHS
    }
    import hashlib

    import vllm.model_executor.kernels.attention.dsa as dsa

    kernel_files = {
        f"vllm/model_executor/kernels/attention/dsa/{name}": hashlib.sha256(
            (Path(dsa.__file__).parent / name).read_bytes()
        ).hexdigest()
        for name in ("dcp_indexer_cutedsl.py", "dcp_topk_pingpong_cutedsl.py")
    }
    record = {
        "kind": "dcp_topk_merge_cutedsl_compile",
        "kernel_files_sha256": kernel_files,
        "what": "vLLM 0.34.0's CuTe DSL DCP top-k selectors compiled per target, no GPU: "
        "compiled means the code generator accepts the target, not that the kernel runs there",
        "nvidia_cutlass_dsl": provenance.package_version("nvidia-cutlass-dsl"),
        "compiled_by_arch": by_arch,
        "cases": cases,
    }
    path = args.out / "dcp-topk-merge-cutedsl-compile-cpu.json"
    provenance.write_result(path, record, gpus=False)
    print(json.dumps({"compiled_by_arch": by_arch, "out": str(path)}))
    return 0 if all(by_arch.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
