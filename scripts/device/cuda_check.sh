#!/usr/bin/env bash
# One device call for the CUDA decode work: op table, whole-model CUDA vs CPU (tiny, fp32 and bf16
# K/V states), golden with --backend cuda (fp32 states; then bf16 states, which take the prefill
# kernels), then the full-size synthetic checkpoint: CUDA vs CPU reference (and, if that fails, a
# per-depth bisect) and the bench sweep. Built here, packed by scripts/device/pack.sh into <build>/dev.
# Usage: B=build-x/dev scripts/device/cuda_check.sh [phase1|phase2|all]   (logs under $OUT)
# Env: CTXS (fp32-state bench contexts), CTXS_BF16 (bf16-state contexts), FULL_STEPS, AB=1 (A/B list AB_VARS,
# each a comma-joined env list, at AB_CTX; AB_PROFILE=1 adds the per-op graph profile), BASE_XZ (an xz'd
# baseline lily binary benched at AB_CTX with the profile). All logs end up in $OUT/logs.tgz (the device
# returns at most 8 files) beside summary.txt.
set -uo pipefail
B=${B:-build-main/dev}   # lily, lily_tests, rt/*.so (made by scripts/device/pack.sh)
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$PWD/$B/rt${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
phase=${1:-all}
# Tests and synth find data under the source dir compiled in (LILY_SOURCE_DIR=/work/main).
[[ -e /work/main ]] || { mkdir -p /work && ln -s "$PWD" /work/main; }
log() { echo "== $* ($(date -u +%T))" | tee -a "$OUT/summary.txt"; }
run_t() {  # name timeout filter [env...]
  local name=$1 to=$2 filt=$3
  shift 3
  env "$@" timeout "$to" "$B/lily_tests" --gtest_filter="$filt" > "$OUT/$name.txt" 2>&1
  echo "rc $?" >> "$OUT/$name.txt"
}
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"
if [[ $phase == phase2 || $phase == all ]]; then
  ( timeout 120 "$B/lily" synth --preset qwen3.6-35b-a3b --out /tmp/full > "$OUT/synth.txt" 2>&1; echo "synth rc $?" >> "$OUT/synth.txt" ) &
  SYN=$!
fi
if [[ $phase == phase1 || $phase == all ]]; then
  log "op table"
  run_t ops 150 'CudaOps.*'
  grep -cE '^\| .*\| ok \|' "$OUT/ops.txt" | sed 's/^/ok rows: /'
  grep -E 'FAIL|PASSED|SKIPPED|rc ' "$OUT/ops.txt" | tail -12
  n=0
  for v in ${OPS_EXTRA:-}; do  # Suite.Test@VAR=x,VAR2=y: that part of the op table again under the env
    n=$((n + 1)); f=${v%%@*}; e=${v#*@}
    log "ops $f with ${e//,/ }"
    run_t ops_extra$n 100 "$f" ${e//,/ }
    grep -cE '^\| .*\| ok \|' "$OUT/ops_extra$n.txt" | sed 's/^/ok rows: /'
    grep -E 'FAIL|PASSED|rc ' "$OUT/ops_extra$n.txt" | tail -4
  done
  if [[ ${ATTN_OLD:-0} == 1 ]]; then
    log "attention ops, per-position split kernel (LILY_ATTN_CHUNK=0)"
    run_t ops_attn_old 100 'CudaOps.Attention' LILY_ATTN_CHUNK=0
    grep -E 'FAIL|PASSED|rc ' "$OUT/ops_attn_old.txt" | tail -4
  fi
  log "tiny model (fp32 and bf16 K/V states)"
  run_t model_tiny 120 'CudaModel.Tiny*'
  grep -E 'step|greedy|pipeline|FAIL|PASSED|rc ' "$OUT/model_tiny.txt" | tail -40
  if ! grep -q '^\[  PASSED  \] 2 tests' "$OUT/model_tiny.txt"; then
    log "tiny model again with LILY_CUDA_PDL=0 (fallback check)"
    run_t model_tiny_nopdl 120 'CudaModel.Tiny*' LILY_CUDA_PDL=0
    grep -E 'greedy|pipeline|FAIL|PASSED|rc ' "$OUT/model_tiny_nopdl.txt" | tail -12
  fi
  log "golden (LILY_BACKEND=cuda, fp32 states)"
  run_t golden 120 '*Golden*' LILY_BACKEND=cuda
  grep -E '\[golden\]|FAIL|PASSED|rc |Failure|error' "$OUT/golden.txt" | tail -20
  log "golden (LILY_BACKEND=cuda, decode graph only: LILY_PREFILL_MIN=1000000)"
  run_t golden_decode 120 '*Golden*' LILY_BACKEND=cuda LILY_PREFILL_MIN=1000000
  grep -E '\[golden\]|FAIL|PASSED|rc ' "$OUT/golden_decode.txt" | tail -16
  n=0
  for v in ${GOLDEN_EXTRA:-}; do  # comma-joined env lists: the decode-graph golden again with each
    n=$((n + 1))
    log "golden (decode graph only) with ${v//,/ }"
    run_t golden_extra$n 120 '*Golden*' LILY_BACKEND=cuda LILY_PREFILL_MIN=1000000 ${v//,/ }
    grep -E 'FAIL|PASSED|rc ' "$OUT/golden_extra$n.txt" | tail -4
  done
  if [[ ${GOLDEN_BF16:-0} == 1 ]]; then
    log "golden (LILY_BACKEND=cuda, LILY_CUDA_KV=bf16: prefill kernels + bf16 K/V)"
    run_t golden_bf16kv 120 '*Golden*' LILY_BACKEND=cuda LILY_CUDA_KV=bf16
    grep -E '\[golden\]|FAIL|PASSED|rc ' "$OUT/golden_bf16kv.txt" | tail -12
  fi
fi
if [[ $phase == phase2 || $phase == all ]]; then
  wait $SYN; tail -2 "$OUT/synth.txt"
  log "full CUDA vs CPU reference (fp32)"
  run_t full_model ${FULL_TIMEOUT:-170} 'CudaModel.FullSize*Matches*' LILY_FULL_CKPT=/tmp/full LILY_FULL_STEPS=${FULL_STEPS:-3} ${FULL_ENV:-}
  tail -14 "$OUT/full_model.txt"
  if [[ -n ${FULL_ENV2:-} ]]; then  # the full-size comparison again under other knobs (comma-joined)
    log "full CUDA vs CPU reference (fp32) with ${FULL_ENV2//,/ }"
    run_t full_model2 ${FULL_TIMEOUT:-170} 'CudaModel.FullSize*Matches*' LILY_FULL_CKPT=/tmp/full LILY_FULL_STEPS=${FULL_STEPS:-3} ${FULL_ENV2//,/ }
    grep -E 'step|greedy|pipeline|PASSED|FAILED|rc ' "$OUT/full_model2.txt" | tail -8
  fi
  if [[ ${BISECT:-1} == 1 ]] && ! grep -q '^\[  PASSED  \] 1 test' "$OUT/full_model.txt"; then
    log "full-size bisect by depth"
    run_t full_bisect 200 'CudaModel.FullSizeLayerBisect' LILY_FULL_CKPT=/tmp/full LILY_FULL_BISECT=1
    grep -E '^\| layers|FAIL|rc ' "$OUT/full_bisect.txt"
  fi
  log "bench full (fp32 states, profile)"
  LILY_CUDA_PROFILE=1 timeout 170 "$B/lily" bench --model /tmp/full --backend cuda --contexts ${CTXS:-256,4096} \
    --label "${LABEL:-}" --json "$OUT/bench_full.json" 2>&1 >/dev/null | tee "$OUT/bench_full.txt" | grep -vE '^\r' | tail -40
  if [[ ${CTXS_BF16:-32768} != none ]]; then
    log "bench full (bf16 K/V states; long contexts)"
    LILY_CUDA_KV=bf16 LILY_CUDA_PROFILE=1 timeout ${BF16_TIMEOUT:-100} "$B/lily" bench --model /tmp/full --backend cuda \
      --contexts ${CTXS_BF16:-32768} --json "$OUT/bench_bf16kv.json" 2>&1 >/dev/null | tee "$OUT/bench_bf16kv.txt" | tail -40
  fi
  if [[ -n ${BASE_XZ:-} && -f ${BASE_XZ:-} ]]; then
    xz -dc "$BASE_XZ" > /tmp/base-lily && chmod +x /tmp/base-lily
    log "baseline binary at ${AB_CTX:-256} (profile)"
    LILY_CUDA_PROFILE=1 timeout 90 /tmp/base-lily bench --model /tmp/full --backend cuda --contexts ${AB_CTX:-256} \
      2>&1 >/dev/null | tee "$OUT/ab_base.txt" | grep -E '^\| [0-9]|whole step|sum of op'
  fi
  if [[ ${AB:-0} == 1 ]]; then
    n=0
    for v in ${AB_VARS:-LILY_CUDA_PDL=0 LILY_CUDA_CARVEOUT=0 LILY_GEMV_SMALL=0}; do
      n=$((n + 1))
      ctx=${AB_CTX:-256}
      if [[ $v == *@* ]]; then ctx=${v%%@*}; v=${v#*@}; fi  # CTX@VAR=x,VAR2=y
      log "A/B at $ctx: $v"
      env ${v//,/ } LILY_CUDA_PROFILE=${AB_PROFILE:-0} timeout 90 "$B/lily" bench --model /tmp/full --backend cuda \
        --contexts $ctx 2>&1 >/dev/null | tee "$OUT/ab_$n.txt" | grep -E '^\| [0-9]|whole step|sum of op|split-K'
    done
  fi
fi
log "done"
( cd "$OUT" && tar czf /tmp/logs.tgz --exclude=logs.tgz . && find . -type f ! -name summary.txt -delete && mv /tmp/logs.tgz . )
