#!/usr/bin/env bash
# Where the inter-token latency tail at 16 clients comes from, one device call: `lily serve` with the
# engine trace (one line per step: prefill ms, decode rows and ms) under bench/load.mjs at 16
# clients, the trace's slow steps summarized; then the batched step's per-op profile at 16 rows and
# an ncu pass over the GDN step kernel.
# Usage (device): scripts/device/itl_diag.sh   carry: .devtools (lily.xz, rt/, node.xz, tokenizer)
set -uo pipefail
export PATH="$PATH:/usr/local/cuda/bin"
O=${OUT:-/tmp/out}; mkdir -p "$O"; S="$O/summary.txt"
export RT=.devtools/rt
NO_TESTS=1 LILY_ENGINE_TRACE=1 W=/tmp/d1 CLIENTS="${CLIENTS:-16}" scripts/device/serve_load.sh > /tmp/d1.log 2>&1
cat /tmp/d1/load.txt >> "$S"
grep -E '^engine step' /tmp/d1/serve.err > "$O/steps.txt"
{ echo "== steps: $(wc -l < "$O/steps.txt"); slowest 40 (prefill + decode ms):"
  awk '{p=$4; d=$9; printf "%.1f %s\n", p+d, $0}' "$O/steps.txt" | sort -rn | head -40
  echo "== prefill chunks:"; grep -E 'prefill chunk|checkout' /tmp/d1/serve.err | sort | uniq -c | sort -rn | head -20
} >> "$S"
grep -E 'prefill chunk|checkout|graph' /tmp/d1/serve.err | head -300 > "$O/prefill_lines.txt"
export LD_LIBRARY_PATH="$PWD/$RT"
echo "== prefill at short prompts $(date -u +%T)" >> "$S"
timeout 120 /tmp/lily bench --model /tmp/full --backend cuda --contexts 16,32,96,256 > "$O/bench_short.txt" 2>&1
grep -v uploading "$O/bench_short.txt" | tail -8 >> "$S"
LILY_PREFILL_PROFILE=2 timeout 120 /tmp/lily bench --model /tmp/full --backend cuda --contexts 96 > "$O/pf_prof96.txt" 2>&1
grep -v uploading "$O/pf_prof96.txt" | tail -45 >> "$S"
echo "== profile B=16 $(date -u +%T)" >> "$S"
LILY_BATCH_PROFILE=1 timeout 120 /tmp/lily bench-batch --model /tmp/full --backend cuda --batches 16 --steps 4 > "$O/prof.txt" 2>&1
grep -v uploading "$O/prof.txt" | head -60 >> "$S"
if command -v ncu >/dev/null; then
  echo "== ncu bgdn_step $(date -u +%T)" >> "$S"
  LILY_BATCH_GRAPH=0 timeout 150 ncu --kernel-name regex:bgdn_step --launch-skip 30 --launch-count 1 \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
    /tmp/lily bench-batch --model /tmp/full --backend cuda --batches 16 --steps 1 > "$O/ncu.txt" 2>&1
  grep -vE '^\s*$' "$O/ncu.txt" | grep -v uploading | tail -80 >> "$S"
fi
echo "== done $(date -u +%T)" >> "$S"
cat "$S"
