#!/usr/bin/env bash
# Issue 7, third pass of the CUDA batched step, one device call: the tensor-core op table (CudaBatchTc.*:
# both expert kernels vs the CPU reference, invariance, fused pack, route table), the exact path's op table
# (CudaBatch.*, expected 0), forward_batch / engine invariance on cuda, then bench-batch (default = stream
# expert kernel; LILY_BTC_STREAM=0 = the previous block kernel), a per-op profile and an ncu look at the
# expert and GDN kernels at B = 64 (NCU=1).
# Usage (device): B=build-x/dev scripts/device/batch3.sh   ($OUT: b3.txt summary, all.tgz every log)
set -uo pipefail
B=${B:?set B to a packed build (scripts/device/pack.sh)}
FINAL=${OUT:-/tmp/out}
OUT=/tmp/b3_out
CK=${CK:-/tmp/full}
mkdir -p "$OUT" "$FINAL"
for f in lily lily_tests; do [[ -x $B/$f ]] || { xz -dc "$B/$f.xz" > "$B/$f" && chmod +x "$B/$f"; }; done
export LD_LIBRARY_PATH="$PWD/$B/rt${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
[[ -e /work/main ]] || { mkdir -p /work && ln -s "$PWD" /work/main; }
T="$OUT/b3.txt"
log() { echo "== $* ($(date -u +%T))" | tee -a "$T"; cp "$T" "$FINAL/" 2>/dev/null; }
finish() { cp "$T" "$FINAL/" 2>/dev/null; tar czf "$FINAL/all.tgz" -C "$OUT" .; }
trap finish EXIT
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader >> "$T" 2>&1
[[ -f $CK/model.safetensors ]] || ( timeout 240 "$B/lily" synth --preset qwen3.6-35b-a3b --out "$CK" > "$OUT/synth.txt" 2>&1 ) &
SYN=$!
t() {  # name timeout filter [env...]
  local name=$1 to=$2 filt=$3
  shift 3
  env "$@" timeout "$to" "$B/lily_tests" --gtest_filter="$filt" > "$OUT/$name.txt" 2>&1
  echo "rc $?" >> "$OUT/$name.txt"
  grep -E '^\[cuda-batch\].*(d\| [1-9]|inf|nan)|\[forward-batch\]|Failure|FAILED|PASSED|SKIPPED|^rc ' "$OUT/$name.txt" | tail -30 | tee -a "$T"
}
log "CudaBatchTc.*"
t tc 150 'CudaBatchTc.*'
grep -E '^\[cuda-batch\] \| tc (moe (act|out)|moe stream|gemm vs|add)' "$OUT/tc.txt" | tee -a "$T"
if [[ ${FULL:-1} == 1 ]]; then
  log "CudaBatch.* (exact kernels, LILY_ATTN_CHUNK=0)"
  t ops 100 'CudaBatch.*' LILY_ATTN_CHUNK=0
  grep -c '^\[cuda-batch\]' "$OUT/ops.txt" | sed 's/^/rows: /' | tee -a "$T"
  log "ForwardBatch exact path"
  t inv_exact 80 'ForwardBatch.*' LILY_BACKEND=cuda LILY_BATCH_TC=0 LILY_ATTN_CHUNK=0 LILY_MOE_TOPK=router
  log "ForwardBatch + engine, cuda default"
  t inv 120 'ForwardBatch.*:BatchingTest.*:Engine/BatchSizes.*' LILY_BACKEND=cuda
fi
log "ForwardBatch + engine, cuda, LILY_BTC_STREAM=1"
t inv_stream 120 'ForwardBatch.*:BatchingTest.*:Engine/BatchSizes.*' LILY_BACKEND=cuda LILY_BTC_STREAM=1
wait $SYN
tail -1 "$OUT/synth.txt" 2>/dev/null | tee -a "$T"
bb() {  # name batches steps [env...]
  local name=$1 bs=$2 steps=$3
  shift 3
  log "bench-batch $name: batches $bs, $*"
  env "$@" timeout ${BENCH_TO:-100} "$B/lily" bench-batch --model "$CK" --backend cuda --batches "$bs" --context 256 --steps "$steps" \
    --check --json "$OUT/bench_$name.json" 2> "$OUT/bench_$name.err" > /dev/null
  echo "rc $?" >> "$OUT/bench_$name.err"
  grep -vE '^\[|load|upload' "$OUT/bench_$name.err" | tail -40 | tee -a "$T"
}
bb stream 1,4,16,64 16 LILY_BTC_STREAM=1
bb old 4,16,64 8 LILY_BTC_STREAM=0
bb profile 16,64 4 LILY_BATCH_PROFILE=1 LILY_BTC_STREAM=1
[[ ${AB:-1} -ge 1 ]] && bb kc4 16,64 8 LILY_BTC_STREAM=1 LILY_BTC_KC=4
[[ ${AB:-1} -ge 2 ]] && bb sdense0 16,64 8 LILY_BTC_STREAM=1 LILY_BTC_SDENSE=0
if [[ ${NCU:-1} == 1 ]] && command -v ncu > /dev/null; then
  log "ncu: expert + GDN kernels, B = 64"
  LILY_BTC_STREAM=1 LILY_BATCH_GRAPH=0 timeout 120 ncu --clock-control none -k 'regex:bstream_kernel|bgdn_step' --launch-skip 200 --launch-count 4 \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
    "$B/lily" bench-batch --model "$CK" --backend cuda --batches 64 --context 256 --steps 2 > "$OUT/ncu64.txt" 2>&1
  echo "rc $?" >> "$OUT/ncu64.txt"
  grep -E 'bstream|bgdn|btc_kernel|broute|Duration|DRAM Throughput|Memory Throughput|Registers Per|Achieved Occupancy|Theoretical Occ|Block Limit|Stall|rc ' "$OUT/ncu64.txt" | head -120 | tee -a "$T"
fi
log "done"
