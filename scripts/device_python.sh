#!/usr/bin/env bash
# The Python module on the GPU machine: build it with CUDA, run python/tests (the CUDA
# tests included), then a short ResNet-50 training loop fed by shardkit.Loader vs
# torchvision's ImageFolder DataLoader (scripts/bench_train.py); a short table last.
#
# There, from the repo root (carry .deps and .corpus):
#   source .deps/unpack.sh && bash scripts/device_python.sh
# Env: BUILD (default build-py), WORK (corpus in $WORK/imgs if it exists; default
# /tmp/skpy), OUT (logs; default $BUILD/out), STEPS (30), WARMUP (5), BATCH (256).
# Made to finish in < 8 minutes on the 16-core H200 machine.
set -uo pipefail
cd "$(dirname "$0")/.."
T0=$(date +%s)
say() { echo "== device_python [$(( $(date +%s) - T0 ))s] $*"; }
B=${BUILD:-build-py}
W=${WORK:-/tmp/skpy}
OUTDIR=${OUT:-$B/out}
mkdir -p "$OUTDIR" "$W"
if [[ "${CMAKE_PREFIX_PATH:-}" != */opt/deps/* ]] && [ -f .deps/unpack.sh ]; then
  # shellcheck disable=SC1091
  source .deps/unpack.sh  # not sourced by the caller
fi
export PATH=/usr/local/cuda/bin:$PATH
PY=$(command -v python3)
J=$(nproc)
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tee "$OUTDIR/py_device.txt"
$PY -c "import torch, torchvision; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'torchvision', torchvision.__version__, 'gpu', torch.cuda.is_available())" \
  2>&1 | tee -a "$OUTDIR/py_device.txt"

say "configure ($B, $PY)"
cmake -S . -B "$B" -DCMAKE_BUILD_TYPE=Release -DPython3_EXECUTABLE="$PY" -DSHARDKIT_WITH_CUDA=ON -DSHARDKIT_WITH_REMOTE=OFF \
  -DCMAKE_CUDA_ARCHITECTURES=90 > "$OUTDIR/py_configure.log" 2>&1 || { tail -40 "$OUTDIR/py_configure.log"; exit 1; }
grep -E "shardkit:" "$OUTDIR/py_configure.log"
say "build (_shardkit, shardkit CLI)"
cmake --build "$B" -j"$J" --target _shardkit shardkit_cli > "$OUTDIR/py_build.log" 2>&1 \
  || { grep -E "error" -A5 "$OUTDIR/py_build.log" | head -60; exit 1; }
export PYTHONPATH=$PWD/$B/python${PYTHONPATH:+:$PYTHONPATH}
$PY -c "import shardkit; from shardkit import _shardkit as m; print('shardkit', shardkit.__version__, 'CUDA', m.CUDA_COMPILED, 'nvJPEG', m.NVJPEG_COMPILED, 'devices', m.cuda_device_count(), m.cuda_unavailable_reason())" \
  | tee -a "$OUTDIR/py_device.txt"

say "shardkit beside this torch (issue 13: import shardkit; import torch aborted with pip's torch)"
rc=0
LIB=$(ls "$B"/python/shardkit/libshardkit.so.* | head -1)
echo "exports of $LIB: $(nm -D --defined-only "$LIB" | wc -l), GNU-unique: $(nm -D --defined-only "$LIB" | awk '$2=="u"' | wc -l)" \
  | tee -a "$OUTDIR/py_device.txt"
# This build has CUDA and nvJPEG: check its exports too (ctest's exports_public_api here).
bash tests/exports_test.sh "$LIB" include > "$OUTDIR/py_exports.log" 2>&1 || rc=1
tail -4 "$OUTDIR/py_exports.log" | tee -a "$OUTDIR/py_device.txt"
if $PY -c "import pytest" 2>/dev/null; then
  trc=0
  timeout 200 $PY -m pytest -q -p no:cacheprovider -rs python/tests/test_packaging.py -k torch \
    > "$OUTDIR/py_torch_order.log" 2>&1 || trc=$?
  tail -3 "$OUTDIR/py_torch_order.log" | tee -a "$OUTDIR/py_device.txt"
  # Debian's libprotobuf.so.32 (a dependency) has GNU-unique symbols of its own; torch has its
  # own protobuf. Does loading it first, alone, upset torch? (Recorded either way.)
  for dep in $(ldd "$LIB" | awk '/libprotobuf/{print $3}'); do
    $PY -c "import ctypes, sys; ctypes.CDLL(sys.argv[1]); import torch; torch.ones(2).sum()" "$dep" \
      > /dev/null 2>&1; echo "  CDLL $(basename "$dep") then import torch: exit $?"
  done | tee -a "$OUTDIR/py_device.txt"
  if [ $trc -ne 0 ]; then
    rc=$trc
    grep -E "free\(\)|Abort|exit -?[0-9]+|FAILED" "$OUTDIR/py_torch_order.log" | head -20
    # Which library, loaded alone (RTLD_LOCAL, as ctypes does) before torch, makes it abort?
    for dep in "$LIB" $(ldd "$LIB" | awk '/=> \//{print $3}'); do
      $PY -c "import ctypes, sys; ctypes.CDLL(sys.argv[1]); import torch; torch.ones(2).sum()" "$dep" \
        > /dev/null 2>&1; echo "  CDLL $(basename "$dep") then import torch: exit $?"
    done | tee -a "$OUTDIR/py_device.txt"
  fi
fi

say "pytest python/tests"
if $PY -c "import pytest" 2>/dev/null; then
  timeout 240 $PY -m pytest -q -p no:cacheprovider -rs python/tests > "$OUTDIR/py_pytest.log" 2>&1 || rc=$?
  grep -E "passed|failed|error|SKIPPED|FAILED|Error" "$OUTDIR/py_pytest.log" | tail -40
  [ $rc -ne 0 ] && { echo "device_python: pytest rc=$rc (log: $OUTDIR/py_pytest.log)"; grep -A40 "^_____" "$OUTDIR/py_pytest.log" | head -150; }
else
  rc=3
  echo "device_python: $PY has no pytest module: python/tests NOT run"
fi
CLI=$B/tools/shardkit
if [ ! -d "$W/imgs" ]; then
  say "corpus: 16 x make_corpus.py --count 500"
  rm -rf "$W/imgs.part" && mkdir -p "$W/imgs.part"
  for k in $(seq 0 15); do $PY .corpus/make_corpus.py "$W/imgs.part" --count 500 --seed "$k" > /dev/null 2>&1 & done
  wait
  n=$(find "$W/imgs.part" -type f | wc -l)
  [ "$n" -gt 0 ] || { echo "device_python: no corpus made (is .corpus/ carried? scripts/stage-corpus.sh makes it)"; exit 1; }
  mv "$W/imgs.part" "$W/imgs"
fi
echo "corpus: $(find "$W/imgs" -type f | wc -l) images in $W/imgs"
if [ ! -f "$W/pywds/train.manifest.json" ]; then
  say "convert to tar shards"
  rm -rf "$W/pywds"
  "$CLI" convert "$W/imgs" "wds:$W/pywds/train-%06d.tar" --shard-size 64MB > "$OUTDIR/py_convert.log" 2>&1 \
    || { tail -20 "$OUTDIR/py_convert.log"; exit 1; }
  tail -3 "$OUTDIR/py_convert.log"
fi
SHARDS=$W/pywds/train.manifest.json
[ -f "$SHARDS" ] || SHARDS="wds:$W/pywds/train-{000000..$(printf %06d $(( $(ls "$W"/pywds/train-*.tar | wc -l) - 1 )))}.tar"

say "ResNet-50 training: shardkit vs ImageFolder DataLoader"
brc=0
timeout 300 $PY scripts/bench_train.py --shards "$SHARDS" --folder "$W/imgs" --batch "${BATCH:-256}" \
  --warmup "${WARMUP:-5}" --steps "${STEPS:-30}" --workers $(( J > 1 ? J - 1 : 1 )) \
  > "$OUTDIR/py_bench_train.txt" 2> "$OUTDIR/py_bench_train.err" || brc=$?
grep -E "^GPU:|shardkit.Loader:" "$OUTDIR/py_bench_train.err"
[ $brc -ne 0 ] && tail -30 "$OUTDIR/py_bench_train.err"
grep "^{" "$OUTDIR/py_bench_train.txt"
say "done (pytest rc=$rc, bench rc=$brc)"
echo
cat "$OUTDIR/py_device.txt"
sed -n '/^ResNet-50/,$p' "$OUTDIR/py_bench_train.txt"
exit $(( rc != 0 || brc != 0 ))
