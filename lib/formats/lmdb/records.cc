// formats/lmdb/records.cc: value decoders (internal.h): shardkit msgpack records, caffe
// Datums, wild layouts. Values are zero-copy views into the map.
#include "formats/lmdb/internal.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <set>
#include <system_error>
#include <thread>

#include <msgpack.hpp>

#include "core/per_thread.h"
#include "core/resume.h"

namespace shardkit::formats::lmdb {

// A view into the map. `owner` keeps the map and the read transaction that
// found the value alive: the Env itself, or a random-access thread slot (which
// holds the Env).
Bytes View(const std::shared_ptr<const void>& owner, const void* p, size_t n) {
  return Bytes(std::shared_ptr<const void>(owner, p), static_cast<const uint8_t*>(p), n);
}

// check_payload: compare the payload with the record's xxh3 (sequential reads, verify);
// random access skips that hash (a few us per 100 kB) on the hot path, like the other formats.
Status DecodeRecord(const Env* env, const std::shared_ptr<const void>& owner, std::string_view lkey,
                    const MDB_val& v, uint64_t index, Sample* out, bool check_payload,
                    uint64_t* stored_sum) {
  out->clear();
  Location loc{.file = env->dir(), .key = std::string(lkey), .index = int64_t(index)};
  auto bad = [&](std::string why) {
    return Status::Corrupt(fmt::format("LMDB key '{}' in '{}': value is not a shardkit record: {}", lkey,
                                       env->data_path(), why),
                           loc);
  };
  if (!env->InMap(v.mv_data, v.mv_size)) return bad("value lies outside the data file");
  msgpack::object_handle oh;
  try {
    std::size_t off = 0;
    auto ref_all = [](msgpack::type::object_type, std::size_t, void*) { return true; };
    oh = msgpack::unpack(static_cast<const char*>(v.mv_data), v.mv_size, off, ref_all, nullptr,
                         msgpack::unpack_limit(0, 1 << 16, 1 << 20, 0xffffffff, 0, 4));
    if (off != v.mv_size) return bad(fmt::format("{} trailing bytes after the msgpack map", v.mv_size - off));
  } catch (const std::exception& e) {
    return bad(fmt::format("msgpack: {}", e.what()));
  }
  const msgpack::object& o = oh.get();
  if (o.type != msgpack::type::MAP) return bad("not a msgpack map");
  bool have_key = false, have_fields = false;
  std::optional<uint64_t> sum, key_sum;
  for (uint32_t i = 0; i < o.via.map.size; ++i) {
    const auto& kv = o.via.map.ptr[i];
    if (kv.key.type != msgpack::type::STR) return bad("a map key is not a string");
    std::string_view name(kv.key.via.str.ptr, kv.key.via.str.size);
    if (name == "key") {
      if (kv.val.type == msgpack::type::STR) out->key.assign(kv.val.via.str.ptr, kv.val.via.str.size);
      else if (kv.val.type == msgpack::type::BIN) out->key.assign(kv.val.via.bin.ptr, kv.val.via.bin.size);
      else return bad("\"key\" is neither str nor bin");
      have_key = true;
    } else if (name == "fields") {
      if (kv.val.type != msgpack::type::MAP) return bad("\"fields\" is not a map");
      const auto& fm = kv.val.via.map;
      out->fields.reserve(fm.size);
      for (uint32_t j = 0; j < fm.size; ++j) {
        const auto& f = fm.ptr[j];
        if (f.key.type != msgpack::type::STR || f.val.type != msgpack::type::BIN)
          return bad("a field is not str -> bin");
        std::string ext(f.key.via.str.ptr, f.key.via.str.size);
        if (ext.empty()) return bad("empty field name");
        if (out->find(ext)) return bad(fmt::format("field '{}' twice", ext));
        out->set(std::move(ext), View(owner, f.val.via.bin.ptr, f.val.via.bin.size));
      }
      have_fields = true;
    } else if (name == "xxh3") {
      if (kv.val.type != msgpack::type::POSITIVE_INTEGER) return bad("\"xxh3\" is not an unsigned integer");
      sum = kv.val.via.u64;
    } else if (name == "key_xxh3") {
      if (kv.val.type != msgpack::type::POSITIVE_INTEGER) return bad("\"key_xxh3\" is not an unsigned integer");
      key_sum = kv.val.via.u64;
    } else {
      // Strict: a damaged name ("xxh3" -> "xxh2") must not switch a check off.
      return bad(fmt::format("unknown record entry '{}'", name));
    }
  }
  if (!have_key || !have_fields) return bad("missing \"key\" or \"fields\"");
  if (out->key.empty()) return bad("empty sample key");
  if (key_sum && *key_sum != paths::Hash(out->key.data(), out->key.size()))
    return Status::Corrupt(fmt::format("LMDB key '{}' in '{}': the sample key '{}' does not match its stored key_xxh3",
                                       lkey, env->data_path(), out->key),
                           loc);
  if (stored_sum) *stored_sum = sum ? *sum : 0;
  if (check_payload && sum && *sum != out->checksum())
    return Status::Corrupt(fmt::format("LMDB key '{}' in '{}': checksum mismatch for sample '{}' (stored {}, computed {})",
                                       lkey, env->data_path(), out->key, paths::ChecksumString(*sum),
                                       paths::ChecksumString(out->checksum())),
                           SampleLoc(loc, out->key))
        .With(Detail::kSampleChecksum);
  return Status::OK();
}

// "00000012_a/b.JPEG" -> key "a/b", ext "jpeg". Keys without the prefix or the
// extension keep what they have.
void SplitCaffeKey(std::string_view lkey, std::string* key, std::string* ext) {
  size_t us = lkey.find('_');
  if (us != std::string_view::npos && us >= 1) {
    bool digits = true;
    for (size_t i = 0; i < us; ++i) digits &= lkey[i] >= '0' && lkey[i] <= '9';
    if (digits) lkey.remove_prefix(us + 1);
  }
  size_t slash = lkey.rfind('/');
  size_t dot = lkey.rfind('.');
  if (dot != std::string_view::npos && (slash == std::string_view::npos || dot > slash) && dot + 1 < lkey.size() &&
      dot > (slash == std::string_view::npos ? 0 : slash + 1)) {
    *key = std::string(lkey.substr(0, dot));
    *ext = paths::Lower(lkey.substr(dot + 1));
  } else {
    *key = std::string(lkey);
    ext->clear();
  }
}

bool ParseDatum(const void* p, size_t n, caffe::Datum* d) {
  if (n > size_t(INT32_MAX)) return false;
  if (!d->ParseFromArray(p, int(n))) return false;
  return d->GetReflection()->GetUnknownFields(*d).empty();
}

Status DecodeDatum(const Env* env, const std::shared_ptr<const void>& owner, std::string_view lkey,
                   const MDB_val& v, uint64_t index, Sample* out, const std::vector<uint64_t>* sums) {
  out->clear();
  Location loc{.file = env->dir(), .key = std::string(lkey), .index = int64_t(index)};
  auto bad = [&](std::string why) {
    return Status::Corrupt(fmt::format("LMDB key '{}' in '{}': value is not a caffe Datum: {}", lkey,
                                       env->data_path(), why),
                           loc);
  };
  if (!env->InMap(v.mv_data, v.mv_size)) return bad("value lies outside the data file");
  caffe::Datum d;
  if (!ParseDatum(v.mv_data, v.mv_size, &d)) return bad("protobuf parse failed");
  std::string ext;
  SplitCaffeKey(lkey, &out->key, &ext);
  if (out->key.empty()) return bad("empty sample key");
  // Zero-copy: locate d.data() inside the value (the parser copied it).
  auto data_view = [&]() -> Bytes {
    const std::string& s = d.data();
    std::string_view val(static_cast<const char*>(v.mv_data), v.mv_size);
    // A bytes field ends the way it was written: tag, length, payload. Find the
    // payload at its position by searching from the end for an exact match.
    if (!s.empty() && s.size() <= val.size()) {
      size_t pos = val.rfind(std::string_view(s));
      if (pos != std::string_view::npos) return View(owner, val.data() + pos, s.size());
    }
    return Bytes::Copy(s);
  };
  if (d.encoded()) {
    Bytes img = data_view();
    if (img.empty()) return bad("encoded Datum without image bytes");
    std::string spelled;  // the key's own spelling of the extension ("JPEG"), kept for writing back
    if (!ext.empty() && lkey.size() > ext.size()) spelled = std::string(lkey.substr(lkey.size() - ext.size()));
    if (ext.empty() || !IsImageExt(ext)) ext = paths::SniffImageExt(img.data(), img.size());
    out->set(ext, std::move(img));
    if (spelled != ext && paths::Lower(spelled) == ext) {
      for (auto& f : out->fields)
        if (f.ext == ext) f.source_ext = spelled;
    }
  } else {
    uint64_t c = uint64_t(std::max(d.channels(), 0)), h = uint64_t(std::max(d.height(), 0)),
             w = uint64_t(std::max(d.width(), 0));
    json shape = {{"channels", c}, {"height", h}, {"width", w}, {"order", "CHW"}, {"colors", "BGR"}};
    if (d.has_data() && !d.data().empty()) {
      if (d.data().size() != c * h * w)
        return bad(fmt::format("raw Datum holds {} bytes, not channels*height*width = {}", d.data().size(), c * h * w));
      shape["dtype"] = "uint8";
      out->set("raw", data_view());
    } else if (d.float_data_size() > 0) {
      if (uint64_t(d.float_data_size()) != c * h * w)
        return bad(fmt::format("raw Datum holds {} floats, not channels*height*width = {}", d.float_data_size(), c * h * w));
      shape["dtype"] = "float32";
      out->set("raw", Bytes::Copy(d.float_data().data(), size_t(d.float_data_size()) * sizeof(float)));
    } else {
      return bad("Datum holds neither data nor float_data");
    }
    out->set("shape", Bytes::Take(shape.dump()));
  }
  if (d.has_label()) out->set_label(d.label());
  if (sums && index < sums->size() && (*sums)[index] != out->checksum())
    return Status::Corrupt(fmt::format("LMDB key '{}' in '{}': checksum mismatch for sample '{}' (shardkit.json has {}, "
                                       "computed {})",
                                       lkey, env->data_path(), out->key, paths::ChecksumString((*sums)[index]),
                                       paths::ChecksumString(out->checksum())),
                           SampleLoc(loc, out->key))
        .With(Detail::kSampleChecksum);
  return Status::OK();
}


// A wild layout's value for one key, decoded (image bytes or a pickle).
Status DecodeWild(const Env* env, const wild::Catalog& cat, const std::shared_ptr<const void>& owner,
                  std::string_view lkey, const MDB_val& v, uint64_t index, Sample* out, MDB_txn* txn) {
  if (!env->InMap(v.mv_data, v.mv_size))
    return Status::Corrupt(fmt::format("LMDB key '{}' in '{}': value lies outside the data file", lkey, env->data_path()),
                           Location{.file = env->dir(), .key = std::string(lkey), .index = int64_t(index)});
  SK_RETURN_IF_ERROR(wild::Decode(cat, lkey, View(owner, v.mv_data, v.mv_size), index, env->data_path(), out));
  if (cat.label_keys.empty()) return Status::OK();
  // The split layout: the label text under its own key, in the same transaction.
  const std::string& label_key = cat.label_keys[index];
  Location loc{.file = env->data_path(), .key = label_key, .index = int64_t(index)};
  MDB_val k{label_key.size(), const_cast<char*>(label_key.data())}, lv;
  int rc = mdb_get(txn, env->dbi(), &k, &lv);
  if (rc == MDB_NOTFOUND)
    return Status::Corrupt(fmt::format("LMDB key '{}' of sample {} is missing from '{}'", label_key, index, env->dir()), loc);
  if (rc) return MdbStatus(rc, fmt::format("reading LMDB key '{}'", label_key), loc);
  if (!env->InMap(lv.mv_data, lv.mv_size))
    return Status::Corrupt(fmt::format("LMDB key '{}' in '{}': value lies outside the data file", label_key, env->data_path()),
                           loc);
  out->key.assign(lkey.substr(lkey.find_last_not_of("0123456789") + 1));  // image-000000001 -> 000000001
  out->set("txt", View(owner, lv.mv_data, lv.mv_size));
  return Status::OK();
}


}  // namespace shardkit::formats::lmdb
