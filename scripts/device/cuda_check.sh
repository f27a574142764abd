#!/usr/bin/env bash
# One device call: CUDA op table, whole-model CUDA vs CPU (tiny), golden with --backend cuda,
# then (phase 2) the full-size synthetic checkpoint: CUDA vs CPU reference for a few steps and
# the bench sweep. Built here (build-cuda, packed by scripts/device/pack.sh into <build>/dev).
# Usage: scripts/device/cuda_check.sh [phase1|phase2|all]   (logs under $OUT)
set -uo pipefail
B=${B:-build-main/dev}   # lily, lily_tests, rt/*.so (made by scripts/device/pack.sh)
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$PWD/$B/rt${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
phase=${1:-all}
# Tests and synth find data under the source dir compiled in (LILY_SOURCE_DIR=/work/main).
[[ -e /work/main ]] || { mkdir -p /work && ln -s "$PWD" /work/main; }
log() { echo "== $* ($(date -u +%T))" | tee -a "$OUT/summary.txt"; }
if [[ $phase == phase1 || $phase == all ]]; then
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"
  log "op table"
  timeout 150 "$B/lily_tests" --gtest_filter='CudaOps.*' 2>&1 | tee "$OUT/ops.txt" | grep -E '^\| |FAILED|PASSED|SKIPPED' | tail -120
  log "tiny model"
  timeout 90 "$B/lily_tests" --gtest_filter='CudaModel.*' 2>&1 | tee "$OUT/model.txt" | tail -30
  log "golden (LILY_BACKEND=cuda)"
  LILY_BACKEND=cuda timeout 60 "$B/lily_tests" --gtest_filter='*Golden*' 2>&1 | tee "$OUT/golden.txt" | tail -25
  log "small bench"
  timeout 40 "$B/lily" synth --preset small --out /tmp/small >/dev/null 2>&1
  timeout 60 "$B/lily" bench --model /tmp/small --backend cuda --contexts 256,4096 --json "$OUT/bench_small.json" 2>&1 >/dev/null | tail -8
fi
if [[ $phase == phase2 || $phase == all ]]; then
  log "synth full"
  timeout 150 "$B/lily" synth --preset qwen3.6-35b-a3b --out /tmp/full 2>&1 | tail -3
  log "bench full"
  timeout 170 "$B/lily" bench --model /tmp/full --backend cuda --contexts ${CTXS:-256,1024,4096,16384,32768} \
    --label "${LABEL:-}" --json "$OUT/bench_full.json" 2>&1 >/dev/null | tee "$OUT/bench_full.txt" | tail -12
  log "full CUDA vs CPU reference"
  LILY_FULL_CKPT=/tmp/full LILY_FULL_STEPS=${FULL_STEPS:-3} timeout ${FULL_TIMEOUT:-150} "$B/lily_tests" \
    --gtest_filter='CudaModel.FullSize*' 2>&1 | tee "$OUT/full_model.txt" | tail -14
fi
log "done"
