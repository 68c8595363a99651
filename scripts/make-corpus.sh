#!/usr/bin/env bash
# Makes COUNT images of the ImageNet-like corpus in DIR (for benchmarks; tests make their
# own fixtures), unless DIR exists. make_corpus.py opens every file of its sources/
# folder as an image, and that folder also holds SOURCES.md: a copy of the generator runs
# beside the source images only.
#   scripts/make-corpus.sh DIR COUNT      (MAKE_CORPUS: the generator, default ../shared/corpus/make_corpus.py)
set -euo pipefail
DIR="$1"
COUNT="$2"
[ -d "$DIR" ] && exit 0
echo "making $COUNT images in $DIR ..." >&2
mkdir -p "$(dirname "$DIR")"
MK="${MAKE_CORPUS:-$(dirname "$0")/../../shared/corpus/make_corpus.py}"
GEN="$(mktemp -d)"
trap 'rm -rf "$GEN"' EXIT
cp "$MK" "$GEN/make_corpus.py"
mkdir "$GEN/sources"
find "$(dirname "$MK")/sources" -maxdepth 1 -type f \( -iname '*.png' -o -iname '*.jpg' -o -iname '*.jpeg' \) \
  -exec cp {} "$GEN/sources/" \;
"${PY:-/usr/bin/python3}" "$GEN/make_corpus.py" "$DIR" --count "$COUNT" >&2
