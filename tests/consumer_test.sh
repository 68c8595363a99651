#!/usr/bin/env bash
# Installs shardkit from BUILD_DIR into a temporary prefix, then configures,
# builds and runs tests/consumer against it with find_package(shardkit).
#   tests/consumer_test.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
SRC="$1"
BUILD="$2"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
cmake --build "$BUILD" --target shardkit shardkit_cli >/dev/null
cmake --install "$BUILD" --prefix "$TMP/prefix" >/dev/null
test -x "$TMP/prefix/bin/shardkit"
test -f "$TMP/prefix/include/shardkit/shardkit.h"
test -f "$TMP/prefix/include/shardkit/convert.h"
cmake -S "$SRC/tests/consumer" -B "$TMP/build" -DCMAKE_PREFIX_PATH="$TMP/prefix" >/dev/null
cmake --build "$TMP/build" >/dev/null
out="$("$TMP/build/consumer")"
echo "$out"
case "$out" in
  "shardkit "*"formats: folder wds lmdb hdf5"*) ;;
  *) echo "consumer_test: unexpected output: $out" >&2; exit 1 ;;
esac
"$TMP/prefix/bin/shardkit" --version
# The installed library exports the public API only.
"$SRC/tests/exports_test.sh" "$(find "$TMP/prefix" -name 'libshardkit.so.*.*.*' | head -1)" "$TMP/prefix/include"
