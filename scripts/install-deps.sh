#!/usr/bin/env bash
# Installs every Debian package shardkit needs to build, test and benchmark.
# A no-op when everything is present. Run as root (or with sudo available).
#   scripts/install-deps.sh [--with-s3rver]
# --with-s3rver also installs s3rver from the npm registry (scripts/install-s3rver.sh), which
# only the remote-storage tests need: building and the demo work without the registry.
set -euo pipefail
PKGS=(
  build-essential cmake pkg-config
  # compiles shared by clones and by the three build directories of .ci/run (scripts/ccache-env.sh)
  ccache
  # links the ~40 test binaries about 4x faster than ld.bfd (CMake option SHARDKIT_USE_MOLD)
  mold
  liblmdb-dev lmdb-utils
  libarchive-dev libarchive-tools tar
  libhdf5-dev hdf5-tools
  libturbojpeg0-dev libjpeg62-turbo-dev libpng-dev
  # WebP, AVIF and JPEG XL images (lib/decode); the command-line codecs decode them
  # independently in the tests (Pillow 9.4 reads WebP only)
  libwebp-dev libavif-dev libjxl-dev webp libavif-bin libjxl-tools
  libcli11-dev libtbb-dev catch2
  libxxhash-dev nlohmann-json3-dev libfmt-dev libmsgpack-cxx-dev
  libprotobuf-dev protobuf-compiler
  python3 python3-dev python3-numpy python3-pil python3-lmdb python3-h5py
  python3-protobuf python3-msgpack python3-pytest pybind11-dev
  # Python module tests of shardkit.Loader (torch 1.13; ~50 MB download, ~580 MB installed)
  python3-torch
  # Remote objects (lib/io/remote, issue 14): libcurl signs SigV4; expat reads S3's XML;
  # boto3 and node (s3rver, scripts/install-s3rver.sh) for tests/remote_test.cc
  libcurl4-openssl-dev libssl-dev libexpat1-dev python3-boto3 nodejs
  # More formats (issue 18): zlib (gzip TFRecord), zstd (MDS compression) and their
  # Python bindings for the tests' independent clients
  zlib1g-dev libzstd-dev python3-zstandard
  # Conversion over several processes (issue 15): OpenMPI, optional at build time
  libopenmpi-dev openmpi-bin
  # Packages: the self-contained wheel (patchelf bundles libraries; the test installs it
  # into a fresh venv) and the .deb (dpkg-shlibdeps fills its Depends)
  patchelf python3-venv python3-pip python3-build dpkg-dev binutils
)
# npm: Debian's package, unless a node install that brings its own npm is there.
command -v npm >/dev/null 2>&1 || PKGS+=(npm)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -ne 0 ]; then
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
echo "install-deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
if [ "${1:-}" = "--with-s3rver" ]; then
  "$(dirname "$0")/install-s3rver.sh"
fi
