#!/usr/bin/env bash
# Decode pass 5, device call 1: the fused MoE kernel v2 (LILY_MOE_FUSED=1) measured and checked
# (op table rows, tiny model, goldens on the decode graph), then bench A/B at 256 (+4k/32k fused).
# Usage (device): B=build-cudadec/dev scripts/device/dec5_fused.sh   (logs under $OUT)
set -uo pipefail
B=${B:-build-cudadec/dev}
OUT=${OUT:-/tmp/out}
for f in lily lily_tests; do [[ -x $B/$f ]] || { xz -dc "$B/$f.xz" > "/tmp/$f" && chmod +x "/tmp/$f"; }; done
export LD_LIBRARY_PATH="$PWD/$B/rt"
mkdir -p /work && ln -sfn "$PWD" /work/main
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > "$OUT/gpu.txt"
( timeout 150 /tmp/lily synth --preset qwen3.6-35b-a3b --out /tmp/full > "$OUT/synth.txt" 2>&1; echo "synth rc $?" >> "$OUT/synth.txt" ) &
SYN=$!
LILY_MOE_FUSED=1 timeout 100 /tmp/lily_tests --gtest_filter='CudaOps.MoeFused:CudaModel.Tiny*' > "$OUT/t_ops_tiny.txt" 2>&1; echo "rc $?" >> "$OUT/t_ops_tiny.txt"
LILY_MOE_FUSED=1 LILY_BACKEND=cuda LILY_PREFILL_MIN=1000000 timeout 100 /tmp/lily_tests --gtest_filter='*Golden*' > "$OUT/t_golden.txt" 2>&1; echo "rc $?" >> "$OUT/t_golden.txt"
wait $SYN
bench() {  # name contexts env...
  local n=$1 c=$2; shift 2
  echo "== $n ($*) ctx $c" >> "$OUT/bench.txt"
  env "$@" timeout 120 /tmp/lily bench --model /tmp/full --backend cuda --contexts "$c" >> "$OUT/bench.txt" 2>&1
}
bench fused_prof 256 LILY_MOE_FUSED=1 LILY_CUDA_PROFILE=1
bench three_prof 256 LILY_MOE_FUSED=0 LILY_CUDA_PROFILE=1
bench fused_dbg1 256 LILY_MOE_FUSED=1 LILY_MOE_FUSED_DBG=1
bench fused_dbg2 256 LILY_MOE_FUSED=1 LILY_MOE_FUSED_DBG=2
bench fused_minb2 256 LILY_MOE_FUSED=1 LILY_MOE_FUSED_MINB=2
bench fused_long 4096,32768 LILY_MOE_FUSED=1
grep -E 'PASSED|FAILED|rc |\| ok' "$OUT"/t_*.txt | tail -30
grep -E '^==|^\| [0-9]|whole step|sum of op|moe' "$OUT/bench.txt" | grep -v '^\r' | head -80
