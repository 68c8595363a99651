#!/usr/bin/env bash
# Issue 19 (and issue 13's import-order check) on a GPU machine with 2+ GPUs, in one call:
# build the CUDA module, run the GPU tests and the fresh-interpreter torch import-order
# tests with the machine's pip torch, make the 8,000-image corpus, convert it to tar
# shards, then scripts/bench_ddp.py: DDP training (ResNet-50, ResNet-18) on G = 1 and 2
# GPUs (GPUS=1,2,4,...) from synthetic data, shardkit.Loader and the DataLoader; table last.
# There (carry .deps .corpus):  source .deps/unpack.sh && bash scripts/device_ddp.sh
# Env: GPUS (1,2), MODELS (resnet50,resnet18), FEEDS (synthetic,shardkit,dataloader),
# STEPS (40), WARMUP (10), SKIP_TESTS=1, BENCH_ARGS (e.g. "--timeline --profile"), VARIANTS (below).
set -uo pipefail
cd "$(dirname "$0")/.."
T0=$(date +%s)
say() { echo "== device_ddp [$(( $(date +%s) - T0 ))s] $*"; }
[[ "${CMAKE_PREFIX_PATH:-}" == */opt/deps/* ]] || source .deps/unpack.sh
export PATH=/usr/local/cuda/bin:$PATH
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUTDIR=${OUT:-/tmp/ddp-out}; mkdir -p "$OUTDIR"
W=/tmp/ddp; mkdir -p "$W"
B=$W/build
PY=$(command -v python3)
J=$(nproc)
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader | tee "$OUTDIR/device.txt"
nvidia-smi topo -m 2>/dev/null | head -5 >> "$OUTDIR/device.txt"
echo "$J CPUs; $($PY -c 'import torch; print("torch", torch.__version__, "GPUs", torch.cuda.device_count())')" | tee -a "$OUTDIR/device.txt"

say "build (CUDA + nvJPEG, static CUDA runtime)"
cmake -S . -B "$B" -DCMAKE_BUILD_TYPE=Release -DPython3_EXECUTABLE="$PY" -DSHARDKIT_WITH_CUDA=ON -DSHARDKIT_WITH_REMOTE=OFF \
  -DCMAKE_CUDA_ARCHITECTURES=90 > "$OUTDIR/cfg.log" 2>&1 || { tail -30 "$OUTDIR/cfg.log"; exit 1; }
grep "shardkit:" "$OUTDIR/cfg.log"
[ -d "$W/imgs" ] || (cd "$W" && for k in $(seq 0 15); do $PY "$OLDPWD/.corpus/make_corpus.py" "$W/imgs" --count 500 --seed "$k" >/dev/null 2>&1 & done; wait) &
corpus=$!
cmake --build "$B" -j"$J" --target shardkit_cli _shardkit test_gpu > "$OUTDIR/build.log" 2>&1 \
  || { grep -E "error" -A5 "$OUTDIR/build.log" | head -60; exit 1; }
LIB=$(ls "$B"/python/shardkit/libshardkit.so.* | head -1)
echo "libshardkit NEEDED cuda: $(readelf -d "$LIB" | grep -cE 'NEEDED.*(cudart|nvjpeg)') (0 = static runtime)" | tee -a "$OUTDIR/device.txt"
MODSO=$(ls "$B"/python/shardkit/_shardkit*.so | head -1)
echo "_shardkit exports: $(nm -D --defined-only "$MODSO" | awk '{print $3}' | sort -u | tr '\n' ' ')(PyInit__shardkit only: python/src/module.map); libstdc++: $(readelf -d "$MODSO" | grep -c 'NEEDED.*libstdc++') (0 = linked statically)" | tee -a "$OUTDIR/device.txt"
export PYTHONPATH=$B/python
rc=0
if [ -z "${SKIP_TESTS:-}" ]; then
  say "GPU tests"
  $B/tests/test_gpu > "$OUTDIR/gpu_tests.log" 2>&1 || rc=1
  tail -2 "$OUTDIR/gpu_tests.log"; grep -B3 -A12 FAILED "$OUTDIR/gpu_tests.log" | head -40
  say "import order with pip torch; python/tests/test_cuda.py, test_packaging.py, test_ddp.py"
  for order in "import shardkit; import torch" "import torch; import shardkit"; do
    $PY -c "$order; import torch; x = torch.ones(4, device='cuda'); print('ok', float(x.sum()))" > "$OUTDIR/imp.log" 2>&1
    echo "[$order] rc=$? $(tail -1 "$OUTDIR/imp.log")" | tee -a "$OUTDIR/device.txt"
  done
  if [ "${PYTEST:-1}" = 1 ] || [ "${PYTEST:-1}" = torch ]; then
  if [ "${PYTEST:-1}" = torch ]; then PT=(python/tests/test_packaging.py -k torch); else
    PT=(python/tests/test_cuda.py python/tests/test_packaging.py python/tests/test_ddp.py); fi
  timeout 240 $PY -m pytest -q -p no:cacheprovider -rs "${PT[@]}" > "$OUTDIR/pytest.log" 2>&1 || rc=1
  grep -E "passed|failed|FAILED" "$OUTDIR/pytest.log" | tail -8 | tee -a "$OUTDIR/device.txt"
  grep -E "^(E  |FAILED)" "$OUTDIR/pytest.log" | head -20
  fi
fi
if [ -n "${DIAG:-}" ]; then
  say "import-order diagnostics"
  {
    $PY -X faulthandler -c "import shardkit; print('A shardkit imported', flush=True); import torch; print('B torch imported', flush=True); torch.ones(1, device='cuda'); print('C cuda ok', flush=True)" 2>&1 | head -14
    echo "--- CDLL(libshardkit) then torch: $($PY -c "import ctypes, sys; ctypes.CDLL(sys.argv[1]); import torch; torch.ones(1, device='cuda'); print('ok')" "$LIB" 2>&1 | tail -1)"
    MOD=$(ls "$B"/python/shardkit/_shardkit*.so | head -1)
    echo "--- the extension module alone (no package __init__), then torch: $($PY -c "import importlib.util, sys; s = importlib.util.spec_from_file_location('_shardkit', sys.argv[1]); m = importlib.util.module_from_spec(s); s.loader.exec_module(m); import torch; torch.ones(1, device='cuda'); print('ok')" "$MOD" 2>&1 | tail -1)"
    echo "--- pip CUDA preload alone, then torch: $($PY -c "import ctypes, glob, importlib.util, os; sp = importlib.util.find_spec('nvidia'); [ctypes.CDLL(p) for r in sp.submodule_search_locations for p in sorted(glob.glob(os.path.join(r, '*', 'lib', 'libcudart.so.[0-9]*')))]; import torch; torch.ones(1, device='cuda'); print('ok')" 2>&1 | tail -1)"
    echo "--- pybind11 internals: ours $(grep -m1 -h 'define PYBIND11_INTERNALS_VERSION' /opt/deps/usr/include/pybind11/detail/internals.h /usr/include/pybind11/detail/internals.h 2>/dev/null | head -1); torch's $(grep -rh -m1 'define PYBIND11_INTERNALS_VERSION' "$($PY -c 'import torch, os; print(os.path.dirname(torch.__file__))')/include/pybind11/detail/" 2>/dev/null | head -2 | tr '\n' ' ')"
    echo "--- LD_DEBUG=files, last lines before the crash:"
    LD_DEBUG=files $PY -c "import shardkit; import torch" 2>&1 | grep -E "calling init" | tail -5
  } > "$OUTDIR/diag.txt" 2>&1
  cat "$OUTDIR/diag.txt"
fi
[ "${BENCH:-1}" = 1 ] || { say "done rc=$rc (no benchmark: BENCH=0)"; cat "$OUTDIR/device.txt"; exit $rc; }
wait $corpus
say "corpus: $(find "$W/imgs" -type f | wc -l) images; convert to tar shards"
"$B/tools/shardkit" convert "$W/imgs" "wds:$W/wds/train-%06d.tar" --shard-size 64MB --overwrite > "$OUTDIR/convert.log" 2>&1 \
  || { tail -5 "$OUTDIR/convert.log"; exit 1; }
# VARIANTS: the benchmark once per space-separated environment setting, e.g.
# VARIANTS="SHARDKIT_GPU_SETS=4 SHARDKIT_GPU_SETS=8" (an experiment's knobs, compared in one call).
variants=${VARIANTS:-none}
# A variant's output files are named by it with '=' and other odd characters made '_'
# (the device tool does not bring back a file whose name has '=' in it).
vfile() { printf '%s' "$1" | tr -c 'A-Za-z0-9._-' '_'; }
for v in $variants; do
  say "DDP training benchmark (variant: $v)"
  envv=(); [ "$v" = none ] || envv=("$v")
  f=$(vfile "$v")
  timeout 480 env "${envv[@]}" $PY scripts/bench_ddp.py --shards "$W/wds/train.manifest.json" --folder "$W/imgs" --gpus "${GPUS:-1,2}" \
    --models "${MODELS:-resnet50,resnet18}" --feeds "${FEEDS:-synthetic,shardkit,dataloader}" --steps "${STEPS:-40}" \
    --warmup "${WARMUP:-10}" --workdir "$OUTDIR" ${BENCH_ARGS:-} > "$OUTDIR/ddp-$f.txt" 2> "$OUTDIR/ddp-$f.err" || rc=1
  grep -E "^== |Error|error" "$OUTDIR/ddp-$f.err" | tail -12
done
say "done rc=$rc"
cat "$OUTDIR/device.txt"
for v in $variants; do
  [ "$v" = none ] || echo "-- variant $v"
  sed -n '/^DDP training/,$p' "$OUTDIR/ddp-$(vfile "$v").txt"
done
exit $rc
