#!/bin/bash
# One batched H200 session of the series' GPU evidence (single GPU). Run on the device machine from
# the repository root after the staged vLLM is installed (../shared/gpu recipe) and .gpu-overlay
# (the applied series, from .gpu/overlay-build.sh) is carried:
#     bash scripts/gpu_h200_session.sh STAGE...
# Stages: topk | tree-tests | eq-triton | eq-flashmla | mtp-exact | mtp-adaptive
# Results are kept in $RES (survives between calls on a warm machine; $OUT is emptied per call)
# and each stage copies what it wrote to $OUT (copied into results/ afterwards).
set -uo pipefail
: "${OUT:?run on the device machine}"
export DCP_GIT_REV="${DCP_GIT_REV:-unknown}"
[ -d "$HOME/gpu-vllm-patched" ] || bash .gpu/device-overlay.sh
VARIANT=patched source .gpu/device-env.sh
export DCP_VLLM_TREE="$HOME/gpu-vllm-patched"
S=scripts/gpu_dsa_equivalence.py
RES=/tmp/dcp-res; mkdir -p "$RES"
for stage in "$@"; do
  echo "=== $stage $(date -u +%T)"; touch "$RES/.stamp-$stage"
  case "$stage" in
    topk)
      python3 scripts/gpu_dcp_topk_check.py --vllm-tree "$DCP_VLLM_TREE" --out "$RES/dcp-topk-h200.json" ;;
    tree-tests)
      # the series' GPU-only vLLM-tree tests, against the patched install
      (cd .gpu-overlay && timeout 300 python3 -m pytest -q -x --noconftest -p no:cacheprovider \
        --import-mode=importlib tests/v1/attention/test_triton_mla_sparse.py \
        tests/kernels/attention/test_triton_sparse_mla.py tests/v1/attention/test_dcp_topk_merge.py \
        tests/v1/attention/test_sparse_mla_dcp.py 2>&1 | tail -25) | tee "$RES/tree-tests-h200.log" ;;
    eq-triton)
      python3 $S run --out-dir "$RES" --name dsa-tp1-triton-fp8 --attention-backend TRITON_MLA_SPARSE \
        --kv-cache-dtype fp8_ds_mla --lens 1024,8192,16384 > "$RES/eq-triton.log" 2>&1
      tail -5 "$RES/eq-triton.log" ;;
    eq-flashmla)
      python3 $S run --out-dir "$RES" --name dsa-tp1-flashmla-fp8 --attention-backend FLASHMLA_SPARSE \
        --kv-cache-dtype fp8_ds_mla --lens 1024,8192,16384 > "$RES/eq-flashmla.log" 2>&1
      tail -5 "$RES/eq-flashmla.log"
      python3 $S compare --out-dir "$RES" --name dsa-eq-triton-vs-flashmla-fp8-tp1 \
        "$RES/dsa-tp1-triton-fp8.json" "$RES/dsa-tp1-flashmla-fp8.json" ;;
    mtp-exact)
      python3 scripts/make_tiny_mtp_ckpt.py --out /tmp/tiny_mtp > "$RES/mtp-ckpt.log" 2>&1
      python3 scripts/gpu_mtp_exactness.py --dcp 1 --ks 2,adaptive --ckpt /tmp/tiny_mtp/agree \
        > "$RES/mtp-exact.log" 2>&1; tail -8 "$RES/mtp-exact.log" ;;
    mtp-adaptive)
      [ -d /tmp/tiny_mtp ] || python3 scripts/make_tiny_mtp_ckpt.py --out /tmp/tiny_mtp
      python3 scripts/gpu_mtp_adaptive.py --ckpt-root /tmp/tiny_mtp --ckpts agree,disagree \
        --modes 2,4,adaptive > "$RES/mtp-adaptive.log" 2>&1; tail -8 "$RES/mtp-adaptive.log" ;;
    *) echo "unknown stage $stage"; exit 2 ;;
  esac
  find "$RES" -newer "$RES/.stamp-$stage" -type f -exec cp {} "$OUT/" \; 2>/dev/null || cp "$RES"/* "$OUT/"
done
ls -la "$RES"
