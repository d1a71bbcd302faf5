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
"""

from __future__ import annotations

import sys
import time


def main() -> int:
    t0 = time.perf_counter()
    try:
        from flashinfer.comm.trtllm_ar import get_trtllm_comm_module
    except ImportError as e:
        print(f"prewarm: nothing to build ({e})")
        return 0
    get_trtllm_comm_module()
    print(f"prewarm: flashinfer trtllm comm module ready in {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
