// TFRecord framing: see frames.h.
#include "formats/tfrecord/frames.h"

#include <zlib.h>

#include <charconv>
#include <cstring>

#include <fmt/format.h>

#include "io/any_file.h"
#include "formats/tfrecord/crc32c.h"

namespace shardkit::formats::tfrecord {

namespace {

uint64_t Le64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
uint32_t Le32(const uint8_t* p) { return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24; }

bool HeaderOk(const uint8_t* p) { return MaskedCrc32c(p, 8) == Le32(p + 8); }

std::string Where(const FileData& f) {
  return f.compression == Compression::kNone ? std::string()
                                             : fmt::format(" (of the {}-inflated stream)", CompressionName(f.compression));
}

struct Inflater {
  z_stream z{};
  bool live = false;
  ~Inflater() {
    if (live) inflateEnd(&z);
  }
};

// Inflates `in` (a whole gzip or zlib file); at most `limit` bytes, or only the
// first `want` bytes when want > 0 (for a bid).
Result<std::string> Inflate(const std::string& path, std::string_view in, Compression c, uint64_t limit,
                            uint64_t want = 0) {
  Inflater inf;
  int bits = c == Compression::kGzip ? 15 + 16 : 15;
  if (inflateInit2(&inf.z, bits) != Z_OK) return Status::Internal("zlib: inflateInit2 failed", Location{.file = path});
  inf.live = true;
  std::string out;
  out.resize(std::min<uint64_t>(std::max<uint64_t>(in.size() * 2, 1 << 16), want ? std::max<uint64_t>(want, 64) : limit));
  inf.z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  uint64_t in_left = in.size();
  uint64_t produced = 0;
  for (;;) {
    if (inf.z.avail_in == 0 && in_left > 0) {
      uInt n = uInt(std::min<uint64_t>(in_left, 1u << 30));
      inf.z.avail_in = n;
      in_left -= n;
    }
    if (produced == out.size()) {
      if (want && produced >= want) break;
      if (produced >= limit) {
        uint64_t at = in.size() - in_left - inf.z.avail_in;
        return Status::Corrupt(
            fmt::format("{} stream inflates to more than {} bytes ({}x its {} compressed bytes, or at least {} "
                        "MiB): refused as a likely zip bomb; store such data uncompressed",
                        CompressionName(c), limit, kInflateRatio, in.size(), kInflateFloor >> 20),
            Location{.file = path, .offset = int64_t(at)});
      }
      out.resize(std::min<uint64_t>(limit, out.size() * 2));
    }
    inf.z.next_out = reinterpret_cast<Bytef*>(out.data() + produced);
    uint64_t room = std::min<uint64_t>(out.size() - produced, 1u << 30);
    inf.z.avail_out = uInt(room);
    int rc = inflate(&inf.z, Z_NO_FLUSH);
    produced += room - inf.z.avail_out;
    uint64_t consumed = in.size() - in_left - inf.z.avail_in;
    if (rc == Z_STREAM_END) {
      // Concatenated gzip members (as `cat a.gz b.gz` makes) continue the stream.
      if (c == Compression::kGzip && consumed < in.size()) {
        if (inflateReset(&inf.z) != Z_OK) return Status::Internal("zlib: inflateReset failed", Location{.file = path});
        continue;
      }
      if (consumed < in.size())
        return Status::Corrupt(fmt::format("{} bytes of trailing garbage after the {} stream", in.size() - consumed,
                                           CompressionName(c)),
                               Location{.file = path, .offset = int64_t(consumed)});
      break;
    }
    if (rc == Z_BUF_ERROR && inf.z.avail_in == 0 && in_left == 0) {
      if (want) break;  // a bid reads a prefix only
      return Status::Corrupt(fmt::format("{} stream is truncated: it ends before its end marker", CompressionName(c)),
                             Location{.file = path, .offset = int64_t(consumed)});
    }
    if (rc != Z_OK && rc != Z_BUF_ERROR)
      return Status::Corrupt(fmt::format("{} stream is damaged: {}", CompressionName(c),
                                         inf.z.msg ? inf.z.msg : "inflate failed"),
                             Location{.file = path, .offset = int64_t(consumed)});
    if (want && produced >= want) break;
  }
  out.resize(produced);
  return out;
}


}  // namespace

const char* CompressionName(Compression c) {
  switch (c) {
    case Compression::kGzip: return "gzip";
    case Compression::kZlib: return "zlib";
    default: return "none";
  }
}

Compression DetectCompression(const uint8_t* p, size_t n) {
  if (n >= kHeaderBytes && HeaderOk(p)) return Compression::kNone;
  if (n >= 3 && p[0] == 0x1f && p[1] == 0x8b && p[2] == 8) return Compression::kGzip;
  if (n >= 2 && (p[0] & 0x0f) == 8 && (p[0] >> 4) <= 7 && ((uint32_t(p[0]) << 8) | p[1]) % 31 == 0 &&
      (p[1] & 0x20) == 0)
    return Compression::kZlib;
  return Compression::kNone;
}

Result<FileData> LoadFile(const std::string& path, const io::CacheOptions& cache) {
  SK_ASSIGN_OR_RETURN(uint64_t size, io::RegularFileSize(path));
  FileData f;
  f.path = path;
  f.disk_bytes = size;
  SK_ASSIGN_OR_RETURN(std::string head, io::ReadAnyHead(path, kHeaderBytes));
  f.compression = DetectCompression(reinterpret_cast<const uint8_t*>(head.data()), head.size());
  if (f.compression == Compression::kNone) {
    SK_ASSIGN_OR_RETURN(std::shared_ptr<io::MappedFile> m, io::MapAny(path, cache));
    f.data = m->data();
    f.size = m->size();
    f.owner = std::move(m);
    return f;
  }
  SK_ASSIGN_OR_RETURN(std::string raw, io::ReadFile(path));
  uint64_t limit = std::max<uint64_t>(kInflateFloor, kInflateRatio * raw.size());
  SK_ASSIGN_OR_RETURN(std::string text, Inflate(path, raw, f.compression, limit));
  auto owned = std::make_shared<std::string>(std::move(text));
  f.data = reinterpret_cast<const uint8_t*>(owned->data());
  f.size = owned->size();
  f.owner = std::move(owned);
  return f;
}

int ContentBid(const std::string& path) {
  if (io::IsUrl(path)) return -1;  // (a remote address is bid on by its name: no request per bid)
  auto read = io::ReadAnyHead(path, 4096);
  if (!read.ok()) return -1;
  const std::string& head = *read;
  auto* p = reinterpret_cast<const uint8_t*>(head.data());
  if (head.size() >= kHeaderBytes && HeaderOk(p)) return 100;
  Compression c = DetectCompression(p, head.size());
  if (c == Compression::kNone) return 0;
  auto prefix = Inflate(path, head, c, kHeaderBytes, kHeaderBytes);
  if (!prefix.ok() || prefix->size() < kHeaderBytes) return 0;
  return HeaderOk(reinterpret_cast<const uint8_t*>(prefix->data())) ? 100 : 0;
}

Result<Frame> ReadHeader(const FileData& f, uint64_t offset) {
  Location at{.file = f.path, .offset = int64_t(offset)};
  if (f.size - offset < kHeaderBytes)
    return Status::Corrupt(fmt::format("truncated record header: {} bytes left, a header takes {}{}",
                                       f.size - offset, kHeaderBytes, Where(f)),
                           at);
  const uint8_t* p = f.data + offset;
  if (!HeaderOk(p))
    return Status::Corrupt(fmt::format("record length CRC mismatch (stored {:#010x}, computed {:#010x}){}",
                                       Le32(p + 8), MaskedCrc32c(p, 8), Where(f)),
                           at);
  uint64_t len = Le64(p);
  uint64_t left = f.size - offset - kHeaderBytes;
  if (len > left || left - len < 4)
    return Status::Corrupt(fmt::format("record length {} runs past the end of the file ({} bytes left after the "
                                       "header, the data and its 4-byte CRC need more){}",
                                       len, left, Where(f)),
                           at);
  return Frame{offset, len};
}

Result<std::vector<Frame>> ScanFrames(const FileData& f) {
  std::vector<Frame> out;
  uint64_t pos = 0;
  while (pos < f.size) {
    SK_ASSIGN_OR_RETURN(Frame fr, ReadHeader(f, pos));
    out.push_back(fr);
    pos += kFrameOverhead + fr.length;
  }
  return out;
}

Status CheckData(const FileData& f, const Frame& fr, int64_t index) {
  const uint8_t* d = f.data + fr.offset + kHeaderBytes;
  uint32_t want = Le32(d + fr.length), got = MaskedCrc32c(d, fr.length);
  if (want == got) return Status::OK();
  Status st = Status::Corrupt(
      fmt::format("record data CRC mismatch (stored {:#010x}, computed {:#010x}) in the {} bytes of data at offset "
                  "{}{}",
                  want, got, fr.length, fr.offset + kHeaderBytes, Where(f)),
      Location{.file = f.path, .offset = int64_t(fr.offset), .index = index});
  st.With(Detail::kSampleChecksum);
  return st;
}

std::string DaliIndexText(const std::vector<Frame>& frames) {
  std::string out;
  out.reserve(frames.size() * 16);
  for (const auto& fr : frames) out += fmt::format("{} {}\n", fr.offset, fr.length + kFrameOverhead);
  return out;
}

std::string IdxPathFor(const std::string& path) {
  size_t slash = path.rfind('/');
  size_t base = slash == std::string::npos ? 0 : slash + 1;
  for (std::string_view ext : {".tfrecords", ".tfrecord", ".TFRECORDS", ".TFRECORD"}) {
    if (path.size() > base + ext.size() && path.compare(path.size() - ext.size(), ext.size(), ext) == 0)
      return path.substr(0, path.size() - ext.size()) + ".idx";
  }
  return path + ".idx";
}

Result<std::vector<Frame>> FramesFromIdx(const FileData& f, const std::string& idx_path, std::string_view text) {
  std::vector<Frame> out;
  size_t line_no = 0;
  uint64_t expect = 0;
  while (!text.empty()) {
    size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
    ++line_no;
    if (line.empty()) continue;
    Location at{.file = idx_path, .index = int64_t(out.size())};
    uint64_t off = 0, size = 0;
    auto sp = line.find(' ');
    bool parsed = sp != std::string_view::npos;
    if (parsed) {
      auto a = std::from_chars(line.data(), line.data() + sp, off);
      auto b = std::from_chars(line.data() + sp + 1, line.data() + line.size(), size);
      parsed = a.ec == std::errc() && a.ptr == line.data() + sp && b.ec == std::errc() &&
               b.ptr == line.data() + line.size();
    }
    if (!parsed)
      return Status::Corrupt(fmt::format("index line {} is not '<offset> <size>': '{}'", line_no,
                                         line.substr(0, std::min<size_t>(line.size(), 80))),
                             at);
    if (off != expect || off >= f.size)
      return Status::Corrupt(fmt::format("index line {}: offset {} is not where record {} of '{}' starts ({}); "
                                         "rebuild it with `shardkit index --format dali` or remove it",
                                         line_no, off, out.size(), f.path, expect),
                             at);
    auto fr = ReadHeader(f, off);
    if (!fr.ok())
      return Status::Corrupt(fmt::format("index line {} points at no valid record of '{}': {}", line_no, f.path,
                                         fr.status().message()),
                             at);
    if (fr->length + kFrameOverhead != size)
      return Status::Corrupt(fmt::format("index line {}: size {} disagrees with the record at offset {} ({} bytes)",
                                         line_no, size, off, fr->length + kFrameOverhead),
                             at);
    out.push_back(*fr);
    expect = off + size;
  }
  if (expect != f.size)
    return Status::Corrupt(fmt::format("index lists {} records ending at offset {}, but '{}' holds {} bytes; rebuild "
                                       "it with `shardkit index --format dali` or remove it",
                                       out.size(), expect, f.path, f.size),
                           Location{.file = idx_path});
  return out;
}

void AppendFrame(std::string* out, std::string_view data) {
  uint8_t h[kHeaderBytes];
  uint64_t len = data.size();
  for (int i = 0; i < 8; ++i) h[i] = uint8_t(len >> (8 * i));
  uint32_t c = MaskedCrc32c(h, 8);
  for (int i = 0; i < 4; ++i) h[8 + i] = uint8_t(c >> (8 * i));
  out->append(reinterpret_cast<const char*>(h), sizeof h);
  out->append(data);
  c = MaskedCrc32c(data.data(), data.size());
  uint8_t t[4];
  for (int i = 0; i < 4; ++i) t[i] = uint8_t(c >> (8 * i));
  out->append(reinterpret_cast<const char*>(t), 4);
}

}  // namespace shardkit::formats::tfrecord
