// `shardkit index`.
#include <fmt/format.h>

#include <cstdio>
#include <memory>

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
    auto list = WriteWidsIndex(shards, f->output, f->name);
    if (!list.ok()) return Fail(list.status());
    if (f->output.empty()) {
      std::fputs(list->text.c_str(), stdout);
      return kExitOk;
    }
    const uint64_t total = list->samples;
    std::printf("%s: %zu shards, %llu samples\n", io::RedactText(f->output).c_str(), shards.size(),
                static_cast<unsigned long long>(total));
    return kExitOk;
  };
}

}  // namespace shardkit::cli
