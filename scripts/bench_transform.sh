#!/usr/bin/env bash
# Transform at conversion (issue 41): images/s of
#   shardkit convert DIR wds:OUT/t-%06d.tar --resize short:256 --encode jpeg:90 --threads N
# beside the usual script, a Python PIL ProcessPoolExecutor with one process per core that
# opens each image, applies its EXIF orientation (ImageOps.exif_transpose), resizes the
# short side to 256 with Image.BILINEAR (PIL's antialiased bilinear: the same widening
# triangle filter shardkit uses; no draft()/reduce) and saves it with quality=90 into a
# folder; then the CPU loader (`shardkit bench --loader`) on the resized output against the
# same corpus converted as it is (--encode keep); and `convert --dedup` against the same
# plain conversion (goal: at least 0.9x; alternated, best of 3 x R runs each). Not a test.
#   scripts/bench_transform.sh [CORPUS_DIR] [--count N] [--runs R] [--threads N] [--only dedup]
# CORPUS_DIR default .bench/corpus-xform (made with ../shared/corpus/make_corpus.py when
# missing; --count default 2000); --threads default nproc; best of R runs (default 2).
# SK: the shardkit binary (default build/tools/shardkit); BENCH_OUT: where outputs go.
set -euo pipefail
cd "$(dirname "$0")/.."
CORPUS=.bench/corpus-xform
COUNT=2000
RUNS=2
THREADS=$(nproc)
ONLY=
while [ $# -gt 0 ]; do
  case "$1" in
    --count) COUNT="$2"; shift 2 ;;
    --runs) RUNS="$2"; shift 2 ;;
    --threads) THREADS="$2"; shift 2 ;;
    --only) ONLY="$2"; shift 2 ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) CORPUS="$1"; shift ;;
  esac
done
SK=${SK:-build/tools/shardkit}
PY=${PY:-/usr/bin/python3}  # Debian's, with Pillow (PY: another python3 with Pillow)
scripts/make-corpus.sh "$CORPUS" "$COUNT"
OUT=${BENCH_OUT:-$(mktemp -d "$(dirname "$CORPUS")/bench-xform.XXXXXX")}
mkdir -p "$OUT"
N=$(find "$CORPUS" -type f | wc -l)
find "$CORPUS" -type f -exec cat {} + >/dev/null  # warm the page cache

cat >"$OUT/pil_resize.py" <<'PYEOF'
import os, sys
from concurrent.futures import ProcessPoolExecutor
from PIL import Image, ImageOps

def one(job):
    src, dst = job
    with Image.open(src) as im:
        im = ImageOps.exif_transpose(im).convert("RGB")
        w, h = im.size
        s = min(w, h)
        if s > 256:
            im = im.resize((round(w * 256 / s), round(h * 256 / s)), Image.BILINEAR)
        im.save(dst, quality=90)

def main(src_root, dst_root, procs):
    jobs = []
    for d, _, files in os.walk(src_root):
        for f in files:
            rel = os.path.relpath(os.path.join(d, f), src_root)
            out = os.path.join(dst_root, os.path.splitext(rel)[0] + ".jpg")
            os.makedirs(os.path.dirname(out), exist_ok=True)
            jobs.append((os.path.join(d, f), out))
    with ProcessPoolExecutor(procs) as ex:
        list(ex.map(one, jobs, chunksize=16))

if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
PYEOF

calc() { awk "BEGIN{print $1}"; }  # arithmetic without bc (not on every machine)
best() {  # best (least) seconds of RUNS runs of "$@"
  local b=""
  for _ in $(seq "$RUNS"); do
    local t0 t1 s
    t0=$(date +%s.%N)
    "$@" >/dev/null
    t1=$(date +%s.%N)
    s=$(calc "$t1 - $t0")
    if [ -z "$b" ] || awk "BEGIN{exit !($s < $b)}"; then b=$s; fi
  done
  echo "$b"
}
conv() { rm -rf "$OUT/sk"; "$SK" convert "$CORPUS" "wds:$OUT/sk/t-%06d.tar" --resize short:256 --encode jpeg:90 --threads "$THREADS"; }
pil() { rm -rf "$OUT/pil"; $PY "$OUT/pil_resize.py" "$CORPUS" "$OUT/pil" "$THREADS"; }
echo "corpus: $CORPUS ($N images), $THREADS threads / processes, $(nproc) cores, best of $RUNS"
if [ "$ONLY" != dedup ]; then
t_sk=$(best conv)
t_pil=$(best pil)
printf "shardkit convert --resize short:256 --encode jpeg:90: %8.1f images/s (%.2f s)\n" "$(calc "$N / $t_sk")" "$t_sk"
printf "PIL ProcessPoolExecutor (BILINEAR, quality=90):        %8.1f images/s (%.2f s)\n" "$(calc "$N / $t_pil")" "$t_pil"
printf "ratio: %.2fx\n" "$(calc "$t_pil / $t_sk")"

# The CPU loader on the resized output against the original bytes.
rm -rf "$OUT/orig"
"$SK" convert "$CORPUS" "wds:$OUT/orig/t-%06d.tar" --threads "$THREADS" >/dev/null
conv >/dev/null
rate() {
  "$SK" bench "$1" --loader --threads "$THREADS" --json | $PY -c \
    'import json,sys; r=json.load(sys.stdin); rows=r.get("rows", r.get("results", [])); print(max(x["images_per_s"] for x in rows))'
}
r_orig=$(rate "$OUT/orig/t.manifest.json")
r_small=$(rate "$OUT/sk/t.manifest.json")
printf "loader (%s threads), original: %8.1f images/s\n" "$THREADS" "$r_orig"
printf "loader (%s threads), resized:  %8.1f images/s\n" "$THREADS" "$r_small"
printf "ratio: %.2fx\n" "$(calc "$r_small / $r_orig")"
fi

# --dedup (a hashing read of every image before the write) against the plain conversion.
plain() { rm -rf "$OUT/plain"; "$SK" convert "$CORPUS" "wds:$OUT/plain/t-%06d.tar" --threads "$THREADS"; }
dedup() { rm -rf "$OUT/dedup"; "$SK" convert "$CORPUS" "wds:$OUT/dedup/t-%06d.tar" --threads "$THREADS" --dedup; }
# Each run takes well under a second at 16 threads: alternate them, best of 3 * RUNS.
t_plain=""; t_dedup=""
for _ in 1 2 3; do
  p=$(best plain); d=$(best dedup)
  if [ -z "$t_plain" ] || awk "BEGIN{exit !($p < $t_plain)}"; then t_plain=$p; fi
  if [ -z "$t_dedup" ] || awk "BEGIN{exit !($d < $t_dedup)}"; then t_dedup=$d; fi
done
printf "convert (plain):   %8.1f images/s (%.2f s)\n" "$(calc "$N / $t_plain")" "$t_plain"
printf "convert --dedup:   %8.1f images/s (%.2f s)\n" "$(calc "$N / $t_dedup")" "$t_dedup"
printf "ratio: %.2fx\n" "$(calc "$t_plain / $t_dedup")"
[ -n "${BENCH_OUT:-}" ] || rm -rf "$OUT"
