#include "pipeline/plan.h"

#include "shardkit/loader.h"

#include <algorithm>
#include <cmath>

namespace shardkit::pipeline {

uint64_t Stream::UniformInt(uint64_t n) {
  // Lemire: m = x * n (128 bit); accept unless the low half falls in the biased zone.
  uint64_t x = Next();
  __uint128_t m = __uint128_t(x) * n;
  uint64_t l = uint64_t(m);
  if (l < n) {
    uint64_t t = (0 - n) % n;
    while (l < t) {
      x = Next();
      m = __uint128_t(x) * n;
      l = uint64_t(m);
    }
  }
  return uint64_t(m >> 64);
}

namespace {
// 0..n-1, shuffled by Fisher-Yates with draws from Stream(seed, stream) when `shuffle`.
std::vector<uint64_t> Shuffled(uint64_t n, uint64_t seed, uint64_t stream, bool shuffle) {
  std::vector<uint64_t> p(n);
  for (uint64_t i = 0; i < n; ++i) p[i] = i;
  if (!shuffle || n < 2) return p;
  Stream s(seed, stream);
  for (uint64_t i = n - 1; i > 0; --i) std::swap(p[i], p[s.UniformInt(i + 1)]);
  return p;
}
}  // namespace

Bijection::Bijection(uint64_t n, uint64_t seed, uint64_t stream, bool shuffle) : n_(n), identity_(!shuffle || n < 2) {
  if (identity_) return;
  unsigned bits = 64 - unsigned(__builtin_clzll(n - 1));  // to write n - 1
  bits += bits & 1;
  half_ = bits / 2;
  mask_ = half_ >= 64 ? ~0ull : (1ull << half_) - 1;
  Stream s(seed, stream);
  for (auto& k : keys_) k = s.Next();
}

uint64_t Bijection::Round(uint64_t x) const {
  uint64_t l = x >> half_, r = x & mask_;
  for (uint64_t k : keys_) {
    uint64_t t = l ^ (Mix64(k ^ r) & mask_);
    l = r;
    r = t;
  }
  return (l << half_) | r;
}

uint64_t Bijection::operator()(uint64_t i) const {
  if (identity_) return i;
  uint64_t x = Round(i);
  while (x >= n_) x = Round(x);  // cycle walking: stays in i's cycle, which holds values < n
  return x;
}

std::vector<uint64_t> EpochPermutation(uint64_t n, uint64_t seed, uint64_t epoch, bool shuffle) {
  Bijection b(n, seed, PermutationStream(epoch), shuffle);
  std::vector<uint64_t> p(n);
  for (uint64_t i = 0; i < n; ++i) p[i] = b(i);
  return p;
}

Partition PartitionEpoch(uint64_t n, uint32_t world, uint64_t batch_size, bool drop_last) {
  Partition r;
  if (world == 0 || batch_size == 0) return r;
  if (drop_last) {
    r.per_rank = n / world;
    r.num_batches = r.per_rank / batch_size;
    r.per_rank = r.num_batches * batch_size;
    r.dropped = n - r.per_rank * world;
  } else {
    r.per_rank = (n + world - 1) / world;
    r.num_batches = (r.per_rank + batch_size - 1) / batch_size;
    r.padded = r.per_rank * world - n;
  }
  return r;
}

std::vector<uint64_t> RankIndices(const std::vector<uint64_t>& perm, uint32_t rank, uint32_t world,
                                  uint64_t batch_size, bool drop_last) {
  Partition part = PartitionEpoch(perm.size(), world, batch_size, drop_last);
  std::vector<uint64_t> out;
  if (perm.empty()) return out;
  out.reserve(part.per_rank);
  for (uint64_t k = 0; k < part.per_rank; ++k) {
    uint64_t pos = uint64_t(rank) + k * world;  // position in the padded permutation
    out.push_back(perm[pos % perm.size()]);     // pad: wrap around to the first samples
  }
  return out;
}

Mixture::Mixture(std::vector<MixSource> sources) : src_(std::move(sources)) {
  for (auto& s : src_) {
    s.passes = s.size == 0 ? 0 : (s.count + s.size - 1) / s.size;
    s.base = items_;
    items_ += s.size * s.passes;
    total_ += s.count;
  }
}

uint64_t Mixture::Position(size_t i, uint64_t k) const {
  // Draws l of source j before draw k of source i: (2l + 1) / m_j < (2k + 1) / m_i, or equal
  // with j < i. With A / B = (2k + 1) m_j / m_i: l < (A/B - 1) / 2, i.e. floor(ceil(A/B) / 2)
  // of them; with ties, floor((floor(A/B) + 1) / 2).
  const uint64_t mi = src_[i].count;
  uint64_t pos = k;
  for (size_t j = 0; j < src_.size(); ++j) {
    const uint64_t mj = src_[j].count;
    if (j == i || mj == 0) continue;
    const __uint128_t A = __uint128_t(2 * k + 1) * mj;
    const __uint128_t q = A / mi;
    const __uint128_t c = j < i ? (q + 1) / 2 : (q + (A % mi != 0)) / 2;
    pos += uint64_t(std::min<__uint128_t>(c, mj));
  }
  return pos;
}

std::pair<size_t, uint64_t> Mixture::At(uint64_t t) const {
  for (size_t i = 0; i < src_.size(); ++i) {
    const uint64_t m = src_[i].count;
    if (m == 0) continue;
    uint64_t lo = 0, hi = m;  // the first k with Position(i, k) >= t
    while (lo < hi) {
      const uint64_t mid = lo + (hi - lo) / 2;
      if (Position(i, mid) < t) lo = mid + 1;
      else hi = mid;
    }
    if (lo < m && Position(i, lo) == t) return {i, lo};
  }
  return {src_.size(), 0};  // t >= epoch_size(): not reached by the loader
}

std::pair<size_t, uint64_t> Mixture::SourceOf(uint64_t item) const {
  size_t i = 0;
  while (i + 1 < src_.size() && item >= src_[i + 1].base) ++i;
  while (i < src_.size() && src_[i].size == 0) ++i;
  if (i >= src_.size()) return {src_.size(), 0};
  return {i, (item - src_[i].base) % src_[i].size};
}

EpochOrder::EpochOrder(uint64_t n, uint64_t seed, uint64_t epoch, bool shuffle)
    : single_(n, seed, PermutationStream(epoch), shuffle), seed_(seed), epoch_(epoch), shuffle_(shuffle) {}

EpochOrder::EpochOrder(std::shared_ptr<const Mixture> mix, uint64_t seed, uint64_t epoch, bool shuffle)
    : mix_(std::move(mix)), seed_(seed), epoch_(epoch), shuffle_(shuffle) {}

uint64_t EpochOrder::operator()(uint64_t t) const {
  if (!mix_) return single_(t);
  const auto [i, k] = mix_->At(t);
  const MixSource& s = mix_->sources()[i];
  const uint64_t pass = k / s.size;
  const Bijection b(s.size, seed_, SourceStream(epoch_, i, pass), shuffle_);
  return s.base + pass * s.size + b(k % s.size);
}

RankOrder::RankOrder(uint64_t n, const LoaderOptions& o, uint64_t epoch)
    : RankOrder(EpochOrder(n, o.seed, epoch, o.shuffle), 0, o) {}

RankOrder::RankOrder(EpochOrder order, uint64_t start, const LoaderOptions& o)
    : order_(std::move(order)), rank_(uint64_t(o.rank)), world_(uint64_t(o.world_size)), batch_(o.batch_size) {
  const uint64_t e = order_.size();
  start_ = std::min(start, e);
  const uint64_t left = e - start_;
  left_ = left == 0 ? 1 : left;
  if (left > 0) part_ = PartitionEpoch(left, uint32_t(o.world_size), o.batch_size, o.drop_last);
}

uint64_t PositionAfter(uint64_t start, uint64_t epoch_size, uint64_t batches, uint64_t batch, uint64_t world) {
  start = std::min(start, epoch_size);
  const __uint128_t done = __uint128_t(batches) * batch * world;
  return start + uint64_t(std::min<__uint128_t>(done, epoch_size - start));
}

uint64_t RankOrder::PositionAfter(uint64_t batches) const {
  return pipeline::PositionAfter(start_, order_.size(), batches, batch_, world_);
}

std::vector<uint64_t> LoaderEpochOrder(uint64_t n, const LoaderOptions& o, uint64_t epoch) {
  // RankIndices(EpochPermutation(...)) without the permutation: this rank's positions only.
  RankOrder r(n, o, epoch);
  std::vector<uint64_t> out;
  out.reserve(r.size());
  for (uint64_t k = 0; k < r.size(); ++k) out.push_back(r[k]);
  return out;
}

std::vector<uint64_t> ShardOrder(uint64_t num_shards, uint64_t seed, uint64_t epoch, bool shuffle) {
  return Shuffled(num_shards, seed, ShardStream(epoch), shuffle);
}

std::vector<Segment> RankSegments(const std::vector<uint64_t>& shard_samples, const std::vector<uint64_t>& order,
                                  uint32_t rank, uint32_t world, uint64_t batch_size, bool drop_last) {
  std::vector<Segment> out;
  uint64_t n = 0;
  for (uint64_t c : shard_samples) n += c;
  if (n == 0 || world == 0 || rank >= world) return out;
  Partition part = PartitionEpoch(n, world, batch_size, drop_last);
  // start[k]: position in S of the first sample of order[k].
  std::vector<uint64_t> start(order.size() + 1, 0);
  for (size_t k = 0; k < order.size(); ++k) start[k + 1] = start[k] + shard_samples[order[k]];
  uint64_t pos = uint64_t(rank) * part.per_rank;
  uint64_t left = part.per_rank;
  while (left > 0) {
    uint64_t p = pos % n;
    // The shard (in order) holding position p: the last k with start[k] <= p and a
    // non-empty shard.
    size_t k = size_t(std::upper_bound(start.begin(), start.end(), p) - start.begin()) - 1;
    uint64_t shard = order[k];
    uint64_t begin = p - start[k];
    uint64_t take = std::min(left, shard_samples[shard] - begin);
    if (!out.empty() && out.back().shard == shard && out.back().end == begin) {
      out.back().end += take;
    } else {
      out.push_back(Segment{shard, begin, begin + take});
    }
    pos += take;
    left -= take;
  }
  return out;
}

uint64_t BufferPick(uint64_t seed, uint64_t epoch, uint64_t rank, uint64_t t, uint64_t size) {
  if (size <= 1) return 0;
  Stream s(seed, BufferStream(epoch, rank) ^ Mix64(t));
  return s.UniformInt(size);
}

Augment TrainAugment(uint64_t seed, uint64_t epoch, uint64_t index, int width, int height,
                     const RrcParams& p) {
  Stream s(seed, SampleStream(epoch, index));
  Augment a;
  const double area = double(width) * height;
  const double log_lo = std::log(p.ratio_min), log_hi = std::log(p.ratio_max);
  bool found = false;
  for (int attempt = 0; attempt < 10 && !found; ++attempt) {
    double target = area * (p.scale_min + (p.scale_max - p.scale_min) * s.UniformDouble());
    double ratio = std::exp(log_lo + (log_hi - log_lo) * s.UniformDouble());
    long w = std::lround(std::sqrt(target * ratio));
    long h = std::lround(std::sqrt(target / ratio));
    if (w > 0 && h > 0 && w <= width && h <= height) {
      long y = long(s.UniformInt(uint64_t(height - h + 1)));
      long x = long(s.UniformInt(uint64_t(width - w + 1)));
      a.box = {double(x), double(y), double(w), double(h)};
      found = true;
    }
  }
  if (!found) {  // torchvision's fallback: the whole image, clamped to the ratio range
    double in_ratio = double(width) / height;
    long w = width, h = height;
    if (in_ratio < p.ratio_min) {
      h = std::lround(w / p.ratio_min);
    } else if (in_ratio > p.ratio_max) {
      w = std::lround(h * p.ratio_max);
    }
    w = std::clamp<long>(w, 1, width);
    h = std::clamp<long>(h, 1, height);
    a.box = {double((width - w) / 2), double((height - h) / 2), double(w), double(h)};
  }
  // The flip draw always comes after the crop draws' fixed budget so that it is
  // independent of how many attempts the crop took.
  Stream f(seed, SampleStream(epoch, index) ^ 0xf11bf11bull);
  a.flip = f.UniformDouble() < p.flip_p;
  return a;
}

Augment EvalAugment(int width, int height, int resize, int out_w, int out_h) {
  Augment a;
  // torchvision Resize(int): shorter side -> resize, longer side int(resize * long / short).
  double rw, rh;
  if (width <= height) {
    rw = resize;
    rh = std::floor(double(resize) * height / width);
  } else {
    rh = resize;
    rw = std::floor(double(resize) * width / height);
  }
  const double sx = width / rw, sy = height / rh;  // source pixels per resized pixel
  // CenterCrop: top = round((rh - out_h) / 2), left = round((rw - out_w) / 2).
  double left = std::nearbyint((rw - out_w) / 2.0), top = std::nearbyint((rh - out_h) / 2.0);  // Python round: half to even
  double cw = std::min<double>(out_w, rw), ch = std::min<double>(out_h, rh);
  left = std::max(0.0, left);
  top = std::max(0.0, top);
  a.box = {left * sx, top * sy, cw * sx, ch * sy};
  return a;
}

}  // namespace shardkit::pipeline
