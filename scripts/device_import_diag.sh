#!/usr/bin/env bash
# Issue 13 on the GPU machine: why does `import shardkit; import torch` crash with pip's
# torch while `import torch; import shardkit` works? (Found and fixed: python/src/module.map;
# docs/python.md.) Builds the module (as device_ddp.sh does), then: a native backtrace of a
# crash (an LD_PRELOAD'ed SIGSEGV handler that prints every frame's library and symbol),
# trivial pybind11 modules with and without libshardkit linked, and the module's exports.
# There (carry .deps):  source .deps/unpack.sh && bash scripts/device_import_diag.sh
set -uo pipefail
cd "$(dirname "$0")/.."
[[ "${CMAKE_PREFIX_PATH:-}" == */opt/deps/* ]] || source .deps/unpack.sh
export PATH=/usr/local/cuda/bin:$PATH
OUTDIR=${OUT:-/tmp/diag-out}; mkdir -p "$OUTDIR"
W=/tmp/diag; mkdir -p "$W"; B=${BUILD:-$W/build}
PY=$(command -v python3)
if [ -z "${NO_BUILD:-}" ]; then
  cmake -S . -B "$B" -DCMAKE_BUILD_TYPE=Release -DPython3_EXECUTABLE="$PY" -DSHARDKIT_WITH_CUDA=ON -DSHARDKIT_WITH_REMOTE=OFF \
    -DCMAKE_CUDA_ARCHITECTURES=90 > "$OUTDIR/cfg.log" 2>&1 || { tail -30 "$OUTDIR/cfg.log"; exit 1; }
  grep "shardkit:" "$OUTDIR/cfg.log"
  cmake --build "$B" -j"$(nproc)" --target shardkit_cli _shardkit > "$OUTDIR/build.log" 2>&1 \
    || { grep -E "error" -A5 "$OUTDIR/build.log" | head -40; exit 1; }
fi
MOD=$(ls "$B"/python/shardkit/_shardkit*.so | head -1)
LIB=$(ls "$B"/python/shardkit/libshardkit.so.* | head -1)
gcc -O1 -shared -fPIC -o "$W/segv.so" scripts/segv_backtrace.c || echo "segv.so did not build"
LOADMOD="import importlib.util, sys; s = importlib.util.spec_from_file_location('_shardkit', sys.argv[1]); m = importlib.util.module_from_spec(s); s.loader.exec_module(m)"
TORCH="import torch; torch.ones(1, device='cuda'); print('ok')"
try() {  # try LABEL ENV... -- PYTHON-ARGS
  local label=$1; shift
  local out; out=$(env "$@" 2>&1 | tail -1)
  printf '%-58s %s\n' "$label" "$out"
}
{
echo "torch $($PY -c 'import torch; print(torch.__version__)'), python $($PY -V 2>&1), gdb: $(command -v gdb || echo none)"
echo "=== backtrace of import shardkit; import torch"
PYTHONPATH=$B/python LD_PRELOAD=$W/segv.so $PY -c "import shardkit; import torch; print('no crash')" 2>&1 | grep -E "NATIVE|no crash|Error" | head -40
echo "=== trivial modules"
PB=$($PY -m pybind11 --includes 2>/dev/null || echo "-I$($PY -c 'import torch,os;print(os.path.dirname(torch.__file__))')/include $(python3-config --includes)")
SUF=$($PY -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")
mkdir -p "$W/triv"
cat > "$W/triv/triv.cc" <<'EOF'
#include <pybind11/pybind11.h>
PYBIND11_MODULE(triv, m) { m.attr("x") = 1; }
EOF
cat > "$W/triv/trivsk.cc" <<'EOF'
#include <pybind11/pybind11.h>
#include "shardkit/version.h"
PYBIND11_MODULE(trivsk, m) { m.attr("x") = shardkit::Version(); }
EOF
cat > "$W/triv/capi.c" <<'EOF'
#include <Python.h>
static struct PyModuleDef d = {PyModuleDef_HEAD_INIT, "capi", 0, -1, 0};
PyMODINIT_FUNC PyInit_capi(void) { return PyModule_Create(&d); }
EOF
g++ -O2 -shared -fPIC -fvisibility=hidden $PB "$W/triv/triv.cc" -o "$W/triv/triv$SUF" && \
  try "trivial pybind11 module then torch" PYTHONPATH=$W/triv $PY -c "import triv; $TORCH"
g++ -O2 -shared -fPIC -fvisibility=hidden $PB -Iinclude "$W/triv/trivsk.cc" -o "$W/triv/trivsk$SUF" "$LIB" -Wl,-rpath,"$(dirname "$LIB")" && \
  try "pybind11 module linking libshardkit then torch" PYTHONPATH=$W/triv $PY -c "import trivsk; $TORCH"
gcc -O2 -shared -fPIC $(python3-config --includes) "$W/triv/capi.c" -o "$W/triv/capi$SUF" "$LIB" -Wl,-rpath,"$(dirname "$LIB")" -Wl,--no-as-needed && \
  try "C-API module linking libshardkit then torch" PYTHONPATH=$W/triv $PY -c "import capi; $TORCH"
try "numpy then torch" $PY -c "import numpy; $TORCH"
try "_shardkit without LD_LIBRARY_PATH" LD_LIBRARY_PATH= $PY -c "$LOADMOD; $TORCH" "$MOD"
echo "=== NEEDED of _shardkit vs libshardkit"
readelf -d "$MOD" | grep NEEDED | sed 's/^/  mod /'
readelf -d "$LIB" | grep NEEDED | sed 's/^/  lib /'
echo "=== exported dynamic symbols of _shardkit (non-PyInit): $(nm -D --defined-only "$MOD" | grep -vc PyInit)"
nm -D --defined-only "$MOD" | grep -v PyInit | head -10
echo "=== libshardkit exported symbols outside shardkit::: $(nm -DC --defined-only "$LIB" | grep -v 'shardkit::' | wc -l)"
nm -DC --defined-only "$LIB" | grep -v 'shardkit::' | awk '{print $2, $3, $4}' | head -15
} 2>&1 | tee "$OUTDIR/import_diag.txt"
