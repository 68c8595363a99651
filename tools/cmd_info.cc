// `shardkit info`.
#include <fmt/format.h>

#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli.h"

namespace shardkit::cli {

RunFn SetupInfo(CLI::App* sub) {
  struct Flags {
    std::string address;
    bool json = false;
    bool count = false;
    OpenOptions open;  // --cache-dir / --cache-bytes, then the environment
  };
  auto f = std::make_shared<Flags>();
  AddCacheOptions(sub, &f->open);
  sub->add_option("DATASET", f->address, "Dataset address, e.g. images/, out/train.manifest.json, lmdb:train.lmdb")
      ->required();
  sub->add_flag("--count", f->count,
                "Count the samples with one full read when the metadata does not record them");
  sub->add_flag("--json", f->json,
                "Print one JSON object: address, format, samples (null when unknown), classes, "
                "fields, shards [{path, samples, bytes, checksum}], bytes, extra, checked (\"metadata\")");
  sub->footer(std::string("Examples:\n"
                          "  shardkit info images/\n"
                          "  shardkit info 'wds:out/train-{000000..000009}.tar' --count\n"
                          "  shardkit info lmdb:train.lmdb --json\n") +
              kEnvironmentHelp + kExitHelp);
  return [f]() -> int {
    if (Status st = OpenOptionsFromEnvironment(&f->open); !st.ok()) return UsageError(st.message());
    auto ds = Open(f->address, f->open);
    if (!ds.ok()) return Fail(ds.status());
    DatasetInfo info = (*ds)->info();
    if (!info.num_samples && f->count) {
      auto r = (*ds)->NewReader();
      if (!r.ok()) return Fail(r.status());
      uint64_t n = 0;
      Sample s;
      for (;;) {
        auto more = (*r)->Next(&s);
        if (!more.ok()) return Fail(more.status());
        if (!*more) break;
        ++n;
      }
      info.num_samples = n;
    }
    if (f->json) {
      nlohmann::json j;
      j["address"] = info.address.empty() ? f->address : info.address;
      j["format"] = info.format;
      j["samples"] = info.num_samples ? nlohmann::json(*info.num_samples) : nlohmann::json(nullptr);
      j["classes"] = info.class_names;
      j["fields"] = info.fields;
      j["shards"] = nlohmann::json::array();
      for (const auto& sh : info.shards)
        j["shards"].push_back(
            {{"path", sh.path}, {"samples", sh.samples}, {"bytes", sh.bytes}, {"checksum", sh.checksum}});
      j["bytes"] = info.total_bytes;
      j["extra"] = info.extra;
      j["checked"] = "metadata";  // not the data: `shardkit verify` checks that
      std::printf("%s\n", io::RedactText(j.dump()).c_str());
      return kExitOk;
    }
    std::string classes = fmt::format("{}", info.class_names.size());
    for (size_t i = 0; i < info.class_names.size() && i < 10; ++i)
      classes += (i == 0 ? " (" : ", ") + info.class_names[i];
    if (info.class_names.size() > 10) classes += ", ...";
    if (!info.class_names.empty()) classes += ")";
    std::string fields;
    for (const auto& x : info.fields) fields += (fields.empty() ? "" : ", ") + x;
    std::printf("address: %s\n", io::RedactText(info.address.empty() ? f->address : info.address).c_str());
    std::printf("format:  %s\n", info.format.c_str());
    std::printf("samples: %s\n", info.num_samples ? std::to_string(*info.num_samples).c_str()
                                                  : "unknown (use --count)");
    if (info.class_names.empty()) classes = "not recorded (labels, where there are any, are plain numbers)";
    std::printf("classes: %s\n", classes.c_str());
    std::printf("fields:  %s\n", fields.empty() ? "-" : fields.c_str());
    std::printf("shards:  %zu\n", info.shards.size());
    std::printf("bytes:   %llu (%s)\n", static_cast<unsigned long long>(info.total_bytes),
                HumanBytes(info.total_bytes).c_str());
    for (const auto& [k, v] : info.extra) std::printf("%s: %s\n", k.c_str(), io::RedactText(v).c_str());
    const size_t shown = info.shards.size() <= 20 ? info.shards.size() : 10;
    for (size_t i = 0; i < shown; ++i) {
      const auto& sh = info.shards[i];
      std::printf("  %s  %llu samples  %llu bytes  %s\n", io::RedactText(sh.path).c_str(),
                  static_cast<unsigned long long>(sh.samples), static_cast<unsigned long long>(sh.bytes),
                  sh.checksum.c_str());
    }
    if (shown < info.shards.size()) std::printf("  ... %zu more (use --json)\n", info.shards.size() - shown);
    // info reads descriptions, not records: a shard with corrupt records passes it.
    std::printf("checked: metadata only; run `shardkit verify` to check the data\n");
    return kExitOk;
  };
}

}  // namespace shardkit::cli
