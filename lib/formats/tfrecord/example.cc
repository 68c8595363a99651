// tf.train.Example <-> Sample: see example.h.
#include "formats/tfrecord/example.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>

#include <algorithm>
#include <cstring>
#include <optional>

#include <fmt/format.h>

#include "core/paths.h"
#include "formats/tfrecord/example.pb.h"

namespace shardkit::formats::tfrecord {

namespace {

namespace pb = ::shardkit::tfexample;

// Wire types of the protobuf encoding.
constexpr int kVarint = 0, kFixed64 = 1, kLen = 2, kFixed32 = 5;

// A cursor over protobuf wire bytes.
struct Wire {
  const uint8_t* p;
  const uint8_t* end;
  explicit Wire(std::string_view s)
      : p(reinterpret_cast<const uint8_t*>(s.data())), end(reinterpret_cast<const uint8_t*>(s.data()) + s.size()) {}
  bool done() const { return p >= end; }
  bool Varint(uint64_t* v) {
    uint64_t out = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (p >= end) return false;
      uint8_t b = *p++;
      out |= uint64_t(b & 0x7f) << shift;
      if (!(b & 0x80)) {
        *v = out;
        return true;
      }
    }
    return false;
  }
  // Reads a tag; false at a malformed one.
  bool Tag(uint32_t* field, int* type) {
    uint64_t t;
    if (!Varint(&t) || (t >> 3) == 0 || (t >> 3) > 0x1fffffff) return false;
    *field = uint32_t(t >> 3);
    *type = int(t & 7);
    return true;
  }
  bool Len(std::string_view* out) {
    uint64_t n;
    if (!Varint(&n) || n > uint64_t(end - p)) return false;
    *out = std::string_view(reinterpret_cast<const char*>(p), size_t(n));
    p += n;
    return true;
  }
  bool Skip(int type) {
    uint64_t v;
    std::string_view s;
    switch (type) {
      case kVarint: return Varint(&v);
      case kFixed64: if (end - p < 8) return false; p += 8; return true;
      case kFixed32: if (end - p < 4) return false; p += 4; return true;
      case kLen: return Len(&s);
      default: return false;  // groups (3, 4) and reserved types do not occur in these messages
    }
  }
};

enum class Kind { kNone, kBytes, kFloat, kInt64 };

struct RawFeature {
  std::string_view key;
  std::string_view body;  // the Feature message
};

struct Values {
  Kind kind = Kind::kNone;
  std::vector<std::string_view> bytes;
  std::vector<int64_t> ints;
  std::vector<float> floats;
  size_t count() const { return kind == Kind::kBytes ? bytes.size() : kind == Kind::kInt64 ? ints.size() : floats.size(); }
};

Status Malformed(const Location& where, std::string_view what) {
  return Status::Corrupt(fmt::format("record is not a tf.train.Example: {}", what), where);
}

// The features of an Example, the last of each key (protobuf's map rule), sorted by key.
Status ParseFeatures(std::string_view record, std::vector<RawFeature>* out, const Location& where) {
  out->clear();
  Wire ex(record);
  while (!ex.done()) {
    uint32_t f;
    int t;
    if (!ex.Tag(&f, &t)) return Malformed(where, "bad tag in Example");
    if (f != pb::Example::kFeaturesFieldNumber || t != kLen) {
      if (!ex.Skip(t)) return Malformed(where, "bad field in Example");
      continue;
    }
    std::string_view features;
    if (!ex.Len(&features)) return Malformed(where, "Example.features runs past the record");
    Wire fs(features);
    while (!fs.done()) {
      if (!fs.Tag(&f, &t)) return Malformed(where, "bad tag in Features");
      if (f != pb::Features::kFeatureFieldNumber || t != kLen) {
        if (!fs.Skip(t)) return Malformed(where, "bad field in Features");
        continue;
      }
      std::string_view entry;
      if (!fs.Len(&entry)) return Malformed(where, "a Features.feature entry runs past its message");
      RawFeature rf;
      Wire e(entry);
      while (!e.done()) {
        if (!e.Tag(&f, &t)) return Malformed(where, "bad tag in a feature map entry");
        if (f == 1 && t == kLen) {
          if (!e.Len(&rf.key)) return Malformed(where, "a feature name runs past its entry");
        } else if (f == 2 && t == kLen) {
          if (!e.Len(&rf.body)) return Malformed(where, "a Feature runs past its entry");
        } else if (!e.Skip(t)) {
          return Malformed(where, "bad field in a feature map entry");
        }
      }
      out->push_back(rf);
    }
  }
  std::stable_sort(out->begin(), out->end(), [](const RawFeature& a, const RawFeature& b) { return a.key < b.key; });
  // Keep the last of equal keys.
  std::vector<RawFeature> dedup;
  dedup.reserve(out->size());
  for (size_t i = 0; i < out->size(); ++i)
    if (i + 1 == out->size() || (*out)[i + 1].key != (*out)[i].key) dedup.push_back((*out)[i]);
  out->swap(dedup);
  return Status::OK();
}

Status DecodeFeature(std::string_view body, Values* v, std::string_view key, const Location& where) {
  *v = Values{};
  std::string_view list;
  Wire w(body);
  while (!w.done()) {
    uint32_t f;
    int t;
    if (!w.Tag(&f, &t)) return Malformed(where, fmt::format("bad tag in feature '{}'", key));
    if (t == kLen && (f == pb::Feature::kBytesListFieldNumber || f == pb::Feature::kFloatListFieldNumber ||
                      f == pb::Feature::kInt64ListFieldNumber)) {
      if (!w.Len(&list)) return Malformed(where, fmt::format("feature '{}' runs past its message", key));
      v->kind = f == pb::Feature::kBytesListFieldNumber   ? Kind::kBytes
                : f == pb::Feature::kFloatListFieldNumber ? Kind::kFloat
                                                          : Kind::kInt64;  // oneof: the last one wins
    } else if (!w.Skip(t)) {
      return Malformed(where, fmt::format("bad field in feature '{}'", key));
    }
  }
  if (v->kind == Kind::kNone) return Status::OK();
  Wire l(list);
  while (!l.done()) {
    uint32_t f;
    int t;
    if (!l.Tag(&f, &t)) return Malformed(where, fmt::format("bad tag in the list of feature '{}'", key));
    if (f != 1) {
      if (!l.Skip(t)) return Malformed(where, fmt::format("bad field in the list of feature '{}'", key));
      continue;
    }
    if (v->kind == Kind::kBytes) {
      std::string_view s;
      if (t != kLen || !l.Len(&s)) return Malformed(where, fmt::format("bad bytes value in feature '{}'", key));
      v->bytes.push_back(s);
    } else if (v->kind == Kind::kInt64) {
      uint64_t x;
      if (t == kVarint) {
        if (!l.Varint(&x)) return Malformed(where, fmt::format("bad int64 value in feature '{}'", key));
        v->ints.push_back(int64_t(x));
      } else if (t == kLen) {
        std::string_view packed;
        if (!l.Len(&packed)) return Malformed(where, fmt::format("bad packed int64s in feature '{}'", key));
        Wire pw(packed);
        while (!pw.done()) {
          if (!pw.Varint(&x)) return Malformed(where, fmt::format("bad packed int64s in feature '{}'", key));
          v->ints.push_back(int64_t(x));
        }
      } else {
        return Malformed(where, fmt::format("bad int64 value in feature '{}'", key));
      }
    } else {
      auto take = [&](const uint8_t* p) {
        uint32_t u = uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
        float fl;
        std::memcpy(&fl, &u, 4);
        v->floats.push_back(fl);
      };
      if (t == kFixed32) {
        if (l.end - l.p < 4) return Malformed(where, fmt::format("bad float value in feature '{}'", key));
        take(l.p);
        l.p += 4;
      } else if (t == kLen) {
        std::string_view packed;
        if (!l.Len(&packed) || packed.size() % 4)
          return Malformed(where, fmt::format("bad packed floats in feature '{}'", key));
        for (size_t i = 0; i < packed.size(); i += 4) take(reinterpret_cast<const uint8_t*>(packed.data() + i));
      } else {
        return Malformed(where, fmt::format("bad float value in feature '{}'", key));
      }
    }
  }
  return Status::OK();
}

// A feature name that can be a field extension as it is.
bool UsableExt(std::string_view s) {
  if (s.empty() || s.size() > 64 || s.front() == '.' || s.back() == '.' || s == kCarriedField) return false;
  if (s.find("..") != std::string_view::npos) return false;
  for (char c : s)
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-' || c == '.')) return false;
  return true;
}

std::string FormatName(std::string_view ext) {
  if (ext == "jpg" || ext == "jpeg") return "JPEG";
  std::string u(ext);
  for (auto& c : u) c = char(std::toupper(static_cast<unsigned char>(c)));
  return u;
}

void AppendVarint(std::string* out, uint64_t v) {
  while (v >= 0x80) {
    out->push_back(char(v | 0x80));
    v >>= 7;
  }
  out->push_back(char(v));
}
void AppendLen(std::string* out, uint32_t field, std::string_view s) {
  AppendVarint(out, (uint64_t(field) << 3) | kLen);
  AppendVarint(out, s.size());
  out->append(s);
}

// An Example holding just these features (sorted), byte for byte as protobuf encodes it.
std::string CarriedExample(const std::vector<const RawFeature*>& fs) {
  std::string features, entry;
  for (const RawFeature* f : fs) {
    entry.clear();
    AppendLen(&entry, 1, f->key);
    AppendLen(&entry, 2, f->body);
    AppendLen(&features, pb::Features::kFeatureFieldNumber, entry);
  }
  std::string ex;
  AppendLen(&ex, pb::Example::kFeaturesFieldNumber, features);
  return ex;
}

Bytes Slice(const Bytes& record, std::string_view v) {
  return record.slice(size_t(reinterpret_cast<const uint8_t*>(v.data()) - record.data()), v.size());
}

std::string FloatText(float f) { return fmt::format("{}", f); }

}  // namespace

Result<Mapping> PresetMapping(std::string_view name) {
  Mapping m;
  m.preset = std::string(name);
  if (name == "imagenet") {
    m.image_feature = "image/encoded";
    m.label_feature = "image/class/label";
    m.label_offset = 1;
    m.key_feature = "image/filename";
    m.key_has_ext = true;
    m.format_feature = "image/format";
  } else if (name == "tfds") {
    m.image_feature = "image";
    m.label_feature = "label";
    m.key_feature = "file_name";
    m.key_has_ext = true;
  } else {
    return Status::Invalid(fmt::format("unknown TFRecord preset '{}' (imagenet, tfds; or give a field map)", name));
  }
  return m;
}

Result<Mapping> FieldMapMapping(const std::map<std::string, std::string>& field_map) {
  Mapping m;
  m.preset = "field-map";
  int keys = 0, labels = 0;
  for (const auto& [feature, target] : field_map) {
    if (feature.empty()) return Status::Invalid("field map: empty feature name");
    if (target == "__key__") {
      ++keys;
    } else if (target == "cls" || target == "cls-1") {
      ++labels;
    } else if (!UsableExt(target)) {
      return Status::Invalid(fmt::format("field map: '{}' -> '{}': the target must be __key__, cls, cls-1 or a "
                                         "lowercase field extension ([a-z0-9._-])",
                                         feature, target));
    }
    for (const auto& [other, t2] : field_map)
      if (other != feature && t2 == target)
        return Status::Invalid(fmt::format("field map: '{}' and '{}' both map to '{}'", feature, other, target));
  }
  (void)keys;
  (void)labels;
  m.field_map = field_map;
  return m;
}

Result<Mapping> DetectMapping(std::string_view record, const std::map<std::string, std::string>& field_map,
                              const Location& where) {
  if (!field_map.empty()) return FieldMapMapping(field_map);
  std::vector<RawFeature> fs;
  SK_RETURN_IF_ERROR(ParseFeatures(record, &fs, where));
  auto has = [&](std::string_view k) {
    return std::any_of(fs.begin(), fs.end(), [&](const RawFeature& f) { return f.key == k; });
  };
  if (has("image/encoded")) return PresetMapping("imagenet");
  if (has("image")) return PresetMapping("tfds");
  Mapping m;
  m.preset = "none";
  return m;
}

Result<std::vector<std::string>> FeatureKeys(std::string_view record, const Location& where) {
  std::vector<RawFeature> fs;
  SK_RETURN_IF_ERROR(ParseFeatures(record, &fs, where));
  std::vector<std::string> out;
  for (const auto& f : fs) out.emplace_back(f.key);
  return out;
}

Status RecordToSample(const Mapping& m, const Bytes& record, uint64_t index, Sample* out, const Location& where) {
  out->clear();
  std::vector<RawFeature> fs;
  SK_RETURN_IF_ERROR(ParseFeatures(record.view(), &fs, where));
  std::vector<bool> used(fs.size(), false);
  Values v;
  std::optional<std::string_view> key, format, image;
  std::string image_target;  // field-map: the image's extension
  std::optional<int64_t> label;
  for (size_t i = 0; i < fs.size(); ++i) {
    const RawFeature& f = fs[i];
    bool mapped = f.key == m.image_feature || f.key == m.label_feature || f.key == m.key_feature ||
                  f.key == m.format_feature || m.field_map.count(std::string(f.key));
    if (!mapped || f.key.empty()) continue;
    SK_RETURN_IF_ERROR(DecodeFeature(f.body, &v, f.key, where));
    bool one_bytes = v.kind == Kind::kBytes && v.bytes.size() == 1;
    bool one_int = v.kind == Kind::kInt64 && v.ints.size() == 1;
    std::string target;
    if (auto it = m.field_map.find(std::string(f.key)); it != m.field_map.end()) target = it->second;
    if (f.key == m.image_feature && one_bytes) {
      image = v.bytes[0];
    } else if (int64_t l; f.key == m.label_feature && one_int && !__builtin_sub_overflow(v.ints[0], m.label_offset, &l)) {
      label = l;
    } else if (f.key == m.key_feature && one_bytes) {
      key = v.bytes[0];
    } else if (f.key == m.format_feature && one_bytes) {
      format = v.bytes[0];
      continue;  // consumed below only when it agrees with the extension
    } else if (target == "__key__" && one_bytes) {
      key = v.bytes[0];
    } else if (int64_t l; (target == "cls" || target == "cls-1") && one_int &&
                          !__builtin_sub_overflow(v.ints[0], target == "cls-1" ? 1 : 0, &l)) {
      label = l;
    } else if (!target.empty() && target != "__key__" && target != "cls" && target != "cls-1" && v.count() == 1) {
      if (v.kind == Kind::kBytes)
        out->set(target, Slice(record, v.bytes[0]));
      else if (v.kind == Kind::kInt64)
        out->set(target, Bytes::Take(std::to_string(v.ints[0])));
      else
        out->set(target, Bytes::Take(FloatText(v.floats[0])));
    } else {
      continue;  // not what the mapping expects: carried
    }
    used[i] = true;
  }
  // The key, and the image's extension from the file name where the preset has one.
  std::string the_key = key ? std::string(*key) : fmt::format("{:09d}", index);
  if (image) {
    std::string ext, source_ext;
    if (m.key_has_ext && key) {
      size_t slash = the_key.rfind('/');
      size_t dot = the_key.rfind('.');
      if (dot != std::string::npos && (slash == std::string::npos || dot > slash) && dot + 1 < the_key.size()) {
        std::string spelled = the_key.substr(dot + 1);
        std::string lower = paths::Lower(spelled);
        if (IsImageExt(lower) && dot > (slash == std::string::npos ? 0 : slash + 1)) {
          ext = lower;
          if (spelled != lower) source_ext = spelled;
          the_key.resize(dot);
        }
      }
    }
    if (ext.empty())
      ext = paths::SniffImageExt(reinterpret_cast<const uint8_t*>(image->data()), image->size());
    out->set(ext, Slice(record, *image));
    if (!source_ext.empty())
      for (auto& fl : out->fields)
        if (fl.ext == ext) fl.source_ext = source_ext;
    if (format && *format == FormatName(ext))
      for (size_t i = 0; i < fs.size(); ++i)
        if (fs[i].key == m.format_feature) used[i] = true;
  }
  if (label) out->set_label(*label);
  // Every other feature: a field of its own, or carried in tfexample.pb.
  std::vector<const RawFeature*> carried;
  for (size_t i = 0; i < fs.size(); ++i) {
    if (used[i]) continue;
    const RawFeature& f = fs[i];
    SK_RETURN_IF_ERROR(DecodeFeature(f.body, &v, f.key, where));
    if (v.kind == Kind::kBytes && v.bytes.size() == 1 && UsableExt(f.key) && !out->find(f.key) &&
        f.key != m.format_feature)
      out->set(std::string(f.key), Slice(record, v.bytes[0]));
    else
      carried.push_back(&f);
  }
  if (!carried.empty()) out->set(std::string(kCarriedField), Bytes::Take(CarriedExample(carried)));
  out->key = std::move(the_key);
  if (out->key.empty()) return Status::Corrupt("record's key feature is empty", where);
  return Status::OK();
}

Result<std::string> SampleToRecord(const Mapping& m, const Sample& s) {
  Location where{.key = s.key};
  pb::Example ex;
  auto& fm = *ex.mutable_features()->mutable_feature();
  if (const Field* c = s.find(kCarriedField)) {
    pb::Example carried;
    if (!carried.ParseFromArray(c->data.data(), int(c->data.size())))
      return Status::Invalid(fmt::format("field '{}' is not a serialized tf.train.Example", kCarriedField), where);
    for (auto& [k, f] : carried.features().feature()) fm[k] = f;
  }
  std::vector<bool> used(s.fields.size(), false);
  auto index_of = [&](const Field* f) { return size_t(f - s.fields.data()); };
  auto put_bytes = [&](const std::string& name, std::string_view value, std::string_view from) -> Status {
    if (fm.count(name))
      return Status::Invalid(fmt::format("feature '{}' is both carried in '{}' and made from {}", name, kCarriedField,
                                         from),
                             where);
    fm[name].mutable_bytes_list()->add_value(value.data(), value.size());
    return Status::OK();
  };
  auto put_int = [&](const std::string& name, int64_t value, std::string_view from) -> Status {
    if (fm.count(name))
      return Status::Invalid(fmt::format("feature '{}' is both carried in '{}' and made from {}", name, kCarriedField,
                                         from),
                             where);
    fm[name].mutable_int64_list()->add_value(value);
    return Status::OK();
  };
  // The label, when `cls` holds one in canonical decimal (else `cls` goes as bytes).
  const Field* cls = s.find("cls");
  const std::optional<int64_t> parsed = s.label();
  const int64_t label_value = parsed.value_or(0);
  int64_t room;  // a label that the preset's offset would overflow is written as bytes
  const bool has_label = parsed.has_value() && cls->data.view() == std::to_string(label_value) &&
                         !__builtin_add_overflow(label_value, int64_t(1), &room);
  if (m.preset == "field-map") {
    for (const auto& [feature, target] : m.field_map) {
      if (target == "__key__") {
        SK_RETURN_IF_ERROR(put_bytes(feature, s.key, "the key"));
      } else if (target == "cls" || target == "cls-1") {
        if (!has_label) continue;
        SK_RETURN_IF_ERROR(put_int(feature, label_value + (target == "cls-1" ? 1 : 0), "the label"));
        used[index_of(cls)] = true;
      } else if (const Field* f = s.find(target)) {
        SK_RETURN_IF_ERROR(put_bytes(feature, f->data.view(), fmt::format("field '{}'", target)));
        used[index_of(f)] = true;
      }
    }
  } else if (m.preset == "imagenet" || m.preset == "tfds") {
    const Field* img = s.image();
    if (img) {
      SK_RETURN_IF_ERROR(put_bytes(m.image_feature, img->data.view(), fmt::format("field '{}'", img->ext)));
      used[index_of(img)] = true;
      if (!m.format_feature.empty() && !fm.count(m.format_feature))
        fm[m.format_feature].mutable_bytes_list()->add_value(FormatName(img->ext));
    }
    if (has_label) {
      SK_RETURN_IF_ERROR(put_int(m.label_feature, label_value + m.label_offset, "the label"));
      used[index_of(cls)] = true;
    }
    std::string name = s.key;
    if (m.key_has_ext && img) name += "." + (img->source_ext.empty() ? img->ext : img->source_ext);
    SK_RETURN_IF_ERROR(put_bytes(m.key_feature, name, "the key"));
  } else {
    return Status::Invalid(fmt::format("cannot write TFRecords with mapping '{}'", m.preset), where);
  }
  for (size_t i = 0; i < s.fields.size(); ++i) {
    const Field& f = s.fields[i];
    if (used[i] || f.ext == kCarriedField) continue;
    SK_RETURN_IF_ERROR(put_bytes(f.ext, f.data.view(), fmt::format("field '{}'", f.ext)));
  }
  std::string out;
  {
    google::protobuf::io::StringOutputStream sos(&out);
    google::protobuf::io::CodedOutputStream cos(&sos);
    cos.SetSerializationDeterministic(true);
    if (!ex.SerializeToCodedStream(&cos)) return Status::Internal("cannot serialize a tf.train.Example", where);
  }
  return out;
}

}  // namespace shardkit::formats::tfrecord
