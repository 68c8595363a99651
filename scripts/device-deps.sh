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
  libcurl4-openssl-dev libssl-dev libexpat1-dev libexpat1 \
  zlib1g-dev libzstd-dev nginx
# libcurl: link against the GPU machine's own libcurl.so.4 (Debian's runtime would need
# Debian's libssh2 and OpenLDAP too); the carried package brings headers and the .so link.
# zlib and zstd (the TFRecord and MDS formats), and libcrypto (MD5) likewise: headers from Debian, the machine's
# own runtime (libz.so.1, libzstd.so.1). OpenMPI is not carried (optional at build time).
# nginx: a real HTTP server (ranges, PUT through its DAV module) for
# `HTTP_SERVER=nginx scripts/bench_remote.sh` (/opt/deps/usr/sbin/nginx).
# libjpeg: Debian's (JPEG_LIB_VERSION 62), headers and library together. Its jconfig.h
# lives in the multiarch include folder, which CPATH did not name, so the machine's own
# jconfig.h (Ubuntu's libjpeg-turbo8-dev: version 80) was read beside Debian's jpeglib.h
# (REMOTE=OFF), or Debian's once curl's include folder (/usr/include/x86_64-linux-gnu)
# was on the line (REMOTE=ON), while libjpeg.pc's -L/usr/lib/... linked the machine's
# libjpeg.so.8: libjpeg refused jpeg_create_decompress (version 62 != 80) and the decoder
# crashed (every `bench --loader` with the remote client; lib/decode/jpeg.cc now reports
# it as an error). So: the multiarch headers on CPATH, and libjpeg.pc pointed at /opt/deps.
cat >> .deps/unpack.sh <<'EOF'
export CPATH=/opt/deps/usr/include/x86_64-linux-gnu:$CPATH
sed -i -E 's#^(prefix|exec_prefix|libdir|includedir)=/usr#\1=/opt/deps/usr#' /opt/deps/usr/lib/x86_64-linux-gnu/pkgconfig/libjpeg.pc
rm -f /opt/deps/usr/lib/x86_64-linux-gnu/libcurl.so.4*
for _lib in libcurl.so.4 libz.so.1 libzstd.so.1 libcrypto.so.3 libssl.so.3; do
  for _d in /usr/lib/x86_64-linux-gnu /lib/x86_64-linux-gnu; do
    if [ -e "$_d/$_lib" ]; then ln -sfn "$_d/$_lib" "/opt/deps/usr/lib/x86_64-linux-gnu/${_lib%.[0-9]}"; break; fi
  done
done
EOF
