#!/usr/bin/env bash
# One short device call for the attention prefill variants (issue 6): the experimental wgmma
# variants' op rows against the CPU reference (CudaPrefill.AttnPrefillWgmmaVariants), then the
# attention kernels alone at the real shape (CudaPrefill.AttnBench: mma.sync, wgmma default,
# stacked [Kh; Kl], three S accumulators; 4096 queries over 0 and 4096 cached positions).
# No checkpoint needed (~1 min). Usage: B=build-prefill/dev scripts/device/attn_ab.sh
# Writes $OUT/attn_ab.txt.
set -uo pipefail
B=${B:-build-prefill/dev}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$PWD/$B/rt${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
for f in lily lily_tests; do [[ -x $B/$f ]] || { xz -dc "$B/$f.xz" > "$B/$f" && chmod +x "$B/$f"; }; done
[[ -e /work/main ]] || { mkdir -p /work && ln -s "$PWD" /work/main; }
S="$OUT/attn_ab.txt"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv >> "$S"
echo "== attention bench (LILY_ATTN_BENCH=1) $(date -u +%T)" >> "$S"
LILY_ATTN_BENCH=1 timeout 60 "$B/lily_tests" --gtest_filter='CudaPrefill.AttnBench' 2>&1 | grep -E '^\| |OK|FAILED|PASSED|rror' >> "$S"
echo "== variant op rows $(date -u +%T)" >> "$S"
LILY_ATTN_VARIANTS=1 timeout 120 "$B/lily_tests" --gtest_filter='CudaPrefill.AttnPrefillWgmmaVariants' > "$OUT/variants.txt" 2>&1
echo "rc $? rows ok: $(grep -c '| ok' "$OUT/variants.txt"), rows FAIL: $(grep -c '| FAIL' "$OUT/variants.txt")" >> "$S"
grep -E 'attn prefill out|FAILED|PASSED' "$OUT/variants.txt" >> "$S"
echo "== done $(date -u +%T)" >> "$S"
cat "$S"
