#!/bin/bash
# One H200 lease of the series' GPU evidence, in as few device calls as it takes. Run on the
# device machine from the repository root, after the staging parts arrived (../shared/gpu
# recipe; carry .gpu, .gpu-overlay, .gpu-tests):
#     bash scripts/gpu_lease.sh first GATE_DEADLINE_S   # install, benches, gates start
#     bash scripts/gpu_lease.sh wait                    # each following call
# `first`: install the staged vLLM and the patched overlay; the kernel and top-k merge benches
# and the top-k order repro, each ALONE on the GPU (their times are the figures); then the
# gate lease (scripts/dcp_gate.py start --suites $GATE_SUITES, default lease; lease-next for
# the next one; detached, with an absolute deadline of GATE_DEADLINE_S seconds) and the
# series' vLLM-tree tests beside the gates' warm-up; then it waits for the gates until the
# call's 600 s are nearly used. `wait`: waits again (the gate
# daemon resumes itself if the previous call's end killed it) and collects.
# A call carries at most 64 MiB: this tree (~10 MB) plus one staging part. ../shared/gpu's
# stage-build.sh cuts 60 MiB parts, too large beside this tree; re-cut them to 48 MiB (32 parts,
# 00..31, the last one small enough to travel with .gpu-overlay and .gpu-tests; 54 MiB parts
# left 0.6 MB to spare beside the 9.9 MB tree of 2026-12-01):
#     W=/tmp/resplit; mkdir -p $W; cat .gpu-parts/*/chunk.v* > $W/vllm.tar.gz
#     cat .gpu-parts/*/chunk.d* > $W/deps.tar; (cd $W && split -b 48m -d -a 2 vllm.tar.gz chunk.v \
#       && split -b 48m -d -a 2 deps.tar chunk.d); rm -rf .gpu-parts; i=0; for c in $W/chunk.*; do
#       d=$(printf .gpu-parts/%02d $i); mkdir -p $d; mv $c $d/; i=$((i+1)); done
#     (cd .gpu-parts && sha256sum */chunk.* > SHA256SUMS) && cp .gpu-parts/SHA256SUMS .gpu/parts.sha256
# Everything comes back in at most 8 files under $OUT: the three bench JSON files, lease-logs.tgz
# (bench logs, tree-test log, status) and gate.tgz (run records, gate files, rank logs).
set -uo pipefail
: "${OUT:?run on the device machine}"
START=$(date +%s)
CALL_S=${CALL_S:-580}
export DCP_GIT_REV="${DCP_GIT_REV:-unknown}"
RES=/root/lease; GATE=/root/gate; DEST=/root/gate-dest
mkdir -p "$RES"
left() { echo $(( START + CALL_S - $(date +%s) )); }
pack() {
  # wait --dest collected (with a partial report); collect only if it did not run
  [ -d "$DEST" ] || python3 scripts/dcp_gate.py collect --work "$GATE" --dest "$DEST" > "$RES/collect.log" 2>&1
  [ -d "$DEST" ] && tar czf "$OUT/gate.tgz" -C "$DEST" .
  nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv > "$RES/nvidia-smi.txt" 2>&1
  tar czf "$OUT/lease-logs.tgz" -C "$RES" .
}
gate_wait() {
  local s; s=$(( $(left) - 25 ))
  rm -rf "$DEST"
  [ "$s" -gt 10 ] && python3 scripts/dcp_gate.py wait --work "$GATE" --seconds "$s" --dest "$DEST" \
    | tail -40
}
case "${1:?first|wait}" in
  first)
    deadline=${2:?GATE_DEADLINE_S}
    bash .gpu/device-install.sh && bash .gpu/device-overlay.sh > "$RES/overlay.log" 2>&1 \
      || { echo "install/overlay failed"; tail "$RES/overlay.log"; exit 1; }
    source .gpu/device-env.sh
    K=$HOME/gpu-vllm-patched/vllm/v1/attention/ops/triton_sparse_mla.py
    echo "=== kernel bench $(date -u +%T)"
    timeout 200 python3 scripts/bench_sparse_mla_kernel.py --kernel-path "$K" --git-rev "$DCP_GIT_REV" \
      --out "$OUT/kernel-bench-h200-0.33.0.json" > "$RES/kernel-bench.log" 2>&1
    tail -4 "$RES/kernel-bench.log" | cut -c1-300
    echo "=== top-k merge bench $(date -u +%T)"
    timeout 100 python3 scripts/bench_dcp_topk.py --vllm-tree "$HOME/gpu-vllm-patched" \
      --out "$OUT/dcp-topk-merge-h200-0.33.0.json" > "$RES/topk.log" 2>&1
    tail -4 "$RES/topk.log" | cut -c1-300
    echo "=== top-k order repro $(date -u +%T)"
    timeout 60 python3 scripts/repro_topk_order.py --out "$OUT/topk-order-h200-0.33.0.json" \
      > "$RES/topk-order.log" 2>&1
    tail -12 "$RES/topk-order.log" | cut -c1-250
    echo "=== gates start $(date -u +%T)"
    python3 scripts/dcp_gate.py start --suites "${GATE_SUITES:-lease}" --work "$GATE" --deadline-s "$deadline"
    ( VARIANT=patched; source .gpu/device-env.sh; cd .gpu-tests
      # -v: one line per test as it ends, so a log cut by the timeout still names every
      # outcome (the 2026-12-01 lease's -q log was cut before its summary)
      timeout 400 python3 -m pytest -v -rfEs --timeout 120 -p no:cacheprovider $(cat SERIES_TESTS) \
        > "$RES/tree-tests-h200.log" 2>&1
      [ $? -eq 4 ] && timeout 300 python3 -m pytest -v -rfEs --timeout 120 --noconftest \
        -p no:cacheprovider $(cat SERIES_TESTS) > "$RES/tree-tests-h200.log" 2>&1 ) &
    gate_wait
    tail -3 "$RES/tree-tests-h200.log" 2>/dev/null
    pack ;;
  wait)
    source .gpu/device-env.sh
    # a previous call's end may have killed the daemon: start resumes it (the first start's
    # absolute deadline wins: start keeps the earlier of the two)
    python3 scripts/dcp_gate.py wait --work "$GATE" --seconds 1 > /dev/null 2>&1
    [ $? -eq 4 ] && python3 scripts/dcp_gate.py start --suites "${GATE_SUITES:-lease}" --work "$GATE" \
      --deadline-s 99999
    gate_wait
    tail -3 "$RES/tree-tests-h200.log" 2>/dev/null
    pack ;;
  *) echo "unknown phase $1 (first | wait)"; exit 2 ;;
esac
