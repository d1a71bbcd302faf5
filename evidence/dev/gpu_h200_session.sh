#!/bin/bash
# One batched H200 session of the series' GPU evidence (single GPU). Run on the device machine from
# the repository root after the staged vLLM is installed (../shared/gpu recipe) and .gpu-overlay
# (the applied series, from .gpu/overlay-build.sh) is carried:
#     bash evidence/dev/gpu_h200_session.sh STAGE...
# Stages: kernel | topk | nvfp4 | topk-order | tree-tests
# Results are kept in $RES (default ${TMPDIR:-/tmp}/dcp-res; survives between calls on a warm
# machine; $OUT is emptied per call) and each stage archives what it wrote to $OUT/STAGE.tar.gz
# (copied into results/ afterwards). evidence/dev/gpu_lease.sh runs the stages its BENCH_STAGES
# names (kernel, topk, nvfp4) and tree-tests.
set -uo pipefail
: "${OUT:?run on the device machine}"
export DCP_GIT_REV="${DCP_GIT_REV:-unknown}"
[ -d "$HOME/gpu-vllm-patched" ] || bash .gpu/device-overlay.sh
export VARIANT=patched; source .gpu/device-env.sh
export DCP_VLLM_TREE="$HOME/gpu-vllm-patched"
RES=${RES:-${TMPDIR:-/tmp}/dcp-res}; mkdir -p "$RES"
for stage in "$@"; do
  echo "=== $stage $(date -u +%T)"; touch "$RES/.stamp-$stage"
  case "$stage" in
    kernel)
      # alone on the GPU: its times are the figures (--budget-s bounds the sweep)
      timeout "${STAGE_TIMEOUT:-200}" python3 evidence/bench_sparse_mla_kernel.py --git-rev "$DCP_GIT_REV" \
        --kernel-path "$DCP_VLLM_TREE/vllm/v1/attention/ops/triton_sparse_mla.py" \
        --budget-s "${KERNEL_BUDGET_S:-170}" --out "$RES/kernel-bench-h200-0.34.0.json" > "$RES/kernel-bench.log" 2>&1
      tail -4 "$RES/kernel-bench.log" | cut -c1-300 ;;
    topk)
      timeout "${STAGE_TIMEOUT:-100}" python3 evidence/bench_dcp_topk.py --vllm-tree "$DCP_VLLM_TREE" \
        --out "$RES/dcp-topk-merge-h200-0.34.0.json" > "$RES/topk.log" 2>&1
      tail -4 "$RES/topk.log" | cut -c1-300 ;;
    nvfp4)
      # alone on the GPU: nvfp4_ds_mla against fp8_ds_mla, same inputs, one run (its ratios
      # are the figures); capacity per format (evidence/bench_nvfp4_sparse_mla.py)
      # the file is named by the card (h100, h200): both kinds are lent
      gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -o 'H[0-9]*' | tr H h)
      timeout "${STAGE_TIMEOUT:-200}" python3 evidence/bench_nvfp4_sparse_mla.py --tree "$DCP_VLLM_TREE" \
        --quick --budget-s "${NVFP4_BUDGET_S:-120}" --kv-gib 80 --out "$RES/nvfp4-bench-${gpu:-gpu}-0.34.0.json" \
        > "$RES/nvfp4-bench.log" 2>&1
      tail -4 "$RES/nvfp4-bench.log" | cut -c1-300 ;;
    tree-tests)
      # the series' vLLM-tree tests (the GPU-only ones are skipped on CPU) against the patched
      # install, from the bundle (evidence/dev/tree_tests_bundle.py; $TREE_TESTS, default the
      # carried .gpu-tests; gpu_lease.sh copies it off the working tree, which the next call
      # replaces: the 22:37Z lease's stage lost it half-way): the wheels
      # vLLM's conftest needs (tblib) installed offline first, then one pytest per file
      # (--tb=short: a file cut by its timeout still leaves its tracebacks), the series' own
      # files first, until STAGE_TIMEOUT; a file whose conftest cannot be imported (exit 4)
      # is run again with --noconftest, and the summary says so.
      LOG="$RES/tree-tests-h200.log"; : > "$LOG"
      T=${TREE_TESTS:-$PWD/.gpu-tests}
      (cd "$T" && if ls wheels/*.whl > /dev/null 2>&1; then
        python3 -m pip install -q --no-index --no-deps wheels/*.whl >> "$LOG" 2>&1; fi)
      END=$(( $(date +%s) + ${STAGE_TIMEOUT:-420} ))
      # offline: the machine reaches no hub; the bundle's hf-cache holds the model configs
      # the tests name (a test naming another fails at once instead of waiting on the hub)
      run_file() {  # pytest of one bundle file within $per seconds, into $LOG
        (cd "$T" && HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_CACHE="$T/hf-cache" \
          timeout "$per" python3 -m pytest -v -rfEs --tb=short --timeout 120 \
          -p no:cacheprovider "$@") >> "$LOG" 2>&1
      }
      # TREE_TESTS_FIRST: grep -E patterns separated by "|"; the files each matches run
      # first, in the patterns' order (a lease that changed one kernel tests that file before
      # the stage's time runs out), then the rest in the bundle's order
      FILES=$( (IFS='|'; for p in ${TREE_TESTS_FIRST:-}; do grep -E "$p" "$T/SERIES_TESTS"; done
        grep -v -E "${TREE_TESTS_FIRST:-^$}" "$T/SERIES_TESTS") | awk 'NF && !seen[$0]++')
      # TREE_TESTS_ONLY: space-separated pytest node ids (file or file::test) run instead,
      # in that order (one test of a large upstream file that the whole file would not reach)
      [ -n "${TREE_TESTS_ONLY:-}" ] && FILES=$TREE_TESTS_ONLY
      for f in $FILES; do
        left=$(( END - $(date +%s) )); if [ $left -le 5 ]; then echo "== $f: not run (stage time out)" >> "$LOG"; continue; fi
        per=$(( left < ${FILE_TIMEOUT:-240} ? left : ${FILE_TIMEOUT:-240} ))
        t0=$(date +%s); echo "== $f" >> "$LOG"
        run_file "$f"; rc=$?; how=conftest
        if [ $rc -eq 4 ]; then how=noconftest; run_file --noconftest "$f"; rc=$?; fi
        echo "== $f: rc=$rc ($how, $(( $(date +%s) - t0 )) s)" >> "$LOG"
      done
      grep '^== .*: ' "$LOG" ;;
    topk-order)
      # is the indexer top-k repeatable, does its order matter (evidence/repro_topk_order.py)
      timeout "${STAGE_TIMEOUT:-120}" python3 evidence/repro_topk_order.py --out "$RES/topk-order-h200-0.34.0.json" \
        > "$RES/topk-order.log" 2>&1; tail -14 "$RES/topk-order.log" | cut -c1-300 ;;
    *) echo "unknown stage $stage"; exit 2 ;;
  esac
  # $OUT takes at most 8 files: one archive per stage of what it wrote
  (cd "$RES" && find . -maxdepth 1 -type f -newer ".stamp-$stage" ! -name '.stamp-*' -printf '%P\n' \
    | tar czf "$OUT/$stage.tar.gz" -T -)
done
ls -la "$RES"
