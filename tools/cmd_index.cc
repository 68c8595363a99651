// `shardkit index`.
#include <fmt/format.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli.h"
#include "shardkit/index.h"

namespace shardkit::cli {

RunFn SetupIndex(CLI::App* sub) {
  struct Flags {
    std::vector<std::string> shards;
    std::string format = "dali";
    std::string output;
    std::string name;
    // --cache-dir / --cache-bytes are accepted as on every command, but index reads
    // each shard once, front to back, without the shard cache (as it always has).
    OpenOptions unused_cache;
  };
  auto f = std::make_shared<Flags>();
  AddCacheOptions(sub, &f->unused_cache);
  sub->add_option("SHARD", f->shards, "Tar shards (paths; a brace range such as 'train-{000000..000009}.tar' "
                                      "is expanded by shardkit when quoted), or files of a format with an index "
                                      "of its own (MXNet RecordIO x.rec: writes x.idx)")
      ->required();
  sub->add_option("--format", f->format,
                  "dali: one DALI index per shard (train-000000.idx beside train-000000.tar); "
                  "wids: one JSON shard list for WebDataset's wids")
      ->check(CLI::IsMember({"dali", "wids"}))
      ->default_val("dali");
  sub->add_option("--output", f->output,
                  "dali: the index file (one shard only; default beside the shard); "
                  "wids: the JSON file (default: standard output); shard urls are written relative to its "
                  "directory");
  sub->add_option("--name", f->name, "wids: the shard list's \"name\" (default: the output's base name)");
  sub->footer(std::string("Examples:\n"
                          "  shardkit index out/train-000000.tar out/train-000001.tar\n"
                          "  shardkit index out/train-00000.tfrecord  # DALI's tfrecord2idx index: train-00000.idx\n"
                          "  shardkit index 'out/train-{000000..000009}.tar' --format wids --output "
                          "out/train.wids.json\n") +
              kExitHelp);
  return [f]() -> int {
    std::vector<std::string> shards;
    for (const auto& s : f->shards) {
      auto r = ExpandShardList(s);
      if (!r.ok()) return UsageError(r.status().message());
      shards.insert(shards.end(), r->begin(), r->end());
    }
    if (f->format == "dali") {
      if (!f->output.empty() && shards.size() != 1)
        return UsageError(fmt::format("--output names one index file, but {} shards were given", shards.size()));
      for (const auto& s : shards) {
        // A format with an index of its own (RecordIO's .idx) writes it; tar shards get DALI's.
        std::string written;
        auto n = WriteFormatIndex(s, f->output, &written);
        if (!n.ok() && (n.status().code() == Code::kUnsupported || n.status().code() == Code::kInvalidArgument)) {
          n = WriteDaliIndex(s, f->output);
          written = f->output.empty() ? DaliIndexPathFor(s) : f->output;
        }
        if (!n.ok()) return Fail(n.status());
        std::printf("%s: %llu samples -> %s\n", io::RedactText(s).c_str(), static_cast<unsigned long long>(*n),
                    io::RedactText(written).c_str());
      }
      return kExitOk;
    }
    namespace fs = std::filesystem;
    fs::path base = f->output.empty() ? fs::path(".") : fs::path(f->output).parent_path();
    if (base.empty()) base = ".";
    nlohmann::json list = nlohmann::json::array();
    uint64_t total = 0;
    for (const auto& s : shards) {
      auto d = DescribeTarShard(s);
      if (!d.ok()) return Fail(d.status());
      std::error_code ec;
      fs::path rel = fs::proximate(fs::path(s), base, ec);
      // A remote shard keeps its address, without secrets (redact.h): no proximate path of a URL.
      std::string url = s.find("://") != std::string::npos ? io::RedactAddress(s) : ec || rel.empty() ? s : rel.string();
      list.push_back({{"url", url}, {"nsamples", d->samples}, {"filesize", d->bytes}, {"md5sum", d->md5}});
      total += d->samples;
    }
    std::string name = f->name;
    if (name.empty()) {
      name = f->output.empty() ? "shardkit" : fs::path(f->output).filename().string();
      for (const char* ext : {".json", ".wids"})
        if (name.size() > std::strlen(ext) && name.substr(name.size() - std::strlen(ext)) == ext)
          name.resize(name.size() - std::strlen(ext));
    }
    nlohmann::json j{{"__kind__", "wids-shard-index-v1"},
                     {"wids_version", 1},
                     {"shardlist", list},
                     {"name", name},
                     {"info", fmt::format("{} samples in {} shards, written by shardkit {}", total, shards.size(),
                                          Version())}};
    std::string text = j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
    if (f->output.empty()) {
      std::fputs(text.c_str(), stdout);
      return kExitOk;
    }
    Status st = WriteIndexFile(f->output, text);
    if (!st.ok()) return Fail(st);
    std::printf("%s: %zu shards, %llu samples\n", io::RedactText(f->output).c_str(), shards.size(),
                static_cast<unsigned long long>(total));
    return kExitOk;
  };
}

}  // namespace shardkit::cli
