#include "pipeline/mixture.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>

namespace shardkit::pipeline {

Result<std::vector<uint64_t>> MixtureCounts(const std::vector<MixSourceSpec>& specs,
                                            const std::vector<uint64_t>& sizes) {
  const size_t S = specs.size();
  std::vector<uint64_t> m(S, 0);
  long double weight_sum = 0;
  uint64_t weighted_size = 0;
  std::vector<size_t> weighted;
  for (size_t i = 0; i < S; ++i) {
    const MixSourceSpec& s = specs[i];
    const std::string who = fmt::format("mixture source {} ('{}')", i, s.address);
    if (!std::isfinite(s.weight) || s.weight < 0)
      return Status::Invalid(fmt::format("{}: weight {} must be a finite number >= 0", who, s.weight));
    if (!std::isfinite(s.repeat) || s.repeat < 0)
      return Status::Invalid(fmt::format("{}: repeat {} must be a finite number >= 0", who, s.repeat));
    if (s.repeat > 0 && s.choose > 0)
      return Status::Invalid(fmt::format("{}: give repeat or choose, not both", who));
    if (s.label_offset < 0)
      return Status::Invalid(fmt::format("{}: label_offset {} must be >= 0", who, s.label_offset));
    if (s.choose > 0) {
      m[i] = s.choose;
    } else if (s.repeat > 0) {
      const long double r = std::nearbyintl((long double)s.repeat * sizes[i]);
      if (r > 1e18L) return Status::Invalid(fmt::format("{}: repeat {} gives too many samples", who, s.repeat));
      m[i] = uint64_t(r);
    } else {
      weighted.push_back(i);
      weight_sum += s.weight;
      if (s.weight > 0) weighted_size += sizes[i];  // a weight-0 source gives nothing and counts for nothing
    }
  }
  if (!weighted.empty()) {
    if (weight_sum <= 0)
      return Status::Invalid("mixture: the weights of the sources without repeat or choose add up to 0");
    // Shares of weighted_size by weight: floors, then the largest remainders (lower index on ties).
    std::vector<std::pair<long double, size_t>> rest;
    uint64_t given = 0;
    for (size_t i : weighted) {
      const long double q = (long double)weighted_size * specs[i].weight / weight_sum;
      m[i] = uint64_t(std::floor(q));
      given += m[i];
      rest.emplace_back(q - std::floor(q), i);
    }
    std::stable_sort(rest.begin(), rest.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
    for (size_t k = 0; given < weighted_size && k < rest.size(); ++k, ++given) ++m[rest[k].second];
  }
  uint64_t total = 0;
  for (size_t i = 0; i < S; ++i) {
    if (m[i] > 0 && sizes[i] == 0)
      return Status::Invalid(
          fmt::format("mixture source {} ('{}') has no samples but is to give {} per epoch", i, specs[i].address, m[i]));
    total += m[i];
  }
  if (total == 0) return Status::Invalid("mixture: no source gives any sample to an epoch");
  return m;
}

namespace {
class MixtureAccess : public RandomAccess {
 public:
  MixtureAccess(std::vector<std::unique_ptr<Dataset>> ds, std::vector<std::shared_ptr<RandomAccess>> ra,
                std::vector<std::string> addresses, std::shared_ptr<const Mixture> mix)
      : ds_(std::move(ds)), ra_(std::move(ra)), addresses_(std::move(addresses)), mix_(std::move(mix)) {}
  ~MixtureAccess() override {
    ra_.clear();  // each RandomAccess before its dataset
    ds_.clear();
  }
  uint64_t size() const override { return mix_->items(); }
  Status Get(uint64_t item, Sample* out) const override {
    const auto [i, j] = mix_->SourceOf(item);
    if (i >= ra_.size())
      return Status::Invalid(fmt::format("mixture item {} is out of range ({} items)", item, mix_->items()));
    Status st = ra_[i]->Get(j, out);
    if (st.ok()) return st;
    return Status(st.code(), fmt::format("mixture source {} ('{}'): {}", i, addresses_[i], st.message()),
                  st.where());
  }
  void Prefetch(const uint64_t* items, size_t n) const override {
    std::vector<std::vector<uint64_t>> per(ra_.size());
    for (size_t k = 0; k < n; ++k) {
      const auto [i, j] = mix_->SourceOf(items[k]);
      if (i < per.size()) per[i].push_back(j);
    }
    for (size_t i = 0; i < per.size(); ++i)
      if (!per[i].empty()) ra_[i]->Prefetch(per[i].data(), per[i].size());
  }

 private:
  std::vector<std::unique_ptr<Dataset>> ds_;
  std::vector<std::shared_ptr<RandomAccess>> ra_;
  std::vector<std::string> addresses_;
  std::shared_ptr<const Mixture> mix_;
};
}  // namespace

Result<OpenedMixture> OpenMixture(const LoaderOptions& o) {
  if (o.sources.empty()) return Status::Invalid("mixture: no sources");
  std::vector<std::unique_ptr<Dataset>> ds;
  std::vector<std::shared_ptr<RandomAccess>> ra;
  std::vector<std::string> addresses;
  std::vector<uint64_t> sizes;
  OpenedMixture out;
  for (size_t i = 0; i < o.sources.size(); ++i) {
    const MixSourceSpec& s = o.sources[i];
    const std::string who = fmt::format("mixture source {} ('{}')", i, s.address);
    if (s.address.empty()) return Status::Invalid(fmt::format("mixture source {} has no address", i));
    Result<std::unique_ptr<Dataset>> d = Open(s.address, o.open);
    if (!d.ok()) {
      const Status& st = d.status();
      return Status(st.code(), fmt::format("{}: {}", who, st.message()), st.where());
    }
    Result<std::shared_ptr<RandomAccess>> r = (*d)->NewRandomAccess();
    if (!r.ok()) {
      const Status& st = r.status();
      if (st.code() == Code::kUnsupported)
        return Status::Unsupported(fmt::format(
            "{}: a mixture needs random access to every source, and this one is read as a stream ({}); "
            "streamed mixtures are not supported yet",
            who, st.message()));
      return Status(st.code(), fmt::format("{}: {}", who, st.message()), st.where());
    }
    if (!*r) return Status::Invalid(fmt::format("{}: no random access", who));
    const SourceFacts f = FactsOf((*d)->info(), (*r)->size());
    out.facts.arrays_bgr = out.facts.arrays_bgr || f.arrays_bgr;
    if (out.facts.channel_order.empty()) out.facts.channel_order = f.channel_order;
    if (out.facts.channel_option.empty()) out.facts.channel_option = f.channel_option;
    if (out.facts.unknown_order.empty() && !f.unknown_order.empty())
      out.facts.unknown_order = fmt::format("{}: {}", who, f.unknown_order);
    sizes.push_back((*r)->size());
    ra.push_back(std::move(*r));
    ds.push_back(std::move(*d));
    addresses.push_back(s.address);
    out.label_offsets.push_back(s.label_offset);
  }
  SK_ASSIGN_OR_RETURN(std::vector<uint64_t> m, MixtureCounts(o.sources, sizes));
  std::vector<MixSource> src(sizes.size());
  for (size_t i = 0; i < sizes.size(); ++i) {
    src[i].size = sizes[i];
    src[i].count = m[i];
  }
  out.mix = std::make_shared<const Mixture>(std::move(src));
  out.data = std::make_shared<MixtureAccess>(std::move(ds), std::move(ra), std::move(addresses), out.mix);
  return out;
}

PlanShape ShapeOf(uint64_t n, const Mixture* mix, bool streaming) {
  PlanShape s;
  s.n = n;
  s.streaming = streaming;
  s.epoch_size = mix ? mix->epoch_size() : n;
  if (mix)
    for (const auto& src : mix->sources()) s.sources.emplace_back(src.size, src.count);
  return s;
}

EpochOrder OrderOf(const std::shared_ptr<const Mixture>& mix, uint64_t n, const LoaderOptions& o, uint64_t epoch) {
  return mix ? EpochOrder(mix, o.seed, epoch, o.shuffle) : EpochOrder(n, o.seed, epoch, o.shuffle);
}

int64_t MixtureLabel(const Mixture* mix, const std::vector<int64_t>& label_offsets, uint64_t item, int64_t label) {
  return mix && label >= 0 ? label + label_offsets[mix->SourceOf(item).first] : label;
}

std::vector<uint32_t> MixtureSources(const Mixture* mix, const std::vector<uint64_t>& items) {
  std::vector<uint32_t> out;
  if (!mix) return out;
  out.reserve(items.size());
  for (uint64_t item : items) out.push_back(uint32_t(mix->SourceOf(item).first));
  return out;
}

}  // namespace shardkit::pipeline
