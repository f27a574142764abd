#!/usr/bin/env bash
# The head's check on the H200 before issue 7 is closed, one call returning two files: verify_head.sh
# (OPS, engine + goldens with LILY_BACKEND=cuda, full-size CUDA vs CPU, bench, bench-batch), then
# serve_ab.sh (1, 16, 64 clients; 16 with logprobs). $OUT: summary.txt, details.tgz.
# Usage (device): scripts/device/final4.sh   carry: .devtools
set -uo pipefail
O=${OUT:-/tmp/out}; mkdir -p "$O"
[[ -d .devtools/rt || ! -f .devtools/rt.tar.xz ]] || tar -C .devtools -xJf .devtools/rt.tar.xz
OUT=/tmp/vh OPS=${OPS:-'CudaBatch.*:CudaModel.Tiny*:CudaDraw.*:CudaState.*'} CTXS=${CTXS:-96,256,32768} \
  BATCHES=${BATCHES:-16,64} scripts/device/verify_head.sh > /dev/null 2>&1
OUT=/tmp/sa DEFAULT_CLIENTS="1 16 64" INTERLEAVE="" PF_BENCH=0 scripts/device/serve_ab.sh > /dev/null 2>&1
cat /tmp/vh/summary.txt /tmp/sa/summary.txt > "$O/summary.txt"
tar czf "$O/details.tgz" -C /tmp vh sa 2>/dev/null
cat "$O/summary.txt"
