#!/usr/bin/env bash
# Packs a build for the GPU machine (which has none of Debian's libraries): stripped copies of
# lily and lily_tests plus every .so they need besides glibc, into <build>/dev/{lily,lily_tests,rt/}.
# Usage: scripts/device/pack.sh build-main   → then carry build-main/dev and run
#        LD_LIBRARY_PATH=$PWD/build-main/dev/rt build-main/dev/lily ...   on the device.
set -euo pipefail
B=${1:?usage: pack.sh <build dir>}
D="$B/dev"
rm -rf "$D" && mkdir -p "$D/rt"
for exe in lily lily_tests; do
  [[ -x "$B/$exe" ]] || { echo "pack: $B/$exe missing (build it first)" >&2; exit 1; }
  strip -o "$D/$exe" "$B/$exe"
  ldd "$B/$exe" | awk '$3 ~ /^\// {print $3}' | while read -r so; do
    case "$(basename "$so")" in libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|librt.so.*|ld-linux*|libcuda.so.*) ;;
      *) cp -L "$so" "$D/rt/" ;; esac
  done
done
du -sh "$D"
