// The batch engine's shared parts (lib/pipeline/engine.h): one Validate for both
// loaders, one restore check, one crop choice, one error/skip settlement, one row reader.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>

#include "pipeline/engine.h"
#include "shardkit/gpu.h"
#include "shardkit/loader.h"
#include "support.h"

using namespace shardkit;

namespace {

LoaderOptions Good() {
  LoaderOptions o;
  o.batch_size = 8;
  o.rank = 0;
  o.world_size = 1;
  return o;
}

class OneSample final : public RandomAccess {
 public:
  Sample s;
  Status fail;
  uint64_t size() const override { return 1; }
  Status Get(uint64_t, Sample* out) const override {
    if (!fail.ok()) return fail;
    *out = s;
    return Status::OK();
  }
};

}  // namespace

TEST_CASE("Validate: one check of the loader options, the GPU's a superset of the CPU's", "[engine]") {
  CHECK(Validate(Good()).ok());
  CHECK(Validate(Good(), GpuOptions{}).ok());
  // Options the GPU decode path's own check used to let through (it skipped the scale,
  // ratio, flip, resize and prefetch checks): both refuse them now.
  struct Bad {
    const char* what;
    void (*set)(LoaderOptions&);
  };
  const Bad bad[] = {
      {"batch_size 0", [](LoaderOptions& o) { o.batch_size = 0; }},
      {"scale_min 0", [](LoaderOptions& o) { o.scale_min = 0; }},
      {"scale_max > 1", [](LoaderOptions& o) { o.scale_max = 1.5; }},
      {"scale min > max", [](LoaderOptions& o) { o.scale_min = 0.9, o.scale_max = 0.5; }},
      {"ratio_min 0", [](LoaderOptions& o) { o.ratio_min = 0; }},
      {"ratio min > max", [](LoaderOptions& o) { o.ratio_min = 2, o.ratio_max = 1; }},
      {"flip_p 2", [](LoaderOptions& o) { o.flip_p = 2; }},
      {"flip_p NaN", [](LoaderOptions& o) { o.flip_p = std::nan(""); }},
      {"resize_size 0", [](LoaderOptions& o) { o.resize_size = 0; }},
      {"prefetch 0", [](LoaderOptions& o) { o.prefetch = 0; }},
      {"threads -1", [](LoaderOptions& o) { o.threads = -1; }},
      {"dct_min_cover 0.25", [](LoaderOptions& o) { o.dct_min_cover = 0.25; }},
      {"max_pixels 0", [](LoaderOptions& o) { o.max_pixels = 0; }},
      {"std 0", [](LoaderOptions& o) { o.std[1] = 0; }},
      {"rank 1 of 1", [](LoaderOptions& o) { o.rank = 1; }},
      {"output 0 wide", [](LoaderOptions& o) { o.output_width = 0; }},
      {"output 16385 high", [](LoaderOptions& o) { o.output_height = 16385; }},
  };
  for (const Bad& b : bad) {
    INFO(b.what);
    LoaderOptions o = Good();
    b.set(o);
    Status cpu = Validate(o);
    Status gpu = Validate(o, GpuOptions{});
    CHECK(cpu.code() == Code::kInvalidArgument);
    CHECK(gpu.code() == Code::kInvalidArgument);
    CHECK(cpu.message() == gpu.message());  // the same check says the same thing
  }
  // The GPU path's own limits: the resize kernel's largest output, the ring, the share of
  // the hardware engines (GpuOptions::hardware_load, once the SHARDKIT_HW_LOAD variable).
  LoaderOptions big = Good();
  big.output_width = 9000;
  CHECK(Validate(big).ok());
  CHECK(Validate(big, GpuOptions{}).code() == Code::kInvalidArgument);
  GpuOptions g;
  g.ring = 1;
  CHECK(Validate(Good(), g).code() == Code::kInvalidArgument);
  g = GpuOptions{};
  g.host_threads = -2;
  CHECK(Validate(Good(), g).code() == Code::kInvalidArgument);
  for (double load : {1.5, std::numeric_limits<double>::quiet_NaN()}) {
    g = GpuOptions{};
    g.hardware_load = load;
    CHECK_THAT(Validate(Good(), g).message(), Catch::Contains("hardware_load"));
  }
  for (double load : {-1.0, 0.0, 0.55, 1.0}) {
    g = GpuOptions{};
    g.hardware_load = load;
    CHECK(Validate(Good(), g).ok());
    CHECK(pipeline::ResolvedHardwareLoad(g) == (load < 0 ? GpuOptions::kDefaultHardwareLoad : load));
  }
}

TEST_CASE("Validate leaves the options alone, ResolveOptions fills in rank, world size and threads", "[engine]") {
  LoaderOptions o = Good();
  o.rank = -1;
  o.world_size = -1;
  o.threads = 0;
  ::setenv("RANK", "1", 1);
  ::setenv("WORLD_SIZE", "4", 1);
  CHECK(Validate(o).ok());
  CHECK(o.rank == -1);
  LoaderOptions r = o;
  REQUIRE(pipeline::ResolveOptions(&r).ok());
  CHECK(r.rank == 1);
  CHECK(r.world_size == 4);
  CHECK(r.threads > 0);
  ::setenv("RANK", "4", 1);
  CHECK(Validate(o).code() == Code::kInvalidArgument);
  CHECK(Validate(o, GpuOptions{}).code() == Code::kInvalidArgument);
  ::unsetenv("RANK");
  ::unsetenv("WORLD_SIZE");
}

TEST_CASE("CheckRestore: same configuration, and a next batch within the epoch", "[engine]") {
  LoaderOptions o = Good();
  o.seed = 5;
  const LoaderState at_end = pipeline::MakeState(o, 100, 3, 13);
  CHECK(at_end.seed == 5);
  CHECK(at_end.epoch == 3);
  CHECK(at_end.next_batch == 13);
  CHECK(at_end.num_samples == 100);
  CHECK(at_end.batch_size == 8);
  CHECK_FALSE(at_end.has_stream);
  CHECK(pipeline::CheckRestore(at_end, o, 100, 13).ok());  // the end of the epoch
  LoaderState s = at_end;
  s.next_batch = 14;
  Status st = pipeline::CheckRestore(s, o, 100, 13);
  CHECK(st.code() == Code::kInvalidArgument);
  CHECK_THAT(st.message(), Catch::Contains("batch 14 of an epoch of 13"));
  s = at_end;
  s.seed = 6;
  CHECK(pipeline::CheckRestore(s, o, 100, 13).code() == Code::kInvalidArgument);
  CHECK(pipeline::CheckRestore(at_end, o, 101, 13).code() == Code::kInvalidArgument);
  s = at_end;
  s.world_size = 2;
  CHECK(pipeline::CheckRestore(s, o, 100, 13).code() == Code::kInvalidArgument);
}

TEST_CASE("SettleRows: the first failure under kError, the failures listed under kSkip", "[engine]") {
  std::vector<Status> rows = {Status::OK(), Status::Corrupt("bad a"), Status::OK(), Status::Corrupt("bad b")};
  std::vector<size_t> keep;
  std::vector<Status> skipped;
  Status st = pipeline::SettleRows(rows, DecodeErrorPolicy::kError, &keep, &skipped);
  CHECK(st.message() == "bad a");
  CHECK(skipped.empty());
  st = pipeline::SettleRows(rows, DecodeErrorPolicy::kSkip, &keep, &skipped);
  CHECK(st.ok());
  CHECK(keep == std::vector<size_t>{0, 2});
  REQUIRE(skipped.size() == 2);
  CHECK(skipped[1].message() == "bad b");
  // A cancelled row cancels the batch whatever the policy.
  rows[3] = Status::Cancelled("loader stopped");
  skipped.clear();
  CHECK(pipeline::SettleRows(rows, DecodeErrorPolicy::kSkip, &keep, &skipped).code() == Code::kCancelled);
}

TEST_CASE("RowsOf cuts an epoch into batches, the last one partial", "[engine]") {
  CHECK(pipeline::RowsOf(20, 8, 0).begin == 0);
  CHECK(pipeline::RowsOf(20, 8, 0).count() == 8);
  CHECK(pipeline::RowsOf(20, 8, 2).begin == 16);
  CHECK(pipeline::RowsOf(20, 8, 2).count() == 4);
  CHECK(pipeline::RowsOf(20, 8, 3).count() == 0);
}

TEST_CASE("ReadRow finds the image and label, and names the sample in its errors", "[engine]") {
  OneSample d;
  d.s.key = "k1";
  d.s.set("jpg", Bytes::Copy(sk_test::MakeJpeg(40, 30, 1)));
  d.s.set_label(4);
  LoaderOptions o = Good();
  Sample scratch;
  auto h = pipeline::ReadRow(&d, o, 7, nullptr, &scratch);
  REQUIRE(h.ok());
  CHECK(h->label == 4);
  CHECK(h->image == scratch.find("jpg"));
  CHECK(h->where.key == "k1");
  CHECK(h->where.index == 7);
  // The crop chosen for it is the plan's (train: RandomResizedCrop of (seed, epoch, index)).
  pipeline::RrcParams rrc;
  pipeline::Augment a = pipeline::ChooseCrop(o, rrc, 2, 7, 40, 30);
  pipeline::Augment b = pipeline::TrainAugment(o.seed, 2, 7, 40, 30, rrc);
  CHECK((a.box.x == b.box.x && a.box.y == b.box.y && a.box.w == b.box.w && a.box.h == b.box.h && a.flip == b.flip));
  o.mode = AugmentMode::kEval;
  a = pipeline::ChooseCrop(o, rrc, 2, 7, 40, 30);
  CHECK_FALSE(a.flip);
  // And its host decode: the crop ChooseCrop picks from the header's size, decoded at
  // full scale for this small image (a region of it that covers the box).
  decode::ImageDecoder dec;
  decode::Region reg;
  pipeline::Augment aug;
  REQUIRE(pipeline::DecodeCrop(dec, o, rrc, 2, 7, h->image->data.data(), h->image->data.size(), h->where, &aug, &reg)
              .ok());
  CHECK((aug.box.x == a.box.x && aug.box.y == a.box.y && aug.box.w == a.box.w && aug.box.h == a.box.h));
  CHECK(reg.scale_num == 8);
  CHECK((reg.width > 0 && reg.width <= 40 && reg.height > 0 && reg.height <= 30));
  // A sample given (streamed mode) is used as it is, without Get().
  d.fail = Status::IOError("unreadable");
  auto g = pipeline::ReadRow(&d, o, 7, &d.s, &scratch);
  REQUIRE(g.ok());
  CHECK(g->sample == &d.s);
  auto f = pipeline::ReadRow(&d, o, 7, nullptr, &scratch);
  CHECK(f.status().code() == Code::kIOError);
  CHECK(f.status().where().index == 7);
  d.fail = Status::OK();
  o.image_field = "png";
  auto m = pipeline::ReadRow(&d, o, 7, nullptr, &scratch);
  CHECK(m.status().code() == Code::kCorrupt);
  CHECK_THAT(m.status().message(), Catch::Contains("'png'"));
  CHECK(m.status().where().key == "k1");
  // Garbage bytes: the decode error names the sample too.
  const uint8_t junk[4] = {1, 2, 3, 4};
  Status bad = pipeline::DecodeCrop(dec, o, rrc, 0, 7, junk, sizeof junk, h->where, &aug, &reg);
  CHECK_FALSE(bad.ok());
  CHECK(bad.where().key == "k1");
}

TEST_CASE("Delivery: the consumer's position, sticky error, end and skipped rows for both loaders", "[engine]") {
  LoaderOptions o = Good();
  o.seed = 9;
  pipeline::Delivery d;
  d.Start(2, 5);
  CHECK(d.epoch == 2);
  CHECK(d.next == 5);
  CHECK(d.sticky.ok());
  CHECK_FALSE(d.ended);
  std::vector<Status> rows = {Status::Corrupt("row 3"), Status::Corrupt("row 6")};
  d.Delivered(5, &rows);
  CHECK(d.next == 6);
  d.Delivered(6);
  CHECK(d.next == 7);
  REQUIRE(d.skipped.size() == 2);
  CHECK(d.skipped[1].message() == "row 6");
  // save_state's position is the batch the next Next() hands out.
  const LoaderState s = d.State(o, 100);
  CHECK(s.epoch == 2);
  CHECK(s.next_batch == 7);
  CHECK(s.seed == 9);
  CHECK(s.num_samples == 100);
  // A failed batch: the error stays (and the position does not move) until Start.
  const Status& st = d.Fail(Status::Corrupt("bad batch"));
  CHECK(st.code() == Code::kCorrupt);
  CHECK(d.sticky.message() == "bad batch");
  CHECK(d.next == 7);
  d.ended = true;
  d.Start(3, 0);
  CHECK(d.epoch == 3);
  CHECK(d.next == 0);
  CHECK(d.sticky.ok());
  CHECK_FALSE(d.ended);
  CHECK(d.skipped.empty());
  CHECK(pipeline::Stopped().code() == Code::kCancelled);
  CHECK(pipeline::Stopped().message() == "loader stopped");
}
