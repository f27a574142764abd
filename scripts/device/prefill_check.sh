#!/usr/bin/env bash
# One device call for the CUDA prefill work (issue 6): the prefill op table (CudaPrefill.*), the
# goldens with --backend cuda under numerics A/B knobs (each prefill stage routed through a precise
# path in turn), the tiny CUDA-vs-CPU model tests, then the full-size synthetic checkpoint: CUDA vs
# CPU reference, bench sweep (prefill tok/s) and a per-op prefill profile.
# Usage: B=build-prefill/dev scripts/device/prefill_check.sh [ab|verify]
# Writes $OUT/summary.txt, $OUT/bench_full.json and $OUT/logs.tgz (every log; the device returns
# at most 8 files).
# Env: GEMM_BENCH=1 (time the GEMM kernels alone first), OPS_FILTER (op-table gtest filter), PROF_ENV (env of the profile run),
#      FULL=0 (skip the model checks), PAR=1 (full-size check beside the op table), CTXS (bench contexts), BENCH_AB (';'-separated env settings benched at CTXS_AB), PROF (profile context, "none" to skip), AB_LIST (golden A/B variants,
#      ';'-separated env assignments; "default" = no knob), FULL_ENVS (extra full-size runs, ';'-separated).
set -uo pipefail
B=${B:-build-prefill/dev}
OUT=${OUT:-/tmp/out}
RES=$OUT
OUT=/tmp/pflogs
mkdir -p "$OUT" "$RES"
export LD_LIBRARY_PATH="$PWD/$B/rt${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# The binaries may travel xz'd (<B>/lily.xz, lily_tests.xz) to stay under the 64 MiB carry limit.
for f in lily lily_tests; do [[ -x $B/$f ]] || { xz -dc "$B/$f.xz" > "$B/$f" && chmod +x "$B/$f"; }; done
mode=${1:-verify}
[[ -e /work/main ]] || { mkdir -p /work && ln -s "$PWD" /work/main; }
log() { echo "== $* ($(date -u +%T))" | tee -a "$OUT/summary.txt"; }
say() { tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv | say
( timeout 120 "$B/lily" synth --preset qwen3.6-35b-a3b --out /tmp/full > "$OUT/synth.txt" 2>&1; echo "synth rc $?" >> "$OUT/synth.txt" ) &
SYN=$!

full_check() {
log "full-size CUDA vs CPU reference (default)"
LILY_FULL_CKPT=/tmp/full LILY_FULL_STEPS=${FULL_STEPS:-3} timeout ${FULL_TIMEOUT:-170} "$B/lily_tests" \
  --gtest_filter='CudaModel.FullSizeCheckpoint*' > "$OUT/full.txt" 2>&1; echo "rc $?" >> "$OUT/full.txt"
grep -E '^\| step|greedy|pipeline|FAILED  \]|PASSED|rc ' "$OUT/full.txt" | say
# A failing default also runs with every stage on its precise path (is the rest prefill at all?).
if ! grep -q '^\[  PASSED  \] 1 test' "$OUT/full.txt" && [[ $mode == ab ]]; then
  FULL_ENVS="${FULL_ENVS:+$FULL_ENVS;}LILY_PREFILL_TERMS=0 LILY_PREFILL_ATTN_TERMS=0"
fi
if [[ -n "${FULL_ENVS:-}" ]]; then
  IFS=';' read -ra FE <<< "$FULL_ENVS"
  j=0
  for v in "${FE[@]}"; do
    j=$((j + 1))
    log "full-size CUDA vs CPU reference [$v]"
    env $v LILY_FULL_CKPT=/tmp/full LILY_FULL_STEPS=${FULL_STEPS:-3} timeout ${FULL_TIMEOUT:-170} "$B/lily_tests" \
      --gtest_filter='CudaModel.FullSizeCheckpoint*' > "$OUT/full_$j.txt" 2>&1; echo "rc $?" >> "$OUT/full_$j.txt"
    grep -E '^\| step|greedy|FAILED  \]|PASSED|rc ' "$OUT/full_$j.txt" | say
  done
fi
}
# PAR=1: the full-size check runs beside the op table and the goldens (correctness only; the
# bench runs alone afterwards).
if [[ ${PAR:-0} == 1 && ${FULL:-1} != 0 ]]; then
  ( while ! grep -q "synth rc" "$OUT/synth.txt" 2>/dev/null; do sleep 2; done; tail -1 "$OUT/synth.txt" | say; full_check ) &
  FULLJOB=$!
fi

if [[ ${GEMM_BENCH:-0} == 1 ]]; then  # GEMM kernels alone at the real shapes (M = 4096): ms, TFLOP/s
  log "GEMM bench CudaPrefill.GemmBench"
  LILY_GEMM_BENCH=1 timeout 120 "$B/lily_tests" --gtest_filter='CudaPrefill.GemmBench' > "$OUT/gemm_bench.txt" 2>&1
  echo "rc $?" >> "$OUT/gemm_bench.txt"
  grep -E '^\| |FAILED  \]|PASSED|rc ' "$OUT/gemm_bench.txt" | say
fi
log "op table CudaPrefill.*"
timeout ${OPS_TIMEOUT:-240} "$B/lily_tests" --gtest_filter="${OPS_FILTER:-CudaPrefill.*}" > "$OUT/ops.txt" 2>&1; echo "rc $?" >> "$OUT/ops.txt"
echo "rows ok: $(grep -c '| ok' "$OUT/ops.txt"), rows FAIL: $(grep -c '| FAIL' "$OUT/ops.txt")" | say
grep -E '\| FAIL|routing|model |attn prefill out|FAILED  \]|PASSED|rc ' "$OUT/ops.txt" | say

# Goldens: default, each stage through its precise path, all precise, decode graph only.
# Knobs: LILY_PREFILL_ATTN_TERMS (3 split bf16 hi+lo, 1 bf16, 0 decode kernels per token),
# LILY_PREFILL_TERMS (GEMM x: 2 fp16 hi+lo, 1 fp16, 0 fp32 CUDA cores), LILY_PREFILL_MIN=1000000 (no prefill kernels).
AB_DEFAULT="default;LILY_PREFILL_ATTN_TERMS=1;LILY_PREFILL_ATTN_TERMS=0;LILY_PREFILL_TERMS=0;LILY_PREFILL_TERMS=0 LILY_PREFILL_ATTN_TERMS=0;LILY_PREFILL_MIN=1000000"
[[ $mode == verify ]] && AB_DEFAULT="default;LILY_PREFILL_MIN=1000000"
IFS=';' read -ra AB <<< "${AB_LIST:-$AB_DEFAULT}"
i=0
for v in "${AB[@]}"; do
  i=$((i + 1))
  log "golden LILY_BACKEND=cuda [$v]"
  ev=""; [[ $v != default ]] && ev="$v"
  env LILY_BACKEND=cuda $ev timeout 90 "$B/lily_tests" --gtest_filter='*Golden*' > "$OUT/golden_$i.txt" 2>&1
  echo "rc $?" >> "$OUT/golden_$i.txt"
  grep -E '\[golden\]|FAILED  \]|PASSED|rc ' "$OUT/golden_$i.txt" | say
done

if [[ ${FULL:-1} != 0 ]]; then  # FULL=0: skip the tiny and full-size model checks (a speed-only call)
log "CudaModel.Tiny* (CUDA vs CPU, prefill + decode)"
timeout 150 "$B/lily_tests" --gtest_filter='CudaModel.Tiny*' > "$OUT/model_tiny.txt" 2>&1; echo "rc $?" >> "$OUT/model_tiny.txt"
grep -E '^\| step|greedy|pipeline|FAILED  \]|PASSED|rc ' "$OUT/model_tiny.txt" | tail -12 | say

if [[ ${PAR:-0} == 1 ]]; then wait $FULLJOB; else
wait $SYN; tail -1 "$OUT/synth.txt" | say
full_check
fi
else wait $SYN; tail -1 "$OUT/synth.txt" | say; fi

log "bench full (contexts ${CTXS:-256,8192,32768})"
timeout ${BENCH_TIMEOUT:-150} "$B/lily" bench --model /tmp/full --backend cuda --contexts ${CTXS:-256,8192,32768} \
  --json "$RES/bench_full.json" > "$OUT/bench_full.txt" 2>&1
grep -v uploading "$OUT/bench_full.txt" | tail -12 | say
if [[ -n "${BENCH_AB:-}" ]]; then  # extra bench runs: "ENV=V ...;..." at contexts CTXS_AB
  IFS=';' read -ra BA <<< "$BENCH_AB"
  for v in "${BA[@]}"; do
    log "bench full [$v] (contexts ${CTXS_AB:-8192,32768})"
    env $v timeout 90 "$B/lily" bench --model /tmp/full --backend cuda --contexts ${CTXS_AB:-8192,32768} 2>&1 \
      | grep -E '^\| [0-9]' | say
  done
fi
if [[ ${PROF:-8192} != none ]]; then
  log "prefill profile at ${PROF:-8192} tokens [${PROF_ENV:-default}]"
  env ${PROF_ENV:-} LILY_PREFILL_PROFILE=1 timeout 60 "$B/lily" bench --model /tmp/full --backend cuda --contexts ${PROF:-8192} \
    > "$OUT/profile.txt" 2>&1
  grep -E '^\||profile' "$OUT/profile.txt" | tail -24 | say
fi
log "done"
cp "$OUT/summary.txt" "$RES/summary.txt"
tar czf "$RES/logs.tgz" -C "$OUT" .
