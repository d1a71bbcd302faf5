#!/bin/bash
# The four-GPU benches (nvidia-h200-x4), from the repository root on the device machine, after
# the staged vLLM is installed (../shared/gpu recipe) and .gpu-overlay (the applied series) carried:
#     DCP_GIT_REV=<commit> bash evidence/dev/gpu_four_gpu.sh STAGE...
# Stages (each one or more engine start-ups; ~3.5 min cold, less warm):
#   comm      per-layer DCP communication and wire bytes, both routes, GLM-5 geometry, DCP 2 and 4,
#             NVLink and NCCL_P2P_DISABLE=1 (evidence/bench_dcp_comm.py)
#   prefill   cold prefill tok/s, DCP 1/2/4 at TP=4, query bf16 / query fp8 / ckv, both fabrics
#             (evidence/bench_dcp_prefill.py --tp 4, once at --dcp 2 and once at --dcp 4; each run
#             also measures DCP=1, so every ratio is taken within one run)
# Results are kept in $RES across calls on a warm machine and copied to $OUT after each stage.
set -uo pipefail
: "${OUT:?run on the device machine}"
export DCP_GIT_REV="${DCP_GIT_REV:-unknown}"
[ -d "$HOME/gpu-vllm-patched" ] || bash .gpu/device-overlay.sh
VARIANT=patched source .gpu/device-env.sh
export DCP_VLLM_TREE="$HOME/gpu-vllm-patched"
RES=${TMPDIR:-/tmp}/dcp-res4; mkdir -p "$RES"
for stage in "$@"; do
  echo "=== $stage $(date -u +%T)"; touch "$RES/.stamp-$stage"
  case "$stage" in
    comm)
      python3 evidence/bench_dcp_comm.py --launch --nproc 4 --dcp-sizes 2 4 \
        --vllm-tree "$DCP_VLLM_TREE" --out "$RES/dcp-comm-x4.json" > "$RES/comm.log" 2>&1
      tail -5 "$RES/comm.log" ;;
    prefill)
      for dcp in 2 4; do
        python3 evidence/bench_dcp_prefill.py --tp 4 --dcp $dcp --lengths 32768 65536 \
          --configs dcp1 query-bf16 query-fp8 ckv --out "$RES/dcp-prefill-x4-dcp$dcp.json" \
          > "$RES/prefill-dcp$dcp.log" 2>&1
        tail -12 "$RES/prefill-dcp$dcp.log"
      done ;;
    *) echo "unknown stage $stage"; exit 2 ;;
  esac
  find "$RES" -newer "$RES/.stamp-$stage" -type f -name '*.json' -exec cp {} "$OUT/" \;
done
