#!/usr/bin/env bash
# Builds the Debian package of BUILD_DIR with CPack and checks it as apt would use it:
# the file name carries the project version, Depends comes from dpkg-shlibdeps (the
# libraries the binaries link, not a hand-written list), and the unpacked package runs
# the command and builds tests/consumer with find_package(shardkit).
#   tests/deb_test.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
SRC="$1"
BUILD="$2"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
version="$(sed -n 's/^project(shardkit VERSION \([0-9.]*\).*/\1/p' "$SRC/CMakeLists.txt")"
[ -n "$version" ] || { echo "deb_test: no project(shardkit VERSION ...) in CMakeLists.txt" >&2; exit 1; }
(cd "$TMP" && cpack -G DEB --config "$BUILD/CPackConfig.cmake" -B "$TMP/pkg" >"$TMP/cpack.log" 2>&1) ||
  { cat "$TMP/cpack.log" >&2; exit 1; }
deb="$TMP/pkg/shardkit_${version}_$(dpkg --print-architecture).deb"
[ -f "$deb" ] || { echo "deb_test: cpack wrote $(ls "$TMP/pkg"), not $deb" >&2; exit 1; }
depends="$(dpkg-deb -f "$deb" Depends)"
echo "Depends: $depends"
for lib in liblmdb0 libarchive13 libturbojpeg0 libcurl4 libtbb12 libc6; do
  case ", $depends" in
    *", $lib "* | *", $lib,"* | *", $lib") ;;
    *) echo "deb_test: Depends lacks $lib (dpkg-shlibdeps should have found it)" >&2; exit 1 ;;
  esac
done
dpkg-deb -c "$deb" | awk '{print $6}' > "$TMP/files"
for f in ./usr/bin/shardkit ./usr/include/shardkit/shardkit.h ./usr/lib/cmake/shardkit/shardkitConfig.cmake; do
  grep -qx "$f" "$TMP/files" || { echo "deb_test: the package lacks $f" >&2; exit 1; }
done
grep -q '^./usr/lib/libshardkit.so' "$TMP/files" || { echo "deb_test: the package lacks libshardkit.so" >&2; exit 1; }
dpkg-deb -x "$deb" "$TMP/root"
"$TMP/root/usr/bin/shardkit" --help >/dev/null
[ "$("$TMP/root/usr/bin/shardkit" --version)" = "$version" ] ||
  { echo "deb_test: shardkit --version is not $version" >&2; exit 1; }
cmake -S "$SRC/tests/consumer" -B "$TMP/build" -DCMAKE_PREFIX_PATH="$TMP/root/usr" >/dev/null
cmake --build "$TMP/build" >/dev/null
out="$(LD_LIBRARY_PATH="$TMP/root/usr/lib" "$TMP/build/consumer")"
echo "$out"
case "$out" in
  "shardkit $version"*"formats: folder wds lmdb hdf5"*) ;;
  *) echo "deb_test: unexpected output: $out" >&2; exit 1 ;;
esac
