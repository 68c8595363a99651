// Mixtures of datasets and elastic resume (issue 42): the plan (pipeline/plan.h, Mixture
// and EpochOrder), the counts rule (pipeline/mixture.h), and the loader across world sizes.
#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <functional>
#include <set>

#include "loader_support.h"
#include "pipeline/mixture.h"
#include "pipeline/plan.h"
#include "shardkit/convert.h"
#include "shardkit/loader.h"
#include "support.h"

using namespace shardkit;
using pipeline::EpochOrder;
using pipeline::Mixture;
using pipeline::MixSource;
using sk_test::MakeImageFolder;
using sk_test::TempDir;


namespace {

std::shared_ptr<const Mixture> MakeMix(const std::vector<std::pair<uint64_t, uint64_t>>& size_count) {
  std::vector<MixSource> v;
  for (auto [n, m] : size_count) v.push_back(MixSource{.size = n, .count = m});
  return std::make_shared<const Mixture>(std::move(v));
}

LoaderOptions Small(int rank, int world, uint32_t batch) {
  LoaderOptions o;
  o.batch_size = batch;
  o.output_width = 16;
  o.output_height = 16;
  o.rank = rank;
  o.world_size = world;
  o.threads = 2;
  o.prefetch = 2;
  o.seed = 42;
  o.dtype = DType::kUint8;
  o.layout = Layout::kNHWC;
  return o;
}

std::unique_ptr<Loader> Must(Result<std::unique_ptr<Loader>> r) {
  INFO(r.status().ToString());
  REQUIRE(r.ok());
  return std::move(r).value();
}

// A row as delivered: which source, which sample.
using Row = std::pair<uint32_t, std::string>;

// Every rank of a world of `world` (batch `batch`) restores `state` (nullptr: epoch e
// from its start), takes `batches` batches (or the rest of the epoch when < 0) and adds
// its rows; returns rank 0's state after them.
std::string RunWorld(const std::function<std::unique_ptr<Loader>(const LoaderOptions&)>& make, int world,
                     uint32_t batch, const std::string* state, uint64_t epoch, int batches, std::vector<Row>* rows) {
  std::string out;
  for (int r = 0; r < world; ++r) {
    auto l = make(Small(r, world, batch));
    if (state) {
      auto st = LoaderState::FromJson(*state);
      REQUIRE(st.ok());
      Status rs = l->restore(*st);
      INFO(rs.ToString());
      REQUIRE(rs.ok());
    } else {
      l->set_epoch(epoch);
    }
    for (int b = 0; batches < 0 || b < batches; ++b) {
      auto nb = l->Next();
      INFO(nb.status().ToString());
      REQUIRE(nb.ok());
      if (nb->end_of_epoch()) break;
      for (size_t i = 0; i < nb->size(); ++i)
        rows->emplace_back(nb->sources().empty() ? 0u : nb->sources()[i], nb->keys()[i]);
    }
    if (r == 0) out = l->save_state().ToJson();
  }
  return out;
}

}  // namespace

TEST_CASE("mixture plan: positions are a bijection with exact counts per source", "[elastic][mixture]") {
  for (const auto& spec : std::vector<std::vector<std::pair<uint64_t, uint64_t>>>{
           {{100, 70}, {37, 20}, {5, 10}}, {{10, 10}}, {{7, 3}, {7, 3}, {7, 3}, {1, 1}}, {{50, 0}, {9, 12}},
           {{1000, 999}, {1000, 1}}}) {
    auto mix = MakeMix(spec);
    std::vector<uint64_t> seen(mix->epoch_size(), 0);
    for (size_t i = 0; i < spec.size(); ++i)
      for (uint64_t k = 0; k < spec[i].second; ++k) {
        const uint64_t p = mix->Position(i, k);
        REQUIRE(p < mix->epoch_size());
        ++seen[p];
        CHECK(mix->At(p) == std::make_pair(i, k));
      }
    for (uint64_t c : seen) REQUIRE(c == 1);
  }
}

TEST_CASE("mixture plan: any window holds each source's share within 1 + S * share", "[elastic][mixture]") {
  // Over any window of 100 global batches (here 100 x 8 positions) and of every length.
  auto mix = MakeMix({{700, 700}, {300, 200}, {40, 100}});
  const uint64_t M = mix->epoch_size();
  const size_t S = mix->sources().size();
  std::vector<size_t> src(M);
  for (uint64_t t = 0; t < M; ++t) src[t] = mix->At(t).first;
  double worst = 0;
  for (uint64_t L : std::vector<uint64_t>{1, 7, 100, 800, M / 2}) {
    for (uint64_t a = 0; a + L <= M; a += (L > 100 ? 3 : 1)) {
      std::vector<uint64_t> c(S, 0);
      for (uint64_t t = a; t < a + L; ++t) ++c[src[t]];
      for (size_t i = 0; i < S; ++i) {
        const double share = double(mix->sources()[i].count) / double(M);
        const double dev = std::abs(double(c[i]) - double(L) * share);
        worst = std::max(worst, dev);
        INFO("window [" << a << ", " << a + L << ") source " << i);
        REQUIRE(dev <= 1.0 + double(S) * share + 1e-9);
      }
    }
  }
  INFO("worst deviation " << worst);
  CHECK(worst < 2.0);
}

TEST_CASE("mixture counts: weights share the weighted sources' size, repeat and choose are exact",
          "[elastic][mixture]") {
  auto spec = [](double w, double repeat = 0, uint64_t choose = 0) {
    MixSourceSpec s;
    s.address = "x";
    s.weight = w;
    s.repeat = repeat;
    s.choose = choose;
    return s;
  };
  auto m = pipeline::MixtureCounts({spec(0.7), spec(0.2), spec(0.1)}, {100, 100, 100});
  REQUIRE(m.ok());
  CHECK(*m == std::vector<uint64_t>{210, 60, 30});
  // Largest remainders: the shares add up to the weighted total exactly.
  m = pipeline::MixtureCounts({spec(1), spec(1), spec(1)}, {10, 2, 1});
  REQUIRE(m.ok());
  CHECK(*m == std::vector<uint64_t>{5, 4, 4});  // 13 / 3 each: the one left to the lowest index
  m = pipeline::MixtureCounts({spec(1, 2.5), spec(5, 0, 7), spec(1)}, {10, 3, 20});
  REQUIRE(m.ok());
  CHECK(*m == std::vector<uint64_t>{25, 7, 20});
  // A weight of 0 gives nothing and adds nothing to the shared total.
  m = pipeline::MixtureCounts({spec(3), spec(0), spec(1)}, {12, 10, 8});
  REQUIRE(m.ok());
  CHECK(*m == std::vector<uint64_t>{15, 0, 5});
  CHECK(pipeline::MixtureCounts({spec(-1)}, {5}).status().code() == Code::kInvalidArgument);
  CHECK(pipeline::MixtureCounts({spec(1, 2, 3)}, {5}).status().code() == Code::kInvalidArgument);
  CHECK(pipeline::MixtureCounts({spec(0)}, {5}).status().code() == Code::kInvalidArgument);
  Status st = pipeline::MixtureCounts({spec(1), spec(1)}, {10, 0}).status();
  CHECK(st.code() == Code::kInvalidArgument);
  CHECK_THAT(st.message(), Catch::Contains("mixture source 1"));
}

TEST_CASE("mixture order: per epoch exact counts, fresh permutations per pass and epoch", "[elastic][mixture]") {
  // Source 0 repeated 2.5 times, source 1 a chosen 4 of 9, source 2 once.
  auto mix = MakeMix({{10, 25}, {9, 4}, {6, 6}});
  std::vector<std::vector<uint64_t>> orders;
  for (uint64_t e = 0; e < 3; ++e) {
    EpochOrder ord(mix, 5, e, true);
    REQUIRE(ord.size() == 35);
    std::map<std::pair<size_t, uint64_t>, int> uses;
    std::vector<uint64_t> items;
    std::set<uint64_t> distinct;
    for (uint64_t t = 0; t < ord.size(); ++t) {
      const uint64_t item = ord(t);
      items.push_back(item);
      distinct.insert(item);
      REQUIRE(item < mix->items());
      ++uses[mix->SourceOf(item)];
    }
    CHECK(distinct.size() == items.size());  // items differ between passes
    std::vector<int> per(3, 0);
    for (auto& [k, c] : uses) {
      per[k.first] += c;
      if (k.first == 0) CHECK((c == 2 || c == 3));  // 2.5 passes: each sample 2 or 3 times
      else CHECK(c == 1);
    }
    CHECK(per == std::vector<int>{25, 4, 6});
    orders.push_back(items);
    EpochOrder again(mix, 5, e, true);
    for (uint64_t t = 0; t < ord.size(); ++t) REQUIRE(again(t) == items[t]);
  }
  CHECK(orders[0] != orders[1]);
  CHECK(orders[1] != orders[2]);
  // One source without repeat or choose is the single dataset's order.
  auto one = MakeMix({{57, 57}});
  EpochOrder a(one, 3, 4, true), b(57, 3, 4, true);
  for (uint64_t t = 0; t < 57; ++t) REQUIRE(a(t) == b(t));
}

TEST_CASE("rank orders from a position: the positions left, once across the ranks", "[elastic]") {
  // 4 ranks, batch 5, 3 batches each: positions [0, 60) consumed; then 3 ranks from 60.
  const uint64_t n = 131;
  EpochOrder ord(n, 9, 2, true);
  std::vector<int> count(n, 0);
  for (int r = 0; r < 4; ++r) {
    pipeline::RankOrder ro(ord, 0, Small(r, 4, 5));
    CHECK(ro.PositionAfter(3) == 60);
    for (uint64_t k = 0; k < 15; ++k) ++count[ro[k]];
  }
  for (int r = 0; r < 3; ++r) {
    pipeline::RankOrder ro(ord, 60, Small(r, 3, 5));
    CHECK(ro.size() == 24);  // ceil(71 / 3): one position padded
    CHECK(ro.num_batches() == 5);
    for (uint64_t k = 0; k < ro.size(); ++k) ++count[ro[k]];
  }
  int twice = 0;
  for (uint64_t i = 0; i < n; ++i) {
    REQUIRE(count[i] >= 1);
    twice += count[i] == 2;
  }
  CHECK(twice == 1);  // the pad repeats the first position left (ord(60))
  CHECK(count[ord(60)] == 2);
}

TEST_CASE("elastic resume: 4 ranks, then 3, then 6 deliver every sample of the epoch once", "[elastic]") {
  TempDir t;
  REQUIRE(MakeImageFolder(t / "imgs", 4, 26) == 104);
  REQUIRE(Convert(t / "imgs", "wds:" + (t / "w/t-%06d.tar")).ok());
  const std::string addr = t / "w/t.manifest.json";
  auto make = [&](const LoaderOptions& o) { return Must(Loader::Create(addr, o)); };
  // 4 ranks x 2 batches x 4 = 32 consumed; 3 ranks x 2 x 4 = 24 more (56); 6 ranks take
  // the last 48 with batch 2 (the global batch of 12 kept): 8 each.
  std::vector<Row> rows;
  const std::string s4 = RunWorld(make, 4, 4, nullptr, 1, 2, &rows);
  auto st4 = LoaderState::FromJson(s4);
  REQUIRE(st4.ok());
  CHECK(st4->position == 32);
  CHECK(st4->version == 2);
  const std::string s3 = RunWorld(make, 3, 4, &s4, 1, 2, &rows);
  CHECK(LoaderState::FromJson(s3)->position == 56);
  RunWorld(make, 6, 2, &s3, 1, -1, &rows);
  std::multiset<std::string> keys;
  for (auto& r : rows) keys.insert(r.second);
  CHECK(keys.size() == 104);
  CHECK(std::set<std::string>(keys.begin(), keys.end()).size() == 104);
  // The same global order as one uninterrupted rank: merged by position, the rows match.
  std::vector<Row> one;
  RunWorld(make, 1, 8, nullptr, 1, -1, &one);
  REQUIRE(one.size() == 104);
  std::vector<std::string> first32;  // positions [0, 32): rank r's k-th row is position r + 4k
  for (size_t p = 0; p < 32; ++p) first32.push_back(rows[(p % 4) * 8 + p / 4].second);
  for (size_t p = 0; p < 32; ++p) CHECK(first32[p] == one[p].second);
  // A state of another seed is refused naming it; a version-1 state on another world size too.
  auto bad = LoaderState::FromJson(s4).value();
  bad.seed = 43;
  auto l = make(Small(0, 3, 4));
  Status st = l->restore(bad);
  CHECK(st.code() == Code::kInvalidArgument);
  CHECK_THAT(st.message(), Catch::Contains("seed 43"));
  auto v1 = LoaderState::FromJson(s4).value();
  v1.version = 1;
  st = l->restore(v1);
  CHECK(st.code() == Code::kInvalidArgument);
  CHECK_THAT(st.message(), Catch::Contains("version-1"));
}

TEST_CASE("elastic resume of a 3-source mixture of tar shards, LMDB and MDS", "[elastic][mixture]") {
  TempDir t;
  const std::vector<std::string> parts = sk_test::MakeMixtureParts(t, {{3, 14}, {2, 10}, {2, 5}});  // 42, 20, 10
  // Weights 0.5 / 0.25 (of 62 samples: 31 and 15, plus remainder rules), c chosen 14 times
  // (1.4 passes).
  std::vector<MixSourceSpec> src(3);
  src[0] = {.address = parts[0], .weight = 0.5};
  src[1] = {.address = parts[1], .weight = 0.25, .label_offset = 100};
  src[2] = {.address = parts[2], .choose = 14, .label_offset = 200};
  auto make = [&](const LoaderOptions& base) {
    LoaderOptions o = base;
    o.sources = src;
    return Must(Loader::Create(o));
  };
  auto probe = make(Small(0, 1, 4));
  const auto shares = probe->mixture();
  REQUIRE(shares.size() == 3);
  CHECK(shares[0] == std::make_pair<uint64_t, uint64_t>(42, 41));
  CHECK(shares[1] == std::make_pair<uint64_t, uint64_t>(20, 21));
  CHECK(shares[2] == std::make_pair<uint64_t, uint64_t>(10, 14));
  CHECK(probe->epoch_size() == 76);
  // Labels: each source's own plus its offset; rows name their source; fields ride along
  // (each row's `cls` field is its source's own label, before the offset).
  {
    LoaderOptions fo = Small(0, 1, 4);
    fo.sources = src;
    fo.fields = {"cls"};
    auto lf = Must(Loader::Create(fo));
    lf->set_epoch(0);
    size_t rows_seen = 0;
    for (;;) {
      auto b = lf->Next();
      REQUIRE(b.ok());
      if (b->end_of_epoch()) break;
      REQUIRE(b->num_fields() == 1);
      for (size_t i = 0; i < b->size(); ++i) {
        const auto& f = b->field(0)[i];
        REQUIRE(f.has_value());
        const int64_t own = std::stoll(std::string(f->view()));
        CHECK(b->labels()[i] == own + (b->sources()[i] == 0 ? 0 : b->sources()[i] == 1 ? 100 : 200));
        ++rows_seen;
      }
    }
    CHECK(rows_seen == 76);
  }
  probe->set_epoch(0);
  std::map<uint32_t, int> per_source;
  for (;;) {
    auto b = probe->Next();
    REQUIRE(b.ok());
    if (b->end_of_epoch()) break;
    REQUIRE(b->sources().size() == b->size());
    for (size_t i = 0; i < b->size(); ++i) {
      const uint32_t s = b->sources()[i];
      ++per_source[s];
      const int64_t lab = b->labels()[i];
      if (s == 0) CHECK((lab >= 0 && lab < 3));
      if (s == 1) CHECK((lab >= 100 && lab < 102));
      if (s == 2) CHECK((lab >= 200 && lab < 202));
    }
  }
  CHECK(per_source == std::map<uint32_t, int>{{0, 41}, {1, 21}, {2, 14}});
  // 4 ranks x 2 batches x 4 = 32; then 3 ranks (44 left, 15 each: one padded) to the end.
  std::vector<Row> rows;
  const std::string s4 = RunWorld(make, 4, 4, nullptr, 2, 2, &rows);
  RunWorld(make, 3, 4, &s4, 2, -1, &rows);
  REQUIRE(rows.size() == 77);
  std::multiset<Row> got(rows.begin(), rows.end());
  std::vector<Row> whole;
  RunWorld(make, 1, 4, nullptr, 2, -1, &whole);
  std::multiset<Row> want(whole.begin(), whole.end());
  // The epoch's multiset plus the one padded row (the first position left: 32).
  REQUIRE(got.size() == want.size() + 1);
  for (const Row& r : want) REQUIRE(got.count(r) >= want.count(r));
  CHECK(got.count(whole[32]) == want.count(whole[32]) + 1);
  // A mixture's state does not restore into a loader of other sources.
  auto other = src;
  other[2].choose = 15;
  LoaderOptions o = Small(0, 3, 4);
  o.sources = other;
  auto l = Must(Loader::Create(o));
  Status st = l->restore(LoaderState::FromJson(s4).value());
  CHECK(st.code() == Code::kInvalidArgument);
  CHECK_THAT(st.message(), Catch::Contains("14 of 10 samples"));
}

TEST_CASE("a mixture refuses a streamed source and bad specs by name", "[elastic][mixture]") {
  TempDir t;
  REQUIRE(MakeImageFolder(t / "a", 2, 3) == 6);
  REQUIRE(Convert(t / "a", "wds:" + (t / "w/t-%06d.tar")).ok());
  LoaderOptions o = Small(0, 1, 2);
  o.sources = {{.address = "pipe:cat " + (t / "w/t-000000.tar")}};
  auto r = Loader::Create(o);
  REQUIRE_FALSE(r.ok());
  CHECK_THAT(r.status().message(), Catch::Contains("mixture source 0"));
  o.sources = {{.address = t / "w/t.manifest.json"}, {.address = t / "nope.lmdb"}};
  r = Loader::Create(o);
  REQUIRE_FALSE(r.ok());
  CHECK_THAT(r.status().message(), Catch::Contains("mixture source 1"));
  o.sources = {{.address = t / "w/t.manifest.json", .repeat = 2, .choose = 3}};
  r = Loader::Create(o);
  REQUIRE_FALSE(r.ok());
  CHECK_THAT(r.status().message(), Catch::Contains("repeat or choose"));
  o.stream = true;
  o.sources = {{.address = t / "w/t.manifest.json"}};
  CHECK(Loader::Create(o).status().code() == Code::kUnsupported);
  CHECK_FALSE(Loader::Create(t / "w/t.manifest.json", o).ok());
}
