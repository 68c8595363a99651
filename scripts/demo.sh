#!/usr/bin/env bash
# The main job on a small built-in example, from a clean clone on Debian 12:
# installs missing packages, builds, makes a sample image folder (200 JPEGs in
# 4 classes, with a grayscale and a progressive JPEG), converts it to tar shards
# and shows `shardkit info`.
#   scripts/demo.sh [WORK_DIR]       (default: out/demo)
set -euo pipefail
cd "$(dirname "$0")/.."
WORK="${1:-out/demo}"
scripts/install-deps.sh
. scripts/ccache-env.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j "$(nproc)" --target shardkit_cli
SK=build/tools/shardkit
rm -rf "$WORK"
mkdir -p "$WORK"

echo "== making a sample image folder in $WORK/images"
/usr/bin/python3 - "$WORK/images" <<'PY'
import os, sys, random
from PIL import Image
root = sys.argv[1]
rng = random.Random(0)
classes = ["apple", "banana", "cherry", "date"]
for c, name in enumerate(classes):
    os.makedirs(os.path.join(root, name), exist_ok=True)
    for i in range(50):
        w, h = rng.randint(48, 160), rng.randint(48, 160)
        im = Image.new("RGB", (w, h), (60 * c, rng.randint(0, 255), rng.randint(0, 255)))
        for _ in range(20):  # a few rectangles so the JPEGs are not trivial
            x, y = rng.randrange(w), rng.randrange(h)
            im.paste((rng.randint(0, 255),) * 3, (x, y, min(w, x + 12), min(h, y + 12)))
        path = os.path.join(root, name, f"{name}_{i:04d}.JPEG")  # ImageNet-style upper-case extension
        if c == 1 and i == 0:
            im.convert("L").save(path, "JPEG", quality=90)        # grayscale
        elif c == 2 and i == 0:
            im.save(path, "JPEG", quality=90, progressive=True)   # progressive
        else:
            im.save(path, "JPEG", quality=rng.randint(75, 95))
print(f"{4 * 50} images in {len(classes)} classes")
PY

echo "== shardkit info $WORK/images"
$SK info "$WORK/images"
echo "== shardkit convert $WORK/images wds:$WORK/shards/train-%06d.tar --samples-per-shard 64"
$SK convert "$WORK/images" "wds:$WORK/shards/train-%06d.tar" --samples-per-shard 64
echo "== shardkit info $WORK/shards/train.manifest.json"
$SK info "$WORK/shards/train.manifest.json"
echo "== shardkit shard $WORK/shards/train.manifest.json $WORK/even/part-%06d.tar --num-shards 3 --shuffle --seed 1"
$SK shard "$WORK/shards/train.manifest.json" "$WORK/even/part-%06d.tar" --num-shards 3 --shuffle --seed 1
echo "== shardkit convert $WORK/images lmdb:$WORK/train.lmdb; and $WORK/train.h5"
$SK convert "$WORK/images" "lmdb:$WORK/train.lmdb"
$SK convert "$WORK/images" "$WORK/train.h5"
echo "== shardkit verify: every checksum, count and key, and sample by sample against the source folder"
$SK verify "$WORK/shards/train.manifest.json" --against "$WORK/images"
$SK verify "$WORK/train.lmdb" --against "$WORK/images"
$SK verify "$WORK/train.h5" --against "$WORK/images" --decode
echo "== shardkit bench: random-read latency of the folder (one file per sample) against the packed formats"
$SK bench "$WORK/images" "$WORK/shards/train.manifest.json" "$WORK/train.lmdb" "$WORK/train.h5" --samples 2000 \
  --plot "$WORK/bench.svg"
echo "(latency CDF and throughput chart: $WORK/bench.svg)"
echo "== shardkit bench --loader: the streaming reader (RandomResizedCrop 224, flip, normalize, batch 32)"
$SK bench "$WORK/shards/train.manifest.json" --loader --batch-size 32 --threads "$(nproc)"
