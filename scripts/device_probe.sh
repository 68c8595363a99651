#!/usr/bin/env bash
# Issue 16 on the GPU machine, in one short call: build the Python module (CUDA + nvJPEG, no
# tests), make the 8,000-image corpus, convert it to tar shards, then
# scripts/neighbour_probe.py: ResNet-18 with its training step in a CUDA graph (--graph),
# then without, each beside and with feeds (PROBE_ARGS / PLAIN_ARGS override the phases).
# There (carry .deps .corpus):  source .deps/unpack.sh && bash scripts/device_probe.sh
# Where the engines' time goes (round 10): PROBE_ARGS="--profile --trace 20 --seconds 4
# --phases none,feed:gpu@1.0,in:gpu@1.0" with TRACE_DIR=$OUT OUT=/tmp/po (the logs stay there,
# the traces come back; at most 8 files), then scripts/trace_summary.py on each trace.
# The process or the machine (side: phases, added in the round 14, not yet run on
# a device): PLAIN_ARGS="--seconds 5 --phases none,out:cpu,side:cpu,out:gpu@0,side:gpu@0,in:gpu@0,none".
# side:cpu against out:cpu is the cost of sharing the process without CUDA; side:gpu@0
# against out:gpu@0 that of sharing one CUDA context; in:gpu@0 against side:gpu@0 that of
# the model consuming the batches.
set -uo pipefail
cd "$(dirname "$0")/.."
[[ "${CMAKE_PREFIX_PATH:-}" == */opt/deps/* ]] || source .deps/unpack.sh
export PATH=/usr/local/cuda/bin:$PATH
OUTDIR=${OUT:-/tmp/probe-out}; mkdir -p "$OUTDIR"
W=/tmp/probe; mkdir -p "$W"
B=$W/build
PY=$(command -v python3)
cmake -S . -B "$B" -DCMAKE_BUILD_TYPE=Release -DPython3_EXECUTABLE="$PY" -DSHARDKIT_WITH_CUDA=ON \
  -DSHARDKIT_WITH_REMOTE=OFF -DSHARDKIT_BUILD_TESTS=OFF -DCMAKE_CUDA_ARCHITECTURES=90 >"$OUTDIR/cfg.log" 2>&1 \
  || { tail -20 "$OUTDIR/cfg.log"; exit 1; }
if [ ! -d "$W/imgs" ]; then
  for k in $(seq 0 15); do "$PY" .corpus/make_corpus.py "$W/imgs" --count 500 --seed "$k" >/dev/null 2>&1 & done
fi
cmake --build "$B" -j"$(nproc)" --target shardkit_cli _shardkit >"$OUTDIR/build.log" 2>&1 \
  || { grep -E "error" -A5 "$OUTDIR/build.log" | head -40; exit 1; }
wait
"$B/tools/shardkit" convert "$W/imgs" "wds:$W/wds/train-%06d.tar" --shard-size 64MB --overwrite >"$OUTDIR/convert.log" 2>&1 \
  || { tail -5 "$OUTDIR/convert.log"; exit 1; }
echo "corpus: $(find "$W/imgs" -type f | wc -l) images"
export PYTHONPATH=$B/python
rc=0
timeout 200 "$PY" scripts/neighbour_probe.py --shards "$W/wds/train.manifest.json" --model resnet18 --graph \
  ${PROBE_ARGS:---seconds 5 --phases none,out:cpu,out:gpu@0,in:gpu@0,in:auto,none} \
  >"$OUTDIR/graph.txt" 2>"$OUTDIR/graph.err" || rc=1
tail -3 "$OUTDIR/graph.err"; cat "$OUTDIR/graph.txt"
timeout 120 "$PY" scripts/neighbour_probe.py --shards "$W/wds/train.manifest.json" --model resnet18 \
  ${PLAIN_ARGS:---seconds 5 --phases none,out:cpu,in:auto} >"$OUTDIR/plain.txt" 2>"$OUTDIR/plain.err" || rc=1
tail -3 "$OUTDIR/plain.err"; cat "$OUTDIR/plain.txt"
exit $rc
