#!/usr/bin/env bash
# Compiles lib/gpu/gpu_loader.cc with SHARDKIT_HAVE_NVJPEG on, syntax only, where the
# CUDA toolkit has no nvjpeg.h (this development machine): gpu_loader.cc sees nvJPEG only
# through lib/gpu/nvjpeg_decoder.h, which has no nvJPEG types, so its nvJPEG branches can
# be checked here before device time is spent on them.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
CUDA_INC=${CUDA_INC:-/usr/local/cuda/include}
for f in lib/gpu/gpu_loader.cc; do
  c++ -std=c++20 -Wall -Wextra -Wno-missing-field-initializers -fsyntax-only \
    -DSHARDKIT_HAVE_CUDA=1 -DSHARDKIT_HAVE_NVJPEG=1 -DFMT_SHARED -DMSGPACK_DEFAULT_API_VERSION=3 \
    -Iinclude -Ilib -I"$BUILD/lib" -isystem "$CUDA_INC" "$f"
  echo "ok: $f (nvJPEG branches)"
done
