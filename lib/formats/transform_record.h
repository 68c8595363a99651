// formats/transform_record.h (internal): the transform applied to images at conversion
// (WriteOptions::transform: a JSON object as text, e.g. {"resize": "short:256", "encode":
// "jpeg:90", "orientation": "applied"}; other members may appear and are kept as they
// are). A writer records it in its format's metadata as a JSON object (or, where the
// metadata is not JSON, as its compact text); the reader gives it back as
// DatasetInfo::extra["transform"], compact JSON text, which verify --against reads.
// docs/formats.md, "Transforms", lists where each format keeps it.
#pragma once

#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "shardkit/dataset.h"

namespace shardkit::formats {

// WriteOptions::transform parsed for the metadata: the JSON object, or kInvalidArgument
// (at `at`) when the text is not one. Call only when it is not empty.
inline Result<nlohmann::json> TransformRecord(const std::string& transform, const Location& at) {
  nlohmann::json j = nlohmann::json::parse(transform, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    return Status::Invalid(fmt::format("the transform to record is not a JSON object: {}", transform), at);
  return j;
}

// The recorded transform `record` (a metadata member, or the JSON text of an attribute)
// into info->extra["transform"] as compact JSON text; kCorrupt naming `file` and
// `metadata` (what holds it: "shardkit.json", "attribute 'transform'") when it is not a
// JSON object.
inline Status TakeTransform(const nlohmann::json& record, const std::string& metadata, const std::string& file,
                            DatasetInfo* info) {
  if (!record.is_object())
    return Status::Corrupt(fmt::format("{}: transform is not a JSON object", metadata), Location{.file = file});
  info->extra["transform"] = record.dump();
  return Status::OK();
}
inline Status TakeTransformText(const std::string& text, const std::string& metadata, const std::string& file,
                                DatasetInfo* info) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded()) return TakeTransform(nlohmann::json(), metadata, file, info);
  return TakeTransform(j, metadata, file, info);
}

}  // namespace shardkit::formats
