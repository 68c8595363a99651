// DALI's index files: reading one that agrees with its shard (the reader's
// fast open) and writing one (the writer, `shardkit index`).
#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "io/file.h"
#include "formats/wds/index.h"
#include "formats/wds/shard_index.h"

namespace shardkit::formats::wds {

// Loads a DALI v1.2 index and checks it against the mapped shard: offsets on
// block boundaries inside the file, a valid regular-file header with the same
// size before every member, names that classify like a scan would, and the
// end-of-archive block right after the last member. Any doubt: returns an
// error and the caller scans instead.
Result<ShardIndex> LoadIdx(const std::string& idx_path, const io::MappedFile& map, int64_t shard) {
  SK_ASSIGN_OR_RETURN(std::string text, io::ReadFile(idx_path));
  return ParseIdx(text, idx_path, map.path(), map.size(), map.data(), shard);
}

Result<ShardIndex> ParseIdx(std::string_view text, const std::string& idx_path, const std::string& shard_path,
                            uint64_t file_size, const uint8_t* data, int64_t shard) {
  auto bad = [&](std::string why) { return Status::Corrupt(why, Location{.file = idx_path, .shard = shard}); };
  ShardIndex idx;
  idx.path = shard_path;
  idx.file_size = file_size;
  size_t pos = 0;
  auto next_line = [&](std::string_view* line) {
    if (pos >= text.size()) return false;
    size_t nl = text.find('\n', pos);
    if (nl == std::string::npos) nl = text.size();
    *line = text.substr(pos, nl - pos);
    pos = nl + 1;
    return true;
  };
  std::string_view line;
  if (!next_line(&line) || line.substr(0, 5) != "v1.2 ") return bad("not a v1.2 index");
  auto digits = [](std::string_view t) {
    return !t.empty() && t.size() <= 19 && std::all_of(t.begin(), t.end(), [](char c) { return c >= '0' && c <= '9'; });
  };
  if (!digits(line.substr(5))) return bad("bad sample count");
  uint64_t n = std::stoull(std::string(line.substr(5)));
  uint64_t last_end = 0;
  while (next_line(&line)) {
    if (line.empty()) continue;
    std::vector<std::string_view> tok;
    size_t s = 0;
    while (s < line.size()) {
      size_t e = line.find(' ', s);
      if (e == std::string_view::npos) e = line.size();
      if (e > s) tok.push_back(line.substr(s, e - s));
      s = e + 1;
    }
    if (tok.empty() || tok.size() % 4 != 0) return bad("malformed line");
    SampleRef sample;
    for (size_t i = 0; i < tok.size(); i += 4) {
      uint64_t off = 0, size = 0;
      if (!digits(tok[i + 1]) || !digits(tok[i + 2])) return bad("bad offset or size");
      off = std::stoull(std::string(tok[i + 1]));
      size = std::stoull(std::string(tok[i + 2]));
      if (off < tar::kBlock || off % tar::kBlock != 0 || off > file_size || size > file_size - off)
        return bad("offset outside the shard");
      // Every byte before this member must be accounted for: it starts right
      // where the previous one ended, or the blocks between are its own pax /
      // long-name headers, which the scanner checks. (fuzz_dali_index found an
      // index listing only the last member trusted: the others were lost.)
      if (off - tar::kBlock < last_end) return bad("members overlap or are out of order");
      if (off - tar::kBlock != last_end && data) {
        tar::Scanner gap(data + last_end, file_size - last_end, shard_path);
        tar::Member gm;
        auto r = gap.Next(&gm);
        if (!r.ok() || !*r || gm.data_offset + last_end != off || gm.size != size)
          return bad("the index skips members or bytes of the shard");
      }
      last_end = off + (size + tar::kBlock - 1) / tar::kBlock * tar::kBlock;
      std::string_view name = tok[i + 3];
      if (name.find('\\') != std::string_view::npos) return bad("escaped member name");
      if (data) {
      const uint8_t* h = data + off - tar::kBlock;
      uint64_t hsize = 0;
      char type = char(h[156]);
      if (!tar::ParseNumber(h + 124, 12, &hsize) || hsize != size || (type != '0' && type != '\0'))
        return bad("index does not match the member headers");
      // The name must be the member's own: it must equal the ustar name (prefix/name);
      // distrust escaped names (`tar --list` output, as wds2idx uses). A name the
      // ustar fields cannot hold (long, or replaced there by a pax record) cannot be
      // checked here, so such an index is not trusted and the shard is scanned:
      // fuzz_dali_index found an index whose unchecked non-ASCII name changed a
      // field's extension.
      {
        std::string ustar(reinterpret_cast<const char*>(h), strnlen(reinterpret_cast<const char*>(h), 100));
        if (std::memcmp(h + 257, "ustar\0", 6) == 0 && h[345] != 0)
          ustar = std::string(reinterpret_cast<const char*>(h + 345), strnlen(reinterpret_cast<const char*>(h + 345), 155)) +
                  "/" + ustar;
        if (ustar != name) return bad("index names do not match the member headers");
      }
      }
      tar::Member m;
      m.name = std::string(name);
      m.type = '0';
      m.header_offset = off - tar::kBlock;
      std::string key, ext;
      auto kind = Classify(m, shard_path, shard, &key, &ext);
      if (!kind.ok()) return bad("index names a member a scan would refuse");
      if (*kind == NameKind::kSkip) {
        ++idx.skipped;
        continue;
      }
      if (!sample.fields.empty() && key != sample.key) return bad("components of one line have different keys");
      for (const auto& f : sample.fields)
        if (f.ext == ext) return bad("duplicate field");
      if (sample.fields.empty()) sample.key = key, sample.offset = off - tar::kBlock;
      idx.exts.insert(ext);
      sample.fields.push_back(FieldRef{std::move(ext), off, size});
    }
    if (!sample.fields.empty()) idx.samples.push_back(std::move(sample));
  }
  if (idx.samples.size() != n) return bad("sample count does not match the lines");
  // Nothing may follow the last indexed member but the end-of-archive blocks.
  if (last_end + tar::kBlock > file_size) return bad("shard shorter than the index says");
  if (data)
    for (uint64_t i = 0; i < tar::kBlock; ++i)
      if (data[last_end + i]) return bad("members follow the last indexed one");
  return idx;
}

std::string DaliIndexPath(const std::string& tar_path) { return IdxPathFor(tar_path); }

std::string DaliIndexText(const std::vector<IndexMember>& members, const std::vector<size_t>& sample_ends) {
  bool names_ok = std::none_of(members.begin(), members.end(), [](const IndexMember& m) { return HasSpace(m.name); });
  std::string text = fmt::format("{} {}\n", names_ok ? "v1.2" : "v1.1", sample_ends.size());
  size_t start = 0;
  for (size_t end : sample_ends) {
    for (size_t i = start; i < end; ++i) {
      const auto& e = members[i];
      if (i > start) text += ' ';
      text += fmt::format("{} {} {}", e.ext, e.offset, e.size);
      if (names_ok) text += " " + e.name;
    }
    text += '\n';
    start = end;
  }
  return text;
}

}  // namespace shardkit::formats::wds

namespace shardkit::formats::wds {

Status CheckSampleHeaders(const uint8_t* bytes, uint64_t length, const SampleRef& ref, const std::string& path,
                          int64_t shard, bool header_checksums) {
  for (const auto& f : ref.fields) {
    uint64_t h = f.offset - tar::kBlock - ref.offset;
    Location where{.file = path, .shard = shard, .offset = int64_t(f.offset - tar::kBlock), .key = ref.key};
    if (f.offset < ref.offset + tar::kBlock || h + tar::kBlock + f.size > length)
      return Status::Corrupt("index entry outside the sample's bytes", where);
    const uint8_t* b = bytes + h;
    uint64_t hsize = 0, stored = 0, computed = 0;
    char type = char(b[156]);
    if (header_checksums && !tar::HeaderChecksumOk(b, &stored, &computed))
      return Status::Corrupt(fmt::format("tar header checksum mismatch (stored {}, computed {}): damaged or not a tar",
                                         stored, computed),
                             where);
    if (!tar::ParseNumber(b + 124, 12, &hsize) || hsize != f.size ||
        (type != '0' && type != '\0'))
      return Status::Corrupt(fmt::format("the shard's member header for field '{}' does not match its index "
                                         "(the shard changed since it was indexed?)",
                                         f.ext),
                             where);
  }
  return Status::OK();
}

}  // namespace shardkit::formats::wds
