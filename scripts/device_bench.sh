#!/usr/bin/env bash
# The benchmarks that need the 16-core GPU machine, in one call (device time is short):
# build, an 8000-image corpus, conversions, read latency/throughput (warm and cold, 1..16
# threads), the streaming reader against torchvision's DataLoader, then the GPU benchmark
# (scripts/device_gpu.sh) when CUDA is there. Prints a short table last.
#
# Here, once:   scripts/device-deps.sh && scripts/stage-corpus.sh
# There:        source .deps/unpack.sh && scripts/device_bench.sh      (carry .deps and .corpus)
# Results go to $OUT (or /tmp/skout): *.txt, *.json, *.svg.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/skout}
mkdir -p "$OUT"
T0=$(date +%s)
step() { echo "== $* (t=$(( $(date +%s) - T0 ))s)"; }
NPROC=$(nproc)
B=${BUILD:-build-dev}
W=${WORK:-/tmp/skbench}
COUNT=${COUNT:-500}   # per generator run; 16 runs

step "build ($B)"
cmake -S . -B "$B" -DCMAKE_BUILD_TYPE=Release -DSHARDKIT_BUILD_TESTS=ON -DSHARDKIT_WITH_REMOTE=OFF >"$OUT/cmake.log" 2>&1 || { tail -40 "$OUT/cmake.log"; exit 1; }
cmake --build "$B" -j "$NPROC" >"$OUT/build.log" 2>&1 || { grep -E "error" -A4 "$OUT/build.log" | head -60; exit 1; }
S="$B/tools/shardkit"

step "corpus: 16 x make_corpus.py --count $COUNT"
rm -rf "$W" && mkdir -p "$W"
for k in $(seq 0 15); do python3 .corpus/make_corpus.py "$W/imgs" --count "$COUNT" --seed "$k" 2>/dev/null & done
wait
N=$(find "$W/imgs" -type f | wc -l)
echo "corpus: $N images, $(du -sh "$W/imgs" | cut -f1)"

step "convert"
cat "$W"/imgs/*/* >/dev/null
$S convert "$W/imgs" "wds:$W/wds/train-%06d.tar" --shard-size 64MB | tee "$OUT/convert.txt"
$S convert "$W/imgs" "lmdb:$W/train.lmdb" | tee -a "$OUT/convert.txt"
$S convert "$W/imgs" "$W/train.h5" | tee -a "$OUT/convert.txt"
DS=("$W/imgs" "$W/wds/train.manifest.json" "$W/train.lmdb" "$W/train.h5")

step "read bench, warm, 1..16 threads"
$S bench "${DS[@]}" --threads 1,2,4,8,16 --samples "$N" --plot "$OUT/bench-warm.svg" | tee "$OUT/bench-warm.txt"
$S bench "${DS[@]}" --threads 1,16 --samples "$N" --json > "$OUT/bench-warm.json"

step "read bench, cold"
$S bench "${DS[@]}" --cold --threads 1,16 --samples 4000 --no-floor | tee "$OUT/bench-cold.txt"

step "loader: single-thread ratio and scaling (sk_loader_bench)"
[ -x "$B/bench/sk_loader_bench" ] && "$B/bench/sk_loader_bench" "$W/wds/train.manifest.json" --threads "$NPROC" --repeat 2 | tee "$OUT/loader.txt"

step "loader vs DataLoader (batch 256, RandomResizedCrop 224, flip, normalize, float32 NCHW)"
$S bench "$W/wds/train.manifest.json" --loader --threads "$NPROC" --batch-size 256 --batches 120 | tee "$OUT/loader-bench.txt"
python3 scripts/bench_loader_peer.py "$W/imgs" --workers $((NPROC - 1)) --batch 256 --epochs 3 | tee "$OUT/peer.txt"

if [ -x scripts/device_gpu.sh ] && command -v nvidia-smi >/dev/null; then
  step "GPU (scripts/device_gpu.sh)"
  BUILD="$B" WORK="$W" OUT="$OUT" scripts/device_gpu.sh
fi

step "summary"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/gpu: /'
echo "cpus: $NPROC; corpus: $N images"
grep -E "random-(view|copy) +1 " "$OUT/bench-warm.txt" | awk '$1 ~ /imgs$/ {f[$2] = $4} {r = ($1 ~ /imgs$/ || !f[$2]) ? "" : sprintf("%.1fx lower than the folder", f[$2] / $4); printf "warm 1 thread %-40s %-11s p50 %8s us  %s\n", $1, $2, $4, r}'
grep -E "random-copy +16 " "$OUT/bench-warm.txt" | awk '{printf "warm 16 threads %-38s samples/s %s\n", $1, $10}'
grep -E "images/s|ratio|efficiency" "$OUT/loader.txt" 2>/dev/null | head -8
tail -3 "$OUT/loader-bench.txt" | head -2
grep -E "images/s" "$OUT/peer.txt" | tail -1
