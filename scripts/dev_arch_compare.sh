#!/usr/bin/env bash
# The second architecture step, before and after, on this (2-core) machine: the tree before
# it (.gl/base.tar, made by `git archive 89c1698 -o .gl/base.tar`) built beside this
# one's build/, then the same commands with the old and the new `shardkit`, alternated,
# ROUNDS times (default 7): random reads (`bench`, 1 and 2 threads, views and copies) of
# tar shards, LMDB and HDF5, the CPU loader (`bench --loader`, 2 threads), and `convert` of
# the folder to tar shards against `tar cf` of it. Prints the medians, new / old.
#   scripts/dev_arch_compare.sh [WORK_DIR]      (default /tmp/arch-dev; needs build/ built)
set -euo pipefail
cd "$(dirname "$0")/.."
W="${1:-/tmp/arch-dev}"
NEW="$PWD/build/tools/shardkit"
OLD="$W/old/build/tools/shardkit"
. scripts/ccache-env.sh
if [ ! -x "$OLD" ]; then
  mkdir -p "$W/old" && tar -xf .gl/base.tar -C "$W/old"
  cmake -S "$W/old" -B "$W/old/build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSHARDKIT_BUILD_TESTS=OFF \
    -DSHARDKIT_BUILD_BENCH=OFF -DSHARDKIT_BUILD_PYTHON=OFF -DSHARDKIT_WITH_CUDA=OFF >/dev/null
  cmake --build "$W/old/build" -j "$(nproc)" --target shardkit_cli >/dev/null
fi
if [ ! -d "$W/imgs" ]; then
  /usr/bin/python3 ../shared/corpus/make_corpus.py "$W/imgs" --count 1500 --seed 1 >/dev/null
  "$NEW" convert "$W/imgs" "wds:$W/wds/t-%06d.tar" --shard-size 32MB >/dev/null
  "$NEW" convert "$W/imgs" "lmdb:$W/t.lmdb" >/dev/null
  "$NEW" convert "$W/imgs" "$W/t.h5" >/dev/null
fi
OUT="$W/out"; rm -rf "$OUT"; mkdir -p "$OUT"
secs() { local s; s=$(date +%s.%N); "$@" >/dev/null 2>&1; echo "$(date +%s.%N) - $s" | bc; }
for r in $(seq 1 "${ROUNDS:-7}"); do
  for v in old new; do
    B=$OLD; [ $v = new ] && B=$NEW
    "$B" bench "$W/wds/t.manifest.json" "$W/t.lmdb" "$W/t.h5" --threads 1,2 --samples 20000 --no-floor > "$OUT/read-$v-$r.txt" 2>&1
    "$B" bench "$W/wds/t.manifest.json" --loader --threads 2 --batch-size 64 --batches 40 > "$OUT/loader-$v-$r.txt" 2>&1
    rm -rf "$W/cv"
    echo "$v $(secs "$B" convert "$W/imgs" "wds:$W/cv/t-%06d.tar" --shard-size 64MB)" >> "$OUT/convert.txt"
  done
  rm -f "$W/tarcf.tar"
  echo "tar $(secs tar cf "$W/tarcf.tar" -C "$W" imgs)" >> "$OUT/convert.txt"
done
/usr/bin/python3 scripts/arch_compare.py "$OUT"
/usr/bin/python3 - "$OUT/convert.txt" <<'PY'
import collections, statistics, sys
d = collections.defaultdict(list)
for line in open(sys.argv[1]):
    k, v = line.split()
    d[k].append(float(v))
m = {k: statistics.median(v) for k, v in d.items()}
print("convert of 1500 images to tar shards, median seconds: old %.2f, new %.2f (new/old time %.2f); "
      "x tar cf: old %.2f, new %.2f" % (m["old"], m["new"], m["new"] / m["old"], m["tar"] / m["old"], m["tar"] / m["new"]))
PY
