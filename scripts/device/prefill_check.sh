#!/usr/bin/env bash
# One device call for the CUDA prefill work (issue 6): prefill op table, whole-model tiny checks,
# the existing CUDA op/model tests and goldens with --backend cuda, then the full-size synthetic
# checkpoint: bench sweep (prefill tok/s) and optionally CUDA vs CPU reference.
# Usage: B=build-prefill/dev scripts/device/prefill_check.sh [quick|full]   (logs under $OUT)
set -uo pipefail
B=${B:-build-prefill/dev}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$PWD/$B/rt${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
mode=${1:-quick}
[[ -e /work/main ]] || { mkdir -p /work && ln -s "$PWD" /work/main; }
log() { echo "== $* ($(date -u +%T))" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"
( timeout 120 "$B/lily" synth --preset qwen3.6-35b-a3b --out /tmp/full > "$OUT/synth.txt" 2>&1; echo "synth rc $?" >> "$OUT/synth.txt" ) &
SYN=$!
for t in Gemm Moe GdnPrefill AttnPrefill TinyModel; do
  log "CudaPrefill.$t"
  timeout ${TEST_TIMEOUT:-100} "$B/lily_tests" --gtest_filter="CudaPrefill.$t" > "$OUT/prefill_$t.txt" 2>&1
  echo "rc $?" >> "$OUT/prefill_$t.txt"
  grep -E '^\| |FAILED|PASSED|SKIPPED|rc ' "$OUT/prefill_$t.txt" | tail -60
done
log "CudaOps + CudaModel (tiny)"
timeout 120 "$B/lily_tests" --gtest_filter='CudaOps.*:CudaModel.Tiny*' > "$OUT/cuda_existing.txt" 2>&1; echo "rc $?" >> "$OUT/cuda_existing.txt"
grep -E 'FAIL|PASSED|SKIPPED|rc |greedy|pipeline' "$OUT/cuda_existing.txt" | tail -15
log "golden (LILY_BACKEND=cuda)"
LILY_BACKEND=cuda timeout 90 "$B/lily_tests" --gtest_filter='*Golden*' > "$OUT/golden.txt" 2>&1; echo "rc $?" >> "$OUT/golden.txt"
grep -E 'FAIL|PASSED|SKIPPED|rc |mismatch|max' "$OUT/golden.txt" | tail -15
wait $SYN; tail -2 "$OUT/synth.txt"
log "bench full (terms ${LILY_PREFILL_TERMS:-2})"
timeout ${BENCH_TIMEOUT:-150} "$B/lily" bench --model /tmp/full --backend cuda --contexts ${CTXS:-256,1024,4096,8192,32768} \
  --json "$OUT/bench_full.json" 2>&1 >/dev/null | tee "$OUT/bench_full.txt" | tail -12
if [[ -n "${CTXS1:-}" ]]; then
  log "bench full, x as one fp16 term"
  LILY_PREFILL_TERMS=1 timeout 60 "$B/lily" bench --model /tmp/full --backend cuda --contexts $CTXS1 \
    --json "$OUT/bench_full_t1.json" 2>&1 >/dev/null | tee "$OUT/bench_full_t1.txt" | tail -6
fi
if [[ $mode == full ]]; then
  log "full CUDA vs CPU reference"
  LILY_FULL_CKPT=/tmp/full LILY_FULL_STEPS=${FULL_STEPS:-3} timeout ${FULL_TIMEOUT:-150} "$B/lily_tests" \
    --gtest_filter='CudaModel.FullSize*' > "$OUT/full_model.txt" 2>&1; echo "rc $?" >> "$OUT/full_model.txt"
  tail -14 "$OUT/full_model.txt"
fi
log "done"
