// The streaming reader: determinism, partition, resume, errors, shutdown.
#include <catch2/catch.hpp>

#include <chrono>
#include <cstdlib>
#include <set>
#include <thread>

#include <fmt/format.h>

#include "shardkit/loader.h"
#include "shardkit/shardkit.h"
#include "loader_support.h"
#include "support.h"

using namespace shardkit;
using sk_test::JpegKind;
using sk_test::MakeJpeg;
using sk_test::Drain;
using sk_test::OneBatch;
using sk_test::Seen;

namespace {

// An in-memory random-access dataset.
class MemData : public RandomAccess {
 public:
  std::vector<Sample> samples;
  int delay_ms = 0;
  uint64_t size() const override { return samples.size(); }
  Status Get(uint64_t i, Sample* out) const override {
    if (delay_ms) std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    if (i >= samples.size()) return Status::NotFound("no such sample", Location{.index = int64_t(i)});
    *out = samples[i];
    return Status::OK();
  }
  void Add(const std::string& key, const std::string& ext, const std::string& bytes, int64_t label) {
    Sample s;
    s.key = key;
    s.set(ext, Bytes::Copy(bytes));
    s.set_label(label);
    samples.push_back(std::move(s));
  }
};

std::shared_ptr<MemData> MakeData(int n, int w0 = 40, uint32_t seed = 1) {
  auto d = std::make_shared<MemData>();
  for (int i = 0; i < n; ++i)
    d->Add(fmt::format("c{}/img{:04d}", i % 7, i), "jpg",
           MakeJpeg(w0 + (i % 5) * 16, w0 - 8 + (i % 3) * 24, seed * 1000 + uint32_t(i)), i % 7);
  return d;
}

LoaderOptions SmallOpts() {
  LoaderOptions o;
  o.batch_size = 8;
  o.output_width = 32;
  o.output_height = 24;
  o.rank = 0;
  o.world_size = 1;
  o.threads = 2;
  o.seed = 17;
  return o;
}

std::unique_ptr<Loader> MustCreate(std::shared_ptr<RandomAccess> d, const LoaderOptions& o) {
  auto r = Loader::Create(std::move(d), o);
  INFO(r.status().ToString());
  REQUIRE(r.ok());
  return std::move(r).value();
}

}  // namespace

TEST_CASE("same seed and epoch give the same batches across runs and thread counts", "[loader]") {
  auto data = MakeData(45);
  for (DType dt : {DType::kFloat32, DType::kUint8, DType::kBFloat16}) {
    LoaderOptions o = SmallOpts();
    o.dtype = dt;
    o.layout = dt == DType::kUint8 ? Layout::kNHWC : Layout::kNCHW;
    std::vector<Seen> first;
    for (int threads : {1, 2, 4, 3}) {
      o.threads = threads;
      o.prefetch = threads + 1;
      auto l = MustCreate(data, o);
      l->set_epoch(2);
      auto got = Drain(*l);
      REQUIRE(got.size() == 6);  // ceil(45 / 8)
      if (first.empty()) first = got;
      else CHECK(got == first);
    }
    // Every sample exactly once, with its own label.
    std::multiset<uint64_t> all;
    for (auto& b : first)
      for (size_t i = 0; i < b.indices.size(); ++i) {
        all.insert(b.indices[i]);
        CHECK(b.labels[i] == int64_t(b.indices[i] % 7));
        CHECK(b.keys[i] == data->samples[b.indices[i]].key);
      }
    CHECK(all.size() == 45);
    CHECK(std::set<uint64_t>(all.begin(), all.end()).size() == 45);
  }
}

TEST_CASE("different epochs and seeds give different orders, no shuffle keeps dataset order", "[loader]") {
  auto data = MakeData(40);
  LoaderOptions o = SmallOpts();
  auto l = MustCreate(data, o);
  l->set_epoch(0);
  auto e0 = Drain(*l);
  l->set_epoch(1);
  auto e1 = Drain(*l);
  l->set_epoch(0);
  auto e0b = Drain(*l);
  CHECK(e0 == e0b);
  CHECK(e0[0].indices != e1[0].indices);
  o.seed = 18;
  auto l2 = MustCreate(data, o);
  CHECK(Drain(*l2)[0].indices != e0[0].indices);
  o.shuffle = false;
  auto l3 = MustCreate(data, o);
  auto s = Drain(*l3);
  for (size_t b = 0; b < s.size(); ++b)
    for (size_t i = 0; i < s[b].indices.size(); ++i) CHECK(s[b].indices[i] == b * 8 + i);
}

TEST_CASE("ranks of world sizes 1..5 are disjoint, cover the epoch and yield equal batch counts", "[loader]") {
  auto data = MakeData(23, 24);
  for (bool drop_last : {false, true}) {
    for (int world = 1; world <= 5; ++world) {
      std::vector<uint64_t> all;
      std::set<size_t> batch_counts;
      for (int rank = 0; rank < world; ++rank) {
        LoaderOptions o = SmallOpts();
        o.batch_size = 3;
        o.rank = rank;
        o.world_size = world;
        o.drop_last = drop_last;
        auto l = MustCreate(data, o);
        l->set_epoch(5);
        auto got = Drain(*l);
        CHECK(got.size() == l->num_batches());
        batch_counts.insert(got.size());
        for (auto& b : got) all.insert(all.end(), b.indices.begin(), b.indices.end());
      }
      INFO("world " << world << " drop_last " << drop_last);
      CHECK(batch_counts.size() == 1);
      std::set<uint64_t> uniq(all.begin(), all.end());
      if (drop_last) {
        CHECK(uniq.size() == all.size());  // disjoint
        uint64_t per_rank = (23 / world) / 3 * 3;
        CHECK(all.size() == per_rank * world);
      } else {
        CHECK(uniq.size() == 23);  // covers the epoch
        uint64_t per_rank = (23 + world - 1) / world;
        CHECK(all.size() == per_rank * world);  // the surplus is the pad, repeated samples
        CHECK(all.size() - uniq.size() == per_rank * world - 23);
      }
    }
  }
}

TEST_CASE("rank and world size default to RANK / WORLD_SIZE", "[loader]") {
  auto data = MakeData(10, 24);
  LoaderOptions o = SmallOpts();
  o.rank = -1;
  o.world_size = -1;
  ::setenv("RANK", "2", 1);
  ::setenv("WORLD_SIZE", "3", 1);
  auto l = MustCreate(data, o);
  CHECK(l->rank() == 2);
  CHECK(l->world_size() == 3);
  ::setenv("RANK", "3", 1);
  auto bad = Loader::Create(data, o);
  CHECK(bad.status().code() == Code::kInvalidArgument);
  ::setenv("RANK", "x", 1);
  CHECK_THAT(Loader::Create(data, o).status().message(), Catch::Contains("RANK"));
  ::unsetenv("RANK");
  ::unsetenv("WORLD_SIZE");
  auto l1 = MustCreate(data, o);
  CHECK(l1->rank() == 0);
  CHECK(l1->world_size() == 1);
}

TEST_CASE("resume from a saved state equals the uninterrupted run, batch for batch", "[loader]") {
  auto data = MakeData(50);
  LoaderOptions o = SmallOpts();
  o.rank = 1;
  o.world_size = 2;
  auto l = MustCreate(data, o);
  l->set_epoch(3);
  auto full = Drain(*l);
  REQUIRE(full.size() == 4);  // 25 per rank, batch 8
  for (uint64_t k : {0, 1, 3, 4}) {
    auto a = MustCreate(data, o);
    a->set_epoch(3);
    for (uint64_t i = 0; i < k; ++i) REQUIRE(a->Next().ok());
    std::string json = a->save_state().ToJson();
    a.reset();  // "a new process"
    auto st = LoaderState::FromJson(json);
    REQUIRE(st.ok());
    CHECK(st->next_batch == k);
    CHECK(st->epoch == 3);
    auto b = MustCreate(data, o);
    REQUIRE(b->restore(*st).ok());
    auto rest = Drain(*b);
    INFO("resumed at " << k);
    CHECK(rest == std::vector<Seen>(full.begin() + long(k), full.end()));
    // The next epoch after a resume is the same too.
    b->set_epoch(4);
    l->set_epoch(4);
    CHECK(Drain(*b) == Drain(*l));
  }
  // A state from another seed or dataset is refused, naming what differs (another world
  // size is an elastic resume: elastic_test.cc).
  LoaderState s = l->save_state();
  s.seed = o.seed + 1;
  Status other = l->restore(s);
  CHECK(other.code() == Code::kInvalidArgument);
  CHECK_THAT(other.message(), Catch::Contains("seed"));
  s = l->save_state();
  s.num_samples = 51;
  other = l->restore(s);
  CHECK(other.code() == Code::kInvalidArgument);
  CHECK_THAT(other.message(), Catch::Contains("51 samples"));
  // A next batch beyond the epoch is refused (pipeline::CheckRestore, shared with the GPU
  // loader); the end of the epoch itself is a position.
  s = l->save_state();
  s.next_batch = l->num_batches() + 1;
  Status rs = l->restore(s);
  CHECK(rs.code() == Code::kInvalidArgument);
  CHECK_THAT(rs.message(), Catch::Contains("of an epoch of 4"));
  s.next_batch = l->num_batches();
  REQUIRE(l->restore(s).ok());
  auto end = l->Next();
  REQUIRE(end.ok());
  CHECK(end->end_of_epoch());
  CHECK(LoaderState::FromJson("{\"version\":1}").status().code() == Code::kInvalidArgument);
  CHECK(LoaderState::FromJson("nope").status().code() == Code::kInvalidArgument);
}

TEST_CASE("quirky images (CMYK, gray, progressive, PNG named .jpeg) all come out as RGB batches", "[loader]") {
  auto d = std::make_shared<MemData>();
  d->Add("q/cmyk", "jpg", MakeJpeg(80, 60, 1, JpegKind::kCmyk), 0);
  d->Add("q/gray", "jpg", MakeJpeg(80, 60, 2, JpegKind::kGray), 1);
  d->Add("q/prog", "jpg", MakeJpeg(80, 60, 3, JpegKind::kProgressive), 2);
  d->Add("q/png", "jpeg", sk_test::MakePng(80, 60, 4), 3);
  d->Add("q/444", "jpg", MakeJpeg(80, 60, 5, JpegKind::kBaseline444), 4);
  LoaderOptions o = SmallOpts();
  o.dtype = DType::kUint8;
  o.layout = Layout::kNHWC;
  o.mode = AugmentMode::kEval;
  o.resize_size = 40;
  auto l = MustCreate(d, o);
  auto r = l->Next();
  REQUIRE(r.ok());
  Batch& b = *r;
  REQUIRE(b.size() == 5);
  CHECK(b.shape()[1] == 24);
  CHECK(b.shape()[2] == 32);
  CHECK(b.shape()[3] == 3);
  const uint8_t* px = static_cast<const uint8_t*>(b.data());
  for (size_t i = 0; i < b.size(); ++i) {
    // Some variation in every image; gray is R == G == B.
    const uint8_t* row = px + i * 24 * 32 * 3;
    int lo = 255, hi = 0;
    bool gray = true;
    for (int p = 0; p < 24 * 32; ++p) {
      lo = std::min<int>(lo, row[p * 3]);
      hi = std::max<int>(hi, row[p * 3]);
      gray = gray && row[p * 3] == row[p * 3 + 1] && row[p * 3 + 1] == row[p * 3 + 2];
    }
    INFO(b.keys()[i]);
    CHECK(hi > lo);
    CHECK(gray == (b.keys()[i] == "q/gray"));
  }
  CHECK(l->Next()->end_of_epoch());
}

TEST_CASE("a corrupt sample fails Next() with its key, or is skipped and counted", "[loader]") {
  auto data = MakeData(30);
  std::string bad = MakeJpeg(64, 64, 9);
  data->samples[13].set("jpg", Bytes::Copy(bad.substr(0, bad.size() / 2)));
  data->samples[21].set("jpg", Bytes::Copy(std::string("not an image at all")));
  LoaderOptions o = SmallOpts();
  o.shuffle = false;
  SECTION("error") {
    auto l = MustCreate(data, o);
    REQUIRE(l->Next().ok());  // batch 0: samples 0..7
    auto r = l->Next();       // batch 1 holds sample 13
    REQUIRE(!r.ok());
    CHECK(r.status().code() == Code::kCorrupt);
    CHECK(r.status().where().key == "c6/img0013");
    CHECK(r.status().where().index == 13);
    CHECK_THAT(r.status().ToString(), Catch::Contains("c6/img0013") && Catch::Contains("Premature end"));
    CHECK(!l->Next().ok());  // sticky until set_epoch
    CHECK(l->save_state().next_batch == 1);  // the failed batch was not handed out
    l->set_epoch(0);
    CHECK(l->save_state().next_batch == 0);
    CHECK(l->Next().ok());
  }
  SECTION("skip") {
    o.on_error = DecodeErrorPolicy::kSkip;
    auto l = MustCreate(data, o);
    auto got = Drain(*l);
    REQUIRE(got.size() == 4);
    CHECK(got[1].indices.size() == 7);
    CHECK(got[2].indices.size() == 7);
    size_t total = 0;
    for (auto& b : got) total += b.indices.size();
    CHECK(total == 28);
    auto sk = l->skipped();
    REQUIRE(sk.size() == 2);
    CHECK(sk[0].where().key == "c6/img0013");
    CHECK(sk[1].where().key == "c0/img0021");
    CHECK_THAT(sk[1].message(), Catch::Contains("not a JPEG, PNG, WebP, AVIF or JPEG XL"));
    // The rows after a skipped one moved up: row 5 of batch 1 is sample 14.
    CHECK(got[1].indices[5] == 14);
    // The list is the epoch's: set_epoch starts a new one.
    l->set_epoch(1);
    CHECK(l->skipped().empty());
  }
  SECTION("sample without an image field") {
    Sample s;
    s.key = "no/image";
    s.set("txt", Bytes::Copy(std::string("hi")));
    data->samples[2] = s;
    auto l = MustCreate(data, o);
    auto r = l->Next();
    REQUIRE(!r.ok());
    CHECK(r.status().where().key == "no/image");
  }
}

TEST_CASE("batch buffers come from a fixed pool and return on release", "[loader]") {
  auto data = MakeData(40);
  LoaderOptions o = SmallOpts();
  o.prefetch = 3;
  auto l = MustCreate(data, o);
  std::set<int> ids;
  std::set<const void*> ptrs;
  {
    std::vector<Batch> held;
    for (int i = 0; i < 3; ++i) {
      auto r = l->Next();
      REQUIRE(r.ok());
      ids.insert(r->buffer_id());
      ptrs.insert(r->data());
      held.push_back(std::move(r).value());
    }
    // All three buffers are held: Next() says so instead of waiting forever.
    auto r = l->Next();
    CHECK(r.status().code() == Code::kInvalidArgument);
    CHECK_THAT(r.status().message(), Catch::Contains("held by the consumer"));
    held[0].Release();
    CHECK(held[0].data() == nullptr);
  }
  CHECK(ids.size() == 3);
  // Later batches reuse the same three buffers.
  l->set_epoch(1);
  for (;;) {
    auto r = l->Next();
    REQUIRE(r.ok());
    if (r->end_of_epoch()) break;
    CHECK(ptrs.count(r->data()) == 1);
  }
  // A batch may outlive its loader.
  l->set_epoch(2);
  auto keep = l->Next();
  REQUIRE(keep.ok());
  Seen before = OneBatch(*keep);
  l.reset();
  CHECK(OneBatch(*keep) == before);
}

TEST_CASE("destroying a loader mid-epoch returns promptly", "[loader]") {
  auto data = MakeData(400, 24);
  data->delay_ms = 20;  // a slow source: the whole epoch would take ~4 s on 2 threads
  LoaderOptions o = SmallOpts();
  o.prefetch = 6;
  auto l = MustCreate(data, o);
  REQUIRE(l->Next().ok());
  auto t0 = std::chrono::steady_clock::now();
  l.reset();
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  INFO("destroy took " << s << " s");
  CHECK(s < 0.5);
  // set_epoch mid-epoch is prompt too.
  auto l2 = MustCreate(data, o);
  REQUIRE(l2->Next().ok());
  t0 = std::chrono::steady_clock::now();
  l2->set_epoch(1);
  s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(s < 0.5);
}

TEST_CASE("options are validated", "[loader]") {
  auto data = MakeData(4, 24);
  LoaderOptions o = SmallOpts();
  o.batch_size = 0;
  CHECK(Loader::Create(data, o).status().code() == Code::kInvalidArgument);
  o = SmallOpts();
  o.scale_min = 0;
  CHECK(Loader::Create(data, o).status().code() == Code::kInvalidArgument);
  o = SmallOpts();
  o.rank = 1;
  CHECK(Loader::Create(data, o).status().code() == Code::kInvalidArgument);
  o = SmallOpts();
  o.dct_min_cover = 0.25;  // would upsample a 1/2-scale decode 4x
  CHECK(Loader::Create(data, o).status().code() == Code::kInvalidArgument);
  o.dct_min_cover = 1.0;
  CHECK(Loader::Create(data, o).ok());
  CHECK(Loader::Create(std::shared_ptr<RandomAccess>(), SmallOpts()).status().code() == Code::kInvalidArgument);
}

TEST_CASE("Create(address) reports a dataset it cannot open instead of crashing", "[loader]") {
  sk_test::TempDir tmp;
  auto r = Loader::Create(tmp / "missing.tar", SmallOpts());
  REQUIRE(!r.ok());
  CHECK(!r.status().message().empty());
}

TEST_CASE("eval mode is deterministic and never flips", "[loader]") {
  auto data = MakeData(12, 64);
  LoaderOptions o = SmallOpts();
  o.mode = AugmentMode::kEval;
  o.shuffle = false;
  o.resize_size = 36;
  auto a = MustCreate(data, o);
  a->set_epoch(0);
  auto e0 = Drain(*a);
  a->set_epoch(7);
  auto e7 = Drain(*a);
  CHECK(e0 == e7);  // no randomness at all in eval mode without shuffle
}

TEST_CASE("Create(address) reads WebDataset shards through their index", "[loader]") {
  sk_test::TempDir tmp;
  auto data = MakeData(21);
  WriteOptions wo;
  wo.samples_per_shard = 8;
  wo.class_names = {"a", "b", "c", "d", "e", "f", "g"};
  {
    auto w = shardkit::Create(tmp / "train-%06d.tar", wo);
    INFO(w.status().ToString());
    REQUIRE(w.ok());
    for (auto& s : data->samples) REQUIRE((*w)->Write(s).ok());
    auto sum = (*w)->Finish();
    INFO(sum.status().ToString());
    REQUIRE(sum.ok());
    REQUIRE(sum->shards.size() == 3);
  }
  LoaderOptions o = SmallOpts();
  auto l = Loader::Create(tmp / "train-{000000..000002}.tar", o);
  INFO(l.status().ToString());
  REQUIRE(l.ok());
  CHECK((*l)->num_samples() == 21);
  // class_names come from the dataset's info (for a brace pattern without a manifest the
  // wds reader has none), so they are not checked here.
  auto from_tar = Drain(**l);
  // The same batches, pixels included, as from the in-memory copy of the same samples.
  auto mem = MustCreate(data, o);
  auto from_mem = Drain(*mem);
  REQUIRE(from_tar.size() == from_mem.size());
  for (size_t b = 0; b < from_tar.size(); ++b) {
    CHECK(from_tar[b].keys == from_mem[b].keys);
    CHECK(from_tar[b].labels == from_mem[b].labels);
    CHECK(from_tar[b].rows == from_mem[b].rows);
  }
}

// ---- Prefetching across epochs (LoaderOptions::prefetch_next_epoch) ----

namespace {

std::vector<Seen> Fresh(std::shared_ptr<RandomAccess> data, LoaderOptions o, uint64_t epoch, uint64_t from = 0) {
  o.prefetch_next_epoch = false;
  auto l = MustCreate(std::move(data), o);
  if (from == 0) {
    l->set_epoch(epoch);
  } else {
    LoaderState s = l->save_state();
    s.epoch = epoch;
    s.next_batch = from;
    REQUIRE(l->restore(s).ok());
  }
  return Drain(*l);
}

}  // namespace

TEST_CASE("prefetching the next epoch changes nothing the consumer sees, whatever the calls", "[loader][prefetch]") {
  struct Cfg {
    uint64_t seed;
    int world, rank;
    bool drop_last;
    uint32_t batch;
    int prefetch, threads;
  };
  const Cfg cfgs[] = {
      {17, 1, 0, false, 8, 4, 2},  // 6 batches, the last partial
      {3, 3, 1, false, 4, 2, 2},   // 15 per rank: 4 batches, the last of 3
      {5, 2, 1, true, 8, 3, 1},    // 22 per rank, drop_last: 2 full batches
      {9, 1, 0, false, 16, 1, 2},  // one buffer
      {11, 1, 0, false, 8, 7, 3},  // more buffers than batches: prefetched from Create()
  };
  auto clean = MakeData(45, 24);
  auto corrupt = MakeData(45, 24);
  std::string jpeg = MakeJpeg(40, 40, 77);
  corrupt->samples[13].set("jpg", Bytes::Copy(jpeg.substr(0, jpeg.size() / 2)));
  corrupt->samples[40].set("jpg", Bytes::Copy(std::string("not an image")));
  for (const Cfg& c : cfgs) {
    for (int variant = 0; variant < 3; ++variant) {  // clean; corrupt + kError; corrupt + kSkip
      LoaderOptions o = SmallOpts();
      o.seed = c.seed;
      o.world_size = c.world;
      o.rank = c.rank;
      o.drop_last = c.drop_last;
      o.batch_size = c.batch;
      o.prefetch = c.prefetch;
      o.threads = c.threads;
      o.on_error = variant == 2 ? DecodeErrorPolicy::kSkip : DecodeErrorPolicy::kError;
      auto data = variant == 0 ? clean : corrupt;
      INFO("seed " << c.seed << " rank " << c.rank << "/" << c.world << " variant " << variant);
      auto [off, on] = sk_test::SameWithAndWithoutPrefetch(o, [&](const LoaderOptions& x) { return MustCreate(data, x); });
      CHECK(off->prefetch_stats().speculated == 0);
      // The prefetch did run and was used (with kError here every epoch of rank 0 of 1
      // fails early: after an error nothing more is submitted, as before).
      if (variant != 1) CHECK(on->prefetch_stats().adopted > 0);
    }
  }
}

TEST_CASE("after a slow consumer, the first Next() of epoch e + 1 does not wait", "[loader][prefetch]") {
  auto data = MakeData(40, 24);
  LoaderOptions o = SmallOpts();  // batch 8: 5 batches
  o.prefetch = 3;
  auto l = MustCreate(data, o);
  l->set_epoch(0);
  auto e0 = Drain(*l);
  // The consumer takes its time: every buffer goes to epoch 1, and no more than that.
  REQUIRE(sk_test::WaitAhead(*l, 3));
  auto st = l->prefetch_stats();
  CHECK(st.speculated == 3);
  CHECK(st.ready_ahead == 3);
  // A state saved now still names the end of epoch 0.
  CHECK(l->save_state().epoch == 0);
  CHECK(l->save_state().next_batch == 5);
  l->set_epoch(1);
  auto r = l->Next();
  REQUIRE(r.ok());
  st = l->prefetch_stats();
  CHECK(!st.last_next_waited);
  CHECK(st.adopted == 3);
  CHECK(st.discarded == 0);
  CHECK(r->epoch() == 1);
  CHECK(r->index() == 0);
  std::vector<Seen> e1{OneBatch(*r)};
  r->Release();
  for (auto& b : Drain(*l)) e1.push_back(b);
  CHECK(e1 == Fresh(data, o, 1));
  CHECK(e0 == Fresh(data, o, 0));

  // Without the prefetch the workers idle until set_epoch: the first batch is decoded
  // after it (a source of 50 ms per sample: 200 ms per batch on 2 threads).
  auto slow = MakeData(16, 24);
  slow->delay_ms = 50;
  o.prefetch_next_epoch = false;
  auto m = MustCreate(slow, o);
  Drain(*m);
  m->set_epoch(1);
  REQUIRE(m->Next().ok());
  CHECK(m->prefetch_stats().last_next_waited);
  CHECK(m->prefetch_stats().speculated == 0);
}

TEST_CASE("set_epoch to another epoch, or restore(), drops the prefetched batches", "[loader][prefetch]") {
  auto data = MakeData(30, 24);
  LoaderOptions o = SmallOpts();  // batch 8: 4 batches, the last of 6
  o.prefetch = 3;
  auto l = MustCreate(data, o);
  Drain(*l);
  REQUIRE(sk_test::WaitAhead(*l, 1));  // epoch 1 is ready
  l->set_epoch(5);
  CHECK(l->prefetch_stats().discarded == 3);
  CHECK(l->prefetch_stats().adopted == 0);
  CHECK(Drain(*l) == Fresh(data, o, 5));  // exactly a fresh loader's epoch 5
  REQUIRE(sk_test::WaitAhead(*l, 1));  // epoch 6 is ready
  // restore() drops it even when it names that very epoch.
  LoaderState s = l->save_state();
  s.epoch = 6;
  s.next_batch = 0;
  REQUIRE(l->restore(s).ok());
  CHECK(l->prefetch_stats().discarded == 6);
  CHECK(l->prefetch_stats().adopted == 0);
  CHECK(Drain(*l) == Fresh(data, o, 6));
  REQUIRE(sk_test::WaitAhead(*l, 1));
  s.epoch = 7;
  s.next_batch = 2;
  REQUIRE(l->restore(s).ok());
  CHECK(Drain(*l) == Fresh(data, o, 7, 2));
  // The same epoch again drops it too.
  REQUIRE(sk_test::WaitAhead(*l, 1));
  l->set_epoch(7);
  CHECK(l->prefetch_stats().adopted == 0);
  CHECK(Drain(*l) == Fresh(data, o, 7));
  // A state saved at the end of an epoch, restored in a new loader, then set_epoch(e + 1).
  auto n = MustCreate(data, o);
  REQUIRE(n->restore(l->save_state()).ok());
  CHECK(n->Next()->end_of_epoch());
  REQUIRE(sk_test::WaitAhead(*n, 1));
  n->set_epoch(8);
  CHECK(n->prefetch_stats().adopted >= 1);
  CHECK(Drain(*n) == Fresh(data, o, 8));
}

TEST_CASE("a decode error of the next epoch is reported in that epoch, at its batch", "[loader][prefetch]") {
  auto data = MakeData(30, 24);
  std::string jpeg = MakeJpeg(40, 40, 5);
  data->samples[25].set("jpg", Bytes::Copy(jpeg.substr(0, jpeg.size() / 3)));  // in the last batch
  LoaderOptions o = SmallOpts();
  o.shuffle = false;  // the same order every epoch: batches 0-2 fine, batch 3 holds sample 25
  o.prefetch = 4;
  SECTION("error") {
    auto l = MustCreate(data, o);
    for (uint64_t e = 0; e < 3; ++e) {
      if (e > 0) {
        REQUIRE(sk_test::WaitAhead(*l, 3));  // epoch e's batches 0-2 prefetched (3 fails)
        l->set_epoch(e);
      }
      for (int b = 0; b < 3; ++b) {
        auto r = l->Next();
        REQUIRE(r.ok());
        CHECK(r->epoch() == e);
      }
      auto r = l->Next();
      REQUIRE(!r.ok());
      CHECK(r.status().where().key == "c4/img0025");
      CHECK(l->save_state().epoch == e);
      CHECK(l->save_state().next_batch == 3);
    }
    CHECK(l->prefetch_stats().adopted >= 6);
  }
  SECTION("skip") {
    o.on_error = DecodeErrorPolicy::kSkip;
    auto l = MustCreate(data, o);
    for (uint64_t e = 0; e < 3; ++e) {
      if (e > 0) {
        REQUIRE(sk_test::WaitAhead(*l, 4));
        l->set_epoch(e);
        CHECK(l->skipped().empty());  // the prefetched batch 3 has not been handed out
      }
      auto got = Drain(*l);
      REQUIRE(got.size() == 4);
      CHECK(got[3].indices.size() == 5);
      auto sk = l->skipped();
      REQUIRE(sk.size() == 1);  // this epoch's, once
      CHECK(sk[0].where().key == "c4/img0025");
    }
  }
}

TEST_CASE("holding batches across set_epoch(e + 1) behaves as without the prefetch", "[loader][prefetch]") {
  auto data = MakeData(40, 24);
  for (bool prefetch : {false, true}) {
    LoaderOptions o = SmallOpts();
    o.prefetch = 3;
    o.prefetch_next_epoch = prefetch;
    auto l = MustCreate(data, o);
    std::vector<Batch> held;
    for (;;) {
      auto r = l->Next();
      REQUIRE(r.ok());
      if (r->end_of_epoch()) break;
      held.push_back(std::move(r).value());
      if (held.size() > 2) held.erase(held.begin());  // holds the last two
    }
    l->set_epoch(1);
    auto first = l->Next();  // the one free buffer
    REQUIRE(first.ok());
    CHECK(first->index() == 0);
    auto r = l->Next();  // every buffer is held
    INFO("prefetch " << prefetch);
    CHECK(r.status().code() == Code::kInvalidArgument);
    held.clear();
    first->Release();
    l->set_epoch(1);
    CHECK(Drain(*l) == Fresh(data, o, 1));
  }
}

TEST_CASE("destroying a loader while it prefetches the next epoch returns promptly", "[loader][prefetch]") {
  for (int how = 0; how < 2; ++how) {
    auto data = MakeData(24, 24);
    data->delay_ms = 20;  // 3 batches of 8: 80 ms a batch on 2 threads
    LoaderOptions o = SmallOpts();
    o.prefetch = 6;  // epoch 1 starts at Create() already
    auto l = MustCreate(data, o);
    Drain(*l);
    CHECK(l->prefetch_stats().speculated >= 3);
    auto t0 = std::chrono::steady_clock::now();
    if (how == 0) l.reset();
    else l->set_epoch(4);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    INFO("took " << s << " s");
    CHECK(s < 0.5);
  }
}

// Not a test (hidden, run by hand): the consumer's wait at epoch starts with and without
// the prefetch, for a consumer slower than the loader (its step is 1.5x the loader's
// time per batch, as in shardkit_gpu_bench's copy_path run).
//   build/tests/test_loader "[.prefetch-bench]"   (SK_BENCH_THREADS, default 2;
//   SK_BENCH_STEP, default 1.5: the consumer's step as a multiple of the batch time)
TEST_CASE("bench: wait at epoch starts with and without the prefetch", "[.prefetch-bench]") {
  using Clock = std::chrono::steady_clock;
  auto data = MakeData(384, 320);  // 320-384 x 312-360 JPEGs
  LoaderOptions o = SmallOpts();
  o.batch_size = 32;
  o.output_width = o.output_height = 224;
  o.prefetch = 4;
  const char* th = std::getenv("SK_BENCH_THREADS");
  o.threads = th ? std::atoi(th) : 2;
  const int epochs = 4;
  // The loader's time per batch, consumer doing nothing.
  double batch_s = 0;
  {
    o.prefetch_next_epoch = false;
    auto l = MustCreate(data, o);
    Drain(*l);
    l->set_epoch(1);
    auto t0 = Clock::now();
    auto n = Drain(*l).size();
    batch_s = std::chrono::duration<double>(Clock::now() - t0).count() / double(n);
  }
  const char* f = std::getenv("SK_BENCH_STEP");  // the consumer's step / the loader's batch time
  const auto step = std::chrono::duration<double>((f ? std::atof(f) : 1.5) * batch_s);
  for (int round = 0; round < 3; ++round) {
    for (bool prefetch : {false, true}) {
      o.prefetch_next_epoch = prefetch;
      auto l = MustCreate(data, o);
      double start_wait = 0, steady_wait = 0, first = 0;
      uint64_t batches = 0;
      Clock::time_point t0;
      for (int e = 0; e < epochs; ++e) {
        l->set_epoch(uint64_t(e));
        for (uint64_t k = 0;; ++k) {
          auto tn = Clock::now();
          auto b = l->Next();
          const double w = std::chrono::duration<double>(Clock::now() - tn).count();
          REQUIRE(b.ok());
          if (b->end_of_epoch()) break;
          if (e == 0 && k == 0) {  // warm-up: not counted
            first = w;
            t0 = Clock::now();
          } else {
            (k == 0 ? start_wait : steady_wait) += w;
            ++batches;
            if (w > 1e-3 && std::getenv("SK_BENCH_VERBOSE"))
              std::printf("  wait e%d #%llu %.1f ms, batch %s\n", e, (unsigned long long)k, w * 1e3,
                          l->prefetch_stats().last_next_waited ? "still decoding" : "was ready");
          }
          std::this_thread::sleep_for(step);  // the consumer's step
        }
      }
      const double total = std::chrono::duration<double>(Clock::now() - t0).count();
      std::printf("{\"prefetch_next_epoch\":%s,\"threads\":%d,\"loader_batch_ms\":%.1f,\"consumer_step_ms\":%.1f,"
                  "\"batches\":%llu,\"seconds\":%.2f,\"first_batch_ms\":%.1f,\"wait_epoch_start_ms\":%.2f,"
                  "\"wait_epoch_start_pct\":%.2f,\"wait_steady_pct\":%.2f,\"adopted\":%llu}\n",
                  prefetch ? "true" : "false", o.threads, batch_s * 1e3, step.count() * 1e3,
                  (unsigned long long)batches, total, first * 1e3, start_wait / (epochs - 1) * 1e3,
                  100 * start_wait / total, 100 * steady_wait / total,
                  (unsigned long long)l->prefetch_stats().adopted);
      std::fflush(stdout);
    }
  }
}
