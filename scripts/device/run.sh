#!/usr/bin/env bash
# The one entry point for GPU-machine work: tests, benchmarks and serving measurements of a packed build.
# Here:   scripts/device/pack.sh build          (after building lily and lily_tests in build/)
# Device: B=build/dev scripts/device/run.sh MODE...   carry ["build/dev"], from the repository root
# Result: $OUT/summary.txt (written as it goes, so a call cut short still returns it) and $OUT/logs.tar.gz
# (every log, JSON and profile): two files, within the tool's 8.
#
# Modes (several may be given; `all` = ops model bench serve; not yet timed on the H200: if the summary says
# "skipped ...: past HARD_S", split it into two calls, `ops model` and `bench serve`):
#   ops              CUDA op tables: every kernel against the CPU reference (lily_tests, filter OPS); the
#                    decode kernels' loads before their PDL wait in the SASS (prewait.py)
#   model            tiny CUDA-vs-CPU models; engine, batching, golden, prefix-cache and service tests with
#                    LILY_BACKEND=cuda; the goldens again under each GOLDEN_ENV; the full-size synthetic
#                    checkpoint, CUDA vs the CPU reference (a per-depth bisect when it fails)
#   bench            `lily bench --backend cuda` over CTXS (prefill + batch-1 decode) and `lily bench-batch`
#                    over BATCHES; optional per-op profiles, A/B settings, a baseline build and ncu
#   serve            `lily serve` + bench/load.mjs at each row of CLIENTS, with the engine trace (ITL tail)
#   cpu              the CPU backend on the device's CPU: `lily bench-cpu` per THREADS, then `lily bench`
#   golden-envelope  transformers' own fp16/bf16 error on each golden (tools/make_golden.py --envelope)
#   llama            llama.cpp built from a carried source, llama-bench and llama-batched-bench on a GGUF
#
# Any LILY_* variable exported before run.sh reaches every program it starts (docs/switches.md lists them).
# Settings (defaults in brackets):
#   B             packed build [build/dev]           OUT      result folder [/tmp/out]
#   CK            checkpoint of model/bench/serve/cpu; written by `lily synth --preset SYNTH_PRESET` when it
#                 holds none [/tmp/full]             SYNTH_PRESET [qwen3.6-35b-a3b]
#   HARD_S        seconds after which no step starts and every timeout is cut, so the call ends inside the
#                 tool's 600 s limit [570]           PAR      1: the full-size check runs beside the op tables [1]
#   ops:    OPS           gtest filter [Cuda*-CudaModel.*]
#           OPS_AB        ';'-separated settings, each "VAR=x VAR2=y" or "FILTER@VAR=x VAR2=y": the op tables
#                         (or FILTER) again under that env ['']
#           OPS_BENCH=1   also the kernel micro-benches (*Bench tests: qgemm, prefill GEMM, attention, the step's small
#                         ops; OPS_BENCH_FILTER narrows them, e.g. CudaBatch.SmallOpsBench) [0]
#           CUBLAS=1      with OPS_BENCH=1: cuBLAS bf16 at the prefill GEMMs' shapes (cublas_bench.py, torch) [0]
#   model:  ENGINE_TESTS  gtest filter run with LILY_BACKEND=cuda
#                         [ForwardBatch.*:BatchingTest.*:Engine*:*Golden*:PrefixCache*:Service*]
#           GOLDEN_ENV    ';'-separated settings, the goldens again under each [LILY_PREFILL_MIN=1000000: the
#                         decode graph for every token]
#           FULL_STEPS    decode steps of the full-size check [3]    BISECT=0  no bisect on failure [1]
#           FULL=0        no full-size check (a short call: the goldens and tiny models only) [1]
#           MODEL_AB      ';'-separated settings: tiny models, goldens and the full-size check again under each ['']
#   bench:  CTXS [256,4096,8192,32768]  BATCHES [1,16,64]  BATCH_CTX [256]  BATCH_STEPS [8]  LABEL (into the JSON)
#           BATCH_ARGS    more `lily bench-batch` options for every batched run, e.g. '--prompt-tokens 480 --segment 96'
#                         (the mixed step: decode rows plus prompt segments) ['']
#           MIXED_ARGS    bench-batch options of one more run (and profile) at MIXED_BATCHES [16,256], beside the
#                         decode-only ones: the mixed step, e.g. '--prompt-tokens 480 --segment 96' ['']
#           PROFILE=1     per-op profiles: batch-1 decode graph (lily bench --profile) at PROFILE_CTXS [256],
#                         prefill (LILY_PREFILL_PROFILE=PF_PROFILE_MODE [1]) at PF_PROFILE_CTX [8192], batched
#                         step (LILY_BATCH_PROFILE) at PROFILE_BATCHES [16,64]   [0]
#           AB            ';'-separated settings, each benched at AB_CTXS [256] and AB_BATCHES [16,64] ('' skips)
#           BASE          a second packed build (<build>/dev, carried too): its lily at AB_CTXS / AB_BATCHES
#                         (and the MIXED_ARGS run at MIXED_BATCHES)
#           NCU=1         ncu: per-kernel time table of one batched step (graphs off) at each of NCU_BATCHES
#                         [1,64], context NCU_CTX [1: ncu also times every context prefill, so at 256 the
#                         table runs past the time limit], NCU_TABLE_ARGS (more ncu options); with NCU_KERNEL
#                         (regex) also that kernel's sections at NCU_SECTION_BATCH [64], of its launch after
#                         NCU_SKIP [20] earlier ones, NCU_COUNT [1] launches; NCU_BASE [function]: what the regex
#                         matches (demangled: with template arguments as ncu prints them, '(int)4', so e.g.
#                         'qgemm_kernel<.int.4, .int.1, .int.[12], .int.2>'); NCU_SECTION_ARGS: more ncu options
#                         of the sections run (at 256 rows '--replay-mode application': kernel replay saves and
#                         restores the ~38 GB the step touches and runs past the limit); NCU_LILY_ARGS: more
#                         bench-batch options of both ncu runs (e.g. '--prompt-tokens 480 --segment 96')
#   serve:  CLIENTS       rows of concurrent streaming clients; "16s": 16 sharing a SYSTEM_WORDS [300] system
#                         prompt ["1 16 64"]      REQ_PER_CLIENT [4] (1 client: REQ1 [4])
#           MAX_TOKENS [128]  PROMPT_WORDS [48]  LOGPROBS=1 (per-token ITL too)  PARALLEL [64]  MAX_SEQ [2048]
#           SERVE_BACKEND [cuda]  SERVE_ARGS (more `lily serve` options)  TRACE [1] (LILY_ENGINE_TRACE: the
#                         slowest engine steps and the prefill chunks go to the summary)
#           SERVE_AB      ';'-separated settings, each words of VAR=x (server env; LOGPROBS=0|1 for the clients)
#                         and --flag value (serve options), at SERVE_AB_CLIENTS [16]; LOGPROBS=, PROMPT_WORDS= and
#                         MAX_TOKENS= there are the clients' settings,
#                         e.g. 'LOGPROBS=1 --step-tokens 1024' ['']
#   cpu:    THREADS ["1 2 4 8 16"]  PROMPT [256]
#   golden-envelope: GOLDENS (golden folders) [tests/data/golden/*]
#   llama:  LLAMA_SRC (a carried llama.cpp checkout) [.llama/llama.cpp]  LLAMA_MODEL (a .gguf on the device)
#           LLAMA_BENCH_ARGS ["-ngl 99 -p 512,4096 -n 128"]
#           LLAMA_BATCHED_ARGS ["-ngl 99 -c 16384 -npp 128 -ntg 128 -npl 1,16,64"]
set -uo pipefail
(( $# )) || { sed -n '2,/^set -uo/p' "$0" | sed '$d'; exit 2; }
MODES=()
for m in "$@"; do
  case $m in
    all) MODES+=(ops model bench serve) ;;
    ops|model|bench|serve|cpu|golden-envelope|llama) MODES+=("$m") ;;
    *) echo "run.sh: unknown mode '$m' (ops model bench serve cpu golden-envelope llama all)" >&2; exit 2 ;;
  esac
done
# shellcheck source=scripts/device/env.sh
source "$(dirname "$0")/env.sh"
has() { [[ " ${MODES[*]} " == *" $1 "* ]]; }
split() { local IFS=';'; read -ra SPLIT <<< "$1"; }   # ';'-separated list -> SPLIT[]
finish() {
  [[ -n ${SRV:-} ]] && kill "$SRV" 2> /dev/null
  if (( ${#FAILED[@]} )); then echo "result: FAILED: ${FAILED[*]}" | say; else echo "result: every step passed" | say; fi
  log "done"
  cp "$OUT/summary.txt" "$LOGS/"
  tar -C "$LOGS" -czf "$OUT/logs.tar.gz" . && du -h "$OUT"/*
}
trap finish EXIT

# --- ops ---------------------------------------------------------------------------------------------------
mode_ops() {
  local n=0 e f
  gtest ops 300 "${OPS:-Cuda*-CudaModel.*}"
  # The decode kernels' weight loads issued before their PDL wait, in the SASS (scripts/device/prewait.py).
  if command -v cuobjdump > /dev/null && in_time prewait; then
    log "pre-wait loads: cuobjdump -sass lily | prewait.py"
    cuobjdump -sass "$LILY" 2> /dev/null | python3 "$REPO/scripts/device/prewait.py" > "$LOGS/prewait.txt"
    (( PIPESTATUS[1] == 0 )) || fail prewait "a decode kernel issues no load before its PDL wait ($LOGS/prewait.txt)"
    grep -E 'MISSING|^pre-wait' "$LOGS/prewait.txt" | head -20 | say
  fi
  split "${OPS_AB:-}"
  for e in "${SPLIT[@]}"; do
    n=$((n + 1)); f=${OPS:-Cuda*-CudaModel.*}
    [[ $e == *@* ]] && { f=${e%%@*}; e=${e#*@}; }
    # shellcheck disable=SC2086  # e is a list of VAR=x words
    gtest "ops_ab$n" 200 "$f" $e
  done
  if [[ ${OPS_BENCH:-0} == 1 ]]; then
    gtest op_bench 200 "${OPS_BENCH_FILTER:-Cuda*.*Bench}" LILY_QGEMM_BENCH=1 LILY_GEMM_BENCH=1 LILY_ATTN_BENCH=1 LILY_SMALL_OPS_BENCH=1
    grep -E '^\| |bench' "$LOGS/op_bench.txt" | grep -v '^\[' | head -60 | say
    grep '^\[small-ops-bench\]' "$LOGS/op_bench.txt" | say
    if [[ ${CUBLAS:-0} == 1 ]] && in_time cublas; then  # cuBLAS bf16 at the prefill GEMMs' shapes (torch)
      log "cuBLAS bf16 at GemmBench's shapes: scripts/device/cublas_bench.py"
      timeout "$(cap 60)" python3 "$REPO/scripts/device/cublas_bench.py" > "$LOGS/cublas.txt" 2>&1 || fail cublas
      grep -E '^\||^cuBLAS' "$LOGS/cublas.txt" | say
    fi
  fi
}

# --- model -------------------------------------------------------------------------------------------------
# The full-size check: synth, CUDA vs the CPU reference, a per-depth bisect if it fails. Started in the
# background (PAR=1) so that its CPU reference runs beside the op tables; bench and serve wait for it.
FULL_PID=""
FULL_DONE=""
full_check() {  # [suffix [VAR=x...]]
  local s=${1:-} rc
  (( $# )) && shift
  synth_wait quiet || { echo "no checkpoint at $CK (synth.txt)" > "$LOGS/full$s.txt"; return 1; }
  env "$@" LILY_FULL_CKPT="$CK" LILY_FULL_STEPS="${FULL_STEPS:-3}" timeout "$(cap 300)" "$TESTS_BIN" \
    --gtest_filter='CudaModel.FullSizeCheckpoint*' > "$LOGS/full$s.txt" 2>&1
  rc=$?
  echo "rc $rc" >> "$LOGS/full$s.txt"
  if (( rc != 0 )) && [[ ${BISECT:-1} == 1 ]]; then
    env "$@" LILY_FULL_CKPT="$CK" LILY_FULL_BISECT=1 timeout "$(cap 240)" "$TESTS_BIN" \
      --gtest_filter='CudaModel.FullSizeLayerBisect' > "$LOGS/full${s}_bisect.txt" 2>&1
    echo "rc $?" >> "$LOGS/full${s}_bisect.txt"
  fi
  return $rc
}
full_report() {  # suffix rc label
  log "full-size CUDA vs CPU reference${3:+ with $3} (LILY_FULL_STEPS=${FULL_STEPS:-3})"
  { grep -E '^\| step|greedy|pipeline' "$LOGS/full$1.txt"; gsum "$LOGS/full$1.txt"; } 2> /dev/null | say
  [[ -f $LOGS/full$1_bisect.txt ]] && grep -E '^\| layers|^\|' "$LOGS/full$1_bisect.txt" | say
  (( $2 == 0 )) || fail "full$1" "rc $2"
}
full_wait() {
  [[ -n $FULL_PID ]] || return 0
  wait "$FULL_PID"
  local rc=$?
  FULL_PID=""
  FULL_DONE=1
  full_report "" $rc
}
mode_model() {
  local n=0 e
  gtest model_tiny 200 'CudaModel.Tiny*'
  grep -E '^\| step|greedy|pipeline' "$LOGS/model_tiny.txt" | tail -12 | say
  gtest engine 300 "${ENGINE_TESTS:-ForwardBatch.*:BatchingTest.*:Engine*:*Golden*:PrefixCache*:Service*:ModelStep.*:Spec*}" LILY_BACKEND=cuda
  grep -E '^\[golden\]|^\[forward-batch\]' "$LOGS/engine.txt" | head -20 | say
  split "${GOLDEN_ENV-LILY_PREFILL_MIN=1000000}"
  for e in "${SPLIT[@]}"; do
    n=$((n + 1))
    # shellcheck disable=SC2086
    gtest "golden_env$n" 150 '*Golden*' LILY_BACKEND=cuda $e
    grep -E '^\[golden\]' "$LOGS/golden_env$n.txt" | head -12 | say
  done
  if [[ -n $FULL_PID ]]; then
    full_wait
  elif [[ -z $FULL_DONE && ${FULL:-1} == 1 ]] && in_time full; then
    full_check; full_report "" $?; FULL_DONE=1
  fi
  n=0
  split "${MODEL_AB:-}"
  for e in "${SPLIT[@]}"; do
    n=$((n + 1))
    # shellcheck disable=SC2086
    gtest "model_ab${n}_tiny" 200 'CudaModel.Tiny*' $e
    # shellcheck disable=SC2086
    gtest "model_ab${n}_golden" 150 '*Golden*' LILY_BACKEND=cuda $e
    # shellcheck disable=SC2086
    [[ ${FULL:-1} == 1 ]] && in_time "model_ab${n}_full" && { full_check "_ab$n" $e; full_report "_ab$n" $? "$e"; }
  done
}

# --- bench -------------------------------------------------------------------------------------------------
# bench1 NAME CONTEXTS [VAR=x... --flag...]: `lily bench --backend cuda` (VAR=x into its environment, --flags to it); its table to the summary.
bench1() {
  local name=$1 ctxs=$2 a
  shift 2
  local vars=() flags=()  # VAR=x for the environment, --flag for lily bench
  for a in "$@"; do [[ $a == --* ]] && flags+=("$a") || vars+=("$a"); done
  in_time "$name" || return 1
  log "$name: lily bench --backend cuda --contexts $ctxs${*:+ with $*}"
  env "${vars[@]}" timeout "$(cap 200)" "${EXE:-$LILY}" bench --model "$CK" --backend cuda --contexts "$ctxs" \
    --label "${LABEL:-}" --json "$LOGS/$name.json" "${flags[@]}" > "$LOGS/$name.txt" 2>&1
  local rc=$?
  echo "rc $rc" >> "$LOGS/$name.txt"
  grep -E '^\||copy|bandwidth' "$LOGS/$name.txt" | grep -v '^\r' | say
  (( rc == 0 )) || { fail "$name" "rc $rc"; grep -v '^\[' "$LOGS/$name.txt" | tail -4 | say; }
}
# benchb NAME BATCHES STEPS [VAR=x...]: `lily bench-batch --backend cuda --check`.
benchb() {
  local name=$1 bs=$2 steps=$3
  shift 3
  in_time "$name" || return 1
  log "$name: lily bench-batch --backend cuda --batches $bs --context ${BATCH_CTX:-256} --steps $steps ${BATCH_ARGS:-}${*:+ with $*}"
  # shellcheck disable=SC2086  # BATCH_ARGS: more bench-batch options, word-split on purpose
  env "$@" timeout "$(cap 200)" "${EXE:-$LILY}" bench-batch --model "$CK" --backend cuda --batches "$bs" \
    --context "${BATCH_CTX:-256}" --steps "$steps" ${BATCH_ARGS:-} --check --label "${LABEL:-}" --json "$LOGS/$name.json" > "$LOGS/$name.txt" 2>&1
  local rc=$?
  echo "rc $rc" >> "$LOGS/$name.txt"
  grep -E '^\||^bench-batch:|profile|^check ' "$LOGS/$name.txt" | head -60 | say
  (( rc == 0 )) || { fail "$name" "rc $rc"; grep -v '^\[' "$LOGS/$name.txt" | tail -4 | say; }
}
# ncu_table B: every kernel of a one-step bench-batch at B rows (graphs off), summed per kernel name.
ncu_table() {
  in_time "ncu_b$1" || return 1
  log "ncu kernel times, bench-batch at $1 rows, 1 step (LILY_BATCH_GRAPH=0)"
  # shellcheck disable=SC2086  # NCU_TABLE_ARGS, NCU_LILY_ARGS: more options, word-split on purpose
  LILY_BATCH_GRAPH=0 timeout "$(cap 200)" ncu --clock-control none --metrics gpu__time_duration.sum --csv ${NCU_TABLE_ARGS:-} \
    "$LILY" bench-batch --model "$CK" --backend cuda --batches "$1" --context "${NCU_CTX:-1}" --steps 1 ${NCU_LILY_ARGS:-} \
    > "$LOGS/ncu_b$1.csv" 2> "$LOGS/ncu_b$1.err"
  python3 "$REPO/scripts/device/ncu_table.py" "$LOGS/ncu_b$1.csv" > "$LOGS/ncu_b$1.txt" 2>&1
  head -40 "$LOGS/ncu_b$1.txt" | say
}
mode_bench() {
  local n=0 e
  synth_wait || return 1
  full_wait   # nothing else on the GPU while timing
  bench1 bench "${CTXS:-256,4096,8192,32768}"
  benchb bench_batch "${BATCHES:-1,16,64}" "${BATCH_STEPS:-8}"
  [[ -n ${MIXED_ARGS:-} ]] && BATCH_ARGS="${BATCH_ARGS:-} $MIXED_ARGS" benchb bench_mixed "${MIXED_BATCHES:-16,256}" "${BATCH_STEPS:-8}"
  if [[ ${PROFILE:-0} == 1 ]]; then
    bench1 profile_decode "${PROFILE_CTXS:-256}" --profile
    bench1 profile_prefill "${PF_PROFILE_CTX:-8192}" LILY_PREFILL_PROFILE="${PF_PROFILE_MODE:-1}"
    benchb profile_batch "${PROFILE_BATCHES:-16,64}" 3 LILY_BATCH_PROFILE=1  # --check takes step 0: 3 mixed steps
    [[ -n ${MIXED_ARGS:-} ]] && BATCH_ARGS="${BATCH_ARGS:-} $MIXED_ARGS" benchb profile_mixed "${MIXED_BATCHES:-16,256}" 3 LILY_BATCH_PROFILE=1
  fi
  split "${AB:-}"
  for e in "${SPLIT[@]}"; do
    n=$((n + 1))
    # shellcheck disable=SC2086
    [[ -n ${AB_CTXS-256} ]] && bench1 "ab${n}_bench" "${AB_CTXS-256}" $e
    # shellcheck disable=SC2086
    [[ -n ${AB_BATCHES-16,64} ]] && benchb "ab${n}_batch" "${AB_BATCHES-16,64}" "${BATCH_STEPS:-8}" $e
  done
  if [[ -n ${BASE:-} ]]; then  # a baseline build, same commands at its defaults
    [[ $BASE == /* ]] || BASE=$REPO/$BASE
    # Unpacked inside this checkout: a build of another commit finds the assets (chat template) above its
    # executable, since its compiled-in source folder need not exist here.
    local bd=$REPO/build/device-base
    rm -rf "$bd" && mkdir -p "$bd" && tar -C "$bd" -xJf "$BASE/dev.tar.xz"
    log "baseline build: $(cat "$bd/commit" 2>/dev/null)"
    [[ -n ${AB_CTXS-256} ]] && LD_LIBRARY_PATH=$bd/rt EXE=$bd/lily bench1 base_bench "${AB_CTXS-256}"
    [[ -n ${AB_BATCHES-16,64} ]] && LD_LIBRARY_PATH=$bd/rt EXE=$bd/lily benchb base_batch "${AB_BATCHES-16,64}" "${BATCH_STEPS:-8}"
    [[ -n ${MIXED_ARGS:-} ]] && BATCH_ARGS="${BATCH_ARGS:-} $MIXED_ARGS" LD_LIBRARY_PATH=$bd/rt EXE=$bd/lily \
      benchb base_mixed "${MIXED_BATCHES:-16,256}" "${BATCH_STEPS:-8}"
  fi
  if [[ ${NCU:-0} == 1 ]]; then
    command -v ncu > /dev/null || { fail ncu "no ncu on the PATH"; return 1; }
    for e in $(tr , " " <<< "${NCU_BATCHES:-1,64}"); do ncu_table "$e"; done
    if [[ -n ${NCU_KERNEL:-} ]] && in_time ncu_sections; then
      log "ncu sections of kernels matching '$NCU_KERNEL', bench-batch at ${NCU_SECTION_BATCH:-64} rows"
      # shellcheck disable=SC2086  # NCU_SECTION_ARGS, NCU_LILY_ARGS: more options, word-split on purpose
      LILY_BATCH_GRAPH=0 timeout "$(cap 200)" ncu --clock-control none --kernel-name-base "${NCU_BASE:-function}" --kernel-name "regex:$NCU_KERNEL" --launch-skip "${NCU_SKIP:-20}" \
        --launch-count "${NCU_COUNT:-1}" --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
        --section MemoryWorkloadAnalysis ${NCU_SECTION_ARGS:-} "$LILY" bench-batch --model "$CK" --backend cuda \
        --batches "${NCU_SECTION_BATCH:-64}" --context 1 --steps 1 ${NCU_LILY_ARGS:-} > "$LOGS/ncu_sections.txt" 2>&1
      grep -E 'Duration|Throughput|Registers|Occupancy|Block Limit|Stall|Warp Cycles|Eligible|L2 Hit|DRAM' \
        "$LOGS/ncu_sections.txt" | head -120 | say
    fi
  fi
}

# --- serve -------------------------------------------------------------------------------------------------
# load_row FILE ROW: one table row from bench/load.mjs's JSON summary.
load_row() {
  # shellcheck disable=SC2016  # JavaScript template strings
  "$NODE" -e '
    const j = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
    const p = (x) => (x ? `${x.p50} / ${x.p90} / ${x.p99}` : "");
    console.log(`| ${process.argv[2]} | ${j.requests} | ${j.aggregate_tok_s} | ${j.stream_tok_s_p50} | ${j.tpot_ms?.p50} | ` +
      `${p(j.itl_ms)} | ${p(j.itl_token_ms)} | ${p(j.ttft_ms)} | ${j.cache_hit_rate} | ${j.failed.length} |`);' "$1" "$2" 2>&1
}
# serve_run NAME CLIENTS [VAR=x...] [--serve-option value...]: `lily serve` on CK, bench/load.mjs per row.
SRV=""
serve_run() {
  local name=$1 rows=$2 w port="" row n sys req
  shift 2
  local envs=() args=() lp=${LOGPROBS:-0} pw=${PROMPT_WORDS:-48} mt=${MAX_TOKENS:-128}
  for w in "$@"; do
    if [[ $w == LOGPROBS=* ]]; then lp=${w#LOGPROBS=}
    elif [[ $w == PROMPT_WORDS=* ]]; then pw=${w#PROMPT_WORDS=}
    elif [[ $w == MAX_TOKENS=* ]]; then mt=${w#MAX_TOKENS=}
    elif [[ $w =~ ^[A-Z_][A-Z0-9_]*= ]]; then envs+=("$w")
    else args+=("$w"); fi
  done
  local lpa=()
  [[ $lp == 1 ]] && lpa=(--logprobs)
  in_time "$name" || return 1
  log "$name: lily serve --backend ${SERVE_BACKEND:-cuda}${*:+ with $*}, clients: $rows"
  # shellcheck disable=SC2086  # SERVE_ARGS: more options, word-split on purpose
  env LILY_ENGINE_TRACE="${TRACE:-1}" "${envs[@]}" "$LILY" serve --model "$CK" --backend "${SERVE_BACKEND:-cuda}" --port 0 \
    --parallel "${PARALLEL:-64}" --max-queue 256 --max-seq "${MAX_SEQ:-2048}" ${SERVE_ARGS:-} "${args[@]}" \
    > "$LOGS/$name.out" 2> "$LOGS/$name.err" &
  SRV=$!
  for _ in $(seq 1 240); do
    port=$(grep -oE 'listening on [^[:space:]]+:[0-9]+' "$LOGS/$name.out" 2> /dev/null | grep -oE '[0-9]+$' | head -1)
    [[ -n $port ]] && break
    kill -0 "$SRV" 2> /dev/null || break
    sleep 0.5
  done
  if [[ -z $port ]]; then
    fail "$name" "the server did not start"
    tail -20 "$LOGS/$name.err" | say
    kill "$SRV" 2> /dev/null; wait "$SRV" 2> /dev/null; SRV=""
    return 1
  fi
  grep -E 'prepared' "$LOGS/$name.err" | head -2 | say
  echo "-- replies of $mt tokens, $pw-word prompts, ${REQ_PER_CLIENT:-4} requests per client (1 client: ${REQ1:-4}); a row 'Ns' shares a ${SYSTEM_WORDS:-300}-word system prompt$([[ $lp == 1 ]] && echo '; with logprobs')" | say
  echo "| clients | requests | aggregate tok/s | stream tok/s p50 | TPOT p50 ms | ITL p50 / p90 / p99 ms (per event) | per token (LOGPROBS=1) | TTFT p50 / p90 / p99 ms | prefix-cache hits | failed |" | say
  for row in $rows; do  # "16s": 16 clients sharing a system prompt
    n=${row%s}; sys=0
    [[ $row == *s ]] && sys=${SYSTEM_WORDS:-300}
    req=$((n * ${REQ_PER_CLIENT:-4})); (( n == 1 )) && req=${REQ1:-4}
    in_time "$name/$row" || break
    timeout "$(cap 240)" "$NODE" "$REPO/bench/load.mjs" --url "http://127.0.0.1:$port" --clients "$n" --requests "$req" \
      --max-tokens "$mt" --prompt-words "$pw" --system-words "$sys" \
      "${lpa[@]}" --json "$LOGS/${name}_$row.json" > "$LOGS/${name}_$row.txt" 2>&1
    local rc=$?
    load_row "$LOGS/${name}_$row.json" "$row" | say
    (( rc == 0 )) || { fail "$name/$row" "rc $rc"; tail -5 "$LOGS/${name}_$row.txt" | say; }
  done
  curl -s "http://127.0.0.1:$port/metrics" > "$LOGS/$name.metrics.txt" 2> /dev/null
  kill "$SRV" 2> /dev/null; wait "$SRV" 2> /dev/null; SRV=""
  # The engine trace (LILY_ENGINE_TRACE=1: one line per step): the slowest steps (prefill + decode ms) and the
  # prefill chunks, where an inter-token latency tail comes from.
  if grep -q '^engine step' "$LOGS/$name.err"; then
    echo "-- engine trace: $(grep -c '^engine step' "$LOGS/$name.err") steps; slowest (ms = prefill + decode):" | say
    grep -E '^engine step' "$LOGS/$name.err" | awk '{printf "%.1f %s\n", $10, $0}' | sort -rn | head -"${SLOW_STEPS:-8}" | say
    grep -oE 'prefill chunk [0-9]+ tokens [0-9.]+ ms' "$LOGS/$name.err" | awk '{n++; t+=$3; ms+=$5}
      END {if (n) printf "prefill chunks %d, mean %.1f tokens, mean %.1f ms\n", n, t/n, ms/n}' | say
    # What a newcomer costs the engine thread: a step's time beside its model step's (printed for steps with
    # segments), the snapshots, the checkouts and the decode graphs captured for new states.
    awk '/^engine: step of/ {m = $(NF-1); next}
      /^engine step:/ {if (m != "") {h += $10 - m; n++}; m = ""; next}
      /^engine: snapshot/ {s += $(NF-1); ns++} /^engine: checkout/ {c += $3; nc++}
      /^cuda: decode graphs/ {g += $(NF-1); ng++}
      END {printf "host time of steps with segments %.2f ms mean (%d); snapshots %d, %.2f ms mean; checkouts %d, %.2f ms mean; decode graph captures %d, %.1f ms mean\n",
        n ? h/n : 0, n, ns, ns ? s/ns : 0, nc, nc ? c/nc : 0, ng, ng ? g/ng : 0}' "$LOGS/$name.err" | say
    # Where the engine thread's time outside the model step went (the trace's "host ms" fields), per kind of step.
    awk '/^engine step:/ && /host ms:/ {k = ($3 > 0) ? "with segments" : "decode only"; n[k]++
        for (i = 1; i <= NF; i++) if ($i ~ /^(plan|feeds|segments|rows|after)$/) {v = $(i+1); sub(",", "", v); t[k, $i] += v}}
      END {for (k in n) printf "host ms of steps %s (%d): plan %.2f, feeds %.2f, segments %.2f, rows %.2f, after %.2f\n",
        k, n[k], t[k, "plan"]/n[k], t[k, "feeds"]/n[k], t[k, "segments"]/n[k], t[k, "rows"]/n[k], t[k, "after"]/n[k]}' \
      "$LOGS/$name.err" | say
  fi
}
mode_serve() {
  local n=0 e
  [[ -n $NODE ]] || { fail serve "no node (pack.sh packs node.xz unless NODE=0)"; return 1; }
  synth_wait || return 1
  full_wait
  serve_run serve "${CLIENTS:-1 16 64}"
  split "${SERVE_AB:-}"
  for e in "${SPLIT[@]}"; do
    n=$((n + 1))
    # shellcheck disable=SC2086  # words of VAR=x and --option value
    serve_run "serve_ab$n" "${SERVE_AB_CLIENTS:-16}" $e
  done
}

# --- cpu ---------------------------------------------------------------------------------------------------
mode_cpu() {
  local t last
  synth_wait || return 1
  full_wait
  { lscpu; free -g; } > "$LOGS/machine.txt" 2>&1
  grep -E 'Model name|^CPU\(s\)' "$LOGS/machine.txt" | say
  echo "| threads | prefill tok/s | decode tok/s | decode GB/s | read BW GB/s | CPU share prefill / decode |" | say
  for t in ${THREADS:-1 2 4 8 16}; do
    in_time "bench-cpu --threads $t" || break
    timeout "$(cap 300)" "$LILY" bench-cpu --model "$CK" --threads "$t" --prompt-len "${PROMPT:-256}" \
      --json "$LOGS/bench_cpu_t$t.json" > "$LOGS/bench_cpu_t$t.txt" 2>&1 || fail "bench-cpu/$t" "rc $?"
    python3 - "$LOGS/bench_cpu_t$t.json" "$t" <<'PY' 2> /dev/null | say
import json, sys
j = json.load(open(sys.argv[1]))
print(f"| {sys.argv[2]} | {j['prefill_tok_s']:.2f} | {j['decode_tok_s']:.2f} | {j['decode_gb_s']:.1f} | "
      f"{j['mem_read_gb_s']:.1f} | {100 * j['prefill_cpu_share']:.0f}% / {100 * j['decode_cpu_share']:.0f}% |")
PY
    last=$t
  done
  [[ -n ${last:-} ]] || return 0
  in_time "bench --backend cpu" || return 0
  log "lily bench --backend cpu --threads $last (the bench contract)"
  timeout "$(cap 300)" "$LILY" bench --model "$CK" --backend cpu --threads "$last" --contexts "${PROMPT:-256}" \
    --json "$LOGS/bench_cpu.json" > "$LOGS/bench_cpu.txt" 2>&1 || fail "bench-cpu-contract" "rc $?"
  grep -E '^\|' "$LOGS/bench_cpu.txt" | say
}

# --- golden-envelope ---------------------------------------------------------------------------------------
# Needs python3 with torch and transformers (the GPU machine's image has them). The new envelope.json and
# README.md of each golden come back in logs.tar.gz under golden-envelope/<name>/.
mode_golden_envelope() {
  local d name
  for d in ${GOLDENS:-tests/data/golden/*}; do
    d=${d%/}; name=$(basename "$d")
    in_time "envelope $name" || return 1
    log "tools/make_golden.py --envelope $d"
    PYTHONUNBUFFERED=1 timeout "$(cap 500)" python3 tools/make_golden.py --envelope "$d" > "$LOGS/envelope_$name.txt" 2>&1 \
      || fail "envelope/$name" "rc $?"
    python3 tools/make_golden.py --readme "$d" >> "$LOGS/envelope_$name.txt" 2>&1
    grep -E '^\[envelope\]|Error|error' "$LOGS/envelope_$name.txt" | say
    mkdir -p "$LOGS/golden-envelope/$name" && cp "$d/envelope.json" "$d/README.md" "$LOGS/golden-envelope/$name/" 2> /dev/null
  done
}

# --- llama -------------------------------------------------------------------------------------------------
# Not run yet: no GGUF of this model can reach the GPU machine (no network, 64 MiB carried), so LLAMA_MODEL
# must be a file made there. The llama-bench flags follow llama.cpp's README of late 2025.
mode_llama() {
  local src=${LLAMA_SRC:-.llama/llama.cpp} bd=/tmp/llama-build
  [[ -f $src/CMakeLists.txt ]] || { fail llama "no llama.cpp source at $src (carry it)"; return 1; }
  in_time "llama build" || return 1
  log "llama.cpp build ($src, $(git -C "$src" rev-parse --short HEAD 2> /dev/null))"
  { cmake -S "$src" -B "$bd" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a -DLLAMA_CURL=OFF &&
    timeout "$(cap 500)" cmake --build "$bd" -j "$(nproc)" --target llama-bench llama-batched-bench; } > "$LOGS/llama_build.txt" 2>&1 \
    || { fail llama-build "see llama_build.txt"; tail -5 "$LOGS/llama_build.txt" | say; return 1; }
  [[ -f ${LLAMA_MODEL:-} ]] || { fail llama "LLAMA_MODEL is not a file"; return 1; }
  in_time llama-bench || return 1
  log "llama-bench"
  # shellcheck disable=SC2086
  timeout "$(cap 300)" "$bd/bin/llama-bench" -m "$LLAMA_MODEL" ${LLAMA_BENCH_ARGS:--ngl 99 -p 512,4096 -n 128} \
    > "$LOGS/llama_bench.txt" 2>&1 || fail llama-bench "rc $?"
  grep -E '^\|' "$LOGS/llama_bench.txt" | say
  in_time llama-batched-bench || return 1
  log "llama-batched-bench"
  # shellcheck disable=SC2086
  timeout "$(cap 300)" "$bd/bin/llama-batched-bench" -m "$LLAMA_MODEL" ${LLAMA_BATCHED_ARGS:--ngl 99 -c 16384 -npp 128 -ntg 128 -npl 1,16,64} \
    > "$LOGS/llama_batched.txt" 2>&1 || fail llama-batched-bench "rc $?"
  grep -E '^\|' "$LOGS/llama_batched.txt" | say
}

# --- main --------------------------------------------------------------------------------------------------
if has model || has bench || has serve || has cpu; then synth_start; fi
if has model && [[ ${PAR:-1} == 1 && ${FULL:-1} == 1 ]]; then
  full_check & FULL_PID=$!
fi
for m in "${MODES[@]}"; do
  case $m in
    golden-envelope) mode_golden_envelope ;;
    *) "mode_$m" ;;
  esac
done
full_wait
