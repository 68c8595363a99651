#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/) with clang + ASan + UBSan and runs each
# on its seed corpus for a while; any crash, leak, timeout or sanitizer report
# fails the run and leaves the reproducer in $BUILD/findings/<target>/.
#   scripts/fuzz.sh [SECONDS_PER_TARGET] [BUILD_DIR]   (defaults: 60, build-fuzz)
#   FUZZ_TARGETS="tar jpeg" scripts/fuzz.sh            (a subset)
#   scripts/fuzz.sh build [BUILD_DIR]                  (install clang and build; run nothing)
#   scripts/fuzz.sh build-deps                         (install clang only)
set -euo pipefail
cd "$(dirname "$0")/.."
SECS="${1:-60}"
BUILD="${2:-build-fuzz}"
TARGETS="${FUZZ_TARGETS:-tar dali_index lmdb_record lmdb_env jpeg image hdf5 mds recordio tfrecord pickle manifest}"
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
[ "$SECS" = build-deps ] && exit 0
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
. scripts/ccache-env.sh
# -O1 -gline-tables-only, as OSS-Fuzz builds: reports keep file:line, and the build is
# about twice as fast as -O2 -g.
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER="$CC_BIN" \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only -DNDEBUG" \
  -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only -DNDEBUG" \
  -DCMAKE_CXX_COMPILER="$CXX_BIN" -DSHARDKIT_FUZZ=ON -DSHARDKIT_SANITIZE=address,undefined \
  -DSHARDKIT_BUILD_TESTS=OFF -DSHARDKIT_BUILD_TOOLS=OFF -DSHARDKIT_WITH_CUDA=OFF -DSHARDKIT_BUILD_PYTHON=OFF >/dev/null
cmake --build "$BUILD" -j "$(nproc)" --target $(for t in $TARGETS; do printf 'fuzz_%s ' "$t"; done)
[ "$SECS" = build ] && exit 0
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:allocator_may_return_null=1"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:abort_on_error=1"
# upstream_crash LOG REGEX: true when LOG holds an AddressSanitizer invalid read
# (not a SEGV, write, leak, timeout or OOM) whose innermost frame outside the sanitizer runtime is in a
# library matching REGEX, i.e. a bug of that (uninstrumented) library itself.
upstream_crash() {
  # Reads out of bounds or of freed memory only: a SEGV or a bad write crashes
  # shardkit too, so it fails the run whoever is at fault.
  grep -q "ERROR: AddressSanitizer: [a-z-]*\(overflow\|use-after-free\)" "$1" && grep -q "^READ of size" "$1" || return 1
  local frame
  # Skipped: the sanitizer's own frames, and frames of the fuzz binary without a source
  # location (its libc interceptors: memcpy, strdup, strlen, ...; shardkit's and the
  # harness's frames carry a file:line).
  frame="$(grep -E '^ +#[0-9]+ ' "$1" | grep -v -E '__interceptor_|__asan_|__sanitizer|libclang_rt|in (malloc|calloc|realloc|free|mem(cpy|move|set)) |in __mem[a-z_0-9]+ ' |
    grep -v -E ' in [A-Za-z_0-9]+ \([^ ]*/fuzz_[a-z_0-9]+\+0x[0-9a-f]+\)' | head -1)"
  [[ "$frame" =~ $2 ]]
}
# fuzz_one TARGET: fuzzes TARGET for SECS seconds; its report goes to $BUILD/fuzz_TARGET.out
# and its exit status says whether it found something.
fuzz_one() {
  local t="$1" status=0
  corpus="$BUILD/corpus/$t"      # grows while fuzzing; the seeds in the repo stay as they are
  findings="$BUILD/findings/$t"
  mkdir -p "$corpus" "$findings"
  dict=()
  [ -f "fuzz/$t.dict" ] && dict=(-dict="fuzz/$t.dict")
  # fuzz/<target>.lsan: LeakSanitizer suppressions for leaks of an
  # uninstrumented library (see the file for what they hide).
  lsan=()
  [ -f "fuzz/$t.lsan" ] && lsan=(env "LSAN_OPTIONS=suppressions=$PWD/fuzz/$t.lsan:print_suppressions=0")
  # fuzz/<target>.upstream: a regex naming an uninstrumented library (e.g.
  # libhdf5). An invalid read whose innermost frame lies there is a bug of that
  # library, not of shardkit: its input goes to $findings/upstream/, the count
  # is reported, and fuzzing goes on for the rest of the time. Anything else
  # (shardkit frames, leaks, timeouts, OOMs) fails the run as before.
  upstream=""
  [ -f "fuzz/$t.upstream" ] && upstream="$(grep -v '^#' "fuzz/$t.upstream" | head -1)"
  echo "== fuzz_$t: ${SECS}s"
  end=$(( $(date +%s) + SECS ))
  runs=0 units=0 upstream_n=0
  : > "$BUILD/fuzz_$t.log"
  while :; do
    left=$(( end - $(date +%s) ))
    [ "$left" -gt 0 ] || break
    ls "$findings" > "$BUILD/fuzz_$t.before" 2>/dev/null
    if "${lsan[@]}" "$BUILD/fuzz/fuzz_$t" "$corpus" "fuzz/corpus/$t" "${dict[@]}" -max_total_time="$left" \
        -timeout=20 -rss_limit_mb=2048 -max_len=65536 -artifact_prefix="$findings/" -print_final_stats=1 \
        > "$BUILD/fuzz_$t.run.log" 2>&1; then
      ok=1
    else
      ok=0
    fi
    cat "$BUILD/fuzz_$t.run.log" >> "$BUILD/fuzz_$t.log"
    runs=$((runs + 1))
    # (A crash report prints the stats twice: the last count is the run's.)
    units=$((units + $(grep -oP 'stat::number_of_executed_units: *\K[0-9]+' "$BUILD/fuzz_$t.run.log" | tail -1 || echo 0)))
    [ "$ok" = 1 ] && break
    artifact="$(ls "$findings" | grep -vxF -f "$BUILD/fuzz_$t.before" | grep -v '^upstream$' | head -1 || true)"
    if [ -n "$upstream" ] && [ -n "$artifact" ] && upstream_crash "$BUILD/fuzz_$t.run.log" "$upstream"; then
      mkdir -p "$findings/upstream"
      mv "$findings/$artifact" "$findings/upstream/"
      cp "$BUILD/fuzz_$t.run.log" "$findings/upstream/$artifact.log"
      upstream_n=$((upstream_n + 1))
      echo "fuzz_$t: a bug in $upstream itself (not shardkit): $findings/upstream/$artifact" >&2
      continue
    fi
    echo "fuzz_$t: FINDING (see $BUILD/fuzz_$t.log and $findings/)" >&2
    tail -60 "$BUILD/fuzz_$t.run.log" >&2
    status=1
    break
  done
  echo "fuzz_$t: $runs run(s), $units executions, $upstream_n input(s) that crash $upstream itself" |
    sed 's/, 0 input(s) that crash .*$//'
  grep -E "stat::peak_rss_mb" "$BUILD/fuzz_$t.log" | tail -1 | sed "s/^/fuzz_$t: /"
  rm -f "$BUILD/fuzz_$t.before" "$BUILD/fuzz_$t.run.log"
  return $status
}
# The targets run $(nproc) at a time (libFuzzer's process uses one core), each for its own
# SECS seconds; their reports are printed in the targets' order.
jobs_n="$(nproc)"
pids=()
names=()
for t in $TARGETS; do
  while [ "$(jobs -rp | wc -l)" -ge "$jobs_n" ]; do sleep 0.2; done
  fuzz_one "$t" > "$BUILD/fuzz_$t.out" 2>&1 &
  pids+=($!)
  names+=("$t")
done
status=0
for k in "${!pids[@]}"; do
  wait "${pids[$k]}" || status=1
  cat "$BUILD/fuzz_${names[$k]}.out"
done
exit $status
