#!/usr/bin/env bash
# Issue 17's goal: converting a seed-style LMDB of decoded arrays (the GPU-utilisation
# article's recipe: keys f"{idx}", values pickle.dumps((cv2.imread(path), label))) to
# tar shards (.npy) at >= 0.8x the rate of `tar cf` over the same bytes.
#   scripts/bench_wild_lmdb.sh [N_IMAGES] [SIDE] [SHARDKIT_BIN] [WORKDIR]
# (defaults: 2000 images of 256x256x3, build/tools/shardkit, $TMPDIR). Prints a table.
set -euo pipefail
N="${1:-2000}"
SIDE="${2:-256}"
BIN="${3:-build/tools/shardkit}"
WORK="$(mktemp -d "${4:-${TMPDIR:-/tmp}}/bench-wild-XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
/usr/bin/python3 - "$WORK" "$N" "$SIDE" <<'PY'
import os, pickle, sys
import lmdb, numpy as np
work, n, side = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = np.random.default_rng(0)
base = rng.integers(0, 256, (side, side, 3), dtype=np.uint8)
env = lmdb.open(f"{work}/seed.lmdb", map_size=1 << 40)
os.makedirs(f"{work}/npy")
with env.begin(write=True) as txn:
    for idx in range(n):
        img = np.roll(base, idx, axis=1)  # a decoded BGR uint8 array, as cv2.imread gives
        txn.put(f"{idx}".encode(), pickle.dumps((img, idx % 1000)))
        np.save(f"{work}/npy/{idx}.npy", img)  # the same bytes as files, for tar cf
        with open(f"{work}/npy/{idx}.cls", "w") as f:
            f.write(str(idx % 1000))
env.close()
PY
sync
bytes=$(du -sb "$WORK/npy" | cut -f1)
# Warm both sources into the page cache, then time each twice and keep the best.
cat "$WORK/seed.lmdb/data.mdb" > /dev/null
tar cf /dev/null -C "$WORK" npy
best_tar=999999; best_sk=999999
for rep in 1 2; do
  rm -f "$WORK/out.tar"
  t0=$(date +%s.%N); tar cf "$WORK/out.tar" -C "$WORK" npy; t1=$(date +%s.%N)
  best_tar=$(python3 -c "print(min($best_tar, $t1 - $t0))")
  rm -rf "$WORK/shards"
  t0=$(date +%s.%N); "$BIN" convert "lmdb:$WORK/seed.lmdb" "wds:$WORK/shards/s-%06d.tar" --no-index > /dev/null; t1=$(date +%s.%N)
  best_sk=$(python3 -c "print(min($best_sk, $t1 - $t0))")
done
out_bytes=$(du -sb "$WORK/shards" | cut -f1)
python3 - "$N" "$SIDE" "$bytes" "$out_bytes" "$best_tar" "$best_sk" <<'PY'
import sys
n, side, b, ob, tt, ts = sys.argv[1:]
b, ob, tt, ts = int(b), int(ob), float(tt), float(ts)
print(f"{'what':<44} {'seconds':>8} {'MB/s':>8}")
print(f"{'tar cf (npy files, ' + str(b >> 20) + ' MiB)':<44} {tt:8.3f} {b / tt / 1e6:8.1f}")
print(f"{'shardkit convert lmdb(pickle) -> wds .npy':<44} {ts:8.3f} {ob / ts / 1e6:8.1f}")
print(f"ratio (shardkit MB/s / tar MB/s): {(ob / ts) / (b / tt):.2f}  (goal >= 0.8; {n} images {side}x{side}x3)")
PY
