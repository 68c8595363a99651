// `shardkit merge DST`: finish a conversion written in parts (--part I/N).
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <memory>

#include "cli.h"

namespace shardkit::cli {

namespace {

void PrintMerge(const MergeSummary& m, bool json) {
  if (json) {
    nlohmann::json j;
    j["command"] = "merge";
    j["destination"] = m.destination;
    j["metadata"] = m.metadata;
    j["parts"] = m.parts;
    j["shards"] = m.shards;
    j["samples"] = m.samples;
    j["bytes"] = m.bytes;
    j["unchanged"] = m.unchanged;
    if (m.skipped) {
      j["skipped"] = m.skipped->size();
      j["skipped_file"] = m.skipped_file;
    }
    std::printf("%s\n", io::RedactText(j.dump()).c_str());
    return;
  }
  std::printf("merge: %llu parts, %llu shards, %llu samples, %s -> %s%s\n",
              static_cast<unsigned long long>(m.parts), static_cast<unsigned long long>(m.shards),
              static_cast<unsigned long long>(m.samples), HumanBytes(m.bytes).c_str(), io::RedactText(m.metadata).c_str(),
              m.unchanged ? " (already merged; unchanged)" : "");
  if (m.skipped)
    std::fprintf(stderr, "shardkit: the parts' --skip-bad left out %zu sample%s, listed in %s\n", m.skipped->size(),
                 m.skipped->size() == 1 ? "" : "s", io::RedactText(m.skipped_file).c_str());
}

}  // namespace

RunFn SetupMerge(CLI::App* sub) {
  struct Flags {
    std::string dst;
    bool checksums = false;
    bool json = false;
  };
  auto f = std::make_shared<Flags>();
  sub->add_option("DST", f->dst, "The destination the parts were given, e.g. wds:out/train-%06d.tar")->required();
  sub->add_flag("--checksums", f->checksums,
                "Also hash every shard against its part record (a full read; without it: names and sizes)");
  sub->add_flag("--json", f->json,
                "Print the summary as one JSON object: command, destination, metadata, parts, shards, samples, "
                "bytes, unchanged (and skipped, skipped_file for parts run with --skip-bad)");
  sub->footer(std::string("Checks that every part 0..N-1 finished with the same flags and source, that the shards are\n"
                          "exactly 0..S-1 (none missing, none twice) with their recorded sizes, then writes the\n"
                          "manifest last. Running it again checks again and rewrites nothing.\n"
                          "Examples:\n"
                          "  shardkit merge wds:out/train-%06d.tar\n"
                          "  shardkit merge out/train-%06d.tar --checksums --json\n") +
              kExitHelp);
  return [f]() -> int {
    MergeOptions o;
    o.checksums = f->checksums;
    auto r = Merge(f->dst, o);
    if (!r.ok()) return Fail(r.status());
    PrintMerge(*r, f->json);
    return kExitOk;
  };
}

namespace {

// Prints a copy's outcome; the exit code.
int Report(const char* command, const Result<ConvertSummary>& r, bool json) {
  if (!r.ok() && r.status().code() == Code::kCancelled && StopRequested() > 0) return Interrupted(r.status());
  if (!r.ok()) return Fail(r.status(), /*overwrite_flag=*/true);
  PrintSummary(command, *r, json);
  return kExitOk;
}

}  // namespace

#ifndef SHARDKIT_WITH_MPI

int FinishCopy(const char* command, const Result<ConvertSummary>& r, const std::string&, bool json,
               const PartSpec&) {
  return Report(command, r, json);
}

#else

}  // namespace shardkit::cli

// The C API only (no MPI C++ bindings to link).
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <cstring>
#include <vector>

namespace shardkit::cli {

// Under mpirun (the part came from OpenMPI's variables): every rank reports, then the
// ranks agree; when all succeeded rank 0 merges and tells the others.
int FinishCopy(const char* command, const Result<ConvertSummary>& r, const std::string& dst, bool json,
               const PartSpec& part) {
  if (part.count == 0 || part.from.rfind("OMPI_", 0) != 0) return Report(command, r, json);
  int rc = Report(command, r, json);
  std::fflush(stdout);
  std::fflush(stderr);
  int inited = 0;
  MPI_Initialized(&inited);
  if (!inited && MPI_Init(nullptr, nullptr) != MPI_SUCCESS) {
    std::fprintf(stderr, "shardkit: error: MPI_Init failed; run `shardkit merge %s` once every part finished\n",
                 io::RedactText(dst).c_str());
    return kExitError;
  }
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  // Each rank's outcome: a code and the start of its message.
  constexpr int kMsg = 1024;
  std::vector<char> mine(kMsg, 0), all(size_t(kMsg) * size_t(size), 0);
  mine[0] = rc == kExitOk ? 0 : 1;
  if (!r.ok()) std::snprintf(mine.data() + 1, kMsg - 1, "%s", r.status().ToString().c_str());
  MPI_Allgather(mine.data(), kMsg, MPI_CHAR, all.data(), kMsg, MPI_CHAR, MPI_COMM_WORLD);
  int failed = 0;
  for (int i = 0; i < size; ++i) {
    const char* m = all.data() + size_t(i) * kMsg;
    if (m[0] == 0) continue;
    ++failed;
    if (rank == 0 && i != 0) std::fprintf(stderr, "shardkit: error: rank %d (part %d/%d) failed: %s\n", i, i, size, m + 1);
  }
  std::vector<char> verdict(kMsg, 0);
  if (rank == 0) {
    if (failed > 0) {
      verdict[0] = 1;
      std::snprintf(verdict.data() + 1, kMsg - 1, "%d of %d parts failed; no manifest written (rerun with --resume)",
                    failed, size);
    } else {
      auto m = Merge(dst, MergeOptions{});
      if (m.ok()) {
        PrintMerge(*m, json);
      } else {
        verdict[0] = 1;
        std::snprintf(verdict.data() + 1, kMsg - 1, "merge failed: %s", m.status().ToString().c_str());
      }
    }
    if (verdict[0]) std::fprintf(stderr, "shardkit: error: %s\n", verdict.data() + 1);
    std::fflush(stdout);
    std::fflush(stderr);
  }
  MPI_Bcast(verdict.data(), kMsg, MPI_CHAR, 0, MPI_COMM_WORLD);
  MPI_Finalize();
  if (rc != kExitOk) return rc;
  return verdict[0] ? kExitError : kExitOk;
}

#endif

}  // namespace shardkit::cli
