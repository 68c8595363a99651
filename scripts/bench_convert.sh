#!/usr/bin/env bash
# Conversion throughput beside `tar cf` of the same image folder (not a test).
#   scripts/bench_convert.sh [CORPUS_DIR] [--count N] [--runs R] [--threads T (default: shardkit's)]
# Makes CORPUS_DIR (default: .bench/corpus) with ../shared/corpus/make_corpus.py
# when it does not exist yet, warms the page cache, then times, best of R runs
# (default 3): tar cf of the folder, shardkit convert folder -> wds, -> lmdb,
# -> hdf5 (each when its format is built), and the py-lmdb peer script
# (scripts/peer_lmdb.py: one put per image, commit every 1000). Prints MB/s over
# the folder's image bytes and the ratio to tar cf. Outputs go to a temporary
# directory on the same file system as CORPUS_DIR's parent unless BENCH_OUT is set.
# MAKE_CORPUS overrides the corpus script path; SK the shardkit binary.
set -euo pipefail
cd "$(dirname "$0")/.."
CORPUS=.bench/corpus
COUNT=4000
RUNS=3
THREADS=""
while [ $# -gt 0 ]; do
  case "$1" in
    --count) COUNT="$2"; shift 2 ;;
    --runs) RUNS="$2"; shift 2 ;;
    --threads) THREADS="$2"; shift 2 ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) CORPUS="$1"; shift ;;
  esac
done
SK=${SK:-build/tools/shardkit}
[ -x "$SK" ] || cmake --build build --target shardkit_cli >/dev/null
scripts/make-corpus.sh "$CORPUS" "$COUNT"
OUT="${BENCH_OUT:-$(mktemp -d "$(dirname "$(realpath "$CORPUS")")/bench-out.XXXXXX")}"
trap 'rm -rf "$OUT"' EXIT
BYTES=$(find "$CORPUS" -type f -printf '%s\n' | awk '{s+=$1} END {print s}')
FILES=$(find "$CORPUS" -type f | wc -l)
find "$CORPUS" -type f -exec cat {} + > /dev/null   # warm the page cache

# best_of NAME CMD...: runs CMD RUNS times (output removed before each), prints the best seconds.
best_of() {
  local best="" t0 t1 dt
  for _ in $(seq "$RUNS"); do
    rm -rf "$OUT/x" && mkdir -p "$OUT/x"
    sync
    t0=$(date +%s.%N)
    "$@" > "$OUT/log" 2>&1 || { echo "FAILED: $* ($(tail -1 "$OUT/log"))" >&2; echo fail; return; }
    t1=$(date +%s.%N)
    dt=$(awk "BEGIN{print $t1 - $t0}")
    if [ -z "$best" ] || awk "BEGIN{exit !($dt < $best)}"; then best=$dt; fi
  done
  echo "$best"
}
has_format() {  # built when opening a missing dataset of it does not say "not implemented"
  local out
  out="$("$SK" info "$1:$OUT/no-such-dataset" 2>&1 || true)"
  [[ "$out" != *"not implemented"* ]]
}
TFLAG=()
[ -z "$THREADS" ] || TFLAG=(--threads "$THREADS")

printf '%s images, %.1f MB in %s (best of %s, page cache warm, --threads %s)\n' \
  "$FILES" "$(awk "BEGIN{print $BYTES / 1000000}")" "$CORPUS" "$RUNS" "${THREADS:-default}"
printf '%-32s %10s %10s %10s\n' "job" "seconds" "MB/s" "vs tar cf"
TAR=$(best_of tar cf "$OUT/x/all.tar" -C "$CORPUS" .)
row() {
  local name="$1" secs="$2"
  if [ "$secs" = fail ]; then printf '%-32s %10s\n' "$name" "failed"; return; fi
  printf '%-32s %10.3f %10.1f %10.2f\n' "$name" "$secs" "$(awk "BEGIN{print $BYTES / 1000000 / $secs}")" \
    "$(awk "BEGIN{print $TAR / $secs}")"
}
row "tar cf" "$TAR"
# shardkit fsyncs what it writes before it reports success; tar cf does not.
row "tar cf && sync (for reference)" "$(best_of sh -c "tar cf '$OUT/x/all.tar' -C '$CORPUS' . && sync")"
row "shardkit convert -> wds" "$(best_of "$SK" convert "$CORPUS" "wds:$OUT/x/train-%06d.tar" "${TFLAG[@]}")"
if has_format lmdb; then
  row "shardkit convert -> lmdb" "$(best_of "$SK" convert "$CORPUS" "lmdb:$OUT/x/train.lmdb" "${TFLAG[@]}")"
fi
if has_format hdf5; then
  row "shardkit convert -> hdf5" "$(best_of "$SK" convert "$CORPUS" "hdf5:$OUT/x/train.h5" "${TFLAG[@]}")"
fi
row "python peer_lmdb.py (py-lmdb)" "$(best_of /usr/bin/python3 scripts/peer_lmdb.py "$CORPUS" "$OUT/x/peer.lmdb")"
if has_format mds; then
  row "shardkit convert -> mds" "$(best_of "$SK" convert "$CORPUS" "mds:$OUT/x/train.mds" "${TFLAG[@]}")"
  # MDS -> tar shards (the MDS source is made once, outside the timing).
  rm -rf "$OUT/src.mds" && "$SK" convert "$CORPUS" "mds:$OUT/src.mds" > /dev/null
  row "shardkit convert mds -> wds" "$(best_of "$SK" convert "mds:$OUT/src.mds" "wds:$OUT/x/m-%06d.tar" "${TFLAG[@]}")"
fi
# Reading the other formats into tar shards (issue 18): each source is made once from the
# folder (not timed), then `convert SRC -> wds` is timed against tar cf of the same image bytes.
if has_format recordio; then
  "$SK" convert "$CORPUS" "recordio:$OUT/src/train.rec" --overwrite > /dev/null
  row "shardkit convert recordio -> wds" \
    "$(best_of "$SK" convert "recordio:$OUT/src/train.rec" "wds:$OUT/x/train-%06d.tar" "${TFLAG[@]}")"
fi
if has_format tfrecord; then
  # TFRecord -> tar shards, beside `tar cf` of the same TFRecord files (the same bytes); the
  # TFRecord files are made from the corpus first (not timed) and read once to warm the cache.
  mkdir -p "$OUT/tfr"
  "$SK" convert "$CORPUS" "tfrecord:$OUT/tfr/train-%05d.tfrecord" --overwrite > /dev/null
  cat "$OUT"/tfr/* > /dev/null
  TFBYTES=$(find "$OUT/tfr" -name '*.tfrecord' -printf '%s\n' | awk '{s+=$1} END {print s}')
  TFTAR=$(best_of tar cf "$OUT/x/tfr.tar" -C "$OUT/tfr" .)
  TFSK=$(best_of "$SK" convert "$OUT/tfr/train.tfrecord.json" "wds:$OUT/x/train-%06d.tar" "${TFLAG[@]}")
  printf '%-32s %10.3f %10.1f %10s\n' "tar cf of the .tfrecord files" "$TFTAR" \
    "$(awk "BEGIN{print $TFBYTES / 1000000 / $TFTAR}")" "1.00"
  if [ "$TFSK" = fail ]; then printf '%-32s %10s\n' "shardkit tfrecord -> wds" "failed"; else
    printf '%-32s %10.3f %10.1f %10.2f\n' "shardkit tfrecord -> wds" "$TFSK" \
      "$(awk "BEGIN{print $TFBYTES / 1000000 / $TFSK}")" "$(awk "BEGIN{print $TFTAR / $TFSK}")"
  fi
fi
