#!/usr/bin/env bash
# Issue 13's check on the GPU machine, in one call: builds the commit before the
# architecture step (from .gl/base.tar, made here by
#   git archive c165097 -o .gl/base.tar) and this tree side by side, then
#   test    the GPU tests (CUDA + nvJPEG) and python/tests with the machine's pip torch,
#           including the fresh-interpreter import-order tests;
#   bench   `shardkit bench` (views, copies) and `shardkit bench --loader` with the old
#           and the new binary on the same files, alternated, three rounds (ROUNDS=N), then
#           a table of medians, new / old (scripts/arch_compare.py).
# There (carry .deps .corpus .gl):  source .deps/unpack.sh && bash scripts/device_arch.sh [test|bench|all]
set -uo pipefail
stage=${1:-all}
cd "$(dirname "$0")/.."
T0=$(date +%s)
say() { echo "== device_arch [$(( $(date +%s) - T0 ))s] $*"; }
[[ "${CMAKE_PREFIX_PATH:-}" == */opt/deps/* ]] || source .deps/unpack.sh
export PATH=/usr/local/cuda/bin:$PATH
OUTDIR=${OUT:-/tmp/arch-out}; mkdir -p "$OUTDIR"
W=/tmp/arch; mkdir -p "$W"
NEW=$W/build-new; OLD=$W/build-old
PY=$(command -v python3)

build_new() {
  [ -x "$NEW/tools/shardkit" ] && return 0
  cmake -S . -B "$NEW" -DCMAKE_BUILD_TYPE=Release -DPython3_EXECUTABLE="$PY" -DSHARDKIT_WITH_CUDA=ON -DSHARDKIT_WITH_REMOTE=OFF \
    -DCMAKE_CUDA_ARCHITECTURES=90 > "$OUTDIR/new_cfg.log" 2>&1 || { tail -30 "$OUTDIR/new_cfg.log"; return 1; }
  grep "shardkit:" "$OUTDIR/new_cfg.log"
  cmake --build "$NEW" -j10 --target shardkit_cli _shardkit test_gpu > "$OUTDIR/new_build.log" 2>&1 \
    || { grep -E "error" -A5 "$OUTDIR/new_build.log" | head -60; return 1; }
}
build_old() {
  [ -x "$OLD/tools/shardkit" ] && return 0
  rm -rf "$W/old-src" && mkdir -p "$W/old-src" && tar -xf .gl/base.tar -C "$W/old-src"
  cmake -S "$W/old-src" -B "$OLD" -DCMAKE_BUILD_TYPE=Release -DSHARDKIT_WITH_CUDA=OFF -DSHARDKIT_BUILD_TESTS=OFF \
    > "$OUTDIR/old_cfg.log" 2>&1 || { tail -30 "$OUTDIR/old_cfg.log"; return 1; }
  cmake --build "$OLD" -j6 --target shardkit_cli > "$OUTDIR/old_build.log" 2>&1 \
    || { grep -E "error" -A5 "$OUTDIR/old_build.log" | head -40; return 1; }
}

say "build old and new"
build_old & bo=$!
build_new; bn=$?
wait $bo; bo=$?
[ $bn -eq 0 ] || { echo "device_arch: new build failed"; exit 1; }
rc=0
if [ "$stage" = test ] || [ "$stage" = all ]; then
  say "GPU tests"
  $NEW/tests/test_gpu > "$OUTDIR/gpu_tests.log" 2>&1 || rc=1
  tail -3 "$OUTDIR/gpu_tests.log"; grep -B3 -A12 FAILED "$OUTDIR/gpu_tests.log" | head -60
  say "python/tests with $($PY -c 'import torch; print("torch", torch.__version__)')"
  PYTHONPATH=$NEW/python timeout 300 $PY -m pytest -q -p no:cacheprovider -rs python/tests > "$OUTDIR/pytest.log" 2>&1 || rc=1
  grep -E "passed|failed|SKIPPED|FAILED" "$OUTDIR/pytest.log" | tail -20
  for order in "import shardkit; import torch" "import torch; import shardkit"; do
    PYTHONPATH=$NEW/python $PY -c "$order; print('ok')" > "$OUTDIR/imp.log" 2>&1; echo "[$order] rc=$? $(tail -1 "$OUTDIR/imp.log")"
  done
  nm -D --defined-only -C "$NEW"/lib/libshardkit.so.0 | wc -l | sed 's/^/exported symbols: /'
fi
if [ "$stage" = bench ] || [ "$stage" = all ]; then
  [ $bo -eq 0 ] || { echo "device_arch: old build failed"; exit 1; }
  if [ ! -d "$W/imgs" ]; then
    say "corpus: 16 x make_corpus.py --count 500"
    for k in $(seq 0 15); do $PY .corpus/make_corpus.py "$W/imgs" --count 500 --seed "$k" >/dev/null 2>&1 & done; wait
    $NEW/tools/shardkit convert "$W/imgs" "wds:$W/wds/t-%06d.tar" --shard-size 64MB > /dev/null
    $NEW/tools/shardkit convert "$W/imgs" "lmdb:$W/t.lmdb" > /dev/null
    $NEW/tools/shardkit convert "$W/imgs" "$W/t.h5" > /dev/null
  fi
  DS=("$W/wds/t.manifest.json" "$W/t.lmdb" "$W/t.h5")
  for r in $(seq 1 "${ROUNDS:-3}"); do
    for v in old new; do
      B=$W/build-$v
      say "round $r: $v read bench"
      $B/tools/shardkit bench "${DS[@]}" --threads 1,16 --samples 40000 --no-floor > "$OUTDIR/read-$v-$r.txt" 2>&1
      say "round $r: $v loader bench"
      $B/tools/shardkit bench "${DS[0]}" --loader --threads 16 --batch-size 256 --batches 120 > "$OUTDIR/loader-$v-$r.txt" 2>&1
    done
  done
  say "summary: median over rounds of samples/s (read) and images/s (loader), new / old"
  $PY scripts/arch_compare.py "$OUTDIR" | tee "$OUTDIR/summary.txt"
fi
say "done rc=$rc"
exit $rc
