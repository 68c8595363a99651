// Tests of `pipe:CMD` tar shards: a shard streamed from a shell command's
// standard output, read in order only.
#include <catch2/catch.hpp>
#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "shardkit/shardkit.h"
#include "support.h"

using namespace shardkit;
using sk_test::Q;
using sk_test::TempDir;

namespace {

// (key, [(ext, bytes)...]) of every sample, in order.
using Flat = std::vector<std::pair<std::string, std::vector<std::pair<std::string, std::string>>>>;

Result<Flat> ReadAll(const std::string& address) {
  SK_ASSIGN_OR_RETURN(auto ds, Open(address));
  SK_ASSIGN_OR_RETURN(auto rd, ds->NewReader());
  Flat out;
  Sample s;
  for (;;) {
    SK_ASSIGN_OR_RETURN(bool more, rd->Next(&s));
    if (!more) break;
    std::vector<std::pair<std::string, std::string>> f;
    for (const auto& x : s.fields) f.emplace_back(x.ext, x.data.str());
    out.emplace_back(s.key, std::move(f));
  }
  return out;
}

// Two shards of 6 samples each (3 classes x 4 images), written by shardkit.
struct Shards {
  TempDir d;
  std::string a, b;
  Shards() {
    sk_test::MakeImageFolder(d / "imgs", 3, 4);
    WriteOptions o;
    o.samples_per_shard = 6;
    auto in = Open(d / "imgs");
    REQUIRE(in.ok());
    auto w = Create("wds:" + (d / "s-%06d.tar"), o);
    REQUIRE(w.ok());
    auto rd = (*in)->NewReader();
    REQUIRE(rd.ok());
    Sample s;
    while (*(*rd)->Next(&s)) REQUIRE((*w)->Write(s).ok());
    REQUIRE((*w)->Finish().ok());
    a = d / "s-000000.tar";
    b = d / "s-000001.tar";
  }
};

// Whether process `pid` has ended, waiting up to 3 s. A grandchild whose shell
// is gone is reaped by init, which in a container may never happen: a zombie
// counts as ended.
bool Ended(pid_t pid) {
  for (int i = 0; i < 300; ++i) {
    if (::kill(pid, 0) != 0 && errno == ESRCH) return true;
    std::ifstream st("/proc/" + std::to_string(pid) + "/stat");
    std::string line;
    if (std::getline(st, line)) {
      size_t paren = line.rfind(')');
      if (paren != std::string::npos && paren + 2 < line.size() && line[paren + 2] == 'Z') return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

pid_t ReadPid(const std::string& path) {
  for (int i = 0; i < 300; ++i) {
    std::ifstream f(path);
    long v = 0;
    if (f >> v && v > 0) return pid_t(v);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return -1;
}

}  // namespace

TEST_CASE("pipe: shard reads the same samples as the file, in order", "[wds][pipe]") {
  Shards s;
  auto want = ReadAll(s.a);
  REQUIRE(want.ok());
  REQUIRE(want->size() == 6);
  auto got = ReadAll("pipe:cat " + Q(s.a));
  INFO(got.status().ToString());
  REQUIRE(got.ok());
  CHECK(*got == *want);
  // The scheme may be given; the command is not run at open.
  auto ds = Open("wds:pipe:cat " + Q(s.a));
  REQUIRE(ds.ok());
  CHECK((*ds)->info().format == "wds");
  CHECK_FALSE((*ds)->info().num_samples.has_value());
  auto never = Open("pipe:touch " + Q(s.d / "ran"));
  REQUIRE(never.ok());
  CHECK_FALSE(std::ifstream(s.d / "ran").good());
  // Through a real stream filter: gzip and back.
  REQUIRE(sk_test::Run("gzip -c " + Q(s.a) + " > " + Q(s.d / "a.tar.gz")).exit_code == 0);
  got = ReadAll("pipe:gzip -dc " + Q(s.d / "a.tar.gz"));
  REQUIRE(got.ok());
  CHECK(*got == *want);
}

TEST_CASE("pipe: shards in :: lists and brace ranges, mixed with files", "[wds][pipe]") {
  Shards s;
  auto a = ReadAll(s.a), b = ReadAll(s.b);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  Flat both = *a;
  both.insert(both.end(), b->begin(), b->end());
  auto got = ReadAll("pipe:cat " + s.a + "::pipe:cat " + s.b);
  REQUIRE(got.ok());
  CHECK(*got == both);
  got = ReadAll("pipe:cat " + (s.d / "s-{000000..000001}.tar"));  // one command per shard
  REQUIRE(got.ok());
  CHECK(*got == both);
  got = ReadAll(s.a + "::pipe:cat " + s.b);
  REQUIRE(got.ok());
  CHECK(*got == both);
}

TEST_CASE("pipe: shard has no random access, and says so", "[wds][pipe]") {
  Shards s;
  std::string addr = "pipe:cat " + s.a;
  auto ds = Open(addr);
  REQUIRE(ds.ok());
  auto ra = (*ds)->NewRandomAccess();
  REQUIRE_FALSE(ra.ok());
  CHECK(ra.status().code() == Code::kUnsupported);
  CHECK(ra.status().where().file == addr);
  CHECK(ra.status().ToString().find("random access") != std::string::npos);
  // A list with one streamed shard has none either.
  ds = Open(s.a + "::" + addr);
  REQUIRE(ds.ok());
  CHECK((*ds)->NewRandomAccess().status().code() == Code::kUnsupported);
}

TEST_CASE("pipe: a failed command is an error naming it, never a short dataset", "[wds][pipe]") {
  Shards s;
  struct Case {
    std::string cmd;
    Code code;
    std::string says;
  };
  std::vector<Case> cases = {
      {"cat " + (s.d / "missing.tar"), Code::kIOError, "exit status 1"},
      {"cat " + s.a + "; exit 3", Code::kIOError, "exit status 3"},  // the whole tar, then a failure
      {"kill -9 $$", Code::kIOError, "signal 9"},
      {"echo hello", Code::kCorrupt, "truncated tar header"},
      {"head -c 1024 /dev/zero | tr '\\0' x", Code::kCorrupt, "not a tar"},
      {fmt::format("head -c {} {}", std::filesystem::file_size(s.a) / 2, s.a), Code::kCorrupt, "truncated"},
      {fmt::format("head -c {} {}", std::filesystem::file_size(s.a) - 1024, s.a), Code::kCorrupt, "end-of-archive"},
      {"cat " + s.a + " " + s.a, Code::kCorrupt, "trailing garbage"},
      {"true", Code::kCorrupt, "wrote nothing"},
  };
  for (const auto& c : cases) {
    std::string addr = "pipe:" + c.cmd;
    INFO(addr);
    auto r = ReadAll(addr);
    REQUIRE_FALSE(r.ok());
    INFO(r.status().ToString());
    CHECK(r.status().code() == c.code);
    CHECK(r.status().where().file == addr);
    CHECK(r.status().where().shard == 0);
    CHECK(r.status().message().find(c.says) != std::string::npos);
  }
  // The error comes after the samples that were read, and stays.
  auto ds = Open("pipe:cat " + s.a + "; exit 3");
  REQUIRE(ds.ok());
  auto rd = (*ds)->NewReader();
  REQUIRE(rd.ok());
  Sample x;
  int n = 0;
  Result<bool> more = true;
  while ((more = (*rd)->Next(&x)).ok() && *more) ++n;
  CHECK(n == 6);
  REQUIRE_FALSE(more.ok());
  CHECK_FALSE((*rd)->Next(&x).ok());
  CHECK(Open("pipe:").status().code() == Code::kInvalidArgument);
}

TEST_CASE("pipe: a damaged shard gives the same error streamed as mapped", "[wds][pipe]") {
  // One tar scanner for both: the same code, message and offset. (A mapped
  // shard without an index is scanned whole at Open(), so its error comes
  // first; a streamed one yields the samples before the damage first.)
  Shards s;
  std::string good = sk_test::ReadFile(s.a);
  auto flip = [&](size_t at) {
    std::string b = good;
    b[at] ^= 0x01;
    return b;
  };
  size_t third = good.find("c0/img2.");  // the first member header of the third sample
  REQUIRE(third != std::string::npos);
  REQUIRE(third % 512 == 0);
  struct Case {
    std::string name, bytes;
  };
  std::vector<Case> cases = {
      {"flipped header byte", flip(third + 1)},
      {"truncated body", good.substr(0, third + 512 + 100)},
      {"truncated header", good.substr(0, third + 100)},
      {"no end blocks", good.substr(0, good.size() - 1024 * 2)},
      {"trailing garbage", good + "x"},
  };
  for (const auto& c : cases) {
    INFO(c.name);
    std::string path = s.d / "damaged.tar";
    sk_test::WriteFile(path, c.bytes);
    auto read_some = [](const std::string& address, size_t* n) -> Status {
      auto ds = Open(address);
      if (!ds.ok()) return ds.status();
      auto rd = (*ds)->NewReader();
      REQUIRE(rd.ok());
      Sample x;
      for (*n = 0;; ++*n) {
        auto m = (*rd)->Next(&x);
        if (!m.ok()) return m.status();
        if (!*m) return Status::OK();
      }
    };
    size_t n_map = 0, n_pipe = 0;
    Status mapped = read_some(path, &n_map);
    Status piped = read_some("pipe:cat " + Q(path), &n_pipe);
    INFO("mapped: " << mapped.ToString() << "\npiped: " << piped.ToString());
    REQUIRE_FALSE(mapped.ok());
    REQUIRE_FALSE(piped.ok());
    CHECK(piped.code() == Code::kCorrupt);
    CHECK(piped.where().offset >= 0);
    CHECK(piped.code() == mapped.code());
    CHECK(piped.message() == mapped.message());
    CHECK(piped.where().offset == mapped.where().offset);
    CHECK(n_map == 0);
  }
}

TEST_CASE("pipe: the command is reaped at the end and stopped when the reader goes early", "[wds][pipe]") {
  Shards s;
  {
    // Read to the end: the shell has exited and is reaped (not a zombie).
    auto ds = Open("pipe:echo $$ > " + Q(s.d / "pid1") + "; cat " + Q(s.a));
    REQUIRE(ds.ok());
    auto rd = (*ds)->NewReader();
    REQUIRE(rd.ok());
    Sample x;
    while (true) {
      auto m = (*rd)->Next(&x);
      REQUIRE(m.ok());
      if (!*m) break;
    }
    pid_t pid = ReadPid(s.d / "pid1");
    REQUIRE(pid > 0);
    CHECK((::kill(pid, 0) != 0 && errno == ESRCH));
  }
  {
    // Destroyed after one sample, while the shell and a child of it still run.
    auto ds = Open("pipe:echo $$ > " + Q(s.d / "pid2") + "; sleep 60 & echo $! > " + Q(s.d / "pid3") + "; cat " +
                   Q(s.a) + "; sleep 60");
    REQUIRE(ds.ok());
    auto rd = (*ds)->NewReader();
    REQUIRE(rd.ok());
    Sample x;
    auto m = (*rd)->Next(&x);
    REQUIRE(m.ok());
    REQUIRE(*m);
    pid_t sh = ReadPid(s.d / "pid2"), bg = ReadPid(s.d / "pid3");
    REQUIRE(sh > 0);
    REQUIRE(bg > 0);
    auto t0 = std::chrono::steady_clock::now();
    rd->reset();
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(2));
    CHECK((::kill(sh, 0) != 0 && errno == ESRCH));  // killed and reaped
    CHECK(Ended(bg));                                 // its process group went too
    // Fields read before stay valid: they own their bytes.
    auto want = ReadAll(s.a);
    REQUIRE(want.ok());
    REQUIRE(x.fields.size() == (*want)[0].second.size());
    for (size_t i = 0; i < x.fields.size(); ++i) CHECK(x.fields[i].data.str() == (*want)[0].second[i].second);
  }
}

TEST_CASE("shardkit convert 'pipe:cat x.tar' out.lmdb round-trips", "[wds][pipe][cli]") {
  Shards s;
  auto r = sk_test::Cli("convert " + Q("pipe:cat " + s.a) + " " + Q(s.d / "out.lmdb"));
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  auto want = ReadAll(s.a);
  auto got = ReadAll(s.d / "out.lmdb");
  REQUIRE(want.ok());
  REQUIRE(got.ok());
  CHECK(*got == *want);
  // A failing command fails the conversion and leaves no output.
  r = sk_test::Cli("convert " + Q("pipe:cat " + s.a + "; exit 4") + " " + Q(s.d / "bad.lmdb"));
  CHECK(r.exit_code != 0);
  CHECK(r.err.find("exit status 4") != std::string::npos);
  CHECK_FALSE(std::filesystem::exists(s.d / "bad.lmdb"));
  r = sk_test::Cli("info --count " + Q("pipe:cat " + s.a));
  CHECK(r.exit_code == 0);
  CHECK(r.out.find("samples: 6") != std::string::npos);
}
