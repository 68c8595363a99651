#!/usr/bin/env bash
# Split conversion scaling (issue 15): one `shardkit convert` process against N
# parts (`--part I/N`, run side by side on this machine) plus `shardkit merge`, for
# N = 1, 4, 8, 16 (or --parts "..."), best of R runs. Prints a table: samples/s,
# MB/s and the ratio to the single process (goal: >= 0.9 for every N), and checks
# that every split wrote the single process's bytes.
#   scripts/bench_parts.sh [CORPUS_DIR] [--count N] [--runs R] [--parts "1 4 8 16"]
#                          [--flags "--shard-size 64MB --shuffle"] [--source wds|folder]
# CORPUS_DIR (default .bench/corpus) is made with ../shared/corpus/make_corpus.py as
# scripts/bench_convert.sh makes it. --source wds (default) first converts the folder
# to tar shards once (random access by index, no per-file opens) and splits that.
# The single process runs with --threads = the cores; each of N parts with
# max(1, cores / N) (they share the machine). Outputs go under BENCH_OUT or a
# temporary directory beside the corpus. SK: the shardkit binary.
# The lead's command on the 16-core GPU machine:
#   scripts/bench_parts.sh .bench/corpus --count 8000 --runs 3
set -euo pipefail
cd "$(dirname "$0")/.."
CORPUS=.bench/corpus
COUNT=8000
RUNS=3
PARTS="1 4 8 16"
FLAGS="--shard-size 64MB --shuffle --seed 1"
SOURCE=wds
while [ $# -gt 0 ]; do
  case "$1" in
    --count) COUNT="$2"; shift 2 ;;
    --runs) RUNS="$2"; shift 2 ;;
    --parts) PARTS="$2"; shift 2 ;;
    --flags) FLAGS="$2"; shift 2 ;;
    --source) SOURCE="$2"; shift 2 ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) CORPUS="$1"; shift ;;
  esac
done
SK=${SK:-build/tools/shardkit}
[ -x "$SK" ] || cmake --build build --target shardkit_cli >/dev/null
scripts/make-corpus.sh "$CORPUS" "$COUNT"
OUT="${BENCH_OUT:-$(mktemp -d "$(dirname "$(realpath "$CORPUS")")/bench-parts.XXXXXX")}"
trap 'rm -rf "$OUT"' EXIT
CORES=$(nproc)
SRC="$CORPUS"
if [ "$SOURCE" = wds ]; then
  "$SK" convert "$CORPUS" "wds:$OUT/src/s-%06d.tar" --shard-size 256MB >/dev/null
  SRC="$OUT/src/s.manifest.json"
fi
BYTES=$(du -sb "$CORPUS" | cut -f1)
SAMPLES=$(find "$CORPUS" -type f | wc -l)
cat "$OUT"/src/*.tar > /dev/null 2>&1 || find "$CORPUS" -type f -exec cat {} + > /dev/null   # warm the page cache

# run_split N DIR: N parts side by side, then merge; exits non-zero if any failed.
run_split() {
  local n=$1 dir=$2 threads pids=() i
  if [ "$n" = 0 ]; then
    "$SK" convert "$SRC" "wds:$dir/t-%06d.tar" $FLAGS --threads "$CORES" > /dev/null
    return
  fi
  threads=$(( CORES / n )); [ "$threads" -ge 1 ] || threads=1
  for i in $(seq 0 $((n - 1))); do
    "$SK" convert "$SRC" "wds:$dir/t-%06d.tar" $FLAGS --threads "$threads" --part "$i/$n" > /dev/null 2>>"$OUT/err" &
    pids+=($!)
  done
  local rc=0
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  [ "$rc" = 0 ] || return 1
  "$SK" merge "wds:$dir/t-%06d.tar" > /dev/null
}

# best N: the best wall time of RUNS runs of run_split N (N = 0: the single process).
best() {
  local b="" t0 t1 dt
  for _ in $(seq "$RUNS"); do
    rm -rf "$OUT/x$1"
    sync
    t0=$(date +%s.%N)
    run_split "$1" "$OUT/x$1" || { echo "FAILED: $1 parts: $(tail -3 "$OUT/err" 2>/dev/null)" >&2; echo fail; return; }
    t1=$(date +%s.%N)
    dt=$(awk "BEGIN{print $t1 - $t0}")
    if [ -z "$b" ] || awk "BEGIN{exit !($dt < $b)}"; then b=$dt; fi
  done
  echo "$b"
}

echo "corpus: $SAMPLES images, $BYTES bytes ($SOURCE source), flags: $FLAGS, $CORES cores, best of $RUNS"
echo
echo "| processes | threads each | seconds | samples/s | MB/s | vs 1 process | same bytes |"
echo "|---|---|---|---|---|---|---|"
T1=$(best 0)
printf "| 1 (no --part) | %d | %.2f | %.0f | %.0f | 1.00 | - |\n" "$CORES" "$T1" \
  "$(awk "BEGIN{print $SAMPLES / $T1}")" "$(awk "BEGIN{print $BYTES / 1e6 / $T1}")"
for n in $PARTS; do
  T=$(best "$n")
  th=$(( CORES / n )); [ "$th" -ge 1 ] || th=1
  same=yes
  for f in "$OUT/x0"/*; do cmp -s "$f" "$OUT/x$n/$(basename "$f")" || same=NO; done
  if [ "$T" = fail ]; then echo "| $n parts | $th | fail | | | | |"; continue; fi
  printf "| %d parts + merge | %d | %.2f | %.0f | %.0f | %.2f | %s |\n" "$n" "$th" "$T" \
    "$(awk "BEGIN{print $SAMPLES / $T}")" "$(awk "BEGIN{print $BYTES / 1e6 / $T}")" \
    "$(awk "BEGIN{print $T1 / $T}")" "$same"
done
