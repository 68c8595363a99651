#!/usr/bin/env bash
# Builds shardkit and runs the whole test suite, from a clean clone on Debian 12: ctest
# (C++, CLI, Python, the .deb), then the self-contained wheel in a fresh venv
# (scripts/test-wheel.sh).
#   scripts/test.sh [BUILD_DIR]      (default: build)
# Installs missing Debian packages first (as root, or through sudo).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD="${1:-build}"
T0=$(date +%s)
scripts/install-deps.sh --with-s3rver
. scripts/ccache-env.sh
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSHARDKIT_WITH_WEBP=ON -DSHARDKIT_WITH_AVIF=ON -DSHARDKIT_WITH_JXL=ON
cmake --build "$BUILD" -j "$(nproc)"
T1=$(date +%s)
(cd "$BUILD" && ctest --output-on-failure -j2)
T2=$(date +%s)
# After ctest: the wheel's build shares the objects just compiled (ccache).
scripts/test-wheel.sh
T3=$(date +%s)
echo "test.sh: deps+build $(( T1 - T0 )) s, ctest $(( T2 - T1 )) s, wheel $(( T3 - T2 )) s"
