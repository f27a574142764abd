#!/usr/bin/env bash
# The lead's serving check on the GPU machine, one call: GPU tests of the state growth and the
# depth-2 pipeline, the engine tests with LILY_BACKEND=cuda, `lily bench` (the batch-1 step), then
# HTTP load twice through serve_load.sh: the pipeline on (1 and 16 clients) and off (1 client).
# Usage (device): scripts/device/lead_check.sh   carry: .devtools (lily.xz, lily_tests.xz, rt/, node, tokenizer)
set -uo pipefail
mkdir -p /work && ln -sfn "$PWD" /work/main && ln -sfn "$PWD" /work/wt-lead  # tests find data through the build's source dir
export RT=.devtools/rt
OUTD=${OUT:-/tmp/out}
mkdir -p "$OUTD"
S="$OUTD/summary.txt"
export TESTS=${TESTS:-'CudaState.*:CudaDraw.*:CudaModel.Tiny*'}
export TESTS_CUDA_ENGINE=${TESTS_CUDA_ENGINE:-'ForwardBatch.*:BatchingTest.*:Engine*:*Golden*'}
export MAX_TOKENS=${MAX_TOKENS:-128}
W=/tmp/lo_on CLIENTS="${CLIENTS:-1 16}" scripts/device/serve_load.sh > /tmp/lo_on.log 2>&1
cat /tmp/lo_on/load.txt >> "$S"
export LD_LIBRARY_PATH="$PWD/$RT"
echo "== lily bench (batch-1 step) $(date -u +%T)" >> "$S"
timeout 200 /tmp/lily bench --model /tmp/full --backend cuda --contexts 256,4096 --json /tmp/bench.json > /tmp/bench.txt 2>&1
grep -E 'tok/s|decode|ctx|\|' /tmp/bench.txt | tail -12 >> "$S"
echo "== pipeline off $(date -u +%T)" >> "$S"
LILY_ENGINE_PIPELINE=0 NO_TESTS=1 W=/tmp/lo_off CLIENTS=1 scripts/device/serve_load.sh > /tmp/lo_off.log 2>&1
cat /tmp/lo_off/load.txt >> "$S"
cp /tmp/bench.json "$OUTD/" 2>/dev/null
tar czf "$OUTD/logs.tgz" /tmp/lo_on /tmp/lo_off /tmp/bench.txt 2>/dev/null
cat "$S"
