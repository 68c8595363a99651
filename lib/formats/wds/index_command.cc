// Index files for tar shards (include/shardkit/index.h): the public face of the
// wds format's own scanner and index writer (formats/wds/index.h), so it lives
// with the format.
#include "shardkit/index.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "io/file.h"
#include "core/md5.h"
#include "core/paths.h"
#include "formats/registry.h"
#include "formats/wds/index.h"
#include "io/shard_cache.h"
#include "shardkit/filesystem.h"
#include "shardkit/version.h"

namespace shardkit {

namespace {
// The format of a file with its own DALI index (Format::write_dali_index), or null (tar shards).
const formats::Format* OwnDaliIndex(const std::string& path) {
  std::string rest;
  auto f = formats::Resolve(path, false, &rest);
  return f.ok() && (*f)->write_dali_index && rest == path ? *f : nullptr;
}
}  // namespace

std::string DaliIndexPathFor(const std::string& tar_path) {
  if (const formats::Format* f = OwnDaliIndex(tar_path); f && f->dali_index_path) return f->dali_index_path(tar_path);
  return formats::wds::DaliIndexPath(tar_path);
}

Result<uint64_t> WriteDaliIndex(const std::string& tar_path, const std::string& output) {
  if (const formats::Format* f = OwnDaliIndex(tar_path)) return f->write_dali_index(tar_path, output);
  SK_ASSIGN_OR_RETURN(auto scan, formats::wds::ScanShardMembers(tar_path));
  if (scan.keys.empty())
    return Status::Invalid("shard holds no samples; DALI's index needs at least one", Location{.file = tar_path});
  std::string path = output.empty() ? DaliIndexPathFor(tar_path) : output;
  if (path == tar_path) return Status::Invalid("index path would overwrite the shard", Location{.file = path});
  SK_RETURN_IF_ERROR(WriteIndexFile(path, formats::wds::DaliIndexText(scan.members, scan.sample_ends)));
  return uint64_t(scan.keys.size());
}

Result<TarShardSummary> DescribeTarShard(const std::string& tar_path) {
  SK_ASSIGN_OR_RETURN(auto scan, formats::wds::ScanShardMembers(tar_path));
  TarShardSummary out;
  out.path = tar_path;
  out.samples = scan.keys.size();
  out.bytes = scan.file_size;
  if (io::IsUrl(tar_path)) {  // a remote shard: its bytes through the seam
    SK_ASSIGN_OR_RETURN(auto fs, FileSystemFor(tar_path));
    SK_ASSIGN_OR_RETURN(auto f, fs->OpenForRead(tar_path));
    md5::Md5 h;
    std::string buf(16 << 20, '\0');
    for (uint64_t off = 0; off < f->size();) {
      SK_ASSIGN_OR_RETURN(size_t n, f->ReadAt(off, buf.size(), buf.data()));
      if (n == 0) return Status::IOError("shard ended early", Location{.file = tar_path, .offset = int64_t(off)});
      h.Update(buf.data(), n);
      off += n;
    }
    out.md5 = h.HexDigest();
    return out;
  }
  SK_ASSIGN_OR_RETURN(out.md5, md5::HashFile(tar_path));
  return out;
}

Result<WidsIndex> WriteWidsIndex(const std::vector<std::string>& shards, const std::string& output,
                                 const std::string& name_in) {
  const std::string base = output.empty() ? "." : io::DirName(output);
  nlohmann::json list = nlohmann::json::array();
  WidsIndex out;
  for (const auto& s : shards) {
    SK_ASSIGN_OR_RETURN(TarShardSummary d, DescribeTarShard(s));
    // A remote shard keeps its address, without secrets (redact.h): no relative path of a URL.
    std::string url = io::IsUrl(s) ? RedactAddress(s) : paths::RelativeTo(s, base);
    list.push_back({{"url", url}, {"nsamples", d.samples}, {"filesize", d.bytes}, {"md5sum", d.md5}});
    out.samples += d.samples;
    ++out.shards;
  }
  std::string name = name_in;
  if (name.empty()) {
    name = output.empty() ? "shardkit" : std::string(paths::BaseName(output));
    for (std::string_view ext : {".json", ".wids"})
      if (name.size() > ext.size() && paths::EndsWith(name, ext)) name.resize(name.size() - ext.size());
  }
  nlohmann::json j{{"__kind__", "wids-shard-index-v1"},
                   {"wids_version", 1},
                   {"shardlist", list},
                   {"name", name},
                   {"info", fmt::format("{} samples in {} shards, written by shardkit {}", out.samples, out.shards,
                                        Version())}};
  out.text = j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  if (!output.empty()) SK_RETURN_IF_ERROR(WriteIndexFile(output, out.text));
  return out;
}

Result<std::vector<std::string>> ExpandShardList(std::string_view pattern) { return paths::ExpandBraces(pattern); }

Status WriteIndexFile(const std::string& path, std::string_view text) {
  if (io::IsUrl(path)) {  // an object appears whole when its upload completes: no temporary name
    SK_ASSIGN_OR_RETURN(auto fs, FileSystemFor(path));
    SK_ASSIGN_OR_RETURN(auto f, fs->NewWritableFile(path, CreateMode::kTruncate));
    SK_RETURN_IF_ERROR(f->Append(text));
    return f->Close();
  }
  return io::WriteFileAtomic(path, text, true);
}

}  // namespace shardkit
