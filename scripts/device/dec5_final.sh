#!/usr/bin/env bash
# Decode pass 5, device call 3: the defaults (tensor-core GEMV + MoE kernels on) through the whole
# op table, tiny model, goldens and the full-size CUDA-vs-CPU check; bench 256/4k/32k with the per-op
# profile; A/B at 256 (old kernels, MoE down only, GEMV variants, top-k order).
# Usage (device): B=build-cudadec/dev scripts/device/dec5_final.sh   (logs under $OUT)
set -uo pipefail
B=${B:-build-cudadec/dev}
OUT=${OUT:-/tmp/out}
for f in lily lily_tests; do [[ -x $B/$f ]] || { xz -dc "$B/$f.xz" > "/tmp/$f" && chmod +x "/tmp/$f"; }; done
export LD_LIBRARY_PATH="$PWD/$B/rt"
mkdir -p /work && ln -sfn "$PWD" /work/main
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > "$OUT/gpu.txt"
( timeout 150 /tmp/lily synth --preset qwen3.6-35b-a3b --out /tmp/full > "$OUT/synth.txt" 2>&1; echo "synth rc $?" >> "$OUT/synth.txt" ) &
SYN=$!
t() {  # name timeout filter env...
  local n=$1 to=$2 f=$3; shift 3
  echo "=== $n ($*) $(date -u +%T)" >> "$OUT/tests.txt"
  env "$@" timeout "$to" /tmp/lily_tests --gtest_filter="$f" >> "$OUT/tests.txt" 2>&1; echo "rc $?" >> "$OUT/tests.txt"
}
t ops 150 'CudaOps.*'
t tiny 100 'CudaModel.Tiny*'
t golden 100 '*Golden*' LILY_BACKEND=cuda
t golden_dec 100 '*Golden*' LILY_BACKEND=cuda LILY_PREFILL_MIN=1000000
wait $SYN
echo "=== full (defaults) $(date -u +%T)" >> "$OUT/full.txt"
LILY_FULL_CKPT=/tmp/full LILY_FULL_STEPS=3 timeout 150 /tmp/lily_tests --gtest_filter='CudaModel.FullSize*Matches*' >> "$OUT/full.txt" 2>&1; echo "rc $?" >> "$OUT/full.txt"
bench() {  # name contexts env...
  local n=$1 c=$2; shift 2
  echo "== $n ($*) ctx $c $(date -u +%T)" >> "$OUT/bench.txt"
  env "$@" timeout 120 /tmp/lily bench --model /tmp/full --backend cuda --contexts "$c" >> "$OUT/bench.txt" 2>&1
}
bench default_prof 256,4096,32768 LILY_CUDA_PROFILE=1
bench old_kernels 256 LILY_GEMV_TC=0 LILY_MOE_TC=0
bench moe_down_only 256 LILY_MOE_TC=2
bench gemv_T3 256 LILY_GEMV_TC_T=3
bench gemv_T2 256 LILY_GEMV_TC_T=2
bench topk_after_stage 256 LILY_MOE_TC_ORDER=0
bench default_again 256
grep -E '^===|PASSED|FAILED|rc ' "$OUT/tests.txt" | tail -30
grep -cE '\| ok' "$OUT/tests.txt"; grep -E '\| FAIL' "$OUT/tests.txt" | head
grep -E 'step|greedy|pipeline|PASSED|FAILED|rc ' "$OUT/full.txt" | tail -8
grep -E '^==|^\| [0-9]|whole step|sum of op' "$OUT/bench.txt" | head -60
