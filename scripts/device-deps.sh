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
  zlib1g-dev libzstd-dev nginx patchelf \
  libwebp-dev libwebp7 libwebpdemux2 libwebpmux3 \
  libavif-dev libavif15 libaom3 libdav1d6 libgav1-1 libabsl20220623 librav1e0 libsvtav1enc1 libyuv0 \
  libjxl-dev libjxl0.7 libhwy-dev libhwy1 liblcms2-2 liblcms2-dev libbrotli-dev libbrotli1
# WebP, AVIF, JPEG XL (Debian 12's, with the libraries they link): the GPU build decodes
# them on its host route and the GPU wheel bundles them, as the CPU build here does.
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
# node (Debian's 18, for s3rver in scripts/bench_remote.sh; carry .npm-deps too): its own
# folder, unpacked under /opt/node, its libraries kept off LD_LIBRARY_PATH (the machine's
# libcurl must not pick up Debian's libnghttp2 or libbrotli) behind a wrapper on PATH.
# Debian's node loads some builtins from /usr/share/nodejs: linked there when the machine
# has none. (This machine's own node may be another build: the Debian version is named.)
mkdir -p .deps/node
_nodev=$(apt-cache madison nodejs | awk '$0 ~ /debian/ {print $3; exit}')
(cd .deps/node && apt-get download -qq "nodejs=$_nodev" libnode108 libicu72 libuv1 libc-ares2 libnghttp2-14 \
  libbrotli1 node-acorn node-cjs-module-lexer node-undici >/dev/null 2>&1) || { echo "device-deps: node packages not downloaded" >&2; exit 1; }
cat >> .deps/unpack.sh <<'EOF'
if [ -d "$_here/node" ] && [ ! -x /opt/node/bin/node ]; then
  mkdir -p /opt/node/bin
  for f in "$_here"/node/*.deb; do dpkg -x "$f" /opt/node; done
  printf '#!/bin/sh\nLD_LIBRARY_PATH=/opt/node/usr/lib/x86_64-linux-gnu exec /opt/node/usr/bin/node "$@"\n' >/opt/node/bin/node
  chmod +x /opt/node/bin/node
  [ -e /usr/share/nodejs ] || ln -s /opt/node/usr/share/nodejs /usr/share/nodejs
fi
[ -x /opt/node/bin/node ] && export PATH=/opt/node/bin:$PATH
export CPATH=/opt/deps/usr/include/x86_64-linux-gnu:$CPATH
sed -i -E 's#^(prefix|exec_prefix|libdir|includedir)=/usr#\1=/opt/deps/usr#' /opt/deps/usr/lib/x86_64-linux-gnu/pkgconfig/libjpeg.pc
rm -f /opt/deps/usr/lib/x86_64-linux-gnu/libcurl.so.4*
for _lib in libcurl.so.4 libz.so.1 libzstd.so.1 libcrypto.so.3 libssl.so.3; do
  for _d in /usr/lib/x86_64-linux-gnu /lib/x86_64-linux-gnu; do
    if [ -e "$_d/$_lib" ]; then ln -sfn "$_d/$_lib" "/opt/deps/usr/lib/x86_64-linux-gnu/${_lib%.[0-9]}"; break; fi
  done
done
EOF
