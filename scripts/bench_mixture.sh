#!/usr/bin/env bash
# Issue 42: the CPU loader over a mixture of three datasets of different formats (tar
# shards, LMDB, MDS; the corpus's classes split in three) against the same images as one
# tar dataset: images/s, alternating rounds, and the ratio (goal >= 0.95); then an
# elastic resume (restore + first batch, resident memory) at 10^6 and 10^8 samples.
#   scripts/bench_mixture.sh [CORPUS_DIR] [--count N] [--threads N] [--rounds R]
# CORPUS_DIR default .bench/corpus-xform (made when missing, --count default 2000);
# --threads default nproc. SK / MIXBENCH: the shardkit CLI and sk_mixture_bench (default build/).
set -euo pipefail
cd "$(dirname "$0")/.."
CORPUS=.bench/corpus-xform
COUNT=2000
THREADS=$(nproc)
ROUNDS=3
while [ $# -gt 0 ]; do
  case "$1" in
    --count) COUNT="$2"; shift 2 ;;
    --threads) THREADS="$2"; shift 2 ;;
    --rounds) ROUNDS="$2"; shift 2 ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) CORPUS="$1"; shift ;;
  esac
done
SK=${SK:-build/tools/shardkit}
MIXBENCH=${MIXBENCH:-build/bench/sk_mixture_bench}
scripts/make-corpus.sh "$CORPUS" "$COUNT"
OUT=$(mktemp -d "${TMPDIR:-/tmp}/bench-mix.XXXXXX")
trap 'rm -rf "$OUT"' EXIT
mapfile -t CLASSES < <(find "$CORPUS" -mindepth 1 -maxdepth 1 -type d -printf '%f\n' | sort)
n=${#CLASSES[@]}
third=$(( (n + 2) / 3 ))
join() { local IFS=,; echo "$*"; }
A=$(join "${CLASSES[@]:0:$third}")
B=$(join "${CLASSES[@]:$third:$third}")
C=$(join "${CLASSES[@]:$((2 * third))}")
"$SK" convert "$CORPUS" "wds:$OUT/one/t-%06d.tar" >/dev/null
"$SK" convert "$CORPUS" "wds:$OUT/a/t-%06d.tar" --select "classes=$A" >/dev/null
"$SK" convert "$CORPUS" "lmdb:$OUT/b.lmdb" --select "classes=$B" >/dev/null
"$SK" convert "$CORPUS" "mds:$OUT/c.mds" --select "classes=$C" >/dev/null
find "$OUT" -type f -exec cat {} + >/dev/null  # the page cache warm for both
echo "corpus: $CORPUS ($(find "$CORPUS" -type f | wc -l) images, $n classes: $third + $third + $(( n - 2 * third )) per source)"
"$MIXBENCH" loader "$OUT/one/t.manifest.json" "$OUT/a/t.manifest.json" "lmdb:$OUT/b.lmdb" "mds:$OUT/c.mds" \
  --threads "$THREADS" --rounds "$ROUNDS" --epochs "${EPOCHS:-2}"
for n in 1000000 100000000; do "$MIXBENCH" resume --samples "$n"; done
