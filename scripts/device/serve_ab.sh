#!/usr/bin/env bash
# Issue 7 serving pass on the H200, one call: HTTP load (bench/load.mjs through serve_load.sh, engine
# trace on) at 16 and 64 clients on the default build, 16 clients with logprobs (per-token ITL) at the
# default --interleave-ms and at each of INTERLEAVE (A/B; empty: none), then (PF_BENCH=1, default)
# prefill tok/s at short prompts. DEFAULT_CLIENTS: the rows of the first run ("16 64"). The
# slowest engine steps of each run go into summary.txt (the device returns few files).
# Usage (device): scripts/device/serve_ab.sh   carry: .devtools (lily.xz, rt.tar.xz, node.xz, tokenizer)
set -uo pipefail
O=${OUT:-/tmp/out}; mkdir -p "$O"; S="$O/summary.txt"
[[ -d .devtools/rt || ! -f .devtools/rt.tar.xz ]] || tar -C .devtools -xJf .devtools/rt.tar.xz
export RT=.devtools/rt LD_LIBRARY_PATH="$PWD/.devtools/rt"
log() { echo "== $* ($(date -u +%T))" >> "$S"; }
slow() {  # the engine trace's slowest steps (prefill + decode ms) and the prefill chunk sizes
  grep -E '^engine step' "$1" | awk '{printf "%.1f %s\n", $4 + $9, $0}' | sort -rn | head -${2:-8} >> "$S"
  grep -oE 'prefill chunk [0-9]+ tokens [0-9.]+ ms' "$1" | awk '{n++; t+=$3; ms+=$5} END {if (n) printf "prefill chunks %d, mean %.1f tokens, mean %.1f ms\n", n, t/n, ms/n}' >> "$S"
}
run() {  # name, clients, extra env
  local name=$1 clients=$2; shift 2
  env "$@" NO_TESTS=1 LILY_ENGINE_TRACE=1 W=/tmp/$name CLIENTS="$clients" REQ1=4 scripts/device/serve_load.sh > /tmp/$name.log 2>&1
  log "$name: $*"
  sed -n '/== load/,$p' /tmp/$name/load.txt | grep -vE '^\s*$|"(requests|aborted|failed|completed|wall_s|completion_tokens)"|^\s*[}{]' >> "$S"
  grep -E 'prepared' /tmp/$name/serve.err | head -2 >> "$S"
  slow /tmp/$name/serve.err
}
run default "${DEFAULT_CLIENTS:-16 64}"
run logprobs 16 LOGPROBS=1
for ms in ${INTERLEAVE-20 40}; do run "il$ms" 16 LOGPROBS=1 SERVE_ARGS="--interleave-ms $ms"; done
[[ ${PF_BENCH:-1} == 1 ]] && {
log "prefill at short prompts"
timeout 120 /tmp/lily bench --model /tmp/full --backend cuda --contexts 16,96,192,256,512 > /tmp/bench.txt 2>&1
grep -E '^\| [0-9]' /tmp/bench.txt >> "$S"
LILY_PF_SMALL_MOE=0 timeout 120 /tmp/lily bench --model /tmp/full --backend cuda --contexts 192 > /tmp/bench0.txt 2>&1
echo "LILY_PF_SMALL_MOE=0:" >> "$S"; grep -E '^\| [0-9]' /tmp/bench0.txt >> "$S"
}
log done
cat "$S"
