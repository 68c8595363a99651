// MXNet RecordIO framing, image header and .idx (framing.h).
#include "formats/recordio/framing.h"

#include <charconv>
#include <cstring>

#include <fmt/format.h>

namespace shardkit::formats::recordio {

namespace {

Status Framing(std::string message, const std::string& file, uint64_t offset) {
  return Status::Corrupt(std::move(message), Location{.file = file, .offset = int64_t(offset)})
      .With(Detail::kRecordFraming);
}

void Put32(std::string* out, uint32_t v) {
  char b[4] = {char(v), char(v >> 8), char(v >> 16), char(v >> 24)};
  out->append(b, 4);
}
void Put64(std::string* out, uint64_t v) {
  Put32(out, uint32_t(v));
  Put32(out, uint32_t(v >> 32));
}

const char* PartName(uint32_t cflag) {
  switch (cflag) {
    case 0: return "a whole record (cflag 0)";
    case 1: return "a first part (cflag 1)";
    case 2: return "a middle part (cflag 2)";
    default: return "a last part (cflag 3)";
  }
}

}  // namespace

Status ReadRecord(const uint8_t* data, uint64_t size, uint64_t offset, const std::string& file,
                  std::string* scratch, Record* out) {
  const uint64_t start = offset;
  bool joining = false;
  out->joined = false;
  out->parts = 0;
  for (;;) {
    if (offset > size || size - offset < 8) {
      if (joining)
        return Framing(fmt::format("continuation record that started at offset {} never ends: the file ends "
                                   "after {} part(s) without a last part (cflag 3)",
                                   start, out->parts),
                       file, offset);
      return Framing(fmt::format("truncated record header: {} byte(s) left at the end of the file, a header "
                                 "needs 8",
                                 offset > size ? 0 : size - offset),
                     file, offset);
    }
    uint32_t magic = Load32(data + offset);
    if (magic != kMagic) {
      if (joining)
        return Framing(fmt::format("continuation record that started at offset {} never ends: bad magic "
                                   "0x{:08x} where part {} should start (expected 0x{:08x})",
                                   start, magic, out->parts + 1, kMagic),
                       file, offset);
      return Framing(fmt::format("bad magic 0x{:08x} (expected 0x{:08x}): not the start of a RecordIO record",
                                 magic, kMagic),
                     file, offset);
    }
    uint32_t lrec = Load32(data + offset + 4);
    uint32_t cflag = lrec >> 29, len = lrec & kMaxPart;
    uint64_t padded = (uint64_t(len) + 3) & ~uint64_t(3);
    if (len > size - offset - 8)
      return Framing(fmt::format("record length {} runs past the end of the file ({} bytes, {} left after "
                                 "the header)",
                                 len, size, size - offset - 8),
                     file, offset);
    if (cflag > 3)
      return Framing(fmt::format("bad continuation flag {} (0..3 expected)", cflag), file, offset);
    bool first_ok = cflag == 0 || cflag == 1, next_ok = cflag == 2 || cflag == 3;
    if (!joining && !first_ok)
      return Framing(fmt::format("{} with no first part before it", PartName(cflag)), file, offset);
    if (joining && !next_ok)
      return Framing(fmt::format("continuation record that started at offset {} never ends: {} follows "
                                 "part {}",
                                 start, PartName(cflag), out->parts),
                     file, offset);
    const uint8_t* body = data + offset + 8;
    ++out->parts;
    // The last record of a file may lack its padding (a writer that stopped short of it).
    offset = padded <= size - offset - 8 ? offset + 8 + padded : size;
    if (cflag == 0) {
      out->payload = std::string_view(reinterpret_cast<const char*>(body), len);
      out->next = offset;
      return Status::OK();
    }
    if (cflag == 1) {
      scratch->clear();
      joining = true;
      out->joined = true;
    }
    scratch->append(reinterpret_cast<const char*>(body), len);
    if (cflag == 3) {
      out->payload = *scratch;
      out->next = offset;
      return Status::OK();
    }
    Put32(scratch, kMagic);
  }
}

Status AppendRecord(std::string_view payload, std::string* out) {
  const uint8_t* p = reinterpret_cast<const uint8_t*>(payload.data());
  const size_t len = payload.size();
  const size_t lower = len & ~size_t(3);
  size_t from = 0;
  auto part = [&](uint32_t cflag, size_t a, size_t b) -> Status {
    if (b - a > kMaxPart)
      return Status::Invalid(fmt::format("record part of {} bytes: RecordIO holds at most {} bytes between two "
                                         "magic words",
                                         b - a, kMaxPart));
    Put32(out, kMagic);
    Put32(out, cflag << 29 | uint32_t(b - a));
    out->append(payload.data() + a, b - a);
    size_t pad = (4 - (b - a) % 4) % 4;
    out->append(pad, '\0');
    return Status::OK();
  };
  for (size_t i = 0; i < lower; i += 4) {
    if (Load32(p + i) != kMagic) continue;
    SK_RETURN_IF_ERROR(part(from == 0 ? 1 : 2, from, i));
    from = i + 4;
  }
  // dmlc-core: cflag 3 when something was cut before (from != 0), else 0.
  return part(from != 0 ? 3 : 0, from, len);
}

Status ParseImageRecord(std::string_view payload, const Location& where, ImageRecord* out) {
  if (payload.size() < kIRHeaderSize)
    return Status::Corrupt(fmt::format("record of {} bytes is too short for the {}-byte image header (IRHeader)",
                                       payload.size(), kIRHeaderSize),
                           where)
        .With(Detail::kRecordFraming);
  const uint8_t* p = reinterpret_cast<const uint8_t*>(payload.data());
  out->flag = Load32(p);
  uint32_t lb = Load32(p + 4);
  std::memcpy(&out->label, &lb, 4);
  out->id = Load64(p + 8);
  out->id2 = Load64(p + 16);
  out->labels.clear();
  uint64_t need = kIRHeaderSize + uint64_t(out->flag) * 4;
  if (need > payload.size())
    return Status::Corrupt(fmt::format("image header announces {} labels ({} bytes) but the record holds only {} "
                                       "bytes after the header",
                                       out->flag, uint64_t(out->flag) * 4, payload.size() - kIRHeaderSize),
                           where)
        .With(Detail::kRecordFraming);
  out->labels.resize(out->flag);
  for (uint32_t i = 0; i < out->flag; ++i) {
    uint32_t v = Load32(p + kIRHeaderSize + 4 * i);
    std::memcpy(&out->labels[i], &v, 4);
  }
  out->image = payload.substr(need);
  return Status::OK();
}

std::string ImagePayload(const ImageRecord& r, std::string_view image) {
  std::string out;
  out.reserve(kIRHeaderSize + 4 * r.labels.size() + image.size());
  uint32_t lb;
  std::memcpy(&lb, &r.label, 4);
  Put32(&out, r.labels.empty() ? r.flag : uint32_t(r.labels.size()));
  Put32(&out, lb);
  Put64(&out, r.id);
  Put64(&out, r.id2);
  for (float f : r.labels) {
    uint32_t v;
    std::memcpy(&v, &f, 4);
    Put32(&out, v);
  }
  out.append(image);
  return out;
}

Result<std::vector<IdxEntry>> ParseIdx(std::string_view text, const std::string& file) {
  std::vector<IdxEntry> out;
  size_t pos = 0, line = 0;
  while (pos < text.size()) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string_view::npos) eol = text.size();
    std::string_view l = text.substr(pos, eol - pos);
    ++line;
    pos = eol + 1;
    if (!l.empty() && l.back() == '\r') l.remove_suffix(1);
    if (l.empty()) {
      if (pos >= text.size()) break;  // the last newline
      return Status::Corrupt(fmt::format("empty line {} in the .idx", line), Location{.file = file})
          .With(Detail::kIndexEntry);
    }
    size_t tab = l.rfind('\t');
    if (tab == std::string_view::npos)
      return Status::Corrupt(fmt::format("line {} of the .idx is not 'key<TAB>offset': '{}'", line,
                                         l.substr(0, 80)),
                             Location{.file = file})
          .With(Detail::kIndexEntry);
    std::string_view off = l.substr(tab + 1);
    uint64_t v = 0;
    auto [ptr, ec] = std::from_chars(off.data(), off.data() + off.size(), v);
    if (off.empty() || ec != std::errc() || ptr != off.data() + off.size())
      return Status::Corrupt(fmt::format("line {} of the .idx has a bad offset '{}'", line, off.substr(0, 40)),
                             Location{.file = file, .key = std::string(l.substr(0, tab))})
          .With(Detail::kIndexEntry);
    out.push_back(IdxEntry{std::string(l.substr(0, tab)), v});
  }
  return out;
}

}  // namespace shardkit::formats::recordio
