// Issue 17, the loader side: extra fields carried with every row (image-text pairs), and
// decoded arrays ("npy") fed to the crop/resize path without decoding.
#include <catch2/catch.hpp>

#include <map>
#include <random>
#include <set>

#include <fmt/format.h>

#include "core/pickle.h"
#include "decode/encode.h"
#include "pipeline/engine.h"
#include "shardkit/loader.h"
#include "shardkit/shardkit.h"
#include "loader_support.h"
#include "support.h"

using namespace shardkit;
using sk_test::MakeJpeg;

namespace {

class MemData : public RandomAccess {
 public:
  std::vector<Sample> samples;
  uint64_t size() const override { return samples.size(); }
  Status Get(uint64_t i, Sample* out) const override {
    if (i >= samples.size()) return Status::NotFound("no such sample", Location{.index = int64_t(i)});
    *out = samples[i];
    return Status::OK();
  }
};

std::string Caption(const std::string& key) { return "a photo of " + key; }

// n image-text pairs: jpg + txt + json + cls; `no_txt` lack their txt.
std::shared_ptr<MemData> MakePairs(int n, std::set<int> no_txt = {}) {
  auto d = std::make_shared<MemData>();
  for (int i = 0; i < n; ++i) {
    Sample s;
    s.key = fmt::format("s{:04d}", i);
    s.set("jpg", Bytes::Copy(MakeJpeg(32 + (i % 3) * 8, 24 + (i % 2) * 8, uint32_t(i + 1))));
    if (!no_txt.count(i)) s.set("txt", Bytes::Copy(Caption(s.key)));
    s.set("json", Bytes::Copy(fmt::format("{{\"i\": {}}}", i)));
    s.set_label(i % 5);
    d->samples.push_back(std::move(s));
  }
  return d;
}

LoaderOptions Opts() {
  LoaderOptions o;
  o.batch_size = 4;
  o.output_width = 16;
  o.output_height = 16;
  o.rank = 0;
  o.world_size = 1;
  o.threads = 2;
  o.seed = 3;
  o.fields = {"txt", "json"};
  return o;
}

std::unique_ptr<Loader> Make(std::shared_ptr<RandomAccess> d, const LoaderOptions& o) {
  auto r = Loader::Create(std::move(d), o);
  INFO(r.status().ToString());
  REQUIRE(r.ok());
  return std::move(r).value();
}

// Every row's (key, txt, json) of the rest of the epoch, checking each row's fields
// belong to its key.
std::vector<std::string> Rows(Loader& l) {
  std::vector<std::string> out;
  for (;;) {
    auto r = l.Next();
    INFO(r.status().ToString());
    REQUIRE(r.ok());
    if (r->end_of_epoch()) break;
    REQUIRE(r->num_fields() == 2);
    REQUIRE(r->field(0).size() == r->size());
    REQUIRE(r->field(1).size() == r->size());
    for (size_t i = 0; i < r->size(); ++i) {
      const std::string& key = r->keys()[i];
      REQUIRE(r->field(0)[i].has_value());
      CHECK(r->field(0)[i]->str() == Caption(key));
      CHECK(r->field(1)[i]->str() == fmt::format("{{\"i\": {}}}", std::stoi(key.substr(1))));
      out.push_back(key + "|" + r->field(0)[i]->str());
    }
  }
  return out;
}

}  // namespace

TEST_CASE("fields follow their rows through shuffling, ranks and resume", "[loader][fields]") {
  auto d = MakePairs(23);
  LoaderOptions o = Opts();
  std::multiset<std::string> all;
  for (int rank = 0; rank < 3; ++rank) {
    o.rank = rank;
    o.world_size = 3;
    auto l = Make(d, o);
    l->set_epoch(2);
    auto rows = Rows(*l);
    CHECK(rows.size() == 8);  // ceil(23 / 3), padded
    all.insert(rows.begin(), rows.end());
    // Resume after one batch: the same rows, fields included.
    auto a = Make(d, o);
    a->set_epoch(2);
    REQUIRE(a->Next().ok());
    LoaderState st = a->save_state();
    auto b = Make(d, o);
    REQUIRE(b->restore(st).ok());
    auto rest = Rows(*b);
    CHECK(std::vector<std::string>(rows.begin() + 4, rows.end()) == rest);
  }
  std::set<std::string> distinct(all.begin(), all.end());
  CHECK(distinct.size() == 23);  // every sample, on some rank
  // Without fields: no columns.
  LoaderOptions plain = Opts();
  plain.fields.clear();
  auto l = Make(d, plain);
  auto r = l->Next();
  REQUIRE(r.ok());
  CHECK(r->num_fields() == 0);
}

TEST_CASE("a sample without a requested field: an error naming it, None, or skipped", "[loader][fields]") {
  sk_test::TempDir tmp;
  auto d = MakePairs(12, {9});
  WriteOptions wo;
  wo.samples_per_shard = 4;
  {
    auto w = shardkit::Create(tmp / "p-%06d.tar", wo);
    REQUIRE(w.ok());
    for (auto& s : d->samples) REQUIRE((*w)->Write(s).ok());
    REQUIRE((*w)->Finish().ok());
  }
  const std::string addr = tmp / "p-{000000..000002}.tar";
  LoaderOptions o = Opts();
  o.shuffle = false;
  for (bool stream : {false, true}) {
    INFO("stream " << stream);
    o.stream = stream;
    o.missing_fields = MissingFieldPolicy::kError;
    auto l = Loader::Create(addr, o);
    REQUIRE(l.ok());
    REQUIRE((*l)->Next().ok());
    REQUIRE((*l)->Next().ok());
    auto bad = (*l)->Next();  // rows 8..11: s0009 has no txt
    REQUIRE(!bad.ok());
    CHECK(bad.status().code() == Code::kCorrupt);
    CHECK(bad.status().where().key == "s0009");
    CHECK(bad.status().where().index == 9);
    CHECK(bad.status().where().shard == 2);
    CHECK(bad.status().where().file.find("p-000002.tar") != std::string::npos);
    CHECK(bad.status().ToString().find("no 'txt' field") != std::string::npos);

    o.missing_fields = MissingFieldPolicy::kNull;
    auto n = Loader::Create(addr, o);
    REQUIRE(n.ok());
    int nulls = 0;
    for (;;) {
      auto b = (*n)->Next();
      REQUIRE(b.ok());
      if (b->end_of_epoch()) break;
      for (size_t i = 0; i < b->size(); ++i) {
        if (b->keys()[i] == "s0009") {
          CHECK(!b->field(0)[i].has_value());
          CHECK(b->field(1)[i].has_value());
          ++nulls;
        } else {
          CHECK(b->field(0)[i]->str() == Caption(b->keys()[i]));
        }
      }
    }
    CHECK(nulls == 1);
  }
  // kError + skip: the sample is left out, the others keep their own fields.
  o.stream = false;
  o.shuffle = true;
  o.missing_fields = MissingFieldPolicy::kError;
  o.on_error = DecodeErrorPolicy::kSkip;
  auto s = Loader::Create(addr, o);
  REQUIRE(s.ok());
  auto rows = Rows(**s);
  CHECK(rows.size() == 11);
  REQUIRE((*s)->skipped().size() == 1);
  CHECK((*s)->skipped()[0].where().key == "s0009");
}

TEST_CASE("field names are checked", "[loader][fields]") {
  LoaderOptions o = Opts();
  CHECK(Validate(o).ok());
  o.fields = {"txt", "txt"};
  CHECK(Validate(o).code() == Code::kInvalidArgument);
  o.fields = {""};
  CHECK(Validate(o).code() == Code::kInvalidArgument);
  o.fields = {"TXT"};
  CHECK(Validate(o).code() == Code::kInvalidArgument);
  o.fields = {".txt"};
  CHECK(Validate(o).code() == Code::kInvalidArgument);
}

namespace {

pickle::NdArray Pixels(int h, int w, int c, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string px(size_t(h) * w * std::max(c, 1), '\0');
  for (auto& ch : px) ch = char(rng() & 0xff);
  pickle::NdArray a;
  a.dtype.kind = 'u';
  a.dtype.itemsize = 1;
  a.dtype.order = '|';
  a.shape = {uint64_t(h), uint64_t(w)};
  if (c) a.shape.push_back(uint64_t(c));
  a.data = Bytes::Take(std::move(px));
  return a;
}

}  // namespace

TEST_CASE("decoded arrays are cropped and resized as the same pixels as PNG", "[loader][arrays]") {
  // [H, W, 3] RGB, [H, W] gray and [H, W, 1]: the rows equal those of lossless PNGs of the
  // same pixels (the PNG decoder's Region and the array's are the same pixels and box).
  for (int c : {3, 0, 1}) {
    INFO("channels " << c);
    auto arrays = std::make_shared<MemData>();
    auto pngs = std::make_shared<MemData>();
    for (int i = 0; i < 10; ++i) {
      pickle::NdArray a = Pixels(20 + 3 * i, 30 - i, c, uint32_t(i + 7));
      Bytes npy = pickle::ToNpy(a);
      auto png = decode::EncodeNpy(npy, decode::EncodeSpec{true, 90});
      INFO(png.status().ToString());
      REQUIRE(png.ok());
      Sample s;
      s.key = fmt::format("k{:02d}", i);
      s.set_label(i);
      Sample p = s;
      s.set("npy", npy);
      p.set("png", *png);
      arrays->samples.push_back(std::move(s));
      pngs->samples.push_back(std::move(p));
    }
    LoaderOptions o = Opts();
    o.fields.clear();
    o.dtype = DType::kUint8;
    o.layout = Layout::kNHWC;
    for (AugmentMode mode : {AugmentMode::kTrain, AugmentMode::kEval}) {
      o.mode = mode;
      o.resize_size = 18;
      auto a = Make(arrays, o);
      auto p = Make(pngs, o);
      a->set_epoch(1);
      p->set_epoch(1);
      auto ra = sk_test::Drain(*a);
      auto rp = sk_test::Drain(*p);
      REQUIRE(ra.size() == rp.size());
      for (size_t b = 0; b < ra.size(); ++b) {
        CHECK(ra[b].keys == rp[b].keys);
        CHECK(ra[b].labels == rp[b].labels);
        CHECK(ra[b].rows == rp[b].rows);
      }
    }
  }
}

TEST_CASE("decoded arrays the loader cannot take, and BGR arrays, are refused by name", "[loader][arrays]") {
  LoaderOptions o = Opts();
  o.fields.clear();
  pipeline::RrcParams rrc{o.scale_min, o.scale_max, o.ratio_min, o.ratio_max, o.flip_p};
  decode::ImageDecoder dec;
  pipeline::Augment aug;
  decode::Region reg;
  Location where{.key = "x", .index = 4};
  auto run = [&](const pickle::NdArray& a, const pipeline::SourceFacts* f) {
    Field fld{"npy", pickle::ToNpy(a), ""};
    return pipeline::DecodeImage(dec, o, rrc, 0, 4, fld, f, where, &aug, &reg);
  };
  CHECK(run(Pixels(8, 9, 3, 1), nullptr).ok());
  CHECK(run(Pixels(8, 9, 0, 1), nullptr).ok());
  Status four = run(Pixels(8, 9, 4, 1), nullptr);
  CHECK(four.code() == Code::kInvalidArgument);
  CHECK(four.where().key == "x");
  CHECK(four.ToString().find("[8, 9, 4]") != std::string::npos);
  pickle::NdArray f32 = Pixels(2, 2, 3, 1);
  f32.dtype.kind = 'f';
  f32.dtype.itemsize = 4;
  f32.dtype.order = '<';
  f32.data = Bytes::Take(std::string(2 * 2 * 3 * 4, '\0'));
  CHECK(run(f32, nullptr).ToString().find("uint8") != std::string::npos);
  Field junk{"npy", Bytes::Copy("not an npy"), ""};
  CHECK(!pipeline::DecodeImage(dec, o, rrc, 0, 4, junk, nullptr, where, &aug, &reg).ok());

  pipeline::SourceFacts bgr;
  bgr.arrays_bgr = true;
  bgr.channel_order = "decoded arrays: bgr (as cv2.imread writes; not converted)";
  bgr.channel_option = "lmdb.channels";
  Status b = run(Pixels(8, 9, 3, 1), &bgr);
  CHECK(b.code() == Code::kInvalidArgument);
  CHECK(b.ToString().find("lmdb.channels=bgr-to-rgb") != std::string::npos);
  CHECK(run(Pixels(8, 9, 0, 1), &bgr).ok());  // gray has no channel order
  // A source that records no order: colour arrays are refused, naming the option that says it.
  DatasetInfo unrecorded;
  unrecorded.format = "wds";
  pipeline::SourceFacts unknown = pipeline::FactsOf(unrecorded, 0);
  Status u = run(Pixels(8, 9, 3, 1), &unknown);
  CHECK(u.code() == Code::kInvalidArgument);
  CHECK(u.ToString().find("no channel order") != std::string::npos);
  CHECK(u.ToString().find("wds.channels=rgb") != std::string::npos);
  CHECK(run(Pixels(8, 9, 0, 1), &unknown).ok());
  unrecorded.extra["channel_order"] = "decoded arrays: rgb (as the manifest records; not converted)";
  pipeline::SourceFacts said = pipeline::FactsOf(unrecorded, 0);
  CHECK(run(Pixels(8, 9, 3, 1), &said).ok());
  // Create's check reads the first sample.
  auto d = std::make_shared<MemData>();
  Sample s;
  s.key = "0";
  s.set("npy", pickle::ToNpy(Pixels(8, 9, 3, 1)));
  d->samples.push_back(s);
  CHECK(pipeline::CheckArrayColours(d.get(), o, bgr).code() == Code::kInvalidArgument);
  CHECK(pipeline::CheckArrayColours(d.get(), o, pipeline::SourceFacts{}).ok());
  d->samples[0].erase("npy");
  d->samples[0].set("jpg", Bytes::Copy(MakeJpeg(8, 8, 1)));  // a pickle LMDB of JPEG bytes is fine
  CHECK(pipeline::CheckArrayColours(d.get(), o, bgr).ok());
}
