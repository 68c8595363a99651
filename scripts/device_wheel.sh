#!/usr/bin/env bash
# The GPU wheel on the GPU machine: build it (CUDA + nvJPEG) with the torch venv's
# interpreter, install it into that venv, then use it with nothing carried on
# LD_LIBRARY_PATH (the machine's own environment, as before .deps was unpacked): both
# import orders, the fresh-venv test (tests/wheel_test.py), Loader(decoder="cpu") and
# Loader(decoder="gpu") with a /proc/self/maps check, and the ResNet-50 comparison of
# scripts/bench_ddp.py (synthetic ceiling, shardkit_cpu, shardkit auto) from the wheel
# against the same build's tree (PYTHONPATH, carried libraries). A short table last.
#
# There, from the repo root (carry .deps and .corpus):
#   STAGE=build bash scripts/device_wheel.sh     # build + install + checks (~2 min fresh, 16 cores)
#   STAGE=bench bash scripts/device_wheel.sh     # corpus + the two ResNet-50 runs (~2 min)
# (STAGE=all does both.) The script sources .deps/unpack.sh itself, for the build only.
set -uo pipefail
cd "$(dirname "$0")/.."
T0=$(date +%s)
say() { echo "== device_wheel [$(( $(date +%s) - T0 ))s] $*"; }
STAGE=${STAGE:-all}
OUTDIR=${OUT:-/tmp/skwheel}
W=${WORK:-/tmp/skwheel-data}
mkdir -p "$OUTDIR" "$W"
PY=$(command -v python3)
VBIN=$(dirname "$PY")
# The machine's own environment, before anything carried is unpacked.
CLEAN=(env -i "PATH=$VBIN:/usr/local/cuda/bin:/usr/local/bin:/usr/bin:/bin" "HOME=${HOME:-/root}"
       "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}" "TMPDIR=${TMPDIR:-/tmp}")
echo "machine LD_LIBRARY_PATH: '${LD_LIBRARY_PATH:-}'" | tee "$OUTDIR/env.txt"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | tee -a "$OUTDIR/env.txt"
rc=0

if [ "$STAGE" = build ] || [ "$STAGE" = all ]; then
  say "build the GPU wheel (.deps on the paths for the build only)"
  (
    # shellcheck disable=SC1091
    source .deps/unpack.sh >/dev/null
    export PATH=/usr/local/cuda/bin:/opt/deps/usr/bin:$PATH  # nvcc; patchelf from .deps
    rm -rf dist-gpu
    SHARDKIT_BUILD_DIR=$PWD/build-pip SHARDKIT_BUILD_TYPE=Release \
      SHARDKIT_CMAKE_ARGS="-DSHARDKIT_WITH_CUDA=ON -DSHARDKIT_WITH_REMOTE=OFF -DCMAKE_CUDA_ARCHITECTURES=90" \
      "$PY" -m pip wheel --no-build-isolation --no-deps --disable-pip-version-check -v -w dist-gpu . \
      > "$OUTDIR/wheel_build.log" 2>&1
  ) || { grep -E "error|Error" "$OUTDIR/wheel_build.log" | head -40; tail -20 "$OUTDIR/wheel_build.log"; exit 1; }
  grep -E "shardkit wheel:" "$OUTDIR/wheel_build.log" | grep -v bundled | tail -3
  echo "bundled: $(grep -c 'shardkit wheel: bundled' "$OUTDIR/wheel_build.log") libraries" | tee -a "$OUTDIR/env.txt"
  WHL=$(ls dist-gpu/shardkit-*.whl)
  ls -la "$WHL" | tee -a "$OUTDIR/env.txt"
  say "install into the torch venv; everything below runs with nothing carried"
  "${CLEAN[@]}" "$PY" -m pip install --no-deps --force-reinstall --disable-pip-version-check -q "$WHL" || exit 1
  for order in "import shardkit; import torch" "import torch; import shardkit"; do
    "${CLEAN[@]}" "$PY" -c "$order; import shardkit._shardkit as m; assert m.CUDA_COMPILED and m.NVJPEG_COMPILED; \
print('[$order] ok', shardkit.__version__, torch.__version__, shardkit.__file__)" 2>&1 | tail -2 | tee -a "$OUTDIR/env.txt"
    [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
  done
  say "fresh venv (tests/wheel_test.py)"
  "${CLEAN[@]}" "$PY" tests/wheel_test.py "$WHL" 2>&1 | tail -3 | tee -a "$OUTDIR/env.txt"
  [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
  say "Loader cpu and gpu from the wheel, /proc/self/maps"
  "${CLEAN[@]}" "$PY" - "$W/small" <<'PY' 2>&1 | tee -a "$OUTDIR/env.txt"
import os, sys, torch
from PIL import Image  # the probe's own tools, loaded before the snapshot
sys.path.insert(0, "python/build_backend")
from wheel_repair import mapped_libraries as maps, outside_wheel
torch.cuda.init()
before = maps()
import shardkit
root = sys.argv[1]
for c in range(2):
    os.makedirs(f"{root}/imgs/c{c}", exist_ok=True)
    for i in range(40):
        Image.new("RGB", (300 + i, 200 + c), (i * 5, 80, 160)).save(f"{root}/imgs/c{c}/{i:03d}.jpg", quality=90)
shardkit.convert(f"{root}/imgs", f"wds:{root}/wds/t-%06d.tar", overwrite=True)
out = {}
for dec in ("cpu", "gpu"):
    ld = shardkit.Loader(f"{root}/wds/t.manifest.json", batch_size=16, device="cuda:0", decoder=dec, seed=1)
    n = 0
    for images, labels in ld:
        assert images.is_cuda and images.shape[0] == 16, images.shape
        n += images.shape[0]
    out[dec] = (ld.decoder, n, tuple(images.shape))
bad = outside_wheel(maps() - before, os.path.dirname(os.path.dirname(shardkit.__file__)), driver=True)
print("loaders:", out)
print("libraries mapped since import shardkit from outside the wheel:", bad or "none")
sys.exit(1 if bad or out["gpu"][0] != "gpu" else 0)
PY
  [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
fi

if [ "$STAGE" = bench ] || [ "$STAGE" = all ]; then
  if [ ! -d "$W/imgs" ]; then
    say "corpus: 16 x make_corpus.py --count 400"
    rm -rf "$W/imgs.part" && mkdir -p "$W/imgs.part"
    for k in $(seq 0 15); do "$PY" .corpus/make_corpus.py "$W/imgs.part" --count 400 --seed "$k" >/dev/null 2>&1 & done
    wait
    mv "$W/imgs.part" "$W/imgs"
  fi
  if [ ! -f "$W/wds/train.manifest.json" ]; then
    say "convert with the wheel's command"
    "${CLEAN[@]}" "$VBIN/shardkit" convert "$W/imgs" "wds:$W/wds/train-%06d.tar" --shard-size 64MB | tail -1
  fi
  ARGS=(--shards "$W/wds/train.manifest.json" --folder "$W/imgs" --gpus 1 --models resnet50
        --feeds synthetic,shardkit_cpu,shardkit --warmup 10 --steps 40 --workdir "$W")
  say "ResNet-50 from the wheel (nothing carried)"
  "${CLEAN[@]}" timeout 280 "$PY" scripts/bench_ddp.py "${ARGS[@]}" > "$OUTDIR/bench_wheel.txt" 2> "$OUTDIR/bench_wheel.err" || rc=1
  say "ResNet-50 from the build tree (PYTHONPATH=build-pip/python, carried libraries)"
  (
    # shellcheck disable=SC1091
    source .deps/unpack.sh >/dev/null
    PYTHONPATH=$PWD/build-pip/python timeout 280 "$PY" scripts/bench_ddp.py "${ARGS[@]}" \
      > "$OUTDIR/bench_tree.txt" 2> "$OUTDIR/bench_tree.err"
  ) || rc=1
  for f in wheel tree; do
    echo "--- $f"; grep -v "^{" "$OUTDIR/bench_$f.txt" | tail -8
    grep -E "Error|error" "$OUTDIR/bench_$f.err" | tail -5
  done
fi
say "done rc=$rc"
cat "$OUTDIR/env.txt"
exit $rc
