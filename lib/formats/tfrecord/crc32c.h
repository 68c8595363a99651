// Internal: CRC32C (Castagnoli, reflected polynomial 0x82F63B78), as TFRecord
// frames use it, and TensorFlow's mask. Our own implementation from the
// definition: a slicing-by-8 table, and the SSE4.2 crc32 instruction where the
// CPU has it (same results; checked against each other in tests/tfrecord_test.cc).
#pragma once

#include <cstddef>
#include <cstdint>

namespace shardkit::formats::tfrecord {

// CRC32C of n bytes, continuing from `crc` (0 for a fresh one).
uint32_t Crc32c(const void* data, size_t n, uint32_t crc = 0);
// The table-only implementation (what Crc32c uses without SSE4.2).
uint32_t Crc32cPortable(const void* data, size_t n, uint32_t crc = 0);

// TensorFlow's masked CRC: rotate right by 15, add 0xa282ead8 (mod 2^32).
inline uint32_t MaskCrc(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }
inline uint32_t MaskedCrc32c(const void* data, size_t n) { return MaskCrc(Crc32c(data, n)); }

}  // namespace shardkit::formats::tfrecord
