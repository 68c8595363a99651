// The shardkit command: a table of subcommands. Each one parses its flags,
// calls the library and prints; see cmd_*.cc. To add a subcommand: write
// cmd_<name>.cc with a Setup function, declare it in cli.h, add a row below
// and the file to tools/CMakeLists.txt.
#include <cstdio>

#include "cli.h"

namespace {

using shardkit::cli::Command;

const Command kCommands[] = {
    {"convert", "Convert a dataset from one format to another, streaming samples in order",
     shardkit::cli::SetupConvert},
    {"shard", "Re-shard any dataset into WebDataset tar shards (N even shards, N samples or N bytes each)",
     shardkit::cli::SetupShard},
    {"info", "Show a dataset's format, samples, classes, fields, shards and bytes (metadata only: verify checks the data)",
     shardkit::cli::SetupInfo},
    {"bench", "Measure random-read latency and read throughput of datasets side by side",
     shardkit::cli::SetupBench},
    {"verify", "Check that a dataset is complete and intact (structure, counts, checksums, keys; --against, --decode)",
     shardkit::cli::SetupVerify},
    {"index", "Write DALI index files or a wids shard list for tar shards", shardkit::cli::SetupIndex},
    {"merge", "Finish a conversion written in parts (--part I/N): check every part, write the manifest",
     shardkit::cli::SetupMerge},
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"shardkit: pack, convert, verify and benchmark training datasets"};
  app.set_version_flag("--version", shardkit::Version());
  app.require_subcommand(1);
  std::string formats;
  for (const auto& f : shardkit::FormatNames()) formats += (formats.empty() ? "" : ", ") + f + ":";
  app.footer(std::string("Dataset addresses are paths, optionally prefixed by a scheme that overrides\n"
                         "format detection (") + formats + ").\n" +
             "Run `shardkit <command> --help` for a command's flags and examples.\n" +
             shardkit::cli::kExitHelp);

  std::vector<std::pair<CLI::App*, shardkit::cli::RunFn>> runs;
  for (const Command& c : kCommands) {
    CLI::App* sub = app.add_subcommand(c.name, c.description);
    runs.emplace_back(sub, c.setup(sub));
  }
  if (argc > 1 && argv[1][0] != '-') {
    bool known = false;
    std::string names;
    for (const Command& c : kCommands) {
      known = known || std::string(argv[1]) == c.name;
      names += (names.empty() ? "" : ", ") + std::string(c.name);
    }
    if (!known)
      return shardkit::cli::UsageError(std::string("unknown command '") + argv[1] + "'; the commands are " +
                                       names + " (run 'shardkit --help')");
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const std::string name = e.get_name();
    if (name == "CallForHelp" || name == "CallForAllHelp" || name == "CallForVersion")
      return app.exit(e);
    // CLI11 exits with its own codes (105, 106, ...); usage errors are 2 here.
    std::string where;
    for (auto& [sub, run] : runs)
      if (sub->parsed()) where = std::string(" ") + sub->get_name();
    std::fprintf(stderr, "shardkit: error: %s\nRun 'shardkit%s --help' for usage.\n",
                 shardkit::io::RedactText(e.what()).c_str(),
                 where.c_str());
    return shardkit::cli::kExitUsage;
  }
  for (auto& [sub, run] : runs)
    if (sub->parsed()) return run();
  return shardkit::cli::kExitUsage;
}
