#include <catch2/catch.hpp>
#include <sched.h>

#include <filesystem>
#include <set>
#include <thread>

#include "core/cores.h"
#include "io/file.h"
#include "core/paths.h"
#include "core/per_thread.h"
#include "shardkit/shardkit.h"
#include "fault_fs.h"
#include "support.h"

using namespace shardkit;

TEST_CASE("Status carries code, message and location", "[core]") {
  Status s = Status::Corrupt("truncated member", Location{.file = "a.tar", .offset = 512, .key = "x/y"});
  CHECK_FALSE(s.ok());
  CHECK(s.code() == Code::kCorrupt);
  CHECK(s.ToString() == "corrupt: file 'a.tar', offset 512, key 'x/y': truncated member");
  s.At(Location{.file = "other", .shard = 3});
  CHECK(s.where().file == "a.tar");
  CHECK(s.where().shard == 3);
  CHECK(Status::OK().ToString() == "ok");
}

TEST_CASE("Result holds a value or a status", "[core]") {
  auto f = [](bool good) -> Result<std::unique_ptr<int>> {
    if (!good) return Status::NotFound("nope");
    return std::make_unique<int>(7);
  };
  auto a = f(true);
  REQUIRE(a.ok());
  CHECK(**a == 7);
  auto b = f(false);
  CHECK_FALSE(b.ok());
  CHECK(b.status().code() == Code::kNotFound);
  auto g = [&]() -> Status {
    SK_ASSIGN_OR_RETURN(auto v, f(false));
    (void)v;
    return Status::OK();
  };
  CHECK(g().code() == Code::kNotFound);
}

TEST_CASE("Sample keeps fields sorted and parses labels", "[core]") {
  Sample s;
  s.key = "k";
  s.set("jpg", Bytes::Copy("abc"));
  s.set("cls", Bytes::Copy("12\n"));
  s.set("json", Bytes::Copy("{}"));
  REQUIRE(s.fields.size() == 3);
  CHECK(s.fields[0].ext == "cls");
  CHECK(s.fields[1].ext == "jpg");
  CHECK(s.fields[2].ext == "json");
  CHECK(s.label() == 12);
  CHECK(s.image()->ext == "jpg");
  s.set("cls", Bytes::Copy("x1"));
  CHECK_FALSE(s.label().has_value());
  uint64_t h1 = s.checksum();
  s.set("jpg", Bytes::Copy("abd"));
  CHECK(s.checksum() != h1);
  s.erase("jpg");
  CHECK(s.find("jpg") == nullptr);
  CHECK(s.bytes() == 4);
}

TEST_CASE("Brace expansion and shard patterns", "[core]") {
  auto r = paths::ExpandBraces("a/t-{008..011}.tar::b.tar");
  REQUIRE(r.ok());
  CHECK(*r == std::vector<std::string>{"a/t-008.tar", "a/t-009.tar", "a/t-010.tar", "a/t-011.tar", "b.tar"});
  CHECK_FALSE(paths::ExpandBraces("a-{1..x}.tar").ok());
  CHECK_FALSE(paths::ExpandBraces("a-{3..1}.tar").ok());
  // 20 digits: refused, not an uncaught std::out_of_range from std::stoull.
  CHECK_FALSE(paths::ExpandBraces("a-{0..99999999999999999999}.tar").ok());
  CHECK(paths::CheckShardPattern("out/train-%06d.tar").ok());
  CHECK(paths::FormatShardPattern("out/train-%06d.tar", 42) == "out/train-000042.tar");
  CHECK(paths::FormatShardPattern("x%%-%d", 5) == "x%-5");
  auto bad = paths::CheckShardPattern("out/train.tar");
  CHECK(bad.code() == Code::kInvalidArgument);
  CHECK(bad.message().find("%06d") != std::string::npos);
  CHECK_FALSE(paths::CheckShardPattern("a-%d-%d.tar").ok());
  CHECK_FALSE(paths::CheckShardPattern("a-%s.tar").ok());
}

TEST_CASE("Unsafe keys are refused", "[core]") {
  CHECK(paths::CheckSafeKey("n01/img_1").ok());
  CHECK_FALSE(paths::CheckSafeKey("../x").ok());
  CHECK_FALSE(paths::CheckSafeKey("a/../../x").ok());
  CHECK_FALSE(paths::CheckSafeKey("/etc/passwd").ok());
  CHECK_FALSE(paths::CheckSafeKey("a//b").ok());
  CHECK_FALSE(paths::CheckSafeKey("").ok());
}

TEST_CASE("AtomicFile appears only on commit", "[core][io]") {
  sk_test::TempDir d;
  std::string p = d / "sub/out.bin";
  {
    auto f = io::AtomicFile::Create(p, false);
    REQUIRE(f.ok());
    REQUIRE((*f)->Write("hello").ok());
    CHECK_FALSE(io::Exists(p));
  }
  CHECK_FALSE(io::Exists(p));  // destroyed without commit: nothing left
  CHECK(std::filesystem::is_empty(d / "sub"));
  auto f = io::AtomicFile::Create(p, false);
  REQUIRE(f.ok());
  REQUIRE((*f)->Write("hello").ok());
  REQUIRE((*f)->Commit().ok());
  CHECK(sk_test::ReadFile(p) == "hello");
  CHECK(io::AtomicFile::Create(p, false).status().code() == Code::kAlreadyExists);
}

TEST_CASE("AtomicFile reports injected write and fsync failures", "[core][io]") {
  sk_test::TempDir d;
  std::string p = d / "x.bin";
  for (std::string op : {"write", "fsync"}) {
    auto faults = sk_test::FaultFs([op](const std::string&, std::string_view o) { return o == op ? ENOSPC : 0; });
    auto f = io::AtomicFile::Create(p, true, faults);
    REQUIRE(f.ok());
    Status s = (*f)->Write("data");
    if (s.ok()) s = (*f)->Commit();
    CHECK(s.code() == Code::kIOError);
    CHECK(s.ToString().find("No space left") != std::string::npos);
    CHECK(s.where().file == p);
    f->reset();
    CHECK_FALSE(io::Exists(p));
  }
}

TEST_CASE("Unknown addresses give a clear error", "[core]") {
  auto r = Open("/nonexistent/thing.xyz");
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().message().find("/nonexistent/thing.xyz") != std::string::npos);
  auto names = FormatNames();
  CHECK(names == std::vector<std::string>{"folder", "wds", "lmdb", "hdf5", "mds", "recordio", "tfrecord"});
}

// core::PerThread (the per-thread owner of zero-copy views): one slot per thread,
// the same slot on every call of that thread, a slot of an exited thread reused,
// and views that outlive the object keep their target alive, never longer.
TEST_CASE("PerThreadViewOwner: a control block per thread, reused, released with the views", "[core]") {
  auto target = std::make_shared<int>(42);
  std::weak_ptr<int> watch = target;
  std::shared_ptr<const void> kept;
  {
    core::PerThreadViewOwner owner(target);
    target.reset();  // the owner keeps it
    std::shared_ptr<const void> a = owner.Owner(), b = owner.Owner();
    CHECK(a.get() != nullptr);
    CHECK(!a.owner_before(b));  // same control block on one thread
    CHECK(!b.owner_before(a));
    CHECK(owner.slots() == 1);
    std::shared_ptr<const void> other;
    std::thread([&] { other = owner.Owner(); }).join();
    CHECK((a.owner_before(other) || other.owner_before(a)));  // another thread: another block
    CHECK(owner.slots() == 2);
    // That thread exited: the next new thread reuses its slot instead of making one.
    std::shared_ptr<const void> third;
    std::thread([&] { third = owner.Owner(); }).join();
    CHECK(owner.slots() == 2);
    CHECK(!third.owner_before(other));
    CHECK(!other.owner_before(third));
    // 8 threads at once get 8 different blocks.
    std::vector<std::shared_ptr<const void>> got(8);
    std::vector<std::thread> ts;
    std::atomic<int> ready{0};
    for (int t = 0; t < 8; ++t)
      ts.emplace_back([&, t] {
        got[t] = owner.Owner();
        ready.fetch_add(1);
        while (ready.load() < 8) std::this_thread::yield();  // all alive together
      });
    for (auto& t : ts) t.join();
    for (int i = 0; i < 8; ++i)
      for (int j = i + 1; j < 8; ++j) CHECK((got[i].owner_before(got[j]) || got[j].owner_before(got[i])));
    CHECK(owner.slots() == 9);  // main + the reused one + 7 new
    kept = a;
    CHECK(!watch.expired());
  }
  // The object is gone; a view's owner still keeps the target alive.
  CHECK(!watch.expired());
  kept.reset();
  CHECK(watch.expired());
}

TEST_CASE("UsableCores counts the CPU affinity mask, not the machine") {
  cpu_set_t mine;
  CPU_ZERO(&mine);
  REQUIRE(sched_getaffinity(0, sizeof mine, &mine) == 0);
  CHECK(shardkit::core::UsableCores() == CPU_COUNT(&mine));
  // sched_setaffinity(0) pins the calling thread only: do it on a thread of our own.
  int pinned = 0;
  std::thread t([&] {
    int first = 0;
    while (!CPU_ISSET(first, &mine)) ++first;
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(first, &one);
    if (sched_setaffinity(0, sizeof one, &one) == 0) pinned = shardkit::core::UsableCores();
  });
  t.join();
  CHECK(pinned == 1);
}
