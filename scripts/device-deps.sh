#!/usr/bin/env bash
# Packs the Debian packages the GPU machine lacks into .deps/ (see ../shared/device/carry-debs.sh).
# Run once here, in the repo root; then on the GPU machine: source .deps/unpack.sh
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
bash ../shared/device/carry-debs.sh \
  liblmdb-dev liblmdb0 lmdb-utils libarchive-dev libarchive13 \
  libturbojpeg0-dev libturbojpeg0 libjpeg62-turbo-dev libjpeg62-turbo libpng-dev libpng16-16 \
  libtbb-dev libtbb12 libtbbmalloc2 libtbbbind-2-5 libhwloc15 \
  libxxhash-dev libxxhash0 libcli11-dev nlohmann-json3-dev libfmt-dev libfmt9 \
  libmsgpack-cxx-dev libdlpack-dev catch2 pybind11-dev \
  libprotobuf-dev libprotobuf32 libprotoc32 protobuf-compiler \
  libcurl4-openssl-dev libexpat1-dev libexpat1
# libcurl: link against the GPU machine's own libcurl.so.4 (Debian's runtime would need
# Debian's libssh2 and OpenLDAP too); the carried package brings headers and the .so link.
cat >> .deps/unpack.sh <<'EOF'
rm -f /opt/deps/usr/lib/x86_64-linux-gnu/libcurl.so.4*
for _d in /usr/lib/x86_64-linux-gnu /lib/x86_64-linux-gnu; do
  if [ -e "$_d/libcurl.so.4" ]; then ln -sfn "$_d/libcurl.so.4" /opt/deps/usr/lib/x86_64-linux-gnu/libcurl.so; break; fi
done
EOF
