// The shardkit command's shared pieces. Each subcommand lives in one file
// (cmd_<name>.cc) with one Setup function; shardkit_main.cc lists them in a table.
//
// Exit codes: 0 success, 1 a data or runtime error reported by the library,
// 2 a usage error (unknown flag, missing argument, bad size string, ...).
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <functional>
#include <string>

#include "shardkit/shardkit.h"
#include "core/redact.h"

namespace shardkit::cli {

constexpr int kExitOk = 0;
constexpr int kExitError = 1;
constexpr int kExitUsage = 2;

// Runs a parsed subcommand and returns the process exit code.
using RunFn = std::function<int()>;

// A row of the command table: Setup adds the subcommand's options to `sub`
// (whose name and one-line description are already set) and returns what
// runs once the command line parsed.
struct Command {
  const char* name;
  const char* description;
  RunFn (*setup)(CLI::App* sub);
};

RunFn SetupConvert(CLI::App* sub);
RunFn SetupShard(CLI::App* sub);
RunFn SetupInfo(CLI::App* sub);
RunFn SetupBench(CLI::App* sub);
RunFn SetupVerify(CLI::App* sub);
RunFn SetupIndex(CLI::App* sub);
RunFn SetupMerge(CLI::App* sub);

// Prints "shardkit: error: <status>" to stderr; returns kExitError. For a
// command with --overwrite (overwrite_flag), an existing output
// (Detail::kOutputExists) gets "(pass --overwrite to replace it)".
int Fail(const Status& st, bool overwrite_flag = false);
// A CLI11 check: an integer of at least 1 ("--num-shards: must be at least 1, got 0").
CLI::Validator AtLeastOne();
// SIGINT, SIGTERM and SIGHUP ask the library to stop (RequestStop); a second one ends
// the process at once. For commands that poll (convert, shard).
void StopOnSignals();
// Reports a copy stopped by a signal (Code::kCancelled after RequestStop) and how to
// resume it; returns 128 + the signal number, as a shell reports a signal's end.
int Interrupted(const Status& st);
// Prints "shardkit: error: <message>" to stderr; returns kExitUsage.
int UsageError(const std::string& message);

// Parses a --shard-size style value; on failure prints a usage error naming
// `flag` and returns false.
bool ParseSizeFlag(const std::string& flag, const std::string& value, uint64_t* out);

// --cache-dir DIR and --cache-bytes SIZE: the local cache of remote shards
// (docs/remote.md), set on *open (OpenOptions::cache_dir/_bytes); *open must
// outlive the parse.
void AddCacheOptions(CLI::App* sub, OpenOptions* open);  // --cache-dir, --cache-bytes, --trust-manifest
// --source-option KEY=VALUE (repeatable): the read options of the dataset read
// (OpenOptions::format_options on *open, which must outlive the parse); malformed: usage error.
void AddSourceOptions(CLI::App* sub, OpenOptions* open);
// The environment the commands honour (the library's OpenOptionsFromEnvironment and
// StagingDirFromEnvironment, called after the flags are parsed, so the flags win).

// Progress on stderr (samples, MB/s, ETA) when stderr is a terminal, else a no-op.
class ProgressPrinter {
 public:
  ProgressPrinter();
  ~ProgressPrinter();  // ends the line if one was drawn
  ProgressFn fn();

 private:
  bool tty_;
  bool drawn_ = false;
};

// "1.23 MB"
std::string HumanBytes(uint64_t bytes);

// Prints the summary of convert/shard: one line, or JSON with --json.
void PrintSummary(const char* command, const ConvertSummary& s, bool json);

// The end of convert/shard: prints the summary or the error and returns the exit
// code. A part (part.count > 0) run by an MPI launcher in a build with MPI
// (tools/mpi.cc) first agrees with the other ranks: every rank's failure is
// reported, and when all succeeded rank 0 merges `dst` (shardkit merge).
int FinishCopy(const char* command, const Result<ConvertSummary>& r, const std::string& dst, bool json,
               const PartSpec& part);

// Help text: how size values are written, for footers.
extern const char* const kSizeHelp;
extern const char* const kExitHelp;
// The environment variables of OpenOptionsFromEnvironment, for footers.
extern const char* const kEnvironmentHelp;

}  // namespace shardkit::cli
