// Internal: tf.train.Example records <-> shardkit samples (docs/formats-tfrecord.md).
//
// Reading walks the protobuf wire format of example.proto's messages directly,
// so that image bytes stay zero-copy views of the mapped file (the field numbers
// are the generated classes' constants); writing builds the generated messages.
//
// A mapping names which features are the image, the label, and the key:
//   imagenet (TensorFlow's ImageNet build scripts): image/encoded, image/class/label
//            (1-based there: shardkit's label = value - 1), image/filename (the key
//            is the file name without its image extension, which gives the field's
//            extension), image/format (written; read back only when it says what
//            the extension says);
//   tfds     (TFDS image datasets): image, label (0-based), file_name (as above);
//   a field map {feature: target}: target "__key__" (the key, verbatim), "cls"
//            (an int64 label as is), "cls-1" (1-based), or a field extension.
// Every other feature is carried, never dropped: a bytes feature holding one value
// whose name is a usable extension becomes that field; the rest (other types,
// several values, names such as "image/height") go into one field
// `tfexample.pb`, a serialized tf.train.Example of just those features, which the
// writer merges back.
//
// Thread safety: a Mapping is immutable; the functions are reentrant.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "shardkit/sample.h"
#include "shardkit/status.h"

namespace shardkit::formats::tfrecord {

// The field that carries unmapped features.
constexpr std::string_view kCarriedField = "tfexample.pb";

struct Mapping {
  std::string preset;         // "imagenet", "tfds", "field-map", "none"
  std::string image_feature;  // bytes: the image
  std::string label_feature;  // int64: the label
  int64_t label_offset = 0;   // shardkit label = value - label_offset
  std::string key_feature;    // bytes: the key
  bool key_has_ext = false;   // the key feature is a file name: key + "." + image extension
  std::string format_feature; // bytes: "JPEG", "PNG" (written; consumed when it agrees)
  std::map<std::string, std::string> field_map;  // feature -> field extension (field-map preset)
};

// A preset by name ("imagenet", "tfds"); an error for another name.
Result<Mapping> PresetMapping(std::string_view name);
// A mapping from a field map {feature: target}; checks the targets.
Result<Mapping> FieldMapMapping(const std::map<std::string, std::string>& field_map);
// The mapping for a dataset whose first record is `record`: the field map when
// given, else the preset whose image feature the record has (imagenet, then
// tfds), else "none" (every feature carried, keys from record numbers).
Result<Mapping> DetectMapping(std::string_view record, const std::map<std::string, std::string>& field_map,
                              const Location& where);

// Parses one record (a serialized Example) into *out. `record` views the
// record's data and keeps it alive; image and other bytes fields are views of
// it. `index` names the sample when no key feature is present ("%09d").
Status RecordToSample(const Mapping& m, const Bytes& record, uint64_t index, Sample* out, const Location& where);

// The feature keys of a record (for tests and info), sorted.
Result<std::vector<std::string>> FeatureKeys(std::string_view record, const Location& where);

// Serializes a sample as an Example under the mapping (deterministic bytes).
Result<std::string> SampleToRecord(const Mapping& m, const Sample& s);

}  // namespace shardkit::formats::tfrecord
