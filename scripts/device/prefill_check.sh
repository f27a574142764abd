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
log() { echo "== $* ($(date -u +%T))"; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 
( timeout 120 "$B/lily" synth --preset qwen3.6-35b-a3b --out /tmp/full > /tmp/synth.txt 2>&1; echo "synth rc $?" >> /tmp/synth.txt ) &
SYN=$!
for t in Gemm Moe GdnPrefill AttnPrefill TinyModel; do
  log "CudaPrefill.$t"
  timeout ${TEST_TIMEOUT:-100} "$B/lily_tests" --gtest_filter="CudaPrefill.$t" > "$OUT/t.txt" 2>&1
  echo "rc $?" >> "$OUT/t.txt"
  cat "$OUT/t.txt" >> "$OUT/tests.txt"
  echo "rows ok: $(grep -c '| ok' "$OUT/t.txt"), rows FAIL: $(grep -c 'FAIL (' "$OUT/t.txt")"
  grep -E 'FAIL \(|FAILED  \]|PASSED|routing|rc ' "$OUT/t.txt" | head -20
done
rm -f "$OUT/t.txt"
log "CudaOps + CudaModel (tiny)"
timeout 120 "$B/lily_tests" --gtest_filter='CudaOps.*:CudaModel.Tiny*' > "$OUT/tests2.txt" 2>&1; echo "rc $?" >> "$OUT/tests2.txt"
grep -E 'FAILED  \]|PASSED|rc |greedy|pipeline' "$OUT/tests2.txt" | tail -8
log "golden (LILY_BACKEND=cuda)"
LILY_BACKEND=cuda timeout 90 "$B/lily_tests" --gtest_filter='*Golden*' >> "$OUT/tests2.txt" 2>&1; echo "rc $?" >> "$OUT/tests2.txt"
grep -E 'FAILED  \]|PASSED|rc ' "$OUT/tests2.txt" | tail -8
wait $SYN; tail -1 /tmp/synth.txt
if [[ -n "${PROF:-}" ]]; then
  log "prefill profile at $PROF tokens"
  LILY_PREFILL_PROFILE=1 timeout 60 "$B/lily" bench --model /tmp/full --backend cuda --contexts $PROF 2>&1 >/dev/null | grep -E '^\||profile' | tail -24
fi
log "bench full (terms ${LILY_PREFILL_TERMS:-2})"
timeout ${BENCH_TIMEOUT:-150} "$B/lily" bench --model /tmp/full --backend cuda --contexts ${CTXS:-256,1024,4096,8192,32768} \
  --json "$OUT/bench_full.json" 2>&1 >/dev/null | grep -v uploading | tail -12
if [[ -n "${CTXS1:-}" ]]; then
  log "bench full, x as one fp16 term"
  LILY_PREFILL_TERMS=1 timeout 60 "$B/lily" bench --model /tmp/full --backend cuda --contexts $CTXS1 \
    --json "$OUT/bench_full_t1.json" 2>&1 >/dev/null | grep -v uploading | tail -4
fi
if [[ $mode == full ]]; then
  log "full CUDA vs CPU reference"
  LILY_FULL_CKPT=/tmp/full LILY_FULL_STEPS=${FULL_STEPS:-3} timeout ${FULL_TIMEOUT:-150} "$B/lily_tests" \
    --gtest_filter='CudaModel.FullSizeCheckpoint*' >> "$OUT/tests2.txt" 2>&1; echo "rc $?" >> "$OUT/tests2.txt"
  grep -E '^\| step|greedy|FAILED  \]|PASSED|rc ' "$OUT/tests2.txt" | tail -14
fi
log "done"
