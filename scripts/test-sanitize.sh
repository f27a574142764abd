#!/usr/bin/env bash
# The sanitizer half of CI (scripts/test.sh runs it after the normal suite), from one clang build
# with AddressSanitizer + UBSan (CPU code, CUDA off) in build-asan:
#  1. the whole C++ test suite, run by ctest; any report fails the test that triggers it;
#  2. every libFuzzer target in tests/fuzz (linked against the same library objects as the suite),
#     run for a fixed budget over its committed corpus (tests/fuzz/corpus/<name>), nproc targets at
#     a time; any crash, leak, timeout (LILY_FUZZ_TIMEOUT) or sanitizer report fails. New inputs go
#     to a scratch dir, not the tree; a failing input is saved as build-asan/fuzz-<name>-*.
# Usage: scripts/test-sanitize.sh [suite|fuzz|all]   (default all)
# Env: LILY_FUZZ_SECONDS (per target, default 10), LILY_FUZZ_TIMEOUT (per input, default 5 s),
# LILY_ASAN_BUILD_DIR.
set -euo pipefail
cd "$(dirname "$0")/.."
what=${1:-all}
JOBS=$(nproc)
ASAN_DIR=${LILY_ASAN_BUILD_DIR:-build-asan}
FUZZ_SECONDS=${LILY_FUZZ_SECONDS:-10}
# Per input. The fuzzing campaigns use 1 s; CI allows 5 so a busy shared machine does not fail it.
FUZZ_TIMEOUT=${LILY_FUZZ_TIMEOUT:-5}
# Halt on the first report (the build also passes -fno-sanitize-recover=all); leaks are errors.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:strict_string_checks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}

# Configure with clang (libFuzzer); a build dir configured with another compiler is reconfigured.
if ! grep -Eq '^CMAKE_CXX_COMPILER:[A-Z]+=(.*/)?clang\+\+(-[0-9]+)?$' "$ASAN_DIR/CMakeCache.txt" 2>/dev/null \
    || [ ! -f "$ASAN_DIR/build.ninja" ]; then
  rm -rf "$ASAN_DIR/CMakeCache.txt" "$ASAN_DIR/CMakeFiles"
  cmake -S . -B "$ASAN_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLILY_SANITIZE=ON -DLILY_CUDA=OFF \
    -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++
fi
targets=()
[ "$what" = fuzz ] || targets+=(lily_tests lily)
[ "$what" = suite ] || targets+=(lily_fuzz)
start=$SECONDS
cmake --build "$ASAN_DIR" -j"$JOBS" --target "${targets[@]}"
echo "test-sanitize: built ${targets[*]} in $((SECONDS - start)) s"

if [ "$what" = all ] || [ "$what" = suite ]; then
  start=$SECONDS
  (cd "$ASAN_DIR" && ctest --output-on-failure -j"$JOBS" --timeout 900)
  echo "test-sanitize: ASan+UBSan suite passed in $((SECONDS - start)) s"
fi

if [ "$what" = all ] || [ "$what" = fuzz ]; then
  start=$SECONDS
  scratch=$(mktemp -d)
  trap 'rm -rf "$scratch"' EXIT
  # One target: its log in $scratch/<name>.log, its exit status in $scratch/<name>.rc.
  fuzz_one() {
    local name=$1 rc=0
    mkdir -p "$scratch/$name"
    "$ASAN_DIR/tests/fuzz/${name}_fuzz" -max_total_time="$FUZZ_SECONDS" -timeout="$FUZZ_TIMEOUT" -rss_limit_mb=2048 \
      -print_final_stats=1 -artifact_prefix="$ASAN_DIR/fuzz-$name-" "$scratch/$name" "tests/fuzz/corpus/$name" \
      > "$scratch/$name.log" 2>&1 || rc=$?
    echo "$rc" > "$scratch/$name.rc"
  }
  names=()
  for src in tests/fuzz/*_fuzz.cpp; do
    names+=("$(basename "$src" _fuzz.cpp)")
  done
  for name in "${names[@]}"; do
    while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n || true; done
    echo "test-sanitize: fuzzing $name for ${FUZZ_SECONDS}s"
    fuzz_one "$name" 2>> "$scratch/$name.log" &  # the shell's own "Aborted" line goes to the log too
  done
  wait
  failed=()
  for name in "${names[@]}"; do
    if [ "$(cat "$scratch/$name.rc" 2>/dev/null || echo missing)" != 0 ]; then
      echo "test-sanitize: $name failed (exit $(cat "$scratch/$name.rc" 2>/dev/null || echo '?')):"
      tail -n 60 "$scratch/$name.log"
      failed+=("$name")
    else
      grep -E 'stat::number_of_executed_units' "$scratch/$name.log" | sed "s/^/  $name: /"
    fi
  done
  if [ ${#failed[@]} -gt 0 ]; then
    echo "test-sanitize: fuzz targets failed: ${failed[*]} (inputs saved as $ASAN_DIR/fuzz-<name>-*)" >&2
    exit 1
  fi
  echo "test-sanitize: all ${#names[@]} fuzz targets ran clean in $((SECONDS - start)) s"
fi
