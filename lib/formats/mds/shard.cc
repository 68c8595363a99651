// One MDS shard file: size and hash checks against index.json, bounded zstd
// decompression, the header (uint32 count, uint32 offsets[count + 1], the
// writer's config JSON) and the samples (uint32 sizes of the variable columns,
// then every column's bytes).
#include <png.h>
#include <zstd.h>

#include <cmath>
#include <cstring>

#include <fmt/format.h>

#include "formats/mds/mds.h"

namespace shardkit::formats::mds {

namespace {

uint32_t U32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;  // little-endian hosts only (x86-64, aarch64), as streaming's numpy writes
}

std::string Short(const std::string& hex) { return hex.size() > 16 ? hex.substr(0, 16) + "..." : hex; }

Status CheckHashes(const FileRef& f, const uint8_t* p, size_t n, const std::string& file, int64_t shard,
                   const char* which) {
  for (const auto& [algo, want] : f.hashes) {
    if (!KnownHash(algo)) continue;  // reported by info (extra "hashes_unchecked")
    SK_ASSIGN_OR_RETURN(std::string got, HashHex(algo, p, n));
    if (got != want) {
      Status st = Status::Corrupt(
          fmt::format("{} {} of {} is {} but index.json records {}", which, algo, f.basename, Short(got), Short(want)),
          Location{.file = file, .shard = shard});
      st.With(Detail::kShardChecksum);
      return st;
    }
  }
  return Status::OK();
}

// The text of a float of `width` bytes: the shortest that reads back the same.
std::string FloatText(const uint8_t* p, int width) {
  if (width == 8) {
    double d;
    std::memcpy(&d, p, 8);
    return fmt::format("{}", d);
  }
  if (width == 4) {
    float f;
    std::memcpy(&f, p, 4);
    return fmt::format("{}", f);
  }
  uint16_t h = uint16_t(p[0] | (p[1] << 8));  // IEEE half
  int e = (h >> 10) & 0x1f, m = h & 0x3ff;
  float v = e == 0 ? std::ldexp(float(m), -24) : e == 31 ? (m ? NAN : INFINITY) : std::ldexp(float(m | 0x400), e - 25);
  if (h & 0x8000) v = -v;
  return fmt::format("{}", v);
}

std::string IntText(const uint8_t* p, int width, bool is_signed) {
  uint64_t u = 0;
  for (int i = width - 1; i >= 0; --i) u = (u << 8) | p[i];
  if (!is_signed) return fmt::format("{}", u);
  if (width < 8 && (u >> (8 * width - 1)) & 1) u |= ~uint64_t(0) << (8 * width);  // sign-extend
  return fmt::format("{}", int64_t(u));
}

}  // namespace

Result<std::string> PilToPng(const uint8_t* p, size_t n, const Location& at) {
  if (n < 12) return Status::Corrupt(fmt::format("pil value of {} bytes is shorter than its header", n), at);
  uint64_t w = U32(p), h = U32(p + 4), ml = U32(p + 8);
  if (ml > n - 12) return Status::Corrupt("pil mode runs past the value", at);
  std::string mode(reinterpret_cast<const char*>(p + 12), size_t(ml));
  uint32_t format;
  uint64_t channels;
  if (mode == "L") format = PNG_FORMAT_GRAY, channels = 1;
  else if (mode == "LA") format = PNG_FORMAT_GA, channels = 2;
  else if (mode == "RGB") format = PNG_FORMAT_RGB, channels = 3;
  else if (mode == "RGBA") format = PNG_FORMAT_RGBA, channels = 4;
  else
    return Status::Unsupported(fmt::format("pil image mode '{}' is not converted (L, LA, RGB and RGBA are)", mode), at);
  uint64_t raw = n - 12 - ml;
  if (w == 0 || h == 0 || w > 0x7fffffff || h > 0x7fffffff || raw / channels / w != h || raw != w * h * channels)
    return Status::Corrupt(fmt::format("pil {}x{} {} image needs {} pixel bytes, the value holds {}", w, h, mode,
                                       w * h * channels, raw),
                           at);
  png_image img{};
  img.version = PNG_IMAGE_VERSION;
  img.width = uint32_t(w);
  img.height = uint32_t(h);
  img.format = format;
  png_alloc_size_t size = 0;
  const uint8_t* px = p + 12 + ml;
  if (!png_image_write_to_memory(&img, nullptr, &size, 0, px, 0, nullptr))
    return Status::Internal(fmt::format("libpng: {}", img.message), at);
  std::string out(size, '\0');
  if (!png_image_write_to_memory(&img, out.data(), &size, 0, px, 0, nullptr))
    return Status::Internal(fmt::format("libpng: {}", img.message), at);
  out.resize(size);
  return out;
}

uint32_t ShardData::offset(uint64_t i) const { return U32(data + 4 + 4 * i); }

bool ParseZstd(std::string_view c, int* level) {
  if (c == "zstd") {
    *level = 3;  // streaming's default
    return true;
  }
  if (c.rfind("zstd:", 0) != 0 || c.size() < 6 || c.size() > 7) return false;
  int l = 0;
  for (char ch : c.substr(5)) {
    if (ch < '0' || ch > '9') return false;
    l = l * 10 + (ch - '0');
  }
  if (l < 1 || l > 22) return false;
  *level = l;
  return true;
}

Result<std::string> Zstd(std::string_view raw, int level) {
  std::string out(ZSTD_compressBound(raw.size()), '\0');
  size_t r = ZSTD_compress(out.data(), out.size(), raw.data(), raw.size(), level);
  if (ZSTD_isError(r)) return Status::Internal(fmt::format("zstd compression failed: {}", ZSTD_getErrorName(r)));
  out.resize(r);
  return out;
}

Result<std::string> Unzstd(const uint8_t* p, size_t n, uint64_t limit, const Location& at) {
  unsigned long long declared = ZSTD_getFrameContentSize(p, n);
  if (declared == ZSTD_CONTENTSIZE_ERROR)
    return Status::Corrupt("not a zstd frame (bad magic or header)", at);
  if (declared != ZSTD_CONTENTSIZE_UNKNOWN && declared > limit)
    return Status::Corrupt(fmt::format("zstd frame declares {} bytes, more than the {} index.json records for the "
                                       "uncompressed shard (a decompression bomb?)",
                                       declared, limit),
                           at);
  std::unique_ptr<ZSTD_DCtx, size_t (*)(ZSTD_DCtx*)> dctx(ZSTD_createDCtx(), ZSTD_freeDCtx);
  if (!dctx) return Status::Internal("cannot create a zstd context", at);
  // Never more than the limit (+1 to notice an overrun), grown as output comes.
  std::string out;
  size_t cap = size_t(std::min<uint64_t>(limit + 1, declared != ZSTD_CONTENTSIZE_UNKNOWN ? declared + 1 : 1 << 20));
  out.resize(std::max<size_t>(cap, 1));
  ZSTD_inBuffer in{p, n, 0};
  size_t pos = 0, last = 0;
  auto bomb = [&] {
    return Status::Corrupt(fmt::format("zstd data decompresses to more than the {} bytes index.json records for the "
                                       "uncompressed shard (a decompression bomb?)",
                                       limit),
                           Location{.file = at.file, .shard = at.shard, .offset = int64_t(in.pos)});
  };
  for (;;) {
    if (pos == out.size()) {
      if (out.size() > limit) return bomb();
      out.resize(size_t(std::min<uint64_t>(limit + 1, uint64_t(out.size()) * 2)));
    }
    ZSTD_outBuffer ob{out.data(), out.size(), pos};
    last = ZSTD_decompressStream(dctx.get(), &ob, &in);
    if (ZSTD_isError(last))
      return Status::Corrupt(fmt::format("zstd: {}", ZSTD_getErrorName(last)),
                             Location{.file = at.file, .shard = at.shard, .offset = int64_t(in.pos)});
    pos = ob.pos;
    if (pos > limit) return bomb();
    if (in.pos == in.size && (last == 0 || ob.pos < ob.size)) break;  // done, or out of input
  }
  if (last != 0)
    return Status::Corrupt("truncated zstd data (the frame does not end)",
                           Location{.file = at.file, .shard = at.shard, .offset = int64_t(n)});
  out.resize(pos);
  return out;
}

Status CheckHeader(const ShardData& d, const ShardMeta& m) {
  const std::string& file = m.path;
  const char* unz = m.zip ? " (of the uncompressed shard)" : "";
  auto at = [&](uint64_t off) { return Location{.file = file, .shard = m.index, .offset = int64_t(off)}; };
  if (d.size < 8) return Status::Corrupt(fmt::format("shard of {} bytes is too short for its header{}", d.size, unz), at(0));
  uint32_t n = U32(d.data);
  if (n != m.samples)
    return Status::Corrupt(fmt::format("shard header counts {} samples but index.json records {}{}", n, m.samples, unz),
                           at(0));
  uint64_t head = 4 + 4 * (uint64_t(n) + 1);
  if (head > d.size)
    return Status::Corrupt(fmt::format("offset table of {} entries runs past the end of the {}-byte shard{}", n + 1,
                                       d.size, unz),
                           at(4));
  uint32_t prev = U32(d.data + 4);
  if (prev < head)
    return Status::Corrupt(fmt::format("first sample offset {} points into the header ({} bytes){}", prev, head, unz),
                           at(4));
  for (uint64_t i = 1; i <= n; ++i) {
    uint32_t o = U32(d.data + 4 + 4 * i);
    if (o < prev)
      return Status::Corrupt(fmt::format("non-monotonic offsets: offsets[{}] = {} is below offsets[{}] = {}{}", i, o,
                                         i - 1, prev, unz),
                             at(4 + 4 * i));
    if (o > d.size)
      return Status::Corrupt(fmt::format("offsets[{}] = {} is past the end of the {}-byte shard{}", i, o, d.size, unz),
                             at(4 + 4 * i));
    prev = o;
  }
  if (prev != d.size)
    return Status::Corrupt(fmt::format("the last sample ends at {} but the shard has {} bytes{}", prev, d.size, unz),
                           at(4 + 4 * uint64_t(n)));
  return Status::OK();
}

Result<std::shared_ptr<const ShardData>> LoadShard(const ShardMeta& m, const std::shared_ptr<FileSystem>& fs,
                                                   const LoadOptions& opts) {
  Location at{.file = m.path, .shard = m.index};
  auto f = fs->OpenForRead(m.path);
  if (!f.ok()) {
    Status st = std::move(f).take_status();
    if (st.code() == Code::kNotFound)
      return Status::NotFound(fmt::format("shard file listed in index.json (shards[{}]) does not exist", m.index), at);
    return st.At(at);
  }
  const ReadableFile& file = **f;
  if (file.size() != m.file_bytes()) {
    Status st = Status::Corrupt(fmt::format("file has {} bytes but index.json records {} (shards[{}].{}.bytes)",
                                            file.size(), m.file_bytes(), m.index, m.zip ? "zip_data" : "raw_data"),
                                at);
    st.With(Detail::kShardChecksum);
    return st;
  }
  if (m.raw.bytes > opts.max_raw)
    return Status::Corrupt(fmt::format("index.json records {} uncompressed bytes, over the limit of {}", m.raw.bytes,
                                       opts.max_raw),
                           at);
  Bytes stored;
  auto mapped = file.Map();
  if (mapped.ok()) {
    stored = std::move(mapped).value();
  } else {
    std::string buf(size_t(file.size()), '\0');
    SK_ASSIGN_OR_RETURN(size_t got, file.ReadAt(0, buf.size(), buf.data()));
    if (got != buf.size()) return Status::Corrupt("file shrank while being read", at);
    stored = Bytes::Take(std::move(buf));
  }
  if (opts.check_hashes)
    SK_RETURN_IF_ERROR(CheckHashes(m.zip ? *m.zip : m.raw, stored.data(), stored.size(), m.path, m.index,
                                   m.zip ? "compressed" : "file"));
  auto d = std::make_shared<ShardData>();
  if (m.zip) {
    int level = 0;
    if (!ParseZstd(m.compression, &level))
      return Status::Unsupported(
          fmt::format("compression '{}' is not read by shardkit (zstd is; decompress with streaming first)", m.compression),
          at);
    SK_ASSIGN_OR_RETURN(std::string raw, Unzstd(stored.data(), stored.size(), m.raw.bytes, at));
    if (raw.size() != m.raw.bytes) {
      Status st = Status::Corrupt(fmt::format("decompresses to {} bytes but index.json records {} (shards[{}].raw_data.bytes)",
                                              raw.size(), m.raw.bytes, m.index),
                                  at);
      st.With(Detail::kShardChecksum);
      return st;
    }
    if (opts.check_hashes) SK_RETURN_IF_ERROR(CheckHashes(m.raw, reinterpret_cast<const uint8_t*>(raw.data()),
                                                          raw.size(), m.path, m.index, "uncompressed"));
    auto owned = std::make_shared<std::string>(std::move(raw));
    d->data = reinterpret_cast<const uint8_t*>(owned->data());
    d->size = owned->size();
    d->owner = std::move(owned);
  } else {
    d->data = stored.data();
    d->size = stored.size();
    d->owner = stored.owner() ? stored.owner() : std::shared_ptr<const void>();
    if (!d->owner) {  // static storage cannot happen for a file; keep the Bytes alive anyway
      auto keep = std::make_shared<Bytes>(stored);
      d->owner = keep;
    }
  }
  d->n = uint32_t(m.samples);
  SK_RETURN_IF_ERROR(CheckHeader(*d, m));
  return std::shared_ptr<const ShardData>(std::move(d));
}

Status DecodeSample(const ShardData& d, const ShardMeta& m, uint64_t i, Sample* out) {
  uint64_t b = d.offset(i), e = d.offset(i + 1);
  const uint8_t* p = d.data + b;
  uint64_t len = e - b;
  auto bad = [&](std::string msg, uint64_t off) {
    return Status::Corrupt(std::move(msg) + (m.zip ? " (offset in the uncompressed shard)" : ""),
                           Location{.file = m.path, .shard = m.index, .offset = int64_t(off),
                                    .index = int64_t(m.first + i)});
  };
  uint64_t nvar = 0;
  for (const auto& c : m.columns) nvar += !c.size || *c.size == 0;
  if (4 * nvar > len)
    return bad(fmt::format("sample {} has {} bytes, too few for the sizes of its {} variable columns", i, len, nvar), b);
  out->clear();
  uint64_t pos = 4 * nvar, vi = 0;
  bool have_key = false;
  for (const auto& c : m.columns) {
    uint64_t sz = (c.size && *c.size) ? *c.size : U32(p + 4 * vi++);
    if (sz > len - pos)
      return bad(fmt::format("column '{}' of sample {} ({} bytes) runs past the sample's end ({} bytes)", c.name, i, sz,
                             len),
                 b + pos);
    const uint8_t* v = p + pos;
    Bytes bytes;
    if (c.conv == Conv::kPil) {
      auto png = PilToPng(v, size_t(sz), Location{.file = m.path, .shard = m.index, .offset = int64_t(b + pos),
                                                  .index = int64_t(m.first + i)});
      if (!png.ok()) return png.status();
      bytes = Bytes::Take(std::move(png).value());
    } else if (c.conv == Conv::kRaw || int64_t(sz) != c.width) {
      bytes = Bytes(d.owner, v, size_t(sz));
    } else if (c.conv == Conv::kFloat) {
      bytes = Bytes::Take(FloatText(v, c.width));
    } else {
      bytes = Bytes::Take(IntText(v, c.width, c.conv == Conv::kInt));
    }
    if (c.role == Role::kKey) {
      out->key = bytes.str();
      have_key = true;
    } else {
      out->set(c.ext, std::move(bytes));
    }
    pos += sz;
  }
  if (pos != len)
    return bad(fmt::format("sample {} has {} bytes after its columns", i, len - pos), b + pos);
  if (!have_key) out->key = fmt::format("{:08d}", m.first + i);
  return Status::OK();
}

}  // namespace shardkit::formats::mds
