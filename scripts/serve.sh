#!/usr/bin/env bash
# One command to a running server: installs and builds what is missing, then starts
# `lily serve`. With no --model it serves the built-in demo checkpoint (random weights).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec build/lily serve "$@"
