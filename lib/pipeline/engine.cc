// The batch engine's shared parts (see engine.h).
#include "pipeline/engine.h"

#include <cstdlib>

#include <fmt/format.h>
#include <tbb/info.h>

#include "shardkit/gpu.h"

namespace shardkit {

namespace {

// RANK / WORLD_SIZE (torchrun): the only environment the loaders read, and only for
// LoaderOptions::rank / world_size < 0.
Result<int> EnvInt(const char* name, int dflt) {
  const char* v = std::getenv(name);
  if (!v || !*v) return dflt;
  char* end = nullptr;
  long x = std::strtol(v, &end, 10);
  if (*end || x < 0 || x > (1 << 20)) return Status::Invalid(fmt::format("environment {}='{}' is not a valid number", name, v));
  return int(x);
}

// The checks that need no environment.
Status CheckOptions(const LoaderOptions& o, int max_side) {
  if (o.batch_size == 0) return Status::Invalid("batch_size must be positive");
  if (o.output_width <= 0 || o.output_height <= 0 || o.output_width > max_side || o.output_height > max_side)
    return Status::Invalid(fmt::format("bad output size {}x{}", o.output_width, o.output_height));
  if (o.prefetch < 1 || o.prefetch > 1024) return Status::Invalid("prefetch must be in [1, 1024]");
  if (o.threads < 0 || o.threads > 4096) return Status::Invalid("threads must be in [0, 4096]");
  if (!(o.scale_min > 0 && o.scale_min <= o.scale_max && o.scale_max <= 1.0))
    return Status::Invalid("RandomResizedCrop scale must satisfy 0 < min <= max <= 1");
  if (!(o.ratio_min > 0 && o.ratio_min <= o.ratio_max)) return Status::Invalid("bad aspect ratio range");
  if (!(o.flip_p >= 0 && o.flip_p <= 1)) return Status::Invalid("flip_p must be in [0, 1]");
  if (o.resize_size <= 0) return Status::Invalid("resize_size must be positive");
  if (!(o.dct_min_cover >= 0.5 && o.dct_min_cover <= 64))
    return Status::Invalid("dct_min_cover must be in [0.5, 64]");
  for (float s : o.std)
    if (!(s > 0)) return Status::Invalid("std must be positive");
  return Status::OK();
}

Status CheckGpuOptions(const GpuOptions& g) {
  if (g.ring < 2 || g.ring > 64) return Status::Invalid("GpuOptions::ring must be in [2, 64]");
  if (g.host_threads < 0 || g.host_threads > 4096) return Status::Invalid("GpuOptions::host_threads must be in [0, 4096]");
  if (!(g.hardware_load < 0 || g.hardware_load <= 1))  // (NaN is refused too)
    return Status::Invalid(fmt::format("GpuOptions::hardware_load {} is not in [0, 1]", g.hardware_load));
  return Status::OK();
}

Status ResolveRank(LoaderOptions* o) {
  if (o->world_size < 0) {
    SK_ASSIGN_OR_RETURN(o->world_size, EnvInt("WORLD_SIZE", 1));
  }
  if (o->rank < 0) {
    SK_ASSIGN_OR_RETURN(o->rank, EnvInt("RANK", 0));
  }
  if (o->world_size < 1 || o->rank >= o->world_size)
    return Status::Invalid(fmt::format("rank {} is not within world size {}", o->rank, o->world_size));
  return Status::OK();
}

}  // namespace

Status Validate(const LoaderOptions& o) {
  LoaderOptions c = o;
  return pipeline::ResolveOptions(&c);
}

Status Validate(const LoaderOptions& o, const GpuOptions& g) {
  LoaderOptions c = o;
  return pipeline::ResolveOptions(&c, g);
}

namespace pipeline {

Status ResolveOptions(LoaderOptions* o) {
  SK_RETURN_IF_ERROR(CheckOptions(*o, kMaxOutputSide));
  SK_RETURN_IF_ERROR(ResolveRank(o));
  if (o->threads == 0) o->threads = tbb::info::default_concurrency();
  return Status::OK();
}

Status ResolveOptions(LoaderOptions* o, const GpuOptions& g) {
  SK_RETURN_IF_ERROR(CheckOptions(*o, kMaxGpuOutputSide));
  SK_RETURN_IF_ERROR(CheckGpuOptions(g));
  SK_RETURN_IF_ERROR(ResolveRank(o));
  // Feeding a GPU: one core is left to the thread that launches the model's kernels
  // (starved of a core, it leaves the GPU idle between kernels: issue 16).
  if (o->threads == 0) o->threads = std::max(1, int(tbb::info::default_concurrency()) - 1);
  return Status::OK();
}

double ResolvedHardwareLoad(const GpuOptions& g) {
  return g.hardware_load < 0 ? GpuOptions::kDefaultHardwareLoad : g.hardware_load;
}

Result<RowHead> ReadRow(const RandomAccess* data, const LoaderOptions& o, uint64_t index, const Sample* given,
                        Sample* scratch) {
  if (!given) {
    scratch->clear();
    Status st = data->Get(index, scratch);
    if (!st.ok()) return st.At(Location{.index = int64_t(index)});
  }
  RowHead h;
  h.sample = given ? given : scratch;
  h.where = Location{.key = h.sample->key, .index = int64_t(index)};
  h.image = o.image_field.empty() ? h.sample->image() : h.sample->find(o.image_field);
  if (!h.image) {
    return Status::Corrupt(o.image_field.empty() ? std::string("sample has no image field")
                                                 : fmt::format("sample has no '{}' field", o.image_field),
                           h.where);
  }
  h.label = h.sample->label().value_or(-1);
  return h;
}

Status RowException(const std::exception& ex, uint64_t index) {
  return Status::Internal(fmt::format("exception while decoding: {}", ex.what()), Location{.index = int64_t(index)});
}

Augment ChooseCrop(const LoaderOptions& o, const RrcParams& rrc, uint64_t epoch, uint64_t index, int w, int h) {
  return o.mode == AugmentMode::kTrain ? TrainAugment(o.seed, epoch, index, w, h, rrc)
                                       : EvalAugment(w, h, o.resize_size, o.output_width, o.output_height);
}

Status DecodeCrop(decode::ImageDecoder& dec, const LoaderOptions& o, const RrcParams& rrc, uint64_t epoch,
                  uint64_t index, const uint8_t* data, size_t size, const Location& where, Augment* aug,
                  decode::Region* out) {
  auto choose = [&](const decode::ImageInfo& info) {
    *aug = ChooseCrop(o, rrc, epoch, index, info.width, info.height);
    return aug->box;
  };
  Status st = dec.Decode(data, size, choose, o.dct_scaling ? o.output_width * o.dct_min_cover : 0.0,
                         o.dct_scaling ? o.output_height * o.dct_min_cover : 0.0, out);
  if (!st.ok()) return st.At(where);
  return Status::OK();
}

Status SettleRows(const std::vector<Status>& rows, DecodeErrorPolicy policy, std::vector<size_t>* keep,
                  std::vector<Status>* skipped) {
  keep->clear();
  keep->reserve(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    if (rows[i].ok()) {
      keep->push_back(i);
    } else if (policy == DecodeErrorPolicy::kError || rows[i].code() == Code::kCancelled) {
      return rows[i];
    } else {
      skipped->push_back(rows[i]);
    }
  }
  return Status::OK();
}

LoaderState MakeState(const LoaderOptions& o, uint64_t n, uint64_t epoch, uint64_t next_batch) {
  LoaderState s;
  s.seed = o.seed;
  s.epoch = epoch;
  s.next_batch = next_batch;
  s.num_samples = n;
  s.rank = o.rank;
  s.world_size = o.world_size;
  s.batch_size = o.batch_size;
  return s;
}

LoaderState Delivery::State(const LoaderOptions& o, uint64_t n) const { return MakeState(o, n, epoch, next); }

Status CheckRestore(const LoaderState& s, const LoaderOptions& o, uint64_t n, uint64_t num_batches) {
  if (s.seed != o.seed || s.num_samples != n || s.rank != o.rank || s.world_size != o.world_size ||
      s.batch_size != o.batch_size)
    return Status::Invalid(fmt::format(
        "loader state (seed {}, {} samples, rank {}/{}, batch {}) does not match this loader "
        "(seed {}, {} samples, rank {}/{}, batch {})",
        s.seed, s.num_samples, s.rank, s.world_size, s.batch_size, o.seed, n, o.rank, o.world_size, o.batch_size));
  if (s.next_batch > num_batches)
    return Status::Invalid(fmt::format("loader state is at batch {} of an epoch of {}", s.next_batch, num_batches));
  return Status::OK();
}

}  // namespace pipeline
}  // namespace shardkit
