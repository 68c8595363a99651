// shardkit/sample.h: the data model.
//
// A sample is a key plus named fields, as in WebDataset: each field is an
// extension (`jpg`, `png`, `cls`, `json`, ...) and its bytes. `cls` holds the
// integer label as ASCII decimal. Extensions are lowercase; fields are kept
// sorted by extension and unique.
//
// Thread safety: a Sample is a plain value. Its field bytes are immutable
// Bytes, so a Sample may be copied and read from any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "shardkit/bytes.h"
#include "shardkit/export.h"

namespace shardkit {

struct Field {
  std::string ext;  // lowercase extension without the leading dot, e.g. "jpg", "seg.png"
  Bytes data;
  // The extension as the source spelled it, where that differs from `ext` in
  // case only (an image folder's "x_0.JPEG": ext "jpeg", source_ext "JPEG");
  // empty otherwise. Not part of the checksum. Writers that name entries by
  // file name (the LMDB caffe layout's keys) keep the source's spelling.
  std::string source_ext;
};

struct SHARDKIT_API Sample {
  std::string key;            // e.g. "n01440764/n01440764_10026"
  std::vector<Field> fields;  // sorted by ext, unique

  // The field with this extension, or nullptr.
  const Field* find(std::string_view ext) const;
  // Inserts or replaces a field, keeping the order.
  void set(std::string ext, Bytes data);
  // Removes a field if present.
  void erase(std::string_view ext);
  // The label parsed from `cls`, if the sample has a valid one.
  std::optional<int64_t> label() const;
  void set_label(int64_t label);
  // The first image field (jpg, jpeg, png, webp, avif, jxl, bmp, ...), or nullptr.
  const Field* image() const;
  // Total payload bytes over all fields.
  uint64_t bytes() const;
  // XXH3-64 over (ext, size, bytes) of every field in order: the per-sample checksum.
  uint64_t checksum() const;
  void clear() { key.clear(); fields.clear(); }
};

// True for extensions that hold an encoded image.
SHARDKIT_API bool IsImageExt(std::string_view ext);

}  // namespace shardkit
