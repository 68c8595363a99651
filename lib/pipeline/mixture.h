// pipeline/mixture.h (internal): LoaderOptions::sources opened as one RandomAccess.
//
// The mixture's items (plan.h, Mixture) are the sources' samples, each source repeated
// for each of its passes: item base_i + p * n_i + j is sample j of source i. Get(item)
// reads source i's sample j; its errors name the source (its index and address).
// Threading: as the sources' RandomAccess (Get and Prefetch from any thread).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "pipeline/engine.h"
#include "pipeline/plan.h"
#include "shardkit/dataset.h"
#include "shardkit/loader.h"

namespace shardkit::pipeline {

// Samples per epoch of each source (LoaderOptions::sources' rule): `choose`, or
// repeat * size rounded to nearest (halves to even), or the total size of the weighted
// sources with a weight > 0 shared by weight (largest remainders, ties to the lower
// index). kInvalidArgument naming the source on a bad spec.
Result<std::vector<uint64_t>> MixtureCounts(const std::vector<MixSourceSpec>& specs,
                                            const std::vector<uint64_t>& sizes);

struct OpenedMixture {
  std::shared_ptr<RandomAccess> data;    // the items; owns the sources' datasets
  std::shared_ptr<const Mixture> mix;
  std::vector<int64_t> label_offsets;    // per source
  SourceFacts facts;                     // the strictest of the sources' (channel order)
};
// Opens every source (o.open), checks that each has random access and samples, and
// computes the counts. Errors name the source.
Result<OpenedMixture> OpenMixture(const LoaderOptions& o);

// The shape of a plan over one dataset of n samples, or over a mixture.
PlanShape ShapeOf(uint64_t n, const Mixture* mix, bool streaming);

// What both loaders (the CPU loader, the GPU decode path) do with a mixture; `mix` null
// for one dataset of n samples.
// Epoch e's order over the mixture's items, or over the n samples.
EpochOrder OrderOf(const std::shared_ptr<const Mixture>& mix, uint64_t n, const LoaderOptions& o, uint64_t epoch);
// A row's label in the mixture's label space: its source's label_offset added (an
// unlabelled row's -1 stays).
int64_t MixtureLabel(const Mixture* mix, const std::vector<int64_t>& label_offsets, uint64_t item, int64_t label);
// Each row's source (Batch::sources()); empty for one dataset.
std::vector<uint32_t> MixtureSources(const Mixture* mix, const std::vector<uint64_t>& items);

}  // namespace shardkit::pipeline
