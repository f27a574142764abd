#!/usr/bin/env bash
# One command for every test: installs and builds what is missing, then runs the C++ suite
# (ctest), the Node suites (tokenizer, template and OpenAI-SDK oracles), and the sanitizer half
# (scripts/test-sanitize.sh: the suite under ASan+UBSan, every fuzz target for a short budget).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
BUILD_DIR=${LILY_BUILD_DIR:-build}
(cd "$BUILD_DIR" && ctest --output-on-failure -j"$(nproc)" --timeout 600)
if ls tests/node/*.test.mjs >/dev/null 2>&1; then
  LILY_BIN="$PWD/$BUILD_DIR/lily" node --test tests/node/
fi
scripts/test-sanitize.sh
