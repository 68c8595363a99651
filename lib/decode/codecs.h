// decode/codecs.h (internal): WebP, AVIF and JPEG XL images decoded whole to 8-bit RGB,
// for ImageDecoder (decode/jpeg.h), which picks the codec by magic bytes.
//
// Each reads the image's header first and refuses declared dimensions over Limits
// (CheckDimensions) before any pixel memory is allocated; then it decodes the whole
// image into `rgb` (width * height * 3 bytes, rows packed). Alpha is dropped (the colour
// samples are kept as stored, as the PNG path and PIL's convert("RGB") do), samples of
// more than 8 bits are reduced to 8, grayscale is expanded to RGB.
// - WebP (libwebp): the first frame only of a still image; an animated WebP is refused.
// - AVIF (libavif): the primary item; its irot/imir transforms are applied (libavif only
//   reports them), the clean aperture (clap) is not. libavif's own imageSizeLimit and
//   imageDimensionLimit are set from Limits, so the AV1 decoder refuses a frame over them.
// - JPEG XL (libjxl): the first frame, with the codestream's orientation applied (libjxl's
//   default), converted by libjxl to its output colour space (sRGB for XYB images).
// A codec left out of the build (SHARDKIT_WITH_* off, cmake/ShardkitDeps.cmake) gives
// kUnsupported saying so.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "decode/jpeg.h"

namespace shardkit::decode {

Status DecodeWebp(const uint8_t* data, size_t size, const Limits& limits, std::vector<uint8_t>* rgb,
                  ImageInfo* info);
Status DecodeAvif(const uint8_t* data, size_t size, const Limits& limits, std::vector<uint8_t>* rgb,
                  ImageInfo* info);
Status DecodeJxl(const uint8_t* data, size_t size, const Limits& limits, std::vector<uint8_t>* rgb,
                 ImageInfo* info);

// The largest image size an AVIF file's 'ispe' properties declare (0x0 when none is
// found): read from the boxes (ftyp, meta, iprp, ipco) without libavif, so that a refusal
// names the declared size even where libavif's own limit stops first.
bool AvifDeclaredSize(const uint8_t* data, size_t size, uint32_t* width, uint32_t* height);

}  // namespace shardkit::decode
