#!/usr/bin/env bash
# Issue 7 (and 9's scaling) on the GPU machine, one call: batch invariance with the CUDA backend
# (ForwardBatch + engine batching tests, LILY_BACKEND=cuda), `lily bench-batch` on the full-shape
# synthetic checkpoint with --backend cuda and with the CPU backend at 16 threads, then the CPU
# thread-scaling table (scripts/device/cpu_scaling.sh, bench-cpu at 1..16 threads).
# Usage (device): B=build-x/dev scripts/device/batch_check.sh   (B made by scripts/device/pack.sh)
# $OUT: batch.txt (tests + bench-batch tables), summary.txt (CPU scaling) and all.tgz (every log and JSON).
set -uo pipefail
B=${B:?set B to a packed build (scripts/device/pack.sh)}
FINAL=${OUT:-/tmp/out}
OUT=/tmp/batch_out
CK=${CK:-/tmp/full}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$PWD/$B/rt${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
[[ -e /work/main ]] || { mkdir -p /work && ln -s "$PWD" /work/main; }
T="$OUT/batch.txt"
log() { echo "== $* ($(date -u +%T))" | tee -a "$T"; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >> "$T" 2>&1
log "synth"
[[ -f $CK/model.safetensors ]] || timeout 240 "$B/lily" synth --preset qwen3.6-35b-a3b --out "$CK" >> "$T" 2>&1
log "batch invariance, LILY_BACKEND=cuda"
LILY_BACKEND=cuda timeout 300 "$B/lily_tests" --gtest_filter='ForwardBatch.*:BatchingTest.*:Engine/BatchSizes.*' >> "$T" 2>&1
echo "tests rc $?" | tee -a "$T"
log "bench-batch cuda"
timeout 240 "$B/lily" bench-batch --model "$CK" --backend cuda --batches 1,4,16 --context 256 --steps 16 \
  --json "$OUT/batch_cuda.json" 2>> "$T" > /dev/null
echo "rc $?" | tee -a "$T"
log "bench-batch cpu 16 threads"
timeout 240 "$B/lily" bench-batch --model "$CK" --backend cpu --threads 16 --batches 1,2,4,8,16 --context 32 --steps 8 \
  --json "$OUT/batch_cpu.json" 2>> "$T" > /dev/null
echo "rc $?" | tee -a "$T"
log "cpu scaling"
BUDGET_S=${BUDGET_S:-200} B="$B" OUT="$OUT" CK="$CK" scripts/device/cpu_scaling.sh
log "done"
mkdir -p "$FINAL" && cp "$T" "$OUT/summary.txt" "$FINAL/" 2>/dev/null
tar czf "$FINAL/all.tgz" -C "$OUT" .
