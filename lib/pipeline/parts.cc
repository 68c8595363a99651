// --part I/N and `shardkit merge`: the generic half of a conversion split into parts
// (shardkit/convert.h). The plan each part follows is made in convert.cc
// (MakePartPlan); the format's writer writes the part and its record, and the
// format's merge hook (formats/registry.h) writes the final metadata.
#include <cstdlib>

#include <fmt/format.h>

#include "formats/registry.h"
#include "pipeline/select.h"
#include "shardkit/convert.h"

namespace shardkit {

namespace {

// A whole decimal number, or nullopt.
std::optional<uint64_t> Number(std::string_view s) {
  if (s.empty() || s.size() > 19) return std::nullopt;
  uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + uint64_t(c - '0');
  }
  return v;
}

const char* Env(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

Result<uint64_t> EnvNumber(const char* name) {
  const char* v = Env(name);
  auto n = Number(v ? v : "");
  if (!n) return Status::Invalid(fmt::format("--part env: {}='{}' is not a whole number", name, v ? v : ""));
  return *n;
}

Status CheckRange(const PartSpec& p) {
  if (p.count == 0 || p.index >= p.count)
    return Status::Invalid(fmt::format("--part env: {} gives part {} of {}; expected 0 <= I < N", p.from, p.index,
                                       p.count));
  return Status::OK();
}

}  // namespace

Result<PartSpec> ParsePart(std::string_view text) {
  if (text == "env") return PartFromEnvironment();
  auto slash = text.find('/');
  std::optional<uint64_t> i, n;
  if (slash != std::string_view::npos) {
    i = Number(text.substr(0, slash));
    n = Number(text.substr(slash + 1));
  }
  if (!i || !n || *n == 0 || *i >= *n)
    return Status::Invalid(fmt::format("bad --part '{}': expected I/N with 0 <= I < N (e.g. 3/16), or 'env' to take "
                                       "them from Slurm, MPI or torchrun",
                                       text));
  return PartSpec{*i, *n, "--part"};
}

Result<PartSpec> PartFromEnvironment() {
  PartSpec p;
  if (Env("SLURM_ARRAY_TASK_ID") && Env("SLURM_ARRAY_TASK_COUNT")) {
    // A job array: ids MIN, MIN+STEP, ... (sbatch --array=0-15, or 1-16, or 0-30:2).
    SK_ASSIGN_OR_RETURN(uint64_t id, EnvNumber("SLURM_ARRAY_TASK_ID"));
    SK_ASSIGN_OR_RETURN(p.count, EnvNumber("SLURM_ARRAY_TASK_COUNT"));
    uint64_t min = 0, step = 1;
    if (Env("SLURM_ARRAY_TASK_MIN")) {
      SK_ASSIGN_OR_RETURN(min, EnvNumber("SLURM_ARRAY_TASK_MIN"));
    }
    if (Env("SLURM_ARRAY_TASK_STEP")) {
      SK_ASSIGN_OR_RETURN(step, EnvNumber("SLURM_ARRAY_TASK_STEP"));
    }
    if (id < min || step == 0 || (id - min) % step != 0)
      return Status::Invalid(fmt::format("--part env: SLURM_ARRAY_TASK_ID={} does not fit the array (min {}, step {})",
                                         id, min, step));
    p.index = (id - min) / step;
    p.from = "SLURM_ARRAY_TASK_ID/SLURM_ARRAY_TASK_COUNT";
    if (min != 0) p.from += " (minus SLURM_ARRAY_TASK_MIN)";
  } else if (Env("OMPI_COMM_WORLD_RANK") && Env("OMPI_COMM_WORLD_SIZE")) {
    SK_ASSIGN_OR_RETURN(p.index, EnvNumber("OMPI_COMM_WORLD_RANK"));
    SK_ASSIGN_OR_RETURN(p.count, EnvNumber("OMPI_COMM_WORLD_SIZE"));
    p.from = "OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE";
  } else if (Env("PMI_RANK") && Env("PMI_SIZE")) {
    SK_ASSIGN_OR_RETURN(p.index, EnvNumber("PMI_RANK"));
    SK_ASSIGN_OR_RETURN(p.count, EnvNumber("PMI_SIZE"));
    p.from = "PMI_RANK/PMI_SIZE";
  } else if (Env("SLURM_PROCID") && Env("SLURM_NTASKS")) {
    SK_ASSIGN_OR_RETURN(p.index, EnvNumber("SLURM_PROCID"));
    SK_ASSIGN_OR_RETURN(p.count, EnvNumber("SLURM_NTASKS"));
    p.from = "SLURM_PROCID/SLURM_NTASKS";
  } else if (Env("RANK") && Env("WORLD_SIZE")) {
    SK_ASSIGN_OR_RETURN(p.index, EnvNumber("RANK"));
    SK_ASSIGN_OR_RETURN(p.count, EnvNumber("WORLD_SIZE"));
    p.from = "RANK/WORLD_SIZE";
  } else {
    return Status::Invalid(
        "--part env: no launcher variables found (SLURM_ARRAY_TASK_ID/SLURM_ARRAY_TASK_COUNT, "
        "OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE, PMI_RANK/PMI_SIZE, SLURM_PROCID/SLURM_NTASKS, RANK/WORLD_SIZE); "
        "give --part I/N instead");
  }
  SK_RETURN_IF_ERROR(CheckRange(p));
  return p;
}

Result<MergeSummary> Merge(std::string_view dst, const MergeOptions& opts) {
  std::string path;
  SK_ASSIGN_OR_RETURN(const formats::Format* fmt, formats::Resolve(dst, /*for_write=*/true, &path));
  if (!fmt->merge)
    return Status::Unsupported(fmt::format("the {} format is not written in parts: there is nothing to merge", fmt->name),
                               Location{.file = path});
  SK_ASSIGN_OR_RETURN(MergeSummary sum, fmt->merge(path, opts));
  sum.destination = std::string(dst);
  if (sum.skipped) {  // --skip-bad: the parts' lists as one, as a single process writes it
    SK_ASSIGN_OR_RETURN(sum.skipped_file, pipeline::WriteSidecar(dst, "skipped.json",
                                                                 pipeline::SkippedJson(sum.source, *sum.skipped),
                                                                 opts.filesystem));
  }
  return sum;
}

}  // namespace shardkit
