// The batch engine's shared parts (see engine.h).
#include "pipeline/engine.h"
#include "pipeline/plan.h"

#include <cstdlib>
#include <thread>

#include <fmt/format.h>
#include <tbb/info.h>

#include "core/cores.h"
#include "core/pickle.h"
#include "formats/channel_order.h"
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
  if (o.max_pixels == 0) return Status::Invalid("max_pixels must be positive");
  for (float s : o.std)
    if (!(s > 0)) return Status::Invalid("std must be positive");
  for (size_t i = 0; i < o.fields.size(); ++i) {
    const std::string& f = o.fields[i];
    if (f.empty() || f.front() == '.' || std::any_of(f.begin(), f.end(), [](char c) { return c >= 'A' && c <= 'Z'; }))
      return Status::Invalid(fmt::format("fields: '{}' is not a field name (a lowercase extension such as \"txt\")", f));
    if (std::find(o.fields.begin(), o.fields.begin() + ptrdiff_t(i), f) != o.fields.begin() + ptrdiff_t(i))
      return Status::Invalid(fmt::format("fields: '{}' is listed twice", f));
  }
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

int DefaultThreads(const LoaderOptions& o, FeedPath path) {
  const int mask = core::UsableCores();
  int cores = mask;
  // G ranks on one machine that each may use all of it would start G x all-cores threads;
  // a rank pinned by its launcher (taskset, numactl, srun --cpu-bind) keeps its mask.
  if (o.local_world_size > 1 && mask >= int(std::thread::hardware_concurrency())) cores = mask / o.local_world_size;
  // Feeding a GPU: one core is left to the thread that launches the model's kernels
  // (starved of a core, it leaves the GPU idle between kernels: issue 16); the decode
  // path leaves one more to its submitter, which spins in nvJPEG's batched call.
  const int spare = path == FeedPath::kHost ? 0 : path == FeedPath::kGpuCopy ? 1 : 2;
  return std::max(1, cores - spare);
}

Status ResolveOptions(LoaderOptions* o) {
  SK_RETURN_IF_ERROR(CheckOptions(*o, kMaxOutputSide));
  SK_RETURN_IF_ERROR(ResolveRank(o));
  if (o->threads == 0) o->threads = DefaultThreads(*o, FeedPath::kHost);
  return Status::OK();
}

Status ResolveOptions(LoaderOptions* o, const GpuOptions& g) {
  SK_RETURN_IF_ERROR(CheckOptions(*o, kMaxGpuOutputSide));
  SK_RETURN_IF_ERROR(CheckGpuOptions(g));
  SK_RETURN_IF_ERROR(ResolveRank(o));
  if (o->threads == 0)
    o->threads = DefaultThreads(*o, g.decoder == DecoderKind::kCpu ? FeedPath::kGpuCopy : FeedPath::kGpuDecode);
  return Status::OK();
}

double ResolvedHardwareLoad(const GpuOptions& g) {
  return g.hardware_load < 0 ? GpuOptions::kDefaultHardwareLoad : g.hardware_load;
}

Location SourceFacts::At(Location where) const {
  if (where.index < 0 || shard_end.empty()) return where;
  auto it = std::upper_bound(shard_end.begin(), shard_end.end(), uint64_t(where.index));
  if (it == shard_end.end()) return where;
  const size_t k = size_t(it - shard_end.begin());
  where.shard = int64_t(k);
  if (where.file.empty()) where.file = shard_file[k];
  return where;
}

SourceFacts FactsOf(const DatasetInfo& info, uint64_t n) {
  SourceFacts f;
  uint64_t total = 0;
  for (const auto& sh : info.shards) {
    total += sh.samples;
    f.shard_end.push_back(total);
    f.shard_file.push_back(sh.path);
  }
  if (total != n) {  // no (complete) shard table: rows name key and index only
    f.shard_end.clear();
    f.shard_file.clear();
  }
  const formats::ArrayOrder order = formats::ArrayOrderOf(info);
  f.arrays_bgr = order == formats::ArrayOrder::kBgr;
  if (order == formats::ArrayOrder::kUnknown) f.unknown_order = formats::UnknownOrderMessage(info, "the loader");
  if (auto it = info.extra.find("channel_order"); it != info.extra.end()) f.channel_order = it->second;
  f.channel_option = formats::ChannelOption(info);
  return f;
}

const Field* RowImage(const Sample& s, const LoaderOptions& o) {
  if (!o.image_field.empty()) return s.find(o.image_field);
  if (const Field* f = s.image()) return f;
  return s.find("npy");
}

Result<RowHead> ReadRow(const RandomAccess* data, const LoaderOptions& o, uint64_t index, const Sample* given,
                        Sample* scratch, const SourceFacts* facts) {
  if (!given) {
    scratch->clear();
    Status st = data->Get(index, scratch);
    if (!st.ok()) return st.At(Location{.index = int64_t(index)});
  }
  RowHead h;
  h.sample = given ? given : scratch;
  h.where = Location{.key = h.sample->key, .index = int64_t(index)};
  h.image = RowImage(*h.sample, o);
  if (!h.image) {
    return Status::Corrupt(o.image_field.empty() ? std::string("sample has no image field (nor a decoded array 'npy')")
                                                 : fmt::format("sample has no '{}' field", o.image_field),
                           h.where);
  }
  h.label = h.sample->label().value_or(-1);
  if (!o.fields.empty()) {
    h.fields.reserve(o.fields.size());
    for (const std::string& name : o.fields) {
      const Field* f = h.sample->find(name);
      if (f) {
        h.fields.emplace_back(f->data);
      } else if (o.missing_fields == MissingFieldPolicy::kNull) {
        h.fields.emplace_back(std::nullopt);
      } else {
        std::string has;
        for (const auto& x : h.sample->fields) has += (has.empty() ? "" : ", ") + x.ext;
        return Status::Corrupt(fmt::format("sample has no '{}' field (it has: {}); to get None for it instead, "
                                           "set missing_fields to none (LoaderOptions::missing_fields = kNull)",
                                           name, has.empty() ? "nothing" : has),
                               facts ? facts->At(h.where) : h.where);
      }
    }
  }
  return h;
}

Status RowException(const std::exception& ex, uint64_t index) {
  return Status::Internal(fmt::format("exception while decoding: {}", ex.what()), Location{.index = int64_t(index)});
}

Augment ChooseCrop(const LoaderOptions& o, const RrcParams& rrc, uint64_t epoch, uint64_t index, int w, int h) {
  return o.mode == AugmentMode::kTrain ? TrainAugment(o.seed, epoch, index, w, h, rrc)
                                       : EvalAugment(w, h, o.resize_size, o.output_width, o.output_height);
}

decode::Limits DecodeLimits(const LoaderOptions& o) {
  decode::Limits l;
  l.max_pixels = o.max_pixels;
  return l;
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

namespace {

// The "npy" field as the pixels DecodeImage crops: uint8 [H, W], [H, W, 1] or [H, W, 3].
struct ArrayView {
  pickle::NdArray arr;
  int width = 0, height = 0, channels = 0;
};

Result<ArrayView> ViewArray(const Bytes& npy) {
  ArrayView v;
  SK_ASSIGN_OR_RETURN(v.arr, pickle::ParseNpy(npy));
  const auto& a = v.arr;
  auto shape = [&] {
    std::string t;
    for (uint64_t d : a.shape) t += (t.empty() ? "" : ", ") + std::to_string(d);
    return "[" + t + "]";
  };
  if (a.dtype.kind != 'u' || a.dtype.itemsize != 1)
    return Status::Invalid(fmt::format("decoded array of dtype {} {}: the loader takes uint8 images "
                                       "([H, W], [H, W, 1] or [H, W, 3])", a.dtype.descr(), shape()));
  const size_t nd = a.shape.size();
  const uint64_t c = nd == 3 ? a.shape[2] : 1;
  if (nd < 2 || nd > 3 || (c != 1 && c != 3))
    return Status::Invalid(fmt::format("decoded array of shape {}: the loader takes [H, W], [H, W, 1] or [H, W, 3] "
                                       "(RGB) images", shape()));
  if (a.fortran_order)
    return Status::Invalid(fmt::format("decoded array of shape {} is in Fortran order: save it C-contiguous "
                                       "(np.ascontiguousarray)", shape()));
  if (a.shape[0] > uint64_t(INT32_MAX) || a.shape[1] > uint64_t(INT32_MAX))
    return Status::Invalid(fmt::format("decoded array of shape {} is too large", shape()));
  v.height = int(a.shape[0]);
  v.width = int(a.shape[1]);
  v.channels = int(c);
  return v;
}

std::string BgrAdvice(const SourceFacts& f) {
  const std::string& opt = f.channel_option;
  return fmt::format("the source's decoded arrays are BGR ({}); the loader feeds RGB: open it with the source "
                     "option {}=bgr-to-rgb (converted on read), or {}=rgb if they are RGB "
                     "(Python: Loader(..., source_options={{\"{}\": \"bgr-to-rgb\"}}))",
                     f.channel_order, opt, opt, opt);
}

}  // namespace

Status DecodeImage(decode::ImageDecoder& dec, const LoaderOptions& o, const RrcParams& rrc, uint64_t epoch,
                   uint64_t index, const Field& image, const SourceFacts* facts, const Location& where,
                   Augment* aug, decode::Region* out) {
  if (image.ext != "npy")
    return DecodeCrop(dec, o, rrc, epoch, index, image.data.data(), image.data.size(), where, aug, out);
  Result<ArrayView> v = ViewArray(image.data);
  if (!v.ok()) return std::move(v).take_status().At(where);
  if (v->channels == 3 && facts && facts->arrays_bgr) return Status::Invalid(BgrAdvice(*facts), where);
  if (v->channels == 3 && facts && !facts->unknown_order.empty()) return Status::Invalid(facts->unknown_order, where);
  auto choose = [&](const decode::ImageInfo& info) {
    *aug = ChooseCrop(o, rrc, epoch, index, info.width, info.height);
    return aug->box;
  };
  Status st = dec.FromPixels(v->arr.data.data(), v->width, v->height, v->channels, size_t(v->width) * v->channels,
                             false, choose, out);
  if (!st.ok()) return st.At(where);
  return Status::OK();
}

Status CheckArrayColours(const RandomAccess* data, const LoaderOptions& o, const SourceFacts& facts) {
  if ((!facts.arrays_bgr && facts.unknown_order.empty()) || !data || data->size() == 0) return Status::OK();
  Sample s;
  Status st = data->Get(0, &s);
  if (!st.ok()) return Status::OK();  // the row reports it, at its batch
  const Field* img = RowImage(s, o);
  if (!img || img->ext != "npy") return Status::OK();
  Result<ArrayView> v = ViewArray(img->data);
  if (v.ok() && v->channels == 3)
    return Status::Invalid(facts.arrays_bgr ? BgrAdvice(facts) : facts.unknown_order,
                           facts.At(Location{.key = s.key, .index = 0}));
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

LoaderState MakeState(const LoaderOptions& o, const PlanShape& shape, uint64_t epoch, uint64_t next_batch,
                      uint64_t start) {
  LoaderState s = MakeState(o, shape.n, epoch, next_batch);
  s.epoch_size = shape.epoch_size;
  s.start = std::min(start, shape.epoch_size);
  s.position = PositionAfter(s.start, shape.epoch_size, next_batch, o.batch_size, uint64_t(o.world_size));
  s.sources = shape.sources;
  return s;
}

LoaderState Delivery::State(const LoaderOptions& o, uint64_t n) const { return MakeState(o, n, epoch, next); }
LoaderState Delivery::State(const LoaderOptions& o, const PlanShape& shape, uint64_t start) const {
  return MakeState(o, shape, epoch, next, start);
}

namespace {
std::string SourcesText(const std::vector<std::pair<uint64_t, uint64_t>>& v) {
  if (v.empty()) return "one dataset";
  std::string t;
  for (size_t i = 0; i < v.size(); ++i)
    t += fmt::format("{}{} of {} samples", i ? ", " : "", v[i].second, v[i].first);
  return fmt::format("a mixture of {} sources ({} per epoch)", v.size(), t);
}
}  // namespace

Result<ResumeAt> PlanRestore(const LoaderState& s, const LoaderOptions& o, const PlanShape& shape) {
  if (s.seed != o.seed)
    return Status::Invalid(fmt::format("loader state has seed {}; this loader's is {}", s.seed, o.seed));
  if (s.version >= 2 && s.sources != shape.sources)
    return Status::Invalid(fmt::format("loader state is of {}; this loader reads {}", SourcesText(s.sources),
                                       SourcesText(shape.sources)));
  if (s.num_samples != shape.n)
    return Status::Invalid(fmt::format("loader state is of a dataset of {} samples; this loader's has {}",
                                       s.num_samples, shape.n));
  const bool same = s.world_size == o.world_size && s.batch_size == o.batch_size;
  if (s.version < 2 || shape.streaming || s.has_stream) {
    // A per-rank cursor: the same rank, world size and batch size only.
    if (!same || s.rank != o.rank) {
      const char* why = s.version < 2 ? "a version-1 state (written before elastic resume) records a per-rank cursor"
                                      : "a streamed loader's state records a per-rank stream position";
      return Status::Invalid(fmt::format(
          "loader state is of rank {} of {} with batch size {}; this loader is rank {} of {} with batch size {}: "
          "{}, so it resumes only on the same rank, world size and batch size",
          s.rank, s.world_size, s.batch_size, o.rank, o.world_size, o.batch_size, why));
    }
    SK_RETURN_IF_ERROR(CheckRestore(s, o, shape.n,
                                    PartitionEpoch(shape.epoch_size, uint32_t(o.world_size), o.batch_size,
                                                   o.drop_last).num_batches));
    return ResumeAt{0, s.next_batch, false};
  }
  if (s.epoch_size != shape.epoch_size)
    return Status::Invalid(fmt::format("loader state's epochs have {} positions; this loader's have {}",
                                       s.epoch_size, shape.epoch_size));
  if (s.start > s.epoch_size || s.position > s.epoch_size || s.position < s.start)
    return Status::Invalid(fmt::format("loader state's position {} (plan from {}) is outside its epoch of {}",
                                       s.position, s.start, s.epoch_size));
  if (same) {
    const uint64_t nb =
        PartitionEpoch(shape.epoch_size - s.start, uint32_t(o.world_size), o.batch_size, o.drop_last).num_batches;
    if (s.next_batch > nb)
      return Status::Invalid(fmt::format("loader state is at batch {} of an epoch of {}", s.next_batch, nb));
    return ResumeAt{s.start, s.next_batch, false};
  }
  return ResumeAt{s.position, 0, true};
}

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
