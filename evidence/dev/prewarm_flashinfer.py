#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Build FlashInfer's trtllm all-reduce module ahead of the DCP gates (GPU machine).

Stock vLLM 0.33.0's DeepSeek-V3.2 / GLM-5 model (``vllm/models/deepseek_v32/nvidia/model.py``)
fuses each layer's all-reduce into the next RMSNorm in eager mode too
(``vllm/models/common/ops/fused_allreduce_rms_norm.py``): at TP > 1 its first forward creates
FlashInfer's trtllm all-reduce workspace whatever ``fuse_allreduce_rms`` and
``VLLM_ALLREDUCE_USE_FLASHINFER`` say, and without FlashInfer's precompiled kernels that
JIT-compiles ``flashinfer.comm.trtllm_ar``'s module first. On the 2026-12-01 18:20Z H200 lease
that took 6 min 7 s, and every TP > 1 engine of the gates' warm-up waited on it (their logs:
"falling back to trtllm backend" at 18:25:54, "Initialized FlashInfer Allreduce norm fusion
workspace" at 18:32:01); later engines found it cached and started in seconds. This builds the
module (FlashInfer's own ``get_trtllm_comm_module``) into FlashInfer's JIT cache, so that it can
run beside the benchmarks instead. Exits 0 with a message when FlashInfer or the function is
missing (nothing to warm).

The build took 422 s again on the 2026-12-07 19:17Z H100 lease, so a lease may carry the
library an earlier lease built:

- ``--keep DIR``: after a fresh JIT build, copy ``trtllm_comm.so`` into DIR beside
  ``trtllm_comm.json`` (its sha256 and the key it was built for: FlashInfer's version, the
  nvcc release, the GPU's compute capability);
- ``--seed DIR``: before building, install DIR's library as FlashInfer's own prebuilt
  (AOT) artifact of the module, only when its key equals this machine's and its bytes match
  the recorded sha256; anything else is reported and the module is built as before. A seeded
  library that FlashInfer fails to load falls back to the JIT build inside FlashInfer.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import time
from pathlib import Path

MODULE = "trtllm_comm"


def sha256_of(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def seed_refusal(kept: Path, key: dict[str, str]) -> str | None:
    """Why DIR's library must not be installed on this machine, or None when it may."""
    so, meta_path = kept / f"{MODULE}.so", kept / f"{MODULE}.json"
    if not so.is_file() or not meta_path.is_file():
        return f"no {so.name} with {meta_path.name} in {kept}"
    meta = json.loads(meta_path.read_text())
    if meta.get("key") != key:
        return f"built for {meta.get('key')}, this machine is {key}"
    if meta.get("sha256") != sha256_of(so):
        return f"{so.name}'s bytes differ from the sha256 {meta_path.name} records"
    return None


def machine_key() -> dict[str, str]:
    """What the library's bytes depend on: FlashInfer, the nvcc that builds, the GPU."""
    import flashinfer
    import torch
    from flashinfer.jit.cpp_ext import get_cuda_version

    major, minor = torch.cuda.get_device_capability(0)
    return {
        "flashinfer": flashinfer.__version__,
        "nvcc": str(get_cuda_version()),
        "capability": f"{major}.{minor}",
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=Path, help="a kept library to install before building")
    ap.add_argument("--keep", type=Path, help="where a freshly built library is copied")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    try:
        from flashinfer.comm.trtllm_ar import get_trtllm_comm_module
        from flashinfer.jit import env as jit_env
    except ImportError as e:
        print(f"prewarm: nothing to build ({e})")
        return 0
    key = machine_key()
    jit_so = jit_env.FLASHINFER_JIT_DIR / MODULE / f"{MODULE}.so"
    aot_so = jit_env.FLASHINFER_AOT_DIR / MODULE / f"{MODULE}.so"
    seeded = False
    if args.seed is not None:
        why = seed_refusal(args.seed, key)
        if why is None and not aot_so.exists():
            aot_so.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(args.seed / f"{MODULE}.so", aot_so)
            seeded = True
            print(f"prewarm: seeded {aot_so} from {args.seed} ({key})")
        else:
            print(f"prewarm: not seeded: {why or f'{aot_so} exists'}")
    fresh = not jit_so.exists()
    get_trtllm_comm_module()
    how = "loaded the seeded library" if seeded and not jit_so.exists() else "built or found"
    print(f"prewarm: flashinfer {MODULE} module {how} in {time.perf_counter() - t0:.1f} s")
    if args.keep is not None and fresh and jit_so.exists():
        args.keep.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(jit_so, args.keep / f"{MODULE}.so")
        meta = {"key": key, "sha256": sha256_of(jit_so), "bytes": jit_so.stat().st_size}
        (args.keep / f"{MODULE}.json").write_text(json.dumps(meta, indent=1) + "\n")
        print(f"prewarm: kept {jit_so} in {args.keep} ({meta['bytes']} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
