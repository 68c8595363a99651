#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/) with clang + ASan + UBSan and runs each
# on its seed corpus for a while; any crash, leak, timeout or sanitizer report
# fails the run and leaves the reproducer in $BUILD/findings/<target>/.
#   scripts/fuzz.sh [SECONDS_PER_TARGET] [BUILD_DIR]   (defaults: 60, build-fuzz)
#   FUZZ_TARGETS="tar jpeg" scripts/fuzz.sh            (a subset)
set -euo pipefail
cd "$(dirname "$0")/.."
SECS="${1:-60}"
BUILD="${2:-build-fuzz}"
TARGETS="${FUZZ_TARGETS:-tar dali_index lmdb_record lmdb_env jpeg hdf5}"
# clang and libFuzzer's runtime are needed by this script only: installed here
# (as root, or through sudo) rather than by scripts/install-deps.sh.
need=()
for p in clang-14 libclang-rt-14-dev; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "fuzz.sh: installing ${need[*]}" >&2
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
CXX_BIN="$(command -v clang++-14 || command -v clang++ || true)"
CC_BIN="$(command -v clang-14 || command -v clang || true)"
if [ -z "$CXX_BIN" ] || [ -z "$CC_BIN" ]; then
  echo "fuzz.sh: clang is not installed (apt-get install clang-14 libclang-rt-14-dev)" >&2
  exit 1
fi
# libFuzzer's runtime: in libclang-rt-14-dev (clang-14 depends on it on Debian 12).
if ! "$CXX_BIN" -print-file-name=libclang_rt.fuzzer-x86_64.a | grep -q /; then
  echo "fuzz.sh: libFuzzer runtime missing (apt-get install libclang-rt-14-dev)" >&2
  exit 1
fi
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER="$CC_BIN" \
  -DCMAKE_CXX_COMPILER="$CXX_BIN" -DSHARDKIT_FUZZ=ON -DSHARDKIT_SANITIZE=address,undefined \
  -DSHARDKIT_BUILD_TESTS=OFF -DSHARDKIT_BUILD_TOOLS=OFF -DSHARDKIT_WITH_CUDA=OFF -DSHARDKIT_BUILD_PYTHON=OFF >/dev/null
cmake --build "$BUILD" -j "$(nproc)" --target $(for t in $TARGETS; do printf 'fuzz_%s ' "$t"; done)
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:allocator_may_return_null=1"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:abort_on_error=1"
status=0
for t in $TARGETS; do
  corpus="$BUILD/corpus/$t"      # grows while fuzzing; the seeds in the repo stay as they are
  findings="$BUILD/findings/$t"
  mkdir -p "$corpus" "$findings"
  dict=()
  [ -f "fuzz/$t.dict" ] && dict=(-dict="fuzz/$t.dict")
  echo "== fuzz_$t: ${SECS}s"
  if ! "$BUILD/fuzz/fuzz_$t" "$corpus" "fuzz/corpus/$t" "${dict[@]}" -max_total_time="$SECS" \
      -timeout=20 -rss_limit_mb=2048 -max_len=65536 -artifact_prefix="$findings/" -print_final_stats=1 \
      > "$BUILD/fuzz_$t.log" 2>&1; then
    echo "fuzz_$t: FINDING (see $BUILD/fuzz_$t.log and $findings/)" >&2
    tail -60 "$BUILD/fuzz_$t.log" >&2
    status=1
  else
    grep -E "stat::number_of_executed_units|stat::peak_rss_mb" "$BUILD/fuzz_$t.log" | sed "s/^/fuzz_$t: /"
  fi
done
exit $status
