#!/usr/bin/env bash
# Decode pass 5, device call 2: the tensor-core GEMV (LILY_GEMV_TC) and MoE expert kernels
# (LILY_MOE_TC): op-table rows, tiny model, goldens and the full-size CUDA-vs-CPU check with both on,
# then bench A/B at 256 (profiles) and 4k/32k on/off. Usage (device): B=build-cudadec/dev scripts/device/dec5_tc.sh
set -uo pipefail
B=${B:-build-cudadec/dev}
OUT=${OUT:-/tmp/out}
for f in lily lily_tests; do [[ -x $B/$f ]] || { xz -dc "$B/$f.xz" > "/tmp/$f" && chmod +x "/tmp/$f"; }; done
export LD_LIBRARY_PATH="$PWD/$B/rt"
mkdir -p /work && ln -sfn "$PWD" /work/main
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > "$OUT/gpu.txt"
( timeout 150 /tmp/lily synth --preset qwen3.6-35b-a3b --out /tmp/full > "$OUT/synth.txt" 2>&1; echo "synth rc $?" >> "$OUT/synth.txt" ) &
SYN=$!
TC="LILY_GEMV_TC=7 LILY_MOE_TC=3"
t() {  # name timeout filter env...
  local n=$1 to=$2 f=$3; shift 3
  echo "=== $n ($*) $(date -u +%T)" >> "$OUT/tests.txt"
  env "$@" timeout "$to" /tmp/lily_tests --gtest_filter="$f" >> "$OUT/tests.txt" 2>&1; echo "rc $?" >> "$OUT/tests.txt"
}
t ops_tc 120 'CudaOps.GemvTc:CudaOps.MoeTc:CudaOps.GemvPlain:CudaOps.GemvAddNorm:CudaOps.LmHeadArgmax:CudaOps.Moe:CudaOps.MoeRoutedHere'
t tiny_tc 100 'CudaModel.Tiny*' $TC
t golden_tc 100 '*Golden*' LILY_BACKEND=cuda $TC
t golden_tc_dec 100 '*Golden*' LILY_BACKEND=cuda LILY_PREFILL_MIN=1000000 $TC
wait $SYN
echo "=== full ($TC) $(date -u +%T)" >> "$OUT/full.txt"
env $TC LILY_FULL_CKPT=/tmp/full LILY_FULL_STEPS=3 timeout 150 /tmp/lily_tests --gtest_filter='CudaModel.FullSize*Matches*' >> "$OUT/full.txt" 2>&1; echo "rc $?" >> "$OUT/full.txt"
bench() {  # name contexts env...
  local n=$1 c=$2; shift 2
  echo "== $n ($*) ctx $c $(date -u +%T)" >> "$OUT/bench.txt"
  env "$@" timeout 120 /tmp/lily bench --model /tmp/full --backend cuda --contexts "$c" >> "$OUT/bench.txt" 2>&1
}
bench tc_all_prof 256 $TC LILY_CUDA_PROFILE=1
bench base_prof 256 LILY_CUDA_PROFILE=1
bench tc_all_long 4096,32768 $TC
bench base_long 4096,32768
bench gemv_only 256 LILY_GEMV_TC=7
bench moe_only 256 LILY_MOE_TC=3
bench tc_T1 256 $TC LILY_GEMV_TC_T=1
bench tc_no_lmhead 256 LILY_GEMV_TC=3 LILY_MOE_TC=3
bench moe_gu_only 256 LILY_GEMV_TC=7 LILY_MOE_TC=1
grep -E '^===|PASSED|FAILED|FAIL|rc ' "$OUT/tests.txt" | tail -40
grep -E 'step|greedy|pipeline|PASSED|FAILED|rc ' "$OUT/full.txt" | tail -8
grep -E '^==|^\| [0-9]|whole step|sum of op' "$OUT/bench.txt" | head -60
