// `shardkit verify`.
#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli.h"
#include "shardkit/verify.h"

namespace shardkit::cli {

namespace {

using json = nlohmann::json;

json OrNull(const std::string& s) { return s.empty() ? json(nullptr) : json(s); }
json OrNull(int64_t v) { return v < 0 ? json(nullptr) : json(v); }

json ReportJson(const VerifyReport& r, const std::string& against, bool decode, bool duplicates) {
  json j;
  j["address"] = r.address;
  j["format"] = r.format;
  j["ok"] = r.ok();
  j["samples"] = r.samples;
  j["bytes"] = r.bytes;
  j["shards"] = r.shards;
  j["seconds"] = r.seconds;
  j["against"] = OrNull(against);
  j["source_samples"] = against.empty() ? json(nullptr) : json(r.source_samples);
  j["sample_checksums"] = r.sample_checksums;
  j["shard_checksums"] = r.shard_checksums;
  j["decode"] = decode;
  j["images_decoded"] = r.images_decoded;
  json counts = json::object();
  for (int k = 0; k < kNumFindingKinds; ++k) counts[FindingKindName(FindingKind(k))] = r.counts[k];
  j["counts"] = counts;
  j["total_findings"] = r.total_findings();
  j["findings"] = json::array();
  for (const auto& f : r.findings)
    j["findings"].push_back({{"kind", FindingKindName(f.kind)},
                             {"file", OrNull(f.where.file)},
                             {"shard", OrNull(f.where.shard)},
                             {"offset", OrNull(f.where.offset)},
                             {"key", OrNull(f.where.key)},
                             {"index", OrNull(f.where.index)},
                             {"message", f.message}});
  j["notes"] = r.notes;
  if (duplicates) {
    j["duplicate_images"] = json::array();
    for (const auto& [k, o] : r.duplicate_images) j["duplicate_images"].push_back({{"key", k}, {"duplicate_of", o}});
  }
  return j;
}

}  // namespace

RunFn SetupVerify(CLI::App* sub) {
  struct Flags {
    std::string address, against;
    bool decode = false, json = false, duplicates = false;
    uint64_t max_findings = 1000;
    int threads = 0;
    uint64_t max_pixels = 200'000'000;
    OpenOptions open;  // --cache-dir / --cache-bytes, then the environment (dataset and --against)
  };
  auto f = std::make_shared<Flags>();
  AddCacheOptions(sub, &f->open);
  AddSourceOptions(sub, &f->open);
  sub->add_option("DATASET", f->address, "Dataset address, e.g. out/train.manifest.json, lmdb:train.lmdb")
      ->required();
  sub->add_option("--against", f->against,
                  "Compare sample by sample, by key, with this source dataset: report keys missing here, "
                  "extra keys, and samples whose label, fields or bytes differ");
  sub->add_flag("--decode", f->decode,
                "Decode every image field in full; report images that fail or decode only with warnings. "
                "Decoded arrays (npy) are parsed, and the report notes their channel order");
  sub->add_flag("--duplicates", f->duplicates,
                "Also list the samples whose image bytes equal an earlier sample's (what `convert --dedup` would "
                "drop); a second read of the dataset. Duplicates are listed, not findings: they do not fail "
                "the check");
  sub->add_option("--threads", f->threads, "Threads decoding images with --decode (0: one per core)")
      ->default_val(0)
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--max-pixels", f->max_pixels,
                  "With --decode: an image whose header declares more pixels (width x height) is a finding, "
                  "refused before its pixels are allocated (decompression-bomb guard)")
      ->default_val(f->max_pixels)
      ->check(CLI::PositiveNumber);
  sub->add_flag("--json", f->json, "Print the report as one JSON object (schema in docs/reliability.md)");
  sub->add_option("--max-findings", f->max_findings,
                  "Findings listed in the report (all are counted); 0 lists all")
      ->default_val(1000);
  sub->footer(std::string(
                  "Checks: the container's structure (every shard and sample read by the format's strict\n"
                  "reader), sample counts against the metadata, recorded shard and per-sample checksums,\n"
                  "duplicate keys (within and across shards), missing or empty shards, samples missing a\n"
                  "field that others have. Each finding names its file, shard, offset and key.\n"
                  "Examples:\n"
                  "  shardkit verify out/train.manifest.json\n"
                  "  shardkit verify 'out/train-{000000..000009}.tar' --against images/ --decode\n"
                  "  shardkit verify lmdb:train.lmdb --json\n"
                  "Exit status: 0 when the dataset is intact, 1 when there are findings or it cannot be\n"
                  "checked (the message says why), 2 on a usage error.\n") +
              kEnvironmentHelp);
  return [f]() -> int {
    if (Status st = OpenOptionsFromEnvironment(&f->open); !st.ok()) return UsageError(st.message());
    VerifyOptions opts;
    opts.open = f->open;
    opts.against_open = f->open;
    opts.against = f->against;
    opts.decode = f->decode;
    opts.duplicates = f->duplicates;
    opts.threads = f->threads;
    opts.max_pixels = f->max_pixels;
    opts.max_findings = f->max_findings;
    const bool tty = isatty(STDERR_FILENO) == 1;
    bool drawn = false;
    if (tty) {
      opts.progress = [&drawn](const VerifyProgress& p) {
        std::string line = fmt::format("\r{}: {} samples", p.phase, p.samples);
        if (p.total) line = fmt::format("\r{}: {}/{} samples", p.phase, p.samples, *p.total);
        double mbs = p.elapsed > 0 ? p.bytes / 1e6 / p.elapsed : 0;
        line += fmt::format("  {}  {:.1f} MB/s\033[K", HumanBytes(p.bytes), mbs);
        std::fputs(line.c_str(), stderr);
        std::fflush(stderr);
        drawn = true;
      };
    }
    auto r = Verify(f->address, opts);
    if (drawn) std::fputc('\n', stderr);
    if (!r.ok()) {
      if (f->json) {
        json j{{"address", f->address}, {"ok", false}, {"error", r.status().ToString()}};
        std::printf("%s\n", io::RedactText(j.dump(-1, ' ', false, json::error_handler_t::replace)).c_str());
      }
      return Fail(r.status());
    }
    const VerifyReport& rep = *r;
    if (f->json) {
      std::printf("%s\n", io::RedactText(ReportJson(rep, f->against, f->decode, f->duplicates)
                                               .dump(-1, ' ', false, json::error_handler_t::replace))
                               .c_str());
      return rep.ok() ? kExitOk : kExitError;
    }
    std::printf("verify %s (%s): %llu samples, %llu shard%s, %s\n", io::RedactText(rep.address).c_str(), rep.format.c_str(),
                static_cast<unsigned long long>(rep.samples), static_cast<unsigned long long>(rep.shards),
                rep.shards == 1 ? "" : "s", HumanBytes(rep.bytes).c_str());
    for (const auto& x : rep.findings) {
      std::string where = x.where.ToString();
      std::printf("%s: %s%s%s\n", FindingKindName(x.kind), io::RedactText(where).c_str(), where.empty() ? "" : ": ",
                  io::RedactText(x.message).c_str());
    }
    if (rep.findings.size() < rep.total_findings())
      std::printf("... %llu more findings not listed (use --max-findings 0 or --json)\n",
                  static_cast<unsigned long long>(rep.total_findings() - rep.findings.size()));
    for (const auto& n : rep.notes) std::printf("note: %s\n", io::RedactText(n).c_str());
    if (f->duplicates) {
      const size_t shown = f->max_findings ? std::min<size_t>(rep.duplicate_images.size(), f->max_findings)
                                           : rep.duplicate_images.size();
      for (size_t i = 0; i < shown; ++i)
        std::printf("duplicate image: %s repeats %s\n", io::RedactText(rep.duplicate_images[i].first).c_str(),
                    io::RedactText(rep.duplicate_images[i].second).c_str());
      if (shown < rep.duplicate_images.size())
        std::printf("... %zu more duplicates not listed (use --max-findings 0 or --json)\n",
                    rep.duplicate_images.size() - shown);
      std::printf("duplicates: %zu sample%s repeat an earlier sample's image bytes (`convert --dedup` drops them)\n",
                  rep.duplicate_images.size(), rep.duplicate_images.size() == 1 ? "" : "s");
    }
    std::string checked = fmt::format("sample checksums {}, shard checksums {}",
                                      rep.sample_checksums ? "checked" : "not checked (none recorded or readable)",
                                      rep.shard_checksums ? "checked" : "not checked (none recorded)");
    if (!f->against.empty()) checked += fmt::format(", compared with {} ({} samples)", f->against, rep.source_samples);
    if (f->decode) checked += fmt::format(", {} images decoded", rep.images_decoded);
    std::printf("checked: %s\n", io::RedactText(checked).c_str());
    if (rep.ok()) {
      std::printf("result: intact (%.2f s)\n", rep.seconds);
      return kExitOk;
    }
    std::string counts;
    for (int k = 0; k < kNumFindingKinds; ++k)
      if (rep.counts[k]) counts += fmt::format("{}{} {}", counts.empty() ? "" : ", ", rep.counts[k], FindingKindName(FindingKind(k)));
    std::printf("result: %llu finding%s: %s (%.2f s)\n", static_cast<unsigned long long>(rep.total_findings()),
                rep.total_findings() == 1 ? "" : "s", counts.c_str(), rep.seconds);
    return kExitError;
  };
}

}  // namespace shardkit::cli
