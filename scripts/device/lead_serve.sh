#!/usr/bin/env bash
# The lead's serving measurement on the GPU machine, one call: the serving GPU tests, then HTTP
# load through serve_load.sh with the engine trace on (1, 16, 64 clients and 16 clients sharing a
# system prompt), `lily bench` for the batch-1 step and `lily bench-batch` for the batched step,
# then 1 client with the depth-2 pipeline off.
# Usage (device): scripts/device/lead_serve.sh   carry: .devtools (lily.xz, lily_tests.xz, rt/, node, tokenizer)
set -uo pipefail
mkdir -p /work && ln -sfn "$PWD" /work/main && ln -sfn "$PWD" /work/wt-lead  # tests find data through the build's source dir
export RT=.devtools/rt
OUTD=${OUT:-/tmp/out}
mkdir -p "$OUTD"
S="$OUTD/summary.txt"
export TESTS=${TESTS:-'CudaState.*:CudaDraw.*'}
export TESTS_CUDA_ENGINE=${TESTS_CUDA_ENGINE:-'EngineTest.*:BatchingTest.*'}
export MAX_TOKENS=${MAX_TOKENS:-128} REQ1=${REQ1:-6}
LILY_ENGINE_TRACE=1 W=/tmp/lo_on CLIENTS="${CLIENTS:-1 16 64 16s}" scripts/device/serve_load.sh > /tmp/lo_on.log 2>&1
cat /tmp/lo_on/load.txt >> "$S"
grep -E 'pipelined' /tmp/lo_on/serve.err | head -12 >> "$S"
export LD_LIBRARY_PATH="$PWD/$RT"
echo "== lily bench (batch-1 step) $(date -u +%T)" >> "$S"
timeout 120 /tmp/lily bench --model /tmp/full --backend cuda --contexts 256 --json /tmp/bench.json > /tmp/bench.txt 2>&1
grep -E 'tok/s|decode|ctx|\|' /tmp/bench.txt | tail -8 >> "$S"
echo "== lily bench-batch $(date -u +%T)" >> "$S"
timeout 120 /tmp/lily bench-batch --model /tmp/full --backend cuda --batches 16,64 > /tmp/bench_batch.txt 2>&1
tail -12 /tmp/bench_batch.txt >> "$S"
echo "== pipeline off $(date -u +%T)" >> "$S"
LILY_ENGINE_PIPELINE=0 NO_TESTS=1 W=/tmp/lo_off CLIENTS=1 scripts/device/serve_load.sh > /tmp/lo_off.log 2>&1
cat /tmp/lo_off/load.txt >> "$S"
cp /tmp/bench.json "$OUTD/" 2>/dev/null
tar czf "$OUTD/logs.tgz" /tmp/lo_on /tmp/lo_off /tmp/bench.txt /tmp/bench_batch.txt 2>/dev/null
cat "$S"
