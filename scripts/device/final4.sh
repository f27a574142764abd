#!/usr/bin/env bash
# The head's check on the H200 before issue 7 is closed, one call returning two files: verify_head.sh
# (OPS, engine + goldens with LILY_BACKEND=cuda, full-size CUDA vs CPU, bench, bench-batch), then
# serve_ab.sh (1, 16, 64 clients; 16 with logprobs), then (PROFILE=16,64, say) the batched step's per-op
# profile. $OUT: summary.txt, details.tgz.
# Usage (device): scripts/device/final4.sh   carry: .devtools
set -uo pipefail
O=${OUT:-/tmp/out}; mkdir -p "$O"
[[ -d .devtools/rt || ! -f .devtools/rt.tar.xz ]] || tar -C .devtools -xJf .devtools/rt.tar.xz
OUT=/tmp/vh OPS=${OPS:-'CudaBatch.*:CudaModel.Tiny*:CudaDraw.*:CudaState.*'} CTXS=${CTXS:-96,256,32768} \
  BATCHES=${BATCHES:-16,64} scripts/device/verify_head.sh > /dev/null 2>&1
OUT=/tmp/sa DEFAULT_CLIENTS="1 16 64" INTERLEAVE="" PF_BENCH=0 scripts/device/serve_ab.sh > /dev/null 2>&1
if [[ -n ${PROFILE:-} ]]; then  # the batched step's per-op profile at PROFILE rows
  LD_LIBRARY_PATH="$PWD/.devtools/rt" LILY_BATCH_PROFILE=1 timeout 120 /tmp/lily bench-batch --model /tmp/full --backend cuda \
    --batches "$PROFILE" --steps 2 2>&1 | grep -E 'profile|^\| [a-z]' > /tmp/sa/profile.txt
fi
cat /tmp/vh/summary.txt /tmp/sa/summary.txt /tmp/sa/profile.txt > "$O/summary.txt"
tar czf "$O/details.tgz" -C /tmp vh sa 2>/dev/null
cat "$O/summary.txt"
