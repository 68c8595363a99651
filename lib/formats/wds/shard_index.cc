// The wds reader's index of a mapped shard (shard_index.h).
#include "formats/wds/shard_index.h"

#include "formats/wds/ranged.h"
#include "io/shard_cache.h"

#include <fmt/format.h>

#include "formats/wds/index.h"

namespace shardkit::formats::wds {

Result<std::shared_ptr<io::MappedFile>> MapShard(const std::string& path, int64_t shard) {
  auto m = io::MappedFile::Open(path);
  if (!m.ok()) {
    Status s = std::move(m).take_status();
    s.At(Location{.file = path, .shard = shard});
    return s;
  }
  return std::move(m).value();
}

Result<ShardIndex> ScanShard(const io::MappedFile& map, int64_t shard) {
  ShardIndex idx;
  idx.path = map.path();
  idx.file_size = map.size();
  SampleCursor cur(map, shard);
  for (;;) {
    SampleRef s;
    SK_ASSIGN_OR_RETURN(bool more, cur.Next(&s));
    if (!more) break;
    for (const auto& f : s.fields) idx.exts.insert(f.ext);
    idx.samples.push_back(std::move(s));
  }
  idx.skipped = cur.skipped();
  return idx;
}

Result<ShardMembers> ScanShardMembers(const std::string& tar_path, int64_t shard) {
  ShardMembers out;
  std::shared_ptr<io::MappedFile> map;
  std::unique_ptr<RangedSource> ranged;  // a remote shard: read through the seam in large ranges
  std::unique_ptr<tar::Scanner> scanner;
  if (io::IsUrl(tar_path)) {
    SK_ASSIGN_OR_RETURN(auto fs, FileSystemFor(tar_path));
    SK_ASSIGN_OR_RETURN(auto f, fs->OpenForRead(tar_path));
    out.file_size = f->size();
    ranged = std::make_unique<RangedSource>(std::shared_ptr<ReadableFile>(std::move(f)));
    scanner = std::make_unique<tar::Scanner>(ranged.get(), tar_path);
  } else {
    SK_ASSIGN_OR_RETURN(map, MapShard(tar_path, shard));
    out.file_size = map->size();
    scanner = std::make_unique<tar::Scanner>(map->data(), map->size(), tar_path);
  }
  tar::Scanner& scan = *scanner;
  tar::Member m;
  size_t sample_start = 0;
  for (;;) {
    auto r = scan.Next(&m);
    if (!r.ok()) {
      Status s = std::move(r).take_status();
      s.At(Location{.shard = shard});
      return s;
    }
    if (!*r) break;
    std::string key, ext;
    SK_ASSIGN_OR_RETURN(NameKind kind, Classify(m, tar_path, shard, &key, &ext));
    if (kind == NameKind::kSkip) continue;
    if (out.keys.empty() || key != out.keys.back()) {
      if (!out.keys.empty()) out.sample_ends.push_back(out.members.size());
      sample_start = out.members.size();
      out.keys.push_back(key);
    } else {
      for (size_t i = sample_start; i < out.members.size(); ++i)
        if (out.members[i].ext == ext)
          return Status::Corrupt(fmt::format("field '{}' appears twice in sample '{}'", ext, key),
                                 Location{.file = tar_path, .shard = shard, .offset = int64_t(m.header_offset),
                                          .key = key});
    }
    out.members.push_back(IndexMember{std::move(ext), m.name, m.data_offset, m.size});
  }
  if (!out.keys.empty()) out.sample_ends.push_back(out.members.size());
  return out;
}

}  // namespace shardkit::formats::wds
