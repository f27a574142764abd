#!/usr/bin/env bash
# Issue 9: CPU thread scaling (1..16) of the fast CPU backend on the GPU machine's CPU. Synthesizes the
# full-shape checkpoint on the device (19.5 GB, /tmp/full), then runs `lily bench-cpu` (prefill 256 +
# 64 decode steps, per-op breakdown, read bandwidth measured in the same run) per thread count, and
# `lily bench --backend cpu` once at the largest count. Built here, packed by scripts/device/pack.sh.
# Usage (device): B=build-x/dev scripts/device/cpu_scaling.sh
# $OUT gets 7 files: summary.txt (the table), machine.txt (lscpu), synth.txt, bench_cpu.log + bench_cpu_all.json
# (every thread count), bench.log + bench.json (lily bench --backend cpu at the largest count).
# Env: THREADS (default "1 2 4 8 16"), PROMPT (default 256), BUDGET_S (stop starting runs after, default 540).
set -uo pipefail
B=${B:-build-main/dev}   # lily, lily_tests, rt/*.so (made by scripts/device/pack.sh)
OUT=${OUT:-/tmp/out}
THREADS=${THREADS:-"1 2 4 8 16"}
PROMPT=${PROMPT:-256}
BUDGET_S=${BUDGET_S:-540}
CK=${CK:-/tmp/full}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$PWD/$B/rt${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
[[ -e /work/main ]] || { mkdir -p /work && ln -s "$PWD" /work/main; }
start=$(date +%s)
log() { echo "== $* ($(date -u +%T), load $(cut -d' ' -f1 /proc/loadavg))" | tee -a "$OUT/summary.txt"; }
{ lscpu; echo; free -g; echo; df -h /tmp; } > "$OUT/machine.txt" 2>&1
grep -E 'Model name|^CPU\(s\)|Thread|Flags' "$OUT/machine.txt" | cut -c1-200 | tee -a "$OUT/summary.txt"
log "synth"
if [[ ! -f $CK/model.safetensors ]]; then
  timeout 240 "$B/lily" synth --preset qwen3.6-35b-a3b --out "$CK" > "$OUT/synth.txt" 2>&1
  echo "synth rc $?" | tee -a "$OUT/summary.txt"
fi
echo "| threads | prefill tok/s | decode tok/s | decode GB/s | read BW GB/s | CPU share prefill/decode |" >> "$OUT/summary.txt"
for t in $THREADS; do
  (( $(date +%s) - start > BUDGET_S )) && { log "budget spent: skipping $t threads and later"; break; }
  log "bench-cpu --threads $t"
  J=/tmp/bench_cpu_t$t.json
  echo "### threads $t" >> "$OUT/bench_cpu.log"
  timeout 300 "$B/lily" bench-cpu --model "$CK" --threads "$t" --prompt-len "$PROMPT" --json "$J" >> "$OUT/bench_cpu.log" 2>&1
  echo "rc $?" >> "$OUT/bench_cpu.log"
  [[ -f $J ]] && cat "$J" >> "$OUT/bench_cpu_all.json"
  python3 - "$J" "$t" >> "$OUT/summary.txt" 2>/dev/null <<'PY' || grep -E '^(prefill|decode) ' "$OUT/bench_cpu.log" | tail -2 | tee -a "$OUT/summary.txt"
import json, sys
j = json.load(open(sys.argv[1]))
print(f"| {sys.argv[2]} | {j['prefill_tok_s']:.2f} | {j['decode_tok_s']:.2f} | {j['decode_gb_s']:.1f} | {j['mem_read_gb_s']:.1f} | "
      f"{100*j['prefill_cpu_share']:.0f}% / {100*j['decode_cpu_share']:.0f}% |")
PY
done
last=${THREADS##* }
if (( $(date +%s) - start < BUDGET_S )); then
  log "lily bench --backend cpu --threads $last (the bench contract)"
  timeout 240 "$B/lily" bench --model "$CK" --backend cpu --threads "$last" --contexts "$PROMPT" --json "$OUT/bench.json" \
    > "$OUT/bench.log" 2>&1
  echo "rc $?" >> "$OUT/bench.log"
  grep -E '^\|' "$OUT/bench.log" | tee -a "$OUT/summary.txt"
fi
log "done"
cat "$OUT/summary.txt"
