#!/usr/bin/env bash
# Packs the Debian packages the GPU machine lacks into .deps/ (see ../shared/device/carry-debs.sh).
# Run once here, in the repo root; then on the GPU machine: source .deps/unpack.sh
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
exec bash ../shared/device/carry-debs.sh \
  liblmdb-dev liblmdb0 lmdb-utils libarchive-dev libarchive13 \
  libturbojpeg0-dev libturbojpeg0 libjpeg62-turbo-dev libjpeg62-turbo libpng-dev libpng16-16 \
  libtbb-dev libtbb12 libtbbmalloc2 libtbbbind-2-5 libhwloc15 \
  libxxhash-dev libxxhash0 libcli11-dev nlohmann-json3-dev libfmt-dev libfmt9 \
  libmsgpack-cxx-dev libdlpack-dev catch2 pybind11-dev \
  libprotobuf-dev libprotobuf32 libprotoc32 protobuf-compiler \
  libcurl4-openssl-dev libcurl4 libexpat1-dev libexpat1
