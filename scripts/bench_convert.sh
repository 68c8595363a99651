#!/usr/bin/env bash
# Conversion throughput beside `tar cf` of the same image folder (not a test).
#   scripts/bench_convert.sh [CORPUS_DIR] [--count N] [--runs R] [--threads T]
# Makes CORPUS_DIR (default: .bench/corpus) with ../shared/corpus/make_corpus.py
# when it does not exist yet, warms the page cache, then times, best of R runs
# (default 3): tar cf of the folder, shardkit convert folder -> wds, -> lmdb,
# -> hdf5 (each when its format is built), and the py-lmdb peer script
# (scripts/peer_lmdb.py: one put per image, commit every 1000). Prints MB/s over
# the folder's image bytes and the ratio to tar cf. Outputs go to a temporary
# directory on the same file system as CORPUS_DIR's parent unless BENCH_OUT is set.
set -euo pipefail
cd "$(dirname "$0")/.."
CORPUS=.bench/corpus
COUNT=4000
RUNS=3
THREADS=1
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
if [ ! -d "$CORPUS" ]; then
  echo "making $COUNT images in $CORPUS ..." >&2
  mkdir -p "$(dirname "$CORPUS")"
  /usr/bin/python3 ../shared/corpus/make_corpus.py "$CORPUS" --count "$COUNT" >&2
fi
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
has_format() {  # a writer exists when converting nothing does not say "not implemented"
  ! "$SK" convert /nonexistent-input "$1:$OUT/probe" 2>&1 | grep -q "not implemented"
}

printf '%s images, %.1f MB in %s (best of %s, page cache warm, --threads %s)\n' \
  "$FILES" "$(awk "BEGIN{print $BYTES / 1000000}")" "$CORPUS" "$RUNS" "$THREADS"
printf '%-32s %10s %10s %10s\n' "job" "seconds" "MB/s" "vs tar cf"
TAR=$(best_of tar cf "$OUT/x/all.tar" -C "$CORPUS" .)
row() {
  local name="$1" secs="$2"
  if [ "$secs" = fail ]; then printf '%-32s %10s\n' "$name" "failed"; return; fi
  printf '%-32s %10.3f %10.1f %10.2f\n' "$name" "$secs" "$(awk "BEGIN{print $BYTES / 1000000 / $secs}")" \
    "$(awk "BEGIN{print $TAR / $secs}")"
}
row "tar cf" "$TAR"
row "shardkit convert -> wds" "$(best_of "$SK" convert "$CORPUS" "wds:$OUT/x/train-%06d.tar" --threads "$THREADS")"
if has_format lmdb; then
  row "shardkit convert -> lmdb" "$(best_of "$SK" convert "$CORPUS" "lmdb:$OUT/x/train.lmdb" --threads "$THREADS")"
fi
if has_format hdf5; then
  row "shardkit convert -> hdf5" "$(best_of "$SK" convert "$CORPUS" "hdf5:$OUT/x/train.h5" --threads "$THREADS")"
fi
row "python peer_lmdb.py (py-lmdb)" "$(best_of /usr/bin/python3 scripts/peer_lmdb.py "$CORPUS" "$OUT/x/peer.lmdb")"
