#!/usr/bin/env bash
# The sanitizer half of CI (scripts/test.sh runs it after the normal suite):
#  1. the whole C++ test suite built with AddressSanitizer + UBSan (CPU code, CUDA off) in its
#     own build dir (build-asan), run by ctest; any report fails the test that triggers it;
#  2. every libFuzzer target in tests/fuzz built with clang (build-fuzz) and run for a fixed
#     budget over its committed corpus (tests/fuzz/corpus/<name>); any crash, leak, timeout
#     (LILY_FUZZ_TIMEOUT) or sanitizer report fails. New inputs go to a scratch dir, not the tree.
# Usage: scripts/test-sanitize.sh [suite|fuzz|all]   (default all)
# Env: LILY_FUZZ_SECONDS (per target, default 10), LILY_FUZZ_TIMEOUT (per input, default 5 s),
# LILY_ASAN_BUILD_DIR, LILY_FUZZ_BUILD_DIR.
set -euo pipefail
cd "$(dirname "$0")/.."
what=${1:-all}
JOBS=$(nproc)
ASAN_DIR=${LILY_ASAN_BUILD_DIR:-build-asan}
FUZZ_DIR=${LILY_FUZZ_BUILD_DIR:-build-fuzz}
FUZZ_SECONDS=${LILY_FUZZ_SECONDS:-10}
# Per input. The fuzzing campaigns use 1 s; CI allows 5 so a busy shared machine does not fail it.
FUZZ_TIMEOUT=${LILY_FUZZ_TIMEOUT:-5}
# Halt on the first report (the builds also pass -fno-sanitize-recover=all); leaks are errors.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:strict_string_checks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}

if [ "$what" = all ] || [ "$what" = suite ]; then
  start=$SECONDS
  if [ ! -f "$ASAN_DIR/build.ninja" ]; then
    cmake -S . -B "$ASAN_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLILY_SANITIZE=ON -DLILY_CUDA=OFF
  fi
  cmake --build "$ASAN_DIR" -j"$JOBS" --target lily_tests lily
  (cd "$ASAN_DIR" && ctest --output-on-failure -j"$JOBS" --timeout 900)
  echo "test-sanitize: ASan+UBSan suite passed in $((SECONDS - start)) s"
fi

if [ "$what" = all ] || [ "$what" = fuzz ]; then
  start=$SECONDS
  if [ ! -f "$FUZZ_DIR/build.ninja" ]; then
    cmake -S . -B "$FUZZ_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLILY_FUZZ=ON -DLILY_CUDA=OFF \
      -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++
  fi
  cmake --build "$FUZZ_DIR" -j"$JOBS"
  scratch=$(mktemp -d)
  trap 'rm -rf "$scratch"' EXIT
  failed=()
  for src in tests/fuzz/*_fuzz.cpp; do
    name=$(basename "$src" _fuzz.cpp)
    mkdir -p "$scratch/$name"
    echo "test-sanitize: fuzzing $name for ${FUZZ_SECONDS}s"
    if ! "$FUZZ_DIR/tests/fuzz/${name}_fuzz" -max_total_time="$FUZZ_SECONDS" -timeout="$FUZZ_TIMEOUT" -rss_limit_mb=2048 \
        -print_final_stats=1 -artifact_prefix="$FUZZ_DIR/fuzz-$name-" "$scratch/$name" "tests/fuzz/corpus/$name" \
        > "$scratch/$name.log" 2>&1; then
      tail -n 60 "$scratch/$name.log"
      failed+=("$name")
    else
      grep -E 'stat::number_of_executed_units' "$scratch/$name.log" | sed "s/^/  $name: /"
    fi
  done
  if [ ${#failed[@]} -gt 0 ]; then
    echo "test-sanitize: fuzz targets failed: ${failed[*]} (inputs saved as $FUZZ_DIR/fuzz-<name>-*)" >&2
    exit 1
  fi
  echo "test-sanitize: all fuzz targets ran clean in $((SECONDS - start)) s"
fi
