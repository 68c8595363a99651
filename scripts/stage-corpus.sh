#!/usr/bin/env bash
# Copies the corpus generator (../shared/corpus) into .corpus/ (git-ignored) so that it can
# travel to the GPU machine, leaving out sources/SOURCES.md, which make_corpus.py would try
# to open as an image (it lists every file in sources/).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
SRC=${1:-../shared/corpus}
rm -rf .corpus && mkdir -p .corpus/sources
cp "$SRC/make_corpus.py" .corpus/
find "$SRC/sources" -maxdepth 1 -type f \( -iname '*.png' -o -iname '*.jpg' -o -iname '*.jpeg' \) -exec cp {} .corpus/sources/ \;
echo "stage-corpus: $(ls .corpus/sources | wc -l) source images in .corpus/"
