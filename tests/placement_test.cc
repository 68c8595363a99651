// Adaptive placement of the GPU decode path (pipeline/placement.h), driven by a simulated
// feed: host threads decoding H images/s, engines E images/s, batches of B, a consumer
// whose step takes W seconds of its own work. The loader's threads run in parallel, so
// the feed delivers a batch every max(host time, engine time); the consumer waits for
// the difference when that is longer than W.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>

#include "pipeline/placement.h"

using shardkit::pipeline::PlacementController;

namespace {

struct Feed {
  double host = 8000, engines = 11000, batch = 256;
  double Prepare(double s) const { return batch * (1 - s) / host + 0.002; }  // + reading, parsing
  double Submit(double s) const { return batch * s / engines + 0.001; }       // + packing, upload
  double Period(double s) const { return std::max(Prepare(s), Submit(s)); }
};

// Runs `n` batches; returns the consumer's mean wait share over the last `tail`.
double Run(PlacementController* c, const Feed& f, double work, int n, int tail = 20) {
  double waited = 0, stepped = 0;
  for (int i = 0; i < n; ++i) {
    const double s = c->share();
    const double period = f.Period(s);
    const double wait = std::max(0.0, period - work);
    const double step = std::max(period, work);
    const double acquire = std::max(0.0, work - period);  // the ring holds the producer back
    c->Observe(wait, step, f.Prepare(s), acquire, f.Submit(s));
    if (i >= n - tail) {
      waited += wait;
      stepped += step;
    }
  }
  return waited / stepped;
}

}  // namespace

TEST_CASE("feed-bound: the share converges within a few batches to the split where both sides take as long",
          "[placement]") {
  Feed f;
  // Balance: B(1-s)/H + 0.002 = Bs/E + 0.001.
  const double want = (f.batch / f.host + 0.001) / (f.batch / f.host + f.batch / f.engines);
  for (double start : {0.0, 0.7, 1.0}) {
    PlacementController c(start);
    Run(&c, f, 0.001, 12);
    INFO("start " << start << " share " << c.share() << " balance " << want);
    CHECK(std::abs(c.share() - want) < 0.05);
    CHECK_FALSE(c.cuda_on());
  }
}

TEST_CASE("model-bound with host threads enough: the engines' share goes to 0 (least GPU work) within a few batches",
          "[placement]") {
  Feed f;
  PlacementController c(0.7);
  Run(&c, f, /*work=*/0.06, 12);  // 4,300 images/s wanted; the host does 8,000
  CHECK(c.share() == 0.0);
  const double wait_share = Run(&c, f, 0.06, 48);
  CHECK(c.share() == 0.0);
  CHECK(wait_share == 0.0);
}

TEST_CASE("a consumer that slows down (heavier model, evaluation) brings the share from its floor to 0",
          "[placement]") {
  Feed f;
  PlacementController c(0.0);
  Run(&c, f, 0.022, 150);  // needs the engines: the share settles above 0 (next test)
  const double settled = c.share();
  CHECK(settled > 0.2);
  Run(&c, f, 0.06, 30);  // now the host threads alone keep up
  INFO("settled at " << settled);
  CHECK(c.share() == 0.0);
}

TEST_CASE("model-bound needing the engines: the share settles near the least that keeps the consumer fed",
          "[placement]") {
  Feed f;
  const double work = 0.022;  // 11,600 images/s: more than the host threads alone decode
  // The least share at which the host side keeps up: B(1-s)/H + 0.002 <= work.
  const double least = 1 - (work - 0.002) * f.host / f.batch;
  PlacementController c(0.0);
  const double wait_share = Run(&c, f, work, 150, 50);
  INFO("share " << c.share() << " least " << least << " wait share " << wait_share);
  CHECK(c.share() > least - 0.05);
  CHECK(c.share() < least + 0.2);
  CHECK(wait_share < 0.05);
}

TEST_CASE("a consumer that holds the ring (its GPU work is the bottleneck) does not raise the share",
          "[placement]") {
  PlacementController c(0.5);
  for (int i = 0; i < 10; ++i) c.Observe(/*wait*/ 0.01, /*step*/ 0.05, /*prepare*/ 0.02, /*acquire*/ 0.03, 0.01);
  CHECK(c.share() < 0.5);
}

TEST_CASE("the CUDA backend joins only when the consumer waits with every image on the engines", "[placement]") {
  Feed f;
  f.engines = 1e6;  // the engines outrun the host by far: the balance is past 1
  PlacementController c(0.9);
  Run(&c, f, 0.001, 10);
  CHECK(c.share() == 1.0);
  CHECK(c.cuda_on());
  Run(&c, f, 1.0, 3);  // a slow consumer: no wait, so no SM work
  CHECK_FALSE(c.cuda_on());
}
