// Shared pieces of the shardkit command: errors, sizes, progress, summaries.
#include <fmt/format.h>
#include <unistd.h>

#include <csignal>

#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "core/front_end.h"
#include "cli.h"
#include "io/upload_staging.h"

namespace shardkit::cli {

const char* const kSizeHelp =
    "SIZE is a byte count with an optional unit: B, KB, MB, GB, TB (powers of 1000) or\n"
    "KiB, MiB, GiB, TiB (powers of 1024), case-insensitive: 1GiB, 500MB, 1000000.\n";
const char* const kExitHelp =
    "Exit status: 0 on success, 1 when the data or the system failed (the message names\n"
    "the file, shard, offset or key), 2 on a usage error (bad flag or value), 128+N when\n"
    "convert or shard stopped on signal N (130: Ctrl-C; 143: SIGTERM) and can --resume.\n";

int Fail(const Status& st, bool overwrite_flag) {
  std::string text = st.ToString();
  // The library says what is wrong; the command says which flag changes it.
  if (overwrite_flag && st.detail() == Detail::kOutputExists && st.message().find("--overwrite") == std::string::npos)
    text += " (pass --overwrite to replace it)";
  std::fprintf(stderr, "shardkit: error: %s\n", io::RedactText(text).c_str());
  // A scheme shardkit does not know is a mistyped address: a usage error.
  return st.detail() == Detail::kUnknownScheme ? kExitUsage : kExitError;
}

CLI::Validator AtLeastOne() {
  return CLI::Validator(
      [](std::string& v) -> std::string {
        try {
          size_t used = 0;
          if (std::stoll(v, &used) >= 1 && used == v.size()) return {};
        } catch (...) {
        }
        return "must be at least 1, got " + v;
      },
      "N>=1", "AtLeastOne");
}

namespace {
extern "C" void OnStopSignal(int sig) { RequestStop(sig); }
}  // namespace

void StopOnSignals() {
  struct sigaction sa{};
  sa.sa_handler = OnStopSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESETHAND;  // a second signal acts as if none were caught: it ends the process
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) ::sigaction(sig, &sa, nullptr);
}

int Interrupted(const Status& st) {
  std::fprintf(stderr,
               "\nshardkit: %s; nothing was published. Run the same command again with --resume to finish it "
               "(tar shards continue from the last complete shard, LMDB from its last durable point; "
               "other formats start over), or with --overwrite to start afresh\n",
               io::RedactText(st.message()).c_str());
  return 128 + StopRequested();
}

int UsageError(const std::string& message) {
  std::fprintf(stderr, "shardkit: error: %s\n", io::RedactText(message).c_str());
  return kExitUsage;
}

namespace {

// The readers' options, from the formats' tables: "KEY=VALUE ...: wds.channels=bgr|rgb|..., ...".
std::string SourceOptionsHelp() {
  std::string help = "KEY=VALUE option of the dataset's reader (repeatable; see docs/existing-data.md):";
  const char* sep = " ";
  for (const FormatOption& o : FormatOptions()) {
    if (o.write) continue;
    std::string values = o.choices.empty() ? "VALUE" : "";
    for (const auto& c : o.choices) values += (values.empty() ? "" : "|") + c;
    help += fmt::format("{}{}={}", sep, o.key(), values);
    sep = ", ";
  }
  return help;
}

}  // namespace

void AddSourceOptions(CLI::App* sub, OpenOptions* open) {
  sub->add_option_function<std::vector<std::string>>(
         "--source-option",
         [open](const std::vector<std::string>& kvs) {
           for (const auto& kv : kvs) {
             size_t eq = kv.find('=');
             if (eq == std::string::npos || eq == 0)
               throw CLI::ValidationError("--source-option", "'" + kv + "': expected KEY=VALUE");
             open->format_options[kv.substr(0, eq)] = kv.substr(eq + 1);
           }
         },
         SourceOptionsHelp())
      ->type_name("KEY=VALUE");
}

void AddCacheOptions(CLI::App* sub, OpenOptions* open) {
  sub->add_option_function<std::string>(
         "--cache-dir", [open](const std::string& d) { open->cache_dir = d; },
         "Remote shards (http(s)://, s3://): download each shard whole on first use into DIR and read it from "
         "there (a second epoch reads local disk); several processes may share DIR (default: "
         "$SHARDKIT_CACHE_DIR)")
      ->type_name("DIR");
  sub->add_option_function<std::string>(
         "--cache-bytes",
         [open](const std::string& v) {
           auto r = ParseByteSize(v);
           if (!r.ok()) throw CLI::ValidationError("--cache-bytes", std::string(r.status().message()));
           open->cache_bytes = *r;
         },
         "Bound of --cache-dir (e.g. 50G; least recently used shards are removed first; default "
         "$SHARDKIT_CACHE_BYTES, else unbounded)")
      ->type_name("SIZE");
  sub->add_flag(
      "--trust-manifest", open->trust_manifest,
      "Trust the dataset's manifest: take the files it names as written, even outside its own directory "
      "(absolute paths, '..', e.g. shards shared by manifests in sibling folders). Off by default: such "
      "entries are refused (docs/reliability.md, \"Confinement\")");
}

const char* const kEnvironmentHelp =
    "Environment (the flags win): SHARDKIT_CACHE_DIR / SHARDKIT_CACHE_BYTES (--cache-dir /\n"
    "--cache-bytes), SHARDKIT_INDEX_BUDGET (the source option wds.index_budget: memory for the\n"
    "per-shard indexes of tar shards' random access, default 64MiB).\n";

bool ParseSizeFlag(const std::string& flag, const std::string& value, uint64_t* out) {
  auto r = ParseByteSize(value);
  if (!r.ok()) {
    UsageError(fmt::format("{}: {}", flag, r.status().message()));
    return false;
  }
  if (*r == 0) {
    UsageError(fmt::format("{}: the size must be greater than 0, got '{}'", flag, value));
    return false;
  }
  *out = *r;
  return true;
}

std::string HumanBytes(uint64_t b) {
  if (b < 1000) return fmt::format("{} B", b);
  if (b < 1000000) return fmt::format("{:.1f} kB", b / 1e3);
  if (b < 1000000000) return fmt::format("{:.1f} MB", b / 1e6);
  return fmt::format("{:.2f} GB", b / 1e9);
}

ProgressPrinter::ProgressPrinter() : tty_(isatty(STDERR_FILENO) == 1) {}

ProgressPrinter::~ProgressPrinter() {
  if (drawn_) std::fputc('\n', stderr);
}

ProgressFn ProgressPrinter::fn() {
  if (!tty_) return {};
  return [this](const ConvertProgress& p) {
    double mbs = p.elapsed > 0 ? p.bytes / 1e6 / p.elapsed : 0;
    std::string line = fmt::format("\r{} samples", p.samples);
    if (p.total) line = fmt::format("\r{}/{} samples", p.samples, *p.total);
    line += fmt::format("  {}  {:.1f} MB/s", HumanBytes(p.bytes), mbs);
    if (p.total && p.samples > 0 && p.elapsed > 0) {
      double rate = p.samples / p.elapsed;
      uint64_t eta = uint64_t((*p.total > p.samples ? *p.total - p.samples : 0) / rate);
      line += fmt::format("  ETA {}:{:02d}", eta / 60, eta % 60);
    }
    line += "\033[K";
    std::fputs(line.c_str(), stderr);
    std::fflush(stderr);
    drawn_ = true;
  };
}

void PrintSummary(const char* command, const ConvertSummary& s, bool json) {
  double mbs = s.seconds > 0 ? s.payload_bytes / 1e6 / s.seconds : 0;
  if (json) {
    nlohmann::json j;
    j["command"] = command;
    j["source"] = s.source;
    j["destination"] = s.destination;
    j["source_format"] = s.source_format;
    j["destination_format"] = s.destination_format;
    j["samples"] = s.samples;
    j["bytes"] = s.bytes;
    j["payload_bytes"] = s.payload_bytes;
    j["seconds"] = s.seconds;
    j["mb_per_s"] = mbs;
    if (s.part.count > 0) {
      j["part"] = s.part.index;
      j["parts"] = s.part.count;
    }
    if (s.already_complete) j["already_complete"] = true;
    j["source_checksums_checked"] = s.source_checksums_checked;
    j["notes"] = s.notes;
    if (!s.transform.empty()) j["transform"] = nlohmann::json::parse(s.transform);
    if (!s.skipped_file.empty() || s.skipped > 0) {  // (a part: its record lists them; merge writes the file)
      j["skipped"] = s.skipped;
      if (!s.skipped_file.empty()) j["skipped_file"] = s.skipped_file;
    }
    if (s.selected > 0 || s.source_samples > 0) {
      j["source_samples"] = s.source_samples;
      j["selected"] = s.selected;
      j["duplicates"] = s.duplicates;
      if (!s.duplicates_file.empty()) j["duplicates_file"] = s.duplicates_file;
    }
    j["shards"] = nlohmann::json::array();
    for (const auto& sh : s.shards)
      j["shards"].push_back(
          {{"path", sh.path}, {"samples", sh.samples}, {"bytes", sh.bytes}, {"checksum", sh.checksum}});
    std::printf("%s\n", io::RedactText(j.dump()).c_str());
    return;
  }
  if (s.already_complete) {
    std::printf("%s: %s%s is already complete (checked: %zu file%s, %llu samples, %s); nothing written\n", command,
                s.part.count > 0 ? fmt::format("part {}/{} of ", s.part.index, s.part.count).c_str() : "",
                io::RedactText(s.destination).c_str(), s.shards.size(), s.shards.size() == 1 ? "" : "s",
                static_cast<unsigned long long>(s.samples), HumanBytes(s.bytes).c_str());
    return;
  }
  for (const auto& n : s.notes) std::fprintf(stderr, "shardkit: note: %s\n", io::RedactText(n).c_str());
  if (!s.skipped_file.empty() || s.skipped > 0)
    std::fprintf(stderr, "shardkit: --skip-bad left out %llu sample%s whose image did not decode, listed in %s\n",
                 static_cast<unsigned long long>(s.skipped), s.skipped == 1 ? "" : "s",
                 s.skipped_file.empty() ? "the part's record (merge writes skipped.json)"
                                        : io::RedactText(s.skipped_file).c_str());
  if (s.source_samples > 0)
    std::fprintf(stderr, "shardkit: chose %llu of the source's %llu samples%s\n",
                 static_cast<unsigned long long>(s.selected - s.duplicates),
                 static_cast<unsigned long long>(s.source_samples),
                 s.duplicates_file.empty()
                     ? ""
                     : fmt::format("; {} duplicate{} dropped, listed in {}", s.duplicates, s.duplicates == 1 ? "" : "s",
                                   io::RedactText(s.duplicates_file))
                           .c_str());
  if (s.part.count > 0)
    std::printf("part %llu/%llu: ", static_cast<unsigned long long>(s.part.index),
                static_cast<unsigned long long>(s.part.count));
  // Shards for the formats that cut them (their index and checksum files are not counted);
  // an LMDB, an HDF5 file or a folder is one output.
  std::string count = s.destination_shards ? fmt::format("{} shard{}, ", s.shards.size(), s.shards.size() == 1 ? "" : "s") : "";
  std::printf("%s: %llu samples (%s) %s -> %s in %.2f s (%.1f MB/s), %s%s %s%s\n",
              command, static_cast<unsigned long long>(s.samples), HumanBytes(s.payload_bytes).c_str(),
              io::RedactText(s.source).c_str(), io::RedactText(s.destination).c_str(), s.seconds, mbs, count.c_str(),
              HumanBytes(s.bytes).c_str(),
              io::IsRemoteOutput(s.destination) ? "uploaded" : "on disk",
              s.source_checksums_checked ? "; every sample matched its source checksum" : "");
}

}  // namespace shardkit::cli
