#!/usr/bin/env bash
# Issue 14 on the GPU machine (16 cores, a real disk): the
# shardkit command without CUDA, a 16,000-image corpus (16 parallel make_corpus.py runs
# of 1,000), then scripts/bench_remote.sh against nginx (HTTP PUT and range requests)
# and the tests' Python S3 emulation, and s3rver where node is there (Debian's node, carried
# in .deps by scripts/device-deps.sh, with .npm-deps), 32 shards, ROUNDS (3) of each shard row.
# There (carry .deps .corpus .npm-deps):  source .deps/unpack.sh && bash scripts/device_upload.sh [bench_remote args]
# Env: B (build-r), CORPUS (/tmp/c16), ROUNDS, LOADER_ROUNDS, UPLOAD_ONLY=1 (no loader rows).
set -euo pipefail
cd "$(dirname "$0")/.."
[[ "${CMAKE_PREFIX_PATH:-}" == */opt/deps/* ]] || source .deps/unpack.sh
B=${B:-build-r}
C=${CORPUS:-/tmp/c16}
LOG=${OUT:-/tmp}
cmake -S . -B "$B" -DCMAKE_BUILD_TYPE=Release -DSHARDKIT_WITH_CUDA=OFF -DSHARDKIT_BUILD_TESTS=OFF \
  -DSHARDKIT_BUILD_PYTHON=OFF >"$LOG/cfg-r.log" 2>&1 || { tail -20 "$LOG/cfg-r.log"; exit 1; }
if [ ! -d "$C" ]; then
  for k in $(seq 0 15); do python3 .corpus/make_corpus.py "$C" --count 1000 --seed "$k" >/dev/null 2>&1 & done
fi
cmake --build "$B" -j"$(nproc)" --target shardkit_cli >"$LOG/build-r.log" 2>&1 || {
  grep -E "error" -A4 "$LOG/build-r.log" | head -30; exit 1; }
wait
echo "corpus: $(find "$C" -type f | wc -l) images, $(du -sm "$C" | cut -f1) MB; $(nproc) cores"
HTTP_SERVER=nginx SK="$B/tools/shardkit" PY=python3 ROUNDS="${ROUNDS:-3}" \
  bash scripts/bench_remote.sh --threads "$(nproc)" --folder "$C" --shards 32 "$@"
