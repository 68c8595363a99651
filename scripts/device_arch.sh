#!/usr/bin/env bash
# Issue 13's check on the GPU machine, in one call: builds the commit before the
# architecture step (from .gl/base.tar, made here by
#   git archive 89c1698 -o .gl/base.tar for the second step) and this tree side by side, then
#   test    the GPU tests (CUDA + nvJPEG) and python/tests (PYTESTS: some of its files) with
#           the machine's pip torch, including the fresh-interpreter import-order tests;
#   bench   `shardkit bench` (views, copies) and `shardkit bench --loader` with the old
#           and the new binary on the same files, alternated, three rounds (ROUNDS=N), then
#           a table of medians, new / old (scripts/arch_compare.py).
#   gpu     the GPU feed: shardkit_gpu_bench (copy path and GPU decode path) of the old
#           tree built with CUDA and of this one, alternated, two rounds (GPU_ROUNDS=N),
#           then the medians of images/s, new / old.
#   device  test, then gpu (one machine start for both).
# There (carry .deps .corpus .gl):  source .deps/unpack.sh && bash scripts/device_arch.sh [test|bench|gpu|device|all]
set -uo pipefail
stage=${1:-all}
cd "$(dirname "$0")/.."
T0=$(date +%s)
say() { echo "== device_arch [$(( $(date +%s) - T0 ))s] $*"; }
[[ "${CMAKE_PREFIX_PATH:-}" == */opt/deps/* ]] || source .deps/unpack.sh
export PATH=/usr/local/cuda/bin:$PATH
# Logs go to one folder, packed into $OUT/device_arch_logs.tgz at the end (the device
# returns at most 8 files).
OUTDIR=/tmp/arch-out; mkdir -p "$OUTDIR"
[ -n "${OUT:-}" ] && trap 'tar -czf "$OUT/device_arch_logs.tgz" -C "$OUTDIR" . 2>/dev/null' EXIT
W=/tmp/arch; mkdir -p "$W"
NEW=$W/build-new; OLD=$W/build-old
PY=$(command -v python3)

build_new() {
  [ -x "$NEW/tools/shardkit" ] && return 0
  cmake -S . -B "$NEW" -DCMAKE_BUILD_TYPE=Release -DPython3_EXECUTABLE="$PY" -DSHARDKIT_WITH_CUDA=ON -DSHARDKIT_WITH_REMOTE=OFF \
    -DCMAKE_CUDA_ARCHITECTURES=90 > "$OUTDIR/new_cfg.log" 2>&1 || { tail -30 "$OUTDIR/new_cfg.log"; return 1; }
  grep "shardkit:" "$OUTDIR/new_cfg.log"
  cmake --build "$NEW" -j10 --target shardkit_cli _shardkit test_gpu shardkit_gpu_bench > "$OUTDIR/new_build.log" 2>&1 \
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

OLDGPU=$W/build-oldgpu
build_oldgpu() {  # the old tree with CUDA: its GPU benchmark only
  [ -x "$OLDGPU/shardkit_gpu_bench" ] || [ -x "$OLDGPU/lib/shardkit_gpu_bench" ] && return 0
  [ -d "$W/old-src" ] || { mkdir -p "$W/old-src" && tar -xf .gl/base.tar -C "$W/old-src"; }
  cmake -S "$W/old-src" -B "$OLDGPU" -DCMAKE_BUILD_TYPE=Release -DSHARDKIT_WITH_CUDA=ON -DSHARDKIT_BUILD_TESTS=OFF \
    -DSHARDKIT_WITH_REMOTE=OFF -DCMAKE_CUDA_ARCHITECTURES=90 > "$OUTDIR/oldgpu_cfg.log" 2>&1 || { tail -30 "$OUTDIR/oldgpu_cfg.log"; return 1; }
  cmake --build "$OLDGPU" -j6 --target shardkit_gpu_bench > "$OUTDIR/oldgpu_build.log" 2>&1 \
    || { grep -E "error" -A5 "$OUTDIR/oldgpu_build.log" | head -40; return 1; }
}
make_corpus() {
  [ -d "$W/imgs" ] && return 0
  say "corpus: 16 x make_corpus.py --count 500"
  for k in $(seq 0 15); do $PY .corpus/make_corpus.py "$W/imgs" --count 500 --seed "$k" >/dev/null 2>&1 & done; wait
}

say "build old and new"
case "$stage" in
  gpu | device) build_oldgpu & bo=$! ;;
  # (ALSO_OLD=1: the test stage builds the old tree too, for a bench stage right after it
  # on the same machine.)
  test) if [ -n "${ALSO_OLD:-}" ]; then build_old & else (true) & fi; bo=$! ;;
  *) build_old & bo=$! ;;
esac
build_new; bn=$?
wait $bo; bo=$?
[ $bn -eq 0 ] || { echo "device_arch: new build failed"; exit 1; }
rc=0
if [ "$stage" = test ] || [ "$stage" = device ] || [ "$stage" = all ]; then
  say "GPU tests"
  $NEW/tests/test_gpu > "$OUTDIR/gpu_tests.log" 2>&1 || rc=1
  tail -3 "$OUTDIR/gpu_tests.log"; grep -B3 -A12 FAILED "$OUTDIR/gpu_tests.log" | head -60
  say "python/tests with $($PY -c 'import torch; print("torch", torch.__version__)')"
  PYTHONPATH=$NEW/python timeout 400 $PY -m pytest -q -p no:cacheprovider -rfs ${PYTESTS:-python/tests} > "$OUTDIR/pytest.log" 2>&1 || rc=1
  grep -E "^FAILED" "$OUTDIR/pytest.log" | cut -c1-300; grep -E "passed|failed" "$OUTDIR/pytest.log" | tail -2
  for order in "import shardkit; import torch" "import torch; import shardkit"; do
    PYTHONPATH=$NEW/python $PY -c "$order; print('ok')" > "$OUTDIR/imp.log" 2>&1; echo "[$order] rc=$? $(tail -1 "$OUTDIR/imp.log")"
  done
  nm -D --defined-only -C "$NEW"/lib/libshardkit.so.0 | wc -l | sed 's/^/exported symbols: /'
fi
if [ "$stage" = bench ] || [ "$stage" = all ]; then
  [ $bo -eq 0 ] || { echo "device_arch: old build failed"; exit 1; }
  if [ ! -d "$W/wds" ]; then
    make_corpus
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
if [ "$stage" = gpu ] || [ "$stage" = device ]; then
  [ $bo -eq 0 ] || { echo "device_arch: old CUDA build failed"; exit 1; }
  make_corpus
  old_bin=$(ls "$OLDGPU"/shardkit_gpu_bench "$OLDGPU"/lib/shardkit_gpu_bench 2>/dev/null | head -1)
  new_bin=$(ls "$NEW"/shardkit_gpu_bench "$NEW"/lib/shardkit_gpu_bench 2>/dev/null | head -1)
  for r in $(seq 1 "${GPU_ROUNDS:-2}"); do
    for v in old new; do
      b=$old_bin; [ $v = new ] && b=$new_bin
      say "round $r: $v GPU feed"
      "$b" "$W/imgs" --modes copy,gpu --epochs 2 > "$OUTDIR/gpu-$v-$r.jsonl" 2> "$OUTDIR/gpu-$v-$r.err" || { tail -5 "$OUTDIR/gpu-$v-$r.err"; rc=1; }
    done
  done
  say "GPU feed: median images/s over rounds, new / old ($(nvidia-smi --query-gpu=name --format=csv,noheader | head -1))"
  $PY - "$OUTDIR" <<'PY' | tee "$OUTDIR/gpu_summary.txt"
import glob, json, os, re, statistics, sys
runs = {}
for path in glob.glob(os.path.join(sys.argv[1], "gpu-*-*.jsonl")):
    v = re.match(r"gpu-(old|new)-\d+\.jsonl", os.path.basename(path)).group(1)
    seen = {}
    for line in open(path):
        try:
            j = json.loads(line)
        except ValueError:
            continue
        if "images_per_s" not in j:
            continue
        # copy_path prints one row per consumer step (0, 0.5x, 1.5x the loader's time).
        k = seen[j["mode"]] = seen.get(j["mode"], -1) + 1
        key = j["mode"] + (" (consumer %d)" % k if j["mode"] == "copy_path" else "")
        runs.setdefault((key, v), []).append(j["images_per_s"])
print("%-50s %12s %12s %8s" % ("mode", "old img/s", "new img/s", "new/old"))
for key in sorted({k for k, _ in runs}):
    o, n = runs.get((key, "old")), runs.get((key, "new"))
    if o and n:
        mo, mn = statistics.median(o), statistics.median(n)
        print("%-50s %12.0f %12.0f %8.2f" % (key, mo, mn, mn / mo))
PY
fi
say "done rc=$rc"
exit $rc
