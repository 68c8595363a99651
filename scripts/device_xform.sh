#!/usr/bin/env bash
# Issue 41's figures on the GPU machine (16 cores), and the whole python/tests suite there:
#   test   python/tests with the machine's pip torch (failures printed by name) and the
#          fresh-interpreter import-order check;
#   bench  scripts/bench_transform.sh on the 8,000-image corpus at 16 threads: convert
#          --resize short:256 --encode jpeg:90 against a PIL ProcessPoolExecutor, the CPU
#          loader on the resized shards against the original, --dedup against plain;
#   train  scripts/bench_ddp.py (1 GPU, batch 256, bf16, channels_last): ResNet-18 and
#          ResNet-50 from synthetic data (the ceiling), decoder="auto" and decoder="cpu",
#          on the resized shards and on the original ones;
#   mix    scripts/bench_mixture.sh at 16 threads (issue 42): the loader over a mixture of
#          tar shards, LMDB and MDS against one tar dataset, and the elastic resume bench;
#   all    the four.
# There (carry .deps .corpus):  source .deps/unpack.sh && bash scripts/device_xform.sh [test|bench|train|mix|all]
# The build and the corpus stay in /tmp/xf while the machine is warm. Env: STEPS (60), WARMUP (10).
set -uo pipefail
stage=${1:-all}
cd "$(dirname "$0")/.."
T0=$(date +%s)
say() { echo "== device_xform [$(( $(date +%s) - T0 ))s] $*"; }
[[ "${CMAKE_PREFIX_PATH:-}" == */opt/deps/* ]] || source .deps/unpack.sh
export PATH=/usr/local/cuda/bin:$PATH
OUTDIR=/tmp/xf-out; mkdir -p "$OUTDIR"
[ -n "${OUT:-}" ] && trap 'tar -czf "$OUT/device_xform_logs.tgz" -C "$OUTDIR" . 2>/dev/null' EXIT
W=/tmp/xf; mkdir -p "$W"
B=$W/build
PY=$(command -v python3)
SK=$B/tools/shardkit
echo "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); $(nproc) cores; $($PY -c 'import torch; print("torch", torch.__version__)')"

if [ ! -x "$SK" ]; then
  say "build (CUDA + nvJPEG) and the corpus (16 x 500 images)"
  [ -d "$W/imgs" ] || (for k in $(seq 0 15); do $PY .corpus/make_corpus.py "$W/imgs" --count 500 --seed "$k" >/dev/null 2>&1 & done; wait) &
  corpus=$!
  cmake -S . -B "$B" -DCMAKE_BUILD_TYPE=Release -DPython3_EXECUTABLE="$PY" -DSHARDKIT_WITH_CUDA=ON -DSHARDKIT_WITH_REMOTE=OFF \
    -DCMAKE_CUDA_ARCHITECTURES=90 > "$OUTDIR/cfg.log" 2>&1 || { tail -30 "$OUTDIR/cfg.log"; exit 1; }
  grep "shardkit:" "$OUTDIR/cfg.log"
  cmake --build "$B" -j"$(nproc)" --target shardkit_cli _shardkit sk_mixture_bench > "$OUTDIR/build.log" 2>&1 \
    || { grep -E "error" -A5 "$OUTDIR/build.log" | head -60; exit 1; }
  wait $corpus
fi
say "corpus: $(find "$W/imgs" -type f | wc -l) images"
export PYTHONPATH=$B/python
rc=0
if [ "$stage" = test ] || [ "$stage" = all ]; then
  say "python/tests"
  timeout 400 $PY -m pytest -q -p no:cacheprovider -rfs python/tests > "$OUTDIR/pytest.log" 2>&1 || rc=1
  grep -E "^(FAILED|ERROR)" "$OUTDIR/pytest.log" | cut -c1-400; grep -E "passed|failed" "$OUTDIR/pytest.log" | tail -2
  grep -E "^E  " "$OUTDIR/pytest.log" | head -30 | cut -c1-300
  for order in "import shardkit; import torch" "import torch; import shardkit"; do
    $PY -c "$order; print('ok', shardkit.HAVE_WEBP, shardkit.HAVE_AVIF, shardkit.HAVE_JXL)" > "$OUTDIR/imp.log" 2>&1
    echo "[$order] rc=$? $(tail -1 "$OUTDIR/imp.log")"
  done
fi
if [ "$stage" = bench ] || [ "$stage" = all ]; then
  say "bench_transform.sh, 16 threads"
  rm -rf "$W/bo"
  PY=$PY SK=$SK BENCH_OUT=$W/bo bash scripts/bench_transform.sh "$W/imgs" --threads "$(nproc)" --runs 2 2>&1 | tee "$OUTDIR/bench_transform.txt"
fi
if [ "$stage" = train ] || [ "$stage" = all ]; then
  [ -f "$W/small/t.manifest.json" ] || $SK convert "$W/imgs" "wds:$W/small/t-%06d.tar" --resize short:256 --encode jpeg:90 --shard-size 64MB > /dev/null
  [ -f "$W/orig/t.manifest.json" ] || $SK convert "$W/imgs" "wds:$W/orig/t-%06d.tar" --shard-size 64MB > /dev/null
  du -sh "$W/small" "$W/orig"
  for ds in small orig; do
    feeds=synthetic,shardkit,shardkit_cpu; [ $ds = orig ] && feeds=shardkit,shardkit_cpu
    say "bench_ddp.py on the $ds shards ($feeds)"
    $PY scripts/bench_ddp.py --shards "$W/$ds/t.manifest.json" --folder "$W/imgs" --gpus 1 --models resnet18,resnet50 \
      --feeds "$feeds" --steps "${STEPS:-60}" --warmup "${WARMUP:-10}" --workdir "$W" > "$OUTDIR/train-$ds.txt" 2>&1 || rc=1
    grep -vE '^\{' "$OUTDIR/train-$ds.txt" | tail -12
  done
fi
if [ "$stage" = mix ] || [ "$stage" = all ]; then
  say "bench_mixture.sh, 16 threads"
  SK=$SK MIXBENCH=$B/bench/sk_mixture_bench bash scripts/bench_mixture.sh "$W/imgs" --threads "$(nproc)" --rounds 3 \
    2>&1 | tee "$OUTDIR/bench_mixture.txt" | grep -v "^shardkit: chose"
fi
say "done rc=$rc"
exit $rc
