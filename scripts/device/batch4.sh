#!/usr/bin/env bash
# Issue 7, fourth pass on the H200, one call: verify_head.sh (op tables, engine + goldens with
# LILY_BACKEND=cuda, full-size CUDA vs CPU, bench at short contexts, bench-batch), the goldens again with
# the prefill's grouped MoE for every chunk (LILY_PF_SMALL_MOE=0), short-prompt prefill A/B, the GDN
# step's launch bounds A/B (LILY_BGDN_MINB) by the batched step's profile, then HTTP load at 1, 16 and 64
# clients (serve_load.sh with the engine trace).
# Usage (device): scripts/device/batch4.sh   carry: .devtools (lily.xz, lily_tests.xz, rt/, node.xz, tokenizer)
set -uo pipefail
O=${OUT:-/tmp/out}; mkdir -p "$O"; S="$O/summary.txt"
[[ -d .devtools/rt || ! -f .devtools/rt.tar.xz ]] || tar -C .devtools -xJf .devtools/rt.tar.xz  # carried packed (64 MiB limit)
export LD_LIBRARY_PATH="$PWD/.devtools/rt"
log() { echo "== $* ($(date -u +%T))" >> "$S"; }
if [[ ${PART:-1} == 1 ]]; then  # PART=1: correctness and the benches; PART=2: the A/Bs and serving
OPS=${OPS:-'CudaOps.*:CudaBatch.*:CudaBatchTc.*:CudaPrefill.*:CudaModel.Tiny*'} CTXS=${CTXS:-16,64,96,128,256,4096} \
  BATCHES=${BATCHES:-16,64} scripts/device/verify_head.sh > /dev/null 2>&1
log "goldens with LILY_PF_SMALL_MOE=0"
LILY_PF_SMALL_MOE=0 LILY_BACKEND=cuda timeout 120 /tmp/lily_tests --gtest_filter='*Golden*:CudaModel.Tiny*' > "$O/golden_pf0.txt" 2>&1
echo "rc $?" >> "$O/golden_pf0.txt"
grep -E '^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED|\[golden\]|rc ' "$O/golden_pf0.txt" >> "$S"
log done; cat "$S"; exit 0
fi
for f in lily lily_tests; do xz -dc ".devtools/$f.xz" > "/tmp/$f" && chmod +x "/tmp/$f"; done
[[ -f /tmp/full/model.safetensors ]] || timeout 120 /tmp/lily synth --preset qwen3.6-35b-a3b --out /tmp/full > /dev/null 2>&1
log "prefill at short prompts, LILY_PF_SMALL_MOE=0"
LILY_PF_SMALL_MOE=0 timeout 120 /tmp/lily bench --model /tmp/full --backend cuda --contexts 16,64,96,128,256 > "$O/bench_pf0.txt" 2>&1
grep -E '^\| [0-9]' "$O/bench_pf0.txt" >> "$S"
for v in 256 192; do
  log "prefill at short prompts, LILY_PF_SMALL_MOE=$v"
  LILY_PF_SMALL_MOE=$v timeout 120 /tmp/lily bench --model /tmp/full --backend cuda --contexts 192,256 > "$O/bench_pf$v.txt" 2>&1
  grep -E '^\| [0-9]' "$O/bench_pf$v.txt" >> "$S"
done
LILY_PREFILL_PROFILE=2 timeout 120 /tmp/lily bench --model /tmp/full --backend cuda --contexts 96 > "$O/pf_prof96.txt" 2>&1
grep -E '^\| (moe|total)' "$O/pf_prof96.txt" | tail -3 >> "$S"
for mb in 1 5 8; do
  log "bench-batch LILY_BGDN_MINB=$mb"
  LILY_BGDN_MINB=$mb timeout 120 /tmp/lily bench-batch --model /tmp/full --backend cuda --batches 16,64 --steps 8 > "$O/bb_minb$mb.txt" 2>&1
  grep -E '^\| [0-9]' "$O/bb_minb$mb.txt" >> "$S"
  [[ $mb == 8 ]] && continue
  LILY_BGDN_MINB=$mb LILY_BATCH_PROFILE=1 timeout 120 /tmp/lily bench-batch --model /tmp/full --backend cuda --batches 16,64 --steps 2 > "$O/prof_minb$mb.txt" 2>&1
  grep -E 'profile, B|gdn step|^\| total' "$O/prof_minb$mb.txt" >> "$S"
done
log "serving"
NO_TESTS=1 LILY_ENGINE_TRACE=1 RT=.devtools/rt W=/tmp/srv CLIENTS="${CLIENTS:-1 16 64}" REQ1=4 scripts/device/serve_load.sh > /tmp/srv.log 2>&1
grep -vE '^\s*$' /tmp/srv/load.txt >> "$S"
grep -E '^engine step' /tmp/srv/serve.err > "$O/steps.txt"
grep -E 'prepared|pipelined' /tmp/srv/serve.err | head -8 >> "$S"
cp /tmp/srv/serve.err "$O/serve.err" 2>/dev/null
log "serving, 16 clients with logprobs (per-token ITL: a token whose text is held back, e.g. part of a UTF-8 character, shares its event's gap)"
NO_TESTS=1 LOGPROBS=1 RT=.devtools/rt W=/tmp/srv2 CLIENTS=16 scripts/device/serve_load.sh > /tmp/srv2.log 2>&1
grep -vE '^\s*$' /tmp/srv2/load.txt | sed -n '/== load/,$p' >> "$S"
log done
cat "$S"
