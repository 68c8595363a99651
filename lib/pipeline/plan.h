// pipeline/plan.h (internal): the epoch plan and per-sample augmentation randomness.
//
// Everything here is a pure function of its arguments, identical on every machine:
// no std::shuffle, no std::uniform_int_distribution (whose results are
// implementation-defined), no floating point in the permutation.
//
// Random numbers: Rand(seed, stream, counter) is SplitMix64's finalizer applied to a
// combination of the three words (a counter-based generator: the i-th draw of a stream
// does not depend on the draws before it). UniformInt(n) uses Lemire's multiply-shift
// with rejection, drawing counters c, c+1, ... until accepted.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "decode/crop_box.h"

namespace shardkit {
struct LoaderOptions;
}

namespace shardkit::pipeline {

// SplitMix64's output function (Steele, Lea, Flood 2014).
inline uint64_t Mix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// A counter-based stream: draw i is Mix64(Mix64(seed ^ Mix64(stream)) + i * golden).
class Stream {
 public:
  Stream(uint64_t seed, uint64_t stream) : key_(Mix64(seed ^ Mix64(stream ^ 0x5eed5eed5eedull))) {}
  uint64_t Next() { return Mix64(key_ + (counter_++) * 0xd1b54a32d192ed03ull); }
  // Uniform in [0, n), n >= 1 (Lemire 2019, with rejection: exact).
  uint64_t UniformInt(uint64_t n);
  // Uniform in [0, 1) with 53 random bits.
  double UniformDouble() { return double(Next() >> 11) * 0x1.0p-53; }

 private:
  uint64_t key_;
  uint64_t counter_ = 0;
};

// Stream ids, so that the permutation and the augmentations never share draws.
inline uint64_t PermutationStream(uint64_t epoch) { return Mix64(epoch * 2 + 1); }
inline uint64_t SampleStream(uint64_t epoch, uint64_t index) { return Mix64(Mix64(epoch * 2 + 2) ^ index); }

// A keyed bijection of [0, n), evaluated per position in O(1) memory and expected
// O(1) time (no table of n indices): a balanced Feistel network of kRounds rounds
// over the smallest even number of bits 2h with 2^(2h) >= n, whose round r maps
// (L, R) to (R, L ^ (Mix64(key_r ^ R) & (2^h - 1))), the keys being the first draws of
// Stream(seed, stream); cycle walking makes it a permutation of [0, n) (apply it
// again while the value is >= n: fewer than 4 applications on average, as
// 2^(2h) < 4n). The identity when !shuffle or n < 2. Copyable, thread-safe (const).
class Bijection {
 public:
  static constexpr int kRounds = 6;
  Bijection(uint64_t n, uint64_t seed, uint64_t stream, bool shuffle = true);
  uint64_t size() const { return n_; }
  // The value at position i (i < size()).
  uint64_t operator()(uint64_t i) const;

 private:
  uint64_t Round(uint64_t x) const;
  uint64_t n_;
  bool identity_;
  unsigned half_ = 0;
  uint64_t mask_ = 0;
  uint64_t keys_[kRounds] = {};
};

// The global order of an epoch: Bijection(n, seed, PermutationStream(epoch), shuffle),
// written out (O(n) memory; LoaderEpochOrder takes only a rank's share).
std::vector<uint64_t> EpochPermutation(uint64_t n, uint64_t seed, uint64_t epoch, bool shuffle);

// How one rank's share of an epoch is cut.
struct Partition {
  uint64_t per_rank = 0;     // samples this (and every) rank yields
  uint64_t num_batches = 0;  // batches every rank yields
  uint64_t padded = 0;       // samples repeated (pad) in the whole epoch, over all ranks
  uint64_t dropped = 0;      // samples dropped in the whole epoch, over all ranks
};
// drop_last: each rank gets floor(n / world) samples and only full batches.
// otherwise: the epoch is padded by repeating its first samples to a multiple of world;
// each rank gets ceil(n / world) samples; its last batch may be partial (same on all ranks).
Partition PartitionEpoch(uint64_t n, uint32_t world, uint64_t batch_size, bool drop_last);

// The dataset indices of this rank's samples in this epoch, in order: rank r takes
// positions r, r + world, r + 2*world, ... of the (padded) permutation, like PyTorch's
// DistributedSampler.
std::vector<uint64_t> RankIndices(const std::vector<uint64_t>& perm, uint32_t rank, uint32_t world,
                                  uint64_t batch_size, bool drop_last);
// ---- Mixtures (LoaderOptions::sources) ----
//
// Source i holds n_i samples and gives m_i of them to each epoch (MixtureCounts). The
// epoch's M = sum m_i positions interleave the sources by ideal time: draw k of source i
// has time (2k + 1) / (2 m_i), and positions follow time, ties going to the lower source
// index. Per epoch every source gives exactly m_i samples, and any window of L
// consecutive positions holds L * m_i / M of source i within +-(S + 1) (S sources; the
// tests check a tighter bound on their mixes). Draw k of source i is pass p = k / n_i,
// element k mod n_i of Bijection(n_i, seed, SourceStream(epoch, i, p)): a fresh keyed
// permutation per pass, whose first m_i elements are the epoch's when m_i < n_i.
// Source 0's first pass uses PermutationStream(epoch), so a one-source mixture without
// repeat or choose is the single dataset's order.
struct MixSource {
  uint64_t size = 0;    // n_i
  uint64_t count = 0;   // m_i
  uint64_t passes = 0;  // ceil(m_i / n_i)
  uint64_t base = 0;    // the first item of the source: sum over j < i of n_j * passes_j
};
class Mixture {
 public:
  explicit Mixture(std::vector<MixSource> sources);
  const std::vector<MixSource>& sources() const { return src_; }
  uint64_t epoch_size() const { return total_; }   // M
  uint64_t items() const { return items_; }        // sum n_i * passes_i
  // The position of draw k of source i in the epoch.
  uint64_t Position(size_t i, uint64_t k) const;
  // The (source, draw) at position t < M.
  std::pair<size_t, uint64_t> At(uint64_t t) const;
  // The source of an item, and its sample index within the source.
  std::pair<size_t, uint64_t> SourceOf(uint64_t item) const;

 private:
  std::vector<MixSource> src_;
  uint64_t total_ = 0, items_ = 0;
};

inline uint64_t SourceStream(uint64_t epoch, uint64_t source, uint64_t pass) {
  if (source == 0 && pass == 0) return PermutationStream(epoch);
  return Mix64(PermutationStream(epoch) ^ Mix64((source << 40) ^ pass ^ 0x6d1f6d1full));
}

// An epoch's order: position t in [0, size()) -> item. One dataset: Bijection(n, seed,
// PermutationStream(epoch), shuffle), the item being the sample index. A mixture: the
// item of draw k of source i is base_i + p * n_i + (Bijection_{i,p}(k mod n_i)), p the pass
// (items of different passes differ, so that each gets its own crop and flip).
// Copyable; const members are thread-safe.
class EpochOrder {
 public:
  EpochOrder() = default;
  EpochOrder(uint64_t n, uint64_t seed, uint64_t epoch, bool shuffle);
  EpochOrder(std::shared_ptr<const Mixture> mix, uint64_t seed, uint64_t epoch, bool shuffle);
  uint64_t size() const { return mix_ ? mix_->epoch_size() : single_.size(); }
  uint64_t operator()(uint64_t t) const;

 private:
  Bijection single_{0, 0, 0, false};
  std::shared_ptr<const Mixture> mix_;
  uint64_t seed_ = 0, epoch_ = 0;
  bool shuffle_ = true;
};

// The global position of a plan from `start` over an epoch of `epoch_size` positions
// after `batches` batches of every one of `world` ranks: start + min(batches * batch *
// world, epoch_size - start).
uint64_t PositionAfter(uint64_t start, uint64_t epoch_size, uint64_t batches, uint64_t batch, uint64_t world);

// A loader rank's order of epoch e from position `start` on (0, or where an elastic
// resume continues), evaluated per position in O(1) memory: with R = size - start left
// and PartitionEpoch(R, world, batch, drop_last)'s per_rank, element k is the epoch's
// order at position start + (rank + k * world) mod R (the pad wraps to the first
// positions left), for k < per_rank; what LoaderEpochOrder writes out. After b batches of
// every rank, the positions [start, start + min(b * batch * world, R)) are consumed.
// Copyable; const members are thread-safe.
class RankOrder {
 public:
  RankOrder() = default;
  RankOrder(uint64_t n, const LoaderOptions& o, uint64_t epoch);
  RankOrder(EpochOrder order, uint64_t start, const LoaderOptions& o);
  uint64_t size() const { return part_.per_rank; }
  uint64_t num_batches() const { return part_.num_batches; }
  const Partition& partition() const { return part_; }
  uint64_t start() const { return start_; }
  uint64_t epoch_size() const { return order_.size(); }
  // The global position reached after `batches` batches of every rank.
  uint64_t PositionAfter(uint64_t batches) const;
  uint64_t operator[](uint64_t k) const { return order_(start_ + (rank_ + k * world_) % left_); }

 private:
  EpochOrder order_;
  Partition part_;
  uint64_t start_ = 0, left_ = 1, rank_ = 0, world_ = 1, batch_ = 1;
};

// A loader's order of epoch e (o.rank's share, `n` samples): RankIndices of
// EpochPermutation with the loader's seed, shuffle, rank, world, batch size and drop_last,
// computed per position (O(share) time and memory, no whole permutation).
std::vector<uint64_t> LoaderEpochOrder(uint64_t n, const LoaderOptions& o, uint64_t epoch);

// ---- Streamed input (no random access, or LoaderOptions::stream) ----
//
// The epoch is a sequence of shards (their samples in stored order), permuted per epoch;
// rank r of W reads one contiguous range of that sequence, cut at sample granularity
// (shard boundaries need not line up with rank boundaries: a shard may be split between
// two ranks, each reading its part), then passes it through a bounded shuffle buffer.

inline uint64_t ShardStream(uint64_t epoch) { return Mix64(Mix64(epoch * 2 + 1) ^ 0x5a4d5a4d5a4dull); }
inline uint64_t BufferStream(uint64_t epoch, uint64_t rank) {
  return Mix64(Mix64(epoch * 2 + 2) ^ Mix64(rank ^ 0xb0ffe4b0ffe4ull));
}

// The order of the shards in epoch e: Fisher-Yates (i from n-1 down to 1, j =
// UniformInt(i+1); a table of num_shards indices) on stream
// (seed, ShardStream(e)); identity when !shuffle.
std::vector<uint64_t> ShardOrder(uint64_t num_shards, uint64_t seed, uint64_t epoch, bool shuffle);

// Samples [begin, end) of one shard, in stored order.
struct Segment {
  uint64_t shard = 0;
  uint64_t begin = 0, end = 0;
  bool operator==(const Segment& o) const { return shard == o.shard && begin == o.begin && end == o.end; }
};

// The segments rank r reads in an epoch. `shard_samples[i]` is shard i's sample count;
// `order` the shard order (ShardOrder). The epoch's sequence S is the shards' samples
// concatenated in `order` (N samples). With PartitionEpoch(N, world, batch, drop_last)'s
// per_rank = P, rank r takes positions [r*P, (r+1)*P) of S, a position p >= N standing
// for S[p mod N] (the pad repeats the first samples of the epoch, as in the
// random-access plan). Empty segments are left out.
std::vector<Segment> RankSegments(const std::vector<uint64_t>& shard_samples, const std::vector<uint64_t>& order,
                                  uint32_t rank, uint32_t world, uint64_t batch_size, bool drop_last);

// The shuffle buffer's t-th pick (t counts this rank's samples handed out in the epoch):
// uniform in [0, size) from stream (seed, BufferStream(epoch, rank) ^ Mix64(t)), so
// that each pick depends on t only, not on how many draws earlier picks rejected.
uint64_t BufferPick(uint64_t seed, uint64_t epoch, uint64_t rank, uint64_t t, uint64_t size);

// A crop box in source pixel coordinates (may be fractional in eval mode); defined
// beside the decoder that takes it (decode/crop_box.h).
using CropBox = decode::CropBox;

struct Augment {
  CropBox box;
  bool flip = false;
};

struct RrcParams {
  double scale_min = 0.08, scale_max = 1.0;
  double ratio_min = 3.0 / 4.0, ratio_max = 4.0 / 3.0;
  double flip_p = 0.5;
};

// torchvision's RandomResizedCrop.get_params for an image of width x height, plus a
// horizontal flip with probability flip_p, drawn from Stream(seed, SampleStream(epoch,
// index)). Ten attempts at a box inside the image, then the center-crop fallback.
Augment TrainAugment(uint64_t seed, uint64_t epoch, uint64_t index, int width, int height,
                     const RrcParams& p);

// Evaluation: resize the shorter side to `resize` then center crop out_w x out_h, expressed
// as one box in source coordinates (the crop of the resized image mapped back). No flip.
Augment EvalAugment(int width, int height, int resize, int out_w, int out_h);

}  // namespace shardkit::pipeline
