#!/usr/bin/env bash
# Builds shardkit and runs the whole test suite, from a clean clone on Debian 12.
#   scripts/test.sh [BUILD_DIR]      (default: build)
# Installs missing Debian packages first (as root, or through sudo).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD="${1:-build}"
scripts/install-deps.sh --with-s3rver
. scripts/ccache-env.sh
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build "$BUILD" -j "$(nproc)"
cd "$BUILD"
ctest --output-on-failure -j2
