#!/bin/bash
# One H200 lease of the series' GPU evidence, in as few device calls as it takes. Run on the
# device machine from the repository root, after the staging parts arrived (../shared/gpu
# recipe; carry .gpu, .gpu-overlay, .gpu-tests):
#     bash evidence/dev/gpu_lease.sh first GATE_DEADLINE_S   # install, benches, gates start
#     (or LEASE_END_S=<device seconds left for the lease calls> ... first: the deadline then
#     fits the lease, see below)
#     bash evidence/dev/gpu_lease.sh wait                    # each following call
#     bash evidence/dev/gpu_lease.sh land STAMP FILES_AT...   # here, afterwards: into results/
# `first`: install the staged vLLM and the patched overlay; the kernel and top-k merge benches
# (evidence/dev/gpu_h200_session.sh stages kernel and topk), each ALONE on the GPU (their times are
# the figures); then the gate lease (evidence/dcp_gate.py start --suites $GATE_SUITES, default
# all; detached, with an absolute deadline of GATE_DEADLINE_S seconds) and, beside the
# gates' warm-up, the series' vLLM-tree tests (the session script's tree-tests stage, detached
# so that a call's end does not cut it; its archive lands in $RES and travels with
# lease-logs.tgz); then it waits for the gates until the call's 600 s are nearly used.
# `wait`: waits again (the gate daemon resumes itself if the previous call's end killed it)
# and collects.
# FlashInfer's trtllm_comm build (422 s on an H100) is kept in the first call's
# $OUT/flashinfer-jit; copy those files to build/flashinfer-jit and carry that folder in a
# later lease's first call: prewarm_flashinfer.py installs it where its key matches.
# PREWARM_WAIT_S=0 starts the gates at once (their engines wait on FlashInfer's build lock).
# Settings (environment): DCP_GIT_REV (the revision the records name), GATE_SUITES,
# LEASE_END_S / GATE_COLLECT_S (first: fit the gates' deadline into the lease, see there),
# BENCH_STAGES (default "kernel topk"; "none": no bench), KERNEL_BUDGET_S, TREE_STAGE_S / TREE_FILE_S and
# TREE_TESTS_FIRST ("|"-separated grep -E patterns of test files to run first, in that
# order; TREE_STAGE_S=0: no tree tests), GATE_MAX_RANKS, CALL_S (this call's seconds).
# `first` receives the staging part its call carries (.gpu-parts/NN; until 2026-12-02 05:30Z it
# did not, and a call carrying the last part had to run `bash .gpu/device-recv.sh && ...`).
# land: LAND_NOISE_SUFFIX names the lease's noise files (see there).
# GATE_REUSE (a landed lease-STAMP.tgz: its finished runs are reused) and GATE_ONLY (the
# runs to run) finish a lease that a released machine cut short.
# `wait` calls need carry nothing: `first` keeps .gpu/device-env.sh under $LEASE_ROOT.
# A lease that a released machine cut short: GATE_REUSE=<the previous lease's archive>
# GATE_ONLY=<the runs left> ... first; `wait` at once (an idle machine is released quickly).
# `serve`: the serving smoke alone (evidence/serve_smoke.py; see there); `land` puts its record
# into results/serve-smoke-0.34.0.json. Staged with STAGE_WHEELS=1 (below), the machine gets
# the overlay wheels of dist/ in place of the official tree and `serve` pip-installs them, as
# the README installs them.
# `tests`: install and the tree tests alone (no bench, no gate), in the foreground, for
# CALL_S less 40 s (or TREE_STAGE_S); carries what `first` carries.
# `mtp`: install and the adaptive-depth benchmark alone (evidence/bench_mtp_depth.py; see there).
# A call carries at most 64 MiB: this tree plus one staging part. ../shared/gpu's
# stage-build.sh cuts 60 MiB parts, too large beside this tree (18.7 MiB with .gpu on
# 2026-12-02 11:30Z; each landed lease adds ~1.5 MiB), so, here, before the lease:
#     make wheel && bash evidence/dev/gpu_lease.sh stage
# (copies ../shared/gpu to .gpu, runs stage-build.sh, re-cuts the parts to what a call leaves
# beside the tree, the largest first so that the last call carries the smallest beside
# .gpu-overlay and .gpu-tests, rebuilds those two from build/vllm, checks every call's size
# and prints the calls; evidence/dev/tests/test_gpu_lease.py). A hand re-cut of 2026-12-02
# joined the chunks by folder order after a folder had been moved, which misorders the bytes:
# `stage` joins them by chunk name.
# Everything comes back in at most 8 files under $OUT: kernel.tar.gz and topk.tar.gz (bench
# JSON + log, first call only), lease-logs.tgz (overlay log, tree tests, status) and gate.tgz
# (run records, gate files, rank logs).
set -uo pipefail
if [ "${1:-}" = stage ]; then
  # Here, before the lease, from a checkout whose build/vllm is applied (make wheel): what
  # the calls carry. ../shared/gpu -> .gpu, the staging parts (.gpu/stage-build.sh, ~1-5 min)
  # re-cut where one is larger than PART_MIB (default: what a call's CALL_MIB = 64 MiB leaves
  # beside the tracked tree and .gpu, less 1 MiB; 45 on 2026-12-02 with an 18.7 MiB tree), in
  # folders ordered largest first, so that the last call, which also carries .gpu-overlay and
  # .gpu-tests, gets the smallest; the overlay and the test bundle rebuilt from build/vllm;
  # then the size check of every call. Prints the calls to make.
  # STAGE_WHEELS=1: the vLLM part of the staging carries the overlay wheels `make wheel` wrote
  # (dist/: the x86_64 vLLM one, the b12x one, their receipts) instead of the official tree
  # (for `serve`, which pip-installs them); the dependency parts are the same. .gpu-parts/STAGED
  # says which of the two the parts hold; asking for the other re-stages.
  CALL_MIB=${CALL_MIB:-64}; PY=${PY:-.venv/bin/python}
  mode=tree; [ -n "${STAGE_WHEELS:-}" ] && mode=wheels
  if [ "$mode" = wheels ]; then
    wheels=$(cd dist && ls vllm-*+dcp.*-manylinux_2_28_x86_64.whl receipt.json \
      $(ls b12x-*+dcp.*.whl receipt-b12x.json 2>/dev/null)) \
      || { echo "no x86_64 overlay wheel in dist/: run make wheel"; exit 2; }
  fi
  [ -d .gpu-parts ] && [ "$(cat .gpu-parts/STAGED 2>/dev/null || echo tree)" != "$mode" ] \
    && { echo "the parts hold another staging: re-staging ($mode)"; rm -rf .gpu-parts .gpu/parts.sha256; }
  [ -d build/vllm ] && [ -d build/base/vllm ] || { echo "build/vllm missing: run make wheel"; exit 2; }
  [ -d .gpu ] || cp -r "${SHARED_GPU:-../shared/gpu}" .gpu || exit 1
  kib() { du -sk "$@" | awk '{s += $1} END {print s}'; }
  tree=$(( $(git ls-files -z | xargs -0 stat -c %s | awk '{s += $1} END {print int(s / 1024)}') + $(kib .gpu) ))
  PART_MIB=${PART_MIB:-$(( CALL_MIB - (tree + 1023) / 1024 - 1 ))}
  [ "$PART_MIB" -gt 0 ] || { echo "no room for a part beside the ${tree} KiB tree"; exit 1; }
  # the vLLM the series is pinned to (stage-build.sh defaults to an older one); FLASHINFER_PIN:
  # vLLM 0.34.0 pins flashinfer-python 0.7.3, which the package index here does not serve
  # (../shared/gpu/README.md), so 0.7.4 is staged unless another is named
  pinned=$(python3 -c 'import tomllib; print(tomllib.load(open("pins.toml", "rb"))["vllm"]["wheel"]["requirement"].split("==")[1])') \
    || { echo "no vllm.wheel pin in pins.toml"; exit 1; }
  export VLLM_VERSION=${VLLM_VERSION:-$pinned} FLASHINFER_PIN=${FLASHINFER_PIN:-0.7.4}
  [ -f .gpu-parts/SHA256SUMS ] || bash .gpu/stage-build.sh || { echo "stage-build failed"; exit 1; }
  over=$(find .gpu-parts -name 'chunk.*' -size +$((PART_MIB * 1024))k | head -1)
  if [ -n "$over" ] || { [ "$mode" = wheels ] && [ ! -f .gpu-parts/STAGED ]; }; then
    W=$(mktemp -d)
    # joined in the chunks' name order, whatever folder holds each (the folders are ordered
    # by size, not by name: a plain glob would join them out of order)
    joined() { ls .gpu-parts/*/chunk."$1"* | awk -F/ '{print $NF, $0}' | sort | cut -d' ' -f2 \
      | xargs cat; }
    if [ "$mode" = wheels ]; then tar czf "$W/vllm.tar.gz" -C dist $wheels; else joined v > "$W/vllm.tar.gz"; fi \
      && joined d > "$W/deps.tar" \
      && (cd "$W" && split -b "${PART_MIB}m" -d -a 2 vllm.tar.gz chunk.v \
        && split -b "${PART_MIB}m" -d -a 2 deps.tar chunk.d && rm vllm.tar.gz deps.tar) \
      || { echo "re-cut failed; .gpu-parts left as it was"; rm -rf "$W"; exit 1; }
    rm -rf .gpu-parts
    # device-install.sh joins chunk.v* and chunk.d* by name: the folders' order is free
    i=0; for c in $(ls -S "$W"/chunk.*); do
      d=$(printf .gpu-parts/%02d $i); mkdir -p "$d"; mv "$c" "$d/"; i=$((i + 1)); done
    rm -rf "$W"
    (cd .gpu-parts && sha256sum */chunk.* > SHA256SUMS) && cp .gpu-parts/SHA256SUMS .gpu/parts.sha256
    [ "$mode" = wheels ] && echo wheels > .gpu-parts/STAGED
  fi
  rm -rf .gpu-overlay .gpu-tests
  bash .gpu/overlay-build.sh build/vllm build/base/vllm > /dev/null \
    && "$PY" evidence/dev/tree_tests_bundle.py build/vllm .gpu-tests > /dev/null \
    || { echo "overlay or test bundle failed"; exit 1; }
  # the b12x overlay wheel (make wheel): 0015's dcp_comm_backend="b12x" imports b12x, which
  # the staged closure lacks (it stages vLLM's requirements without extras); install_carried
  # puts it into the patched tree
  b12x_whl=$(ls dist/b12x-*+dcp.*-py3-none-any.whl 2>/dev/null | tail -1)
  if [ -n "$b12x_whl" ]; then mkdir -p .gpu-overlay/b12x-wheel && cp "$b12x_whl" .gpu-overlay/b12x-wheel/; fi
  parts=$(ls -d .gpu-parts/[0-9]* | sort); last=$(echo "$parts" | tail -1)
  big=$(for d in $parts; do kib "$d"; done | sort -n | tail -1)
  lastcall=$(( tree + $(kib "$last" .gpu-overlay .gpu-tests) ))
  echo "tree + .gpu ${tree} KiB; parts of at most ${PART_MIB} MiB, the largest ${big} KiB; last call ${lastcall} KiB (limit $((CALL_MIB * 1024)))"
  [ $((tree + big)) -lt $((CALL_MIB * 1024)) ] && [ "$lastcall" -lt $((CALL_MIB * 1024)) ] \
    || { echo "a call would exceed ${CALL_MIB} MiB: lower PART_MIB"; exit 1; }
  n=$(echo "$parts" | wc -l)
  echo "calls: carry [.gpu, .gpu-parts/NN] 'bash .gpu/device-recv.sh' for NN in $(echo "$parts" | head -1 | xargs basename)..$(echo "$parts" | sed -n "$((n - 1))p" | xargs basename);"
  echo "then carry [.gpu, $last, .gpu-overlay, .gpu-tests] 'bash evidence/dev/gpu_lease.sh first' ($n calls)"
  exit 0
fi
if [ "${1:-}" = land ]; then
  # Here, after the lease: put what the calls brought back (FILES_AT: one folder per call, or
  # the files themselves) into results/. Gate files whose comparison never ran (runs cut by the
  # deadline) are left out, so an earlier finished file of the same name stays; so is a gate
  # file without a caught negative control where the earlier file of that name has one.
  shift; stamp=${1:?STAMP (e.g. 20261201T1900Z)}; shift
  [ $# -gt 0 ] || { echo "land STAMP FILES_AT..."; exit 2; }
  # logs and run archives are kept out of results/ (LEASE_ARCHIVE, default build/leases/STAMP)
  A=${LEASE_ARCHIVE:-build/leases/$stamp}
  W=$(mktemp -d); mkdir -p "$A"
  for d in "$@"; do
    for f in kernel topk nvfp4; do
      [ -f "$d/$f.tar.gz" ] && tar xzf "$d/$f.tar.gz" -C "$W" && echo "landed $d/$f.tar.gz"
    done
    [ -f "$d/gate.tgz" ] && rm -rf "$W/gate" && mkdir -p "$W/gate" && tar xzf "$d/gate.tgz" -C "$W/gate"
    [ -f "$d/lease-logs.tgz" ] && cp "$d/lease-logs.tgz" "$A/gpu-lease-logs.tgz"
  done
  for d in "$@"; do  # the serving smoke (phase serve): its record and its logs
    [ -f "$d/serve-smoke.json" ] && cp "$d/serve-smoke.json" results/serve-smoke-0.34.0.json \
      && echo "results/serve-smoke-0.34.0.json"
    [ -f "$d/serve-logs.tgz" ] && cp "$d/serve-logs.tgz" "$A/serve-logs.tgz"
  done
  for f in kernel-bench-h200-0.34.0.json dcp-topk-merge-h200-0.34.0.json; do
    [ -s "$W/$f" ] && cp "$W/$f" results/ && echo "results/$f"
  done
  for f in "$W"/nvfp4-bench-*-0.34.0.json; do
    [ -s "$f" ] && cp "$f" results/ && echo "results/$(basename "$f")"
  done
  for f in "$W"/*.log; do [ -f "$f" ] && cp "$f" "$A/$(basename "$f")"; done
  if [ -d "$W/gate" ]; then  # the last call's gate.tgz holds everything the gates wrote
    # The harness names a noise file by checkpoint only (dcp-gate-noise-glmn-patched.json),
    # so a lease of another release or suite would replace an earlier lease's file of that
    # name: LAND_NOISE_SUFFIX (e.g. 0.34.0-dcp4) lands it as dcp-gate-noise-<ckpt>-<suffix>.json;
    # without it, a noise file that would replace a different one stops the landing before
    # anything is copied.
    python3 - "$W/gate/results" <<'PY' || { rm -rf "$W"; exit 2; }
import json, os, shutil, sys
from pathlib import Path
suffix = os.environ.get("LAND_NOISE_SUFFIX", "")
docs = {f: json.loads(f.read_text()) for f in sorted(Path(sys.argv[1]).glob("*.json"))}
noise = {f for f, d in docs.items() if d.get("kind") == "dcp_gate_noise"}
dest = {
    f: Path("results") / (f"{f.stem}-{suffix}.json" if suffix and f in noise else f.name)
    for f in docs
}
clash = [str(dest[f]) for f in sorted(noise) if dest[f].is_file()
         and dest[f].read_bytes() != f.read_bytes()]
if clash:
    print(f"no gate file landed: the lease's noise file would replace {', '.join(clash)}; "
          "name it with LAND_NOISE_SUFFIX=<release>-<suite>")
    sys.exit(2)
for f, d in docs.items():
    if d.get("kind") == "dcp_gate" and d.get("max_abs_logprob_diff") is None:
        print(f"not landed (never compared): {f.name}")
        continue
    old = Path("results") / f.name
    if (
        d.get("kind") == "dcp_gate"
        and not d.get("negative_control_detected")
        and old.is_file()
        and json.loads(old.read_text()).get("negative_control_detected")
    ):
        print(f"not landed (its negative control did not run; {old} has one): {f.name}")
        continue
    shutil.copy(f, dest[f])
    print(dest[f])
PY
    [ -f "$W/gate/rank-logs.tgz" ] && mv "$W/gate/rank-logs.tgz" "$A/gate-ranks.tgz"
    tar czf "$A/gate-runs.tgz" -C "$W/gate" \
      $(cd "$W/gate" && ls -d daemon.log runs status.json 2>/dev/null)
  fi
  rm -rf "$W"; exit 0
fi
: "${OUT:?run on the device machine}"
START=$(date +%s)
CALL_S=${CALL_S:-580}
export DCP_GIT_REV="${DCP_GIT_REV:-unknown}"
R=${LEASE_ROOT:-/root}  # LEASE_ROOT: another scratch root (a dry run on CPU with stubs)
RES=$R/lease; GATE=$R/gate; DEST=$R/gate-dest
mkdir -p "$RES"
# What later calls need from the carried folders lives off the working tree, which every call
# replaces with what it carries: the overlay's MANIFEST (the gate records its sha256; the
# 22:37Z lease's runs started after the first call recorded it missing) and the test bundle.
export GATE_OVERLAY=$R/overlay
left() { echo $(( START + CALL_S - $(date +%s) )); }
pack_logs() {
  nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv > "$RES/nvidia-smi.txt" 2>&1
  # the detached tree-test stage may still be writing its logs: GNU tar then exits 1 ("file
  # changed as we read it") with the archive written; only a worse status fails the call
  tar czf "$OUT/lease-logs.tgz" --warning=no-file-changed -C "$RES" . || [ $? -eq 1 ]
}
pack() {
  # wait --dest collected (with a partial report); collect only if it did not run
  [ -d "$DEST" ] || python3 evidence/dcp_gate.py collect --work "$GATE" --dest "$DEST" > "$RES/collect.log" 2>&1
  [ -d "$DEST" ] && tar czf "$OUT/gate.tgz" -C "$DEST" .
  pack_logs
}
install_carried() {
  # the last staging part, when this call carries it (.gpu-parts/NN), then the staged vLLM
  # and the patched overlay
  if ls .gpu-parts/[0-9]*/chunk.* > /dev/null 2>&1; then
    bash .gpu/device-recv.sh || { echo "receiving the carried part failed"; exit 1; }
  fi
  bash .gpu/device-install.sh && bash .gpu/device-overlay.sh > "$RES/overlay.log" 2>&1 \
    || { echo "install/overlay failed"; tail "$RES/overlay.log"; exit 1; }
  # the carried b12x overlay wheel (stage), into the patched tree: first on a patched rank's
  # PYTHONPATH, so `import b12x` is the pinned b12x, not flashinfer's embedded copy
  if ls .gpu-overlay/b12x-wheel/b12x-*.whl > /dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile \
      --target "${GPU_ROOT:-$HOME}/gpu-vllm-patched" .gpu-overlay/b12x-wheel/b12x-*.whl \
      > "$RES/b12x-install.log" 2>&1 \
      || { echo "b12x wheel install failed"; tail "$RES/b12x-install.log"; exit 1; }
  fi
}
gate_start() {
  # GATE_ONLY: the comma-separated runs of the suites to run (dcp_gate.py --only)
  # GATE_MAX_RANKS: rank processes at once (dcp_gate.py's default 16: four TP 4 engines),
  # fewer where the GPU holds fewer ranks of GATE_RANK_GIB (dcp_gate.py's RANK_GIB; 0: off)
  python3 evidence/dcp_gate.py start --suites "${GATE_SUITES:-all}" --work "$GATE" \
    ${GATE_ONLY:+--only "$GATE_ONLY"} ${GATE_MAX_RANKS:+--max-ranks "$GATE_MAX_RANKS"} \
    ${GATE_RANK_GIB:+--rank-gib "$GATE_RANK_GIB"} "$@"
}
gate_wait() {
  local s; s=$(( $(left) - 25 ))
  rm -rf "$DEST"
  [ "$s" -gt 10 ] && python3 evidence/dcp_gate.py wait --work "$GATE" --seconds "$s" --dest "$DEST" \
    | tail -40
}
case "${1:?first|wait|tests|serve|mtp}" in
  first)
    deadline=${2:-}
    [ -n "$deadline" ] || [ -n "${LEASE_END_S:-}" ] || { echo "first GATE_DEADLINE_S (or LEASE_END_S)"; exit 2; }
    install_carried
    # later calls need not carry .gpu for the environment
    cp .gpu/device-env.sh "$R/device-env.sh"
    mkdir -p "$GATE_OVERLAY" && cp .gpu-overlay/MANIFEST "$GATE_OVERLAY/" \
      && rm -rf "$R/gpu-tests" && cp -r .gpu-tests "$R/gpu-tests" \
      || { echo "carry .gpu-overlay and .gpu-tests in the first call"; exit 1; }
    source .gpu/device-env.sh
    # FlashInfer's trtllm all-reduce module, which every TP > 1 gate engine needs and whose
    # JIT build held the 18:20Z lease's warm-up for 6 minutes (evidence/dev/prewarm_flashinfer.py),
    # built beside the benches (nvcc on 4 jobs; the benches' times are CUDA-graph replays);
    # build/flashinfer-jit, when carried, is an earlier lease's build of it (files of a call's
    # $OUT/flashinfer-jit), installed only where its key matches this machine
    seed=; [ -f build/flashinfer-jit/trtllm_comm.json ] && seed=build/flashinfer-jit
    MAX_JOBS=4 setsid nohup python3 evidence/dev/prewarm_flashinfer.py ${seed:+--seed "$seed"} \
      --keep "$OUT/flashinfer-jit" > "$RES/prewarm-flashinfer.log" 2>&1 < /dev/null &
    prewarm_pid=$!
    # the gate checkpoints need only the CPU: made beside the benches (the 22:37Z lease's gate
    # clock spent its first 3 minutes on them), on part of the cores
    OMP_NUM_THREADS=8 python3 evidence/dcp_gate.py checkpoints --suites "${GATE_SUITES:-all}" \
      --work "$GATE" > "$RES/checkpoints.log" 2>&1 < /dev/null &
    ckpt_pid=$!
    # BENCH_STAGES: the benches to run (default both; a lease that changed only the merge
    # runs topk alone and gives the kernel's minutes to the gates; "none": no bench)
    stages=${BENCH_STAGES:-kernel topk}; [ "$stages" = none ] && stages=
    # shellcheck disable=SC2086  # the stage names, word-split on purpose
    RES="$RES/session" bash evidence/dev/gpu_h200_session.sh $stages
    # the gates start once that build is done: a run started before it waits on FlashInfer's
    # build lock with the gate clock running (the 17:03Z lease of 2026-12-07, BENCH_STAGES=none
    # and no warm-up run, spent its whole 422 s deadline there); PREWARM_WAIT_S bounds the wait
    waited=0
    while kill -0 "$prewarm_pid" 2> /dev/null && [ "$waited" -lt "${PREWARM_WAIT_S:-480}" ]; do
      sleep 2; waited=$(( waited + 2 ))
    done
    echo "flashinfer prewarm: waited ${waited} s"
    tail -1 "$RES/prewarm-flashinfer.log" 2>/dev/null
    wait "$ckpt_pid" || { echo "checkpoints failed"; tail -5 "$RES/checkpoints.log"; }
    # LEASE_END_S: seconds after this call's start by which the lease's last call ends (the
    # device budget left, less the calls' start-ups). The gates' deadline counts from their
    # start, after install and benches (the 06:15Z lease gave 1350 s from there and its last
    # call ended 150 s before it, so the three runs still in flight never got a record); with
    # LEASE_END_S it ends GATE_COLLECT_S (90) before the lease does, so the runs it cuts are
    # recorded and collected; a GATE_DEADLINE_S given too is an upper bound.
    if [ -n "${LEASE_END_S:-}" ]; then
      fit=$(( LEASE_END_S - ($(date +%s) - START) - ${GATE_COLLECT_S:-90} ))
      if [ -z "$deadline" ] || [ "$fit" -lt "$deadline" ]; then deadline=$fit; fi
    fi
    [ "$deadline" -gt 0 ] || { echo "no time left for the gates (deadline $deadline s)"; pack; exit 1; }
    # GATE_REUSE: a landed lease's run archive (build/leases/STAMP/gate-runs.tgz) whose
    # finished runs the suite reuses instead of running them again (a lease cut short by a
    # released machine); the gates refuse a pair whose records name different checkpoint bytes
    if [ -n "${GATE_REUSE:-}" ]; then
      mkdir -p "$GATE" && tar xzf "$GATE_REUSE" -C "$GATE" runs \
        || { echo "GATE_REUSE: no runs/ in $GATE_REUSE"; pack; exit 1; }
      echo "reusing $(ls "$GATE/runs" | wc -l) runs of $GATE_REUSE"
    fi
    echo "=== gates start $(date -u +%T), deadline ${deadline} s"
    gate_start --deadline-s "$deadline"
    mkdir -p "$RES/tree-tests"
    # beside the gates the files run slowly (the 22:37Z lease's kernel test file needed more
    # than 240 s): the stage may use the whole lease, each file 6 minutes; TREE_STAGE_S=0
    # leaves the GPU and the cores to the gates (a lease of TP 4 engines)
    if [ "${TREE_STAGE_S:-1100}" -gt 0 ]; then
      OUT="$RES/tree-tests" RES="$RES/tree-tests" TREE_TESTS="$R/gpu-tests" \
        STAGE_TIMEOUT=${TREE_STAGE_S:-1100} FILE_TIMEOUT=${TREE_FILE_S:-360} setsid nohup \
        bash evidence/dev/gpu_h200_session.sh tree-tests > "$RES/tree-tests/stage.log" 2>&1 < /dev/null &
    fi
    gate_wait
    tail -3 "$RES/tree-tests/tree-tests-h200.log" 2>/dev/null
    pack ;;
  wait)
    if [ -f .gpu/device-env.sh ]; then source .gpu/device-env.sh; else source "$R/device-env.sh"; fi
    # a previous call's end may have killed the daemon: start resumes it (the first start's
    # absolute deadline wins: start keeps the earlier of the two)
    python3 evidence/dcp_gate.py wait --work "$GATE" --seconds 1 > /dev/null 2>&1
    [ $? -eq 4 ] && gate_start --deadline-s 99999
    gate_wait
    tail -3 "$RES/tree-tests/tree-tests-h200.log" 2>/dev/null
    pack ;;
  tests)
    # the tree tests alone, no gates and no bench: a lease whose gates are done and whose
    # tests want the GPU to themselves (install as in first; carry the last part, .gpu,
    # .gpu-overlay and .gpu-tests). TREE_STAGE_S bounds the stage (default what the call
    # leaves less 40 s), TREE_FILE_S each file (default 240).
    install_carried
    source .gpu/device-env.sh
    stage_s=${TREE_STAGE_S:-$(( $(left) - 40 ))}
    [ "$stage_s" -ge 30 ] || { echo "no time left for the tree tests (${stage_s} s)"; exit 1; }
    mkdir -p "$RES/tree-tests"
    OUT="$RES/tree-tests" RES="$RES/tree-tests" TREE_TESTS="$PWD/.gpu-tests" \
      STAGE_TIMEOUT=$stage_s FILE_TIMEOUT=${TREE_FILE_S:-240} \
      bash evidence/dev/gpu_h200_session.sh tree-tests > "$RES/tree-tests/stage.log" 2>&1 < /dev/null
    grep -h "^== .*: " "$RES/tree-tests/tree-tests-h200.log" 2>/dev/null
    pack_logs ;;
  serve)
    # The serving smoke (evidence/serve_smoke.py): `vllm serve` of the patched tree answering
    # the openai client, compared with the offline engine; the GPU to itself, no gate. Carry
    # what `first` carries (.gpu, the last part if not yet received, .gpu-overlay). A second
    # `serve` call on the same warm machine resumes: the checkpoint and the offline reference
    # stay under $R/serve. Brings back serve-smoke.json and serve-logs.tgz.
    # Staged with STAGE_WHEELS=1, the official tree's place holds the overlay wheels: they are
    # pip-installed (--no-deps: the machine has no package index; the requirements are the
    # staged ones) into $R/wheel-site, the patched files there are checked against the
    # overlay's MANIFEST, and the server is the `vllm` script pip wrote.
    install_carried
    mkdir -p "$R/serve"
    staged=${GPU_ROOT:-$HOME}/gpu-vllm
    if ls "$staged"/vllm-*+dcp.*.whl > /dev/null 2>&1; then
      site=$R/wheel-site
      whls=$(ls "$staged"/vllm-*+dcp.*.whl "$staged"/b12x-*+dcp.*.whl 2>/dev/null)
      if [ ! -f "$site/.installed" ]; then
        rm -rf "$site"
        python3 -m pip install --no-index --no-deps --no-compile --target "$site" $whls \
          > "$RES/pip-install.log" 2>&1 || { echo "pip install failed"; tail "$RES/pip-install.log"; exit 1; }
        touch "$site/.installed"
      fi
      (cd "$site" && sha256sum -c --quiet "$OLDPWD/.gpu-overlay/MANIFEST") \
        || { echo "the installed wheel's patched files differ from the overlay"; exit 1; }
      python3 - "$site" "$RES/install.json" .gpu-overlay/MANIFEST $whls <<'PY'
import hashlib, json, subprocess, sys
from pathlib import Path
site, out, manifest, *whls = sys.argv[1:]
pip = subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True, text=True)
json.dump({
    "how": "pip install --no-index --no-deps --target SITE of the overlay wheels (the machine "
    "has no package index: the wheels' requirements were staged from the index and installed "
    "beside them)",
    "pip": pip.stdout.strip(),
    "wheels": [{"file": Path(w).name, "sha256": hashlib.sha256(Path(w).read_bytes()).hexdigest()}
               for w in whls],
    "patched_files_checked": len(Path(manifest).read_text().splitlines()),
    "site": site,
}, open(out, "w"), indent=1)
PY
      source .gpu/device-env.sh
      export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" PATH="$site/bin:$PATH"
      cli=(--vllm "$site/bin/vllm" --install-record "$RES/install.json")
    else
      VARIANT=patched source .gpu/device-env.sh
      cli=()
    fi
    python3 evidence/serve_smoke.py all --work "$R/serve" --out "$OUT/serve-smoke.json" \
      --deadline-s $(( $(left) - 30 )) --overlay-manifest .gpu-overlay/MANIFEST "${cli[@]}" \
      > "$RES/serve.log" 2>&1 < /dev/null
    rc=$?
    tail -25 "$RES/serve.log"
    tar czf "$OUT/serve-logs.tgz" -C "$R/serve" --exclude ckpt . -C "$RES" serve.log \
      $(cd "$RES" && ls pip-install.log install.json 2>/dev/null)
    exit $rc ;;
  mtp)
    # The adaptive-depth benchmark alone on the GPU (evidence/bench_mtp_depth.py): install as
    # in first (carry .gpu, the last part if not yet received, .gpu-overlay), write the
    # cost-realistic checkpoint under $R/mtp unless a previous call did, run the benchmark on
    # the patched tree until the call's end less 40 s. A part a previous call finished is
    # kept, so repeating the call on the same warm machine finishes a benchmark its end cut.
    # MTP_ARGS adds to the benchmark's arguments (e.g. "--repeats 1 --engines nospec").
    # Brings back mtp-bench.tgz (result, parts, child logs) and lease-logs.tgz.
    install_carried
    VARIANT=patched source .gpu/device-env.sh
    mkdir -p "$R/mtp/work"
    if [ ! -f "$R/mtp/ckpt/mtp_cost_ckpt.json" ]; then
      python3 evidence/make_mtp_cost_ckpt.py --out "$R/mtp/ckpt" > "$RES/mtp-ckpt.log" 2>&1 \
        || { echo "checkpoint failed"; tail "$RES/mtp-ckpt.log"; pack_logs; exit 1; }
    fi
    # shellcheck disable=SC2086  # MTP_ARGS, word-split on purpose
    python3 evidence/bench_mtp_depth.py run --ckpt "$R/mtp/ckpt" --work "$R/mtp/work" \
      --out "$R/mtp/work/result.json" --deadline-s $(( $(left) - 40 )) ${MTP_ARGS:-} \
      > "$RES/mtp-bench.log" 2>&1 < /dev/null
    rc=$?
    tail -5 "$RES/mtp-bench.log"
    tar czf "$OUT/mtp-bench.tgz" -C "$R/mtp/work" .
    pack_logs
    exit $rc ;;
  *) echo "unknown phase $1 (first | wait | tests | serve | mtp)"; exit 2 ;;
esac
