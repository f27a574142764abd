#!/usr/bin/env bash
# Decode pass 5, device call 5 (only on a warm machine): the rolling L2 prefetch of the tensor-core
# GEMV (LILY_GEMV_TC_PF=1): its op-table rows, bench A/B at 256 and 32k; then the batched-vs-batch-1
# kernel equality tests (direct gemv()/moe calls keep the CUDA-core kernels).
set -uo pipefail
B=${B:-build-cudadec/dev}
OUT=${OUT:-/tmp/out}
for f in lily lily_tests; do xz -dc "$B/$f.xz" > "/tmp/$f" && chmod +x "/tmp/$f"; done
export LD_LIBRARY_PATH="$PWD/$B/rt"
mkdir -p /work && ln -sfn "$PWD" /work/main
[[ -f /tmp/full/config.json ]] || timeout 100 /tmp/lily synth --preset qwen3.6-35b-a3b --out /tmp/full > /dev/null 2>&1
timeout 60 /tmp/lily_tests --gtest_filter='CudaOps.GemvTcPrefetch' > "$OUT/tests.txt" 2>&1; echo "rc $?" >> "$OUT/tests.txt"
for v in LILY_GEMV_TC_PF=1 LILY_GEMV_TC_PF=0; do
  echo "== $v" >> "$OUT/bench.txt"
  env $v LILY_CUDA_PROFILE=1 timeout 60 /tmp/lily bench --model /tmp/full --backend cuda --contexts 256,32768 >> "$OUT/bench.txt" 2>&1
done
timeout 45 /tmp/lily_tests --gtest_filter='CudaBatch.GemvRowsEqualBatch1:CudaBatch.MoeEqualsBatch1' >> "$OUT/tests.txt" 2>&1; echo "rc $?" >> "$OUT/tests.txt"
grep -E 'PASSED|FAILED|FAIL|rc ' "$OUT/tests.txt"; grep -cE '\| ok' "$OUT/tests.txt"
grep -E '^==|^\| [0-9]|whole step|sum of op|gemv' "$OUT/bench.txt" | grep -v '| 30 |\|| 10 |\|| 1 |'
