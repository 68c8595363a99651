// Atomic and resumable writes: a write killed (SIGKILL) or failed (ENOSPC, EIO)
// at many points, then resumed with WriteOptions::resume, gives the very bytes
// of an uninterrupted write; a resume refuses a different source or options.
#include <catch2/catch.hpp>
#include <fmt/format.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>

#include "io/file.h"
#include "formats/lmdb/lmdb.h"
#include "shardkit/shardkit.h"
#include "fault_fs.h"
#include "support.h"

using namespace shardkit;
using sk_test::TempDir;
using sk_test::DataOp;
using sk_test::FaultFs;
namespace fs = std::filesystem;

namespace {

std::vector<Sample> MakeSamples(int n, uint32_t seed = 1) {
  std::vector<Sample> out;
  for (int i = 0; i < n; ++i) {
    Sample s;
    s.key = fmt::format("c{}/img{:04d}", i % 3, i);
    s.set("jpg", Bytes::Take(sk_test::MakeJpeg(16 + int((i + seed) % 9), 12, uint32_t(i) + seed)));
    s.set_label(i % 3);
    if (i % 2) s.set("json", Bytes::Take(fmt::format("{{\"i\": {}}}", i)));
    out.push_back(std::move(s));
  }
  return out;
}

// Every file of a directory (hidden ones too) -> its bytes.
std::map<std::string, std::string> Snapshot(const std::string& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::directory_iterator(dir))
    out[e.path().filename().string()] = sk_test::ReadFile(e.path().string());
  return out;
}

std::vector<std::string> Names(const std::map<std::string, std::string>& m) {
  std::vector<std::string> v;
  for (const auto& [k, _] : m) v.push_back(k);
  return v;
}

// Writes all samples; the first error (if any) is returned.
Status WriteAll(const std::string& address, const std::vector<Sample>& samples, const WriteOptions& opts) {
  auto w = Create(address, opts);
  if (!w.ok()) return w.status();
  for (const auto& s : samples) SK_RETURN_IF_ERROR((*w)->Write(s));
  return (*w)->Finish().status();
}

WriteOptions Opts(bool resume = false) {
  WriteOptions o;
  o.samples_per_shard = 3;
  o.class_names = {"a", "b", "c"};
  o.resume = resume;
  return o;
}

// Runs a write in a child process that SIGKILLs itself at the n-th operation
// of the file layer (a write or an fsync of a shard, an index, the journal, the
// manifest or a directory). Returns true if the child was killed, false if it
// finished first.
bool KillAt(const std::string& address, const std::vector<Sample>& samples, const WriteOptions& opts, int n) {
  pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    int ops = 0;
    WriteOptions o = opts;
    o.filesystem = FaultFs([&](const std::string&, std::string_view op) {
      if (DataOp(op) && ++ops == n) ::raise(SIGKILL);
      return 0;
    });
    Status st = WriteAll(address, samples, o);
    ::_exit(st.ok() ? 0 : 3);
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  if (WIFSIGNALED(status)) {
    REQUIRE(WTERMSIG(status) == SIGKILL);
    return true;
  }
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  return false;
}

}  // namespace

TEST_CASE("resume: a wds write killed at every file operation resumes to the same bytes", "[resume]") {
  TempDir t;
  auto samples = MakeSamples(14);  // 5 shards of 3, 3, 3, 3, 2
  REQUIRE(WriteAll(t / "ref/x-%06d.tar", samples, Opts()).ok());
  auto ref = Snapshot(t / "ref");
  REQUIRE(Names(ref) == std::vector<std::string>{"x-000000.idx", "x-000000.tar", "x-000000.tar.xxh3",
                                                 "x-000001.idx", "x-000001.tar", "x-000001.tar.xxh3",
                                                 "x-000002.idx", "x-000002.tar", "x-000002.tar.xxh3",
                                                 "x-000003.idx", "x-000003.tar", "x-000003.tar.xxh3",
                                                 "x-000004.idx", "x-000004.tar", "x-000004.tar.xxh3",
                                                 "x.manifest.json"});
  int killed = 0;
  for (int n = 1;; ++n) {
    std::string dir = t / fmt::format("k{}", n);
    if (!KillAt(dir + "/x-%06d.tar", samples, Opts(), n)) break;
    ++killed;
    INFO("killed at file operation " << n);
    const bool journal = io::Exists(dir + "/x.manifest.json.partial");
    if (!journal && io::Exists(dir + "/x.manifest.json")) {
      // Killed after the manifest and the journal's removal: complete already.
      CHECK(Snapshot(dir) == ref);
      continue;
    }
    if (journal) {
      // A plain rerun refuses and points to --resume.
      auto again = Create(dir + "/x-%06d.tar", Opts());
      REQUIRE_FALSE(again.ok());
      CHECK(again.status().message().find("--resume") != std::string::npos);
    }
    // Resume, sometimes killed again a few operations later, then resume to the end.
    if (n % 4 == 0) (void)KillAt(dir + "/x-%06d.tar", samples, Opts(true), 3);
    Status st = WriteAll(dir + "/x-%06d.tar", samples, Opts(true));
    INFO(st.ToString());
    REQUIRE(st.ok());
    auto got = Snapshot(dir);
    CHECK(Names(got) == Names(ref));
    CHECK(got == ref);
    auto ds = Open(dir + "/x.manifest.json");
    REQUIRE(ds.ok());
    CHECK((*ds)->info().num_samples == 14u);
  }
  CHECK(killed > 20);  // every shard's write, fsync, rename, index, checksums and journal
}

TEST_CASE("resume: disk full and I/O errors leave a resumable state", "[resume]") {
  TempDir t;
  auto samples = MakeSamples(11);
  REQUIRE(WriteAll(t / "ref/x-%06d.tar", samples, Opts()).ok());
  auto ref = Snapshot(t / "ref");
  for (int err : {ENOSPC, EIO, EDQUOT}) {
    for (int n = 1; n < 40; n += 3) {
      std::string dir = t / fmt::format("e{}-{}", err, n);
      int ops = 0;
      WriteOptions o = Opts();
      o.filesystem = FaultFs([&](const std::string&, std::string_view op) { return DataOp(op) && ++ops == n ? err : 0; });
      Status st = WriteAll(dir + "/x-%06d.tar", samples, o);
      if (st.ok()) break;  // n is past the last operation
      INFO(st.ToString());
      CHECK(st.code() == Code::kIOError);
      CHECK_FALSE(st.where().file.empty());
      CHECK(st.message().find(std::strerror(err)) != std::string::npos);
      if (n > 1) CHECK(st.message().find("--resume") != std::string::npos);  // n == 1: the journal itself
      CHECK_FALSE(io::Exists(dir + "/x.manifest.json"));
      // No temporary file is left behind.
      for (const auto& [name, _] : Snapshot(dir)) CHECK(name.find(".tmp-") == std::string::npos);
      if (n > 1) {
        REQUIRE(WriteAll(dir + "/x-%06d.tar", samples, Opts(true)).ok());
        CHECK(Snapshot(dir) == ref);
      }
    }
  }
}

TEST_CASE("resume: refuses a different source, different options, or changed shards", "[resume]") {
  TempDir t;
  auto samples = MakeSamples(10);
  std::string pat = t / "o/x-%06d.tar";
  auto interrupted = [&] {
    fs::remove_all(t / "o");
    int ops = 0;
    // ENOSPC on the 3rd shard's data: shards 0 and 1 complete.
    WriteOptions o = Opts();
    o.filesystem = FaultFs([&](const std::string& p, std::string_view op) {
      return op == "write" && p.find("x-000002.tar") != std::string::npos && ++ops == 1 ? ENOSPC : 0;
    });
    Status st = WriteAll(pat, samples, o);
    REQUIRE(st.code() == Code::kIOError);
    REQUIRE(io::Exists(t / "o/x-000001.tar"));
  };

  SECTION("a sample changed in a committed shard") {
    interrupted();
    auto other = samples;
    other[4].set("json", Bytes::Take("{\"changed\": true}"));
    Status st = WriteAll(pat, other, Opts(true));
    INFO(st.ToString());
    CHECK(st.code() == Code::kInvalidArgument);
    CHECK(st.message().find("shard 1") != std::string::npos);
    CHECK(st.where().file.find("x-000001.tar") != std::string::npos);
    // The state stays resumable with the right source.
    REQUIRE(WriteAll(pat, samples, Opts(true)).ok());
  }
  SECTION("a different order") {
    interrupted();
    auto other = samples;
    std::swap(other[0], other[1]);
    Status st = WriteAll(pat, other, Opts(true));
    CHECK(st.code() == Code::kInvalidArgument);
    CHECK(st.message().find("shard 0") != std::string::npos);
  }
  SECTION("a shorter source") {
    interrupted();
    Status st = WriteAll(pat, std::vector<Sample>(samples.begin(), samples.begin() + 4), Opts(true));
    CHECK(st.code() == Code::kInvalidArgument);
    CHECK(st.message().find("ended after 4 samples") != std::string::npos);
  }
  SECTION("different options") {
    interrupted();
    WriteOptions o = Opts(true);
    o.samples_per_shard = 4;
    Status st = WriteAll(pat, samples, o);
    CHECK(st.code() == Code::kInvalidArgument);
    CHECK(st.message().find("samples_per_shard") != std::string::npos);
    CHECK(st.where().file.find("x.manifest.json.partial") != std::string::npos);
  }
  SECTION("a committed shard damaged or removed since") {
    interrupted();
    std::string bytes = sk_test::ReadFile(t / "o/x-000001.tar");
    bytes[700] ^= 1;
    sk_test::WriteFile(t / "o/x-000001.tar", bytes);
    Status st = WriteAll(pat, samples, Opts(true));
    CHECK(st.code() == Code::kCorrupt);
    CHECK(st.where().file.find("x-000001.tar") != std::string::npos);
    CHECK(st.message().find("checksum") != std::string::npos);
    fs::remove(t / "o/x-000000.tar");
    st = WriteAll(pat, samples, Opts(true));
    CHECK(st.code() == Code::kCorrupt);
    CHECK(st.where().file.find("x-000000.tar") != std::string::npos);
    // --overwrite starts over.
    WriteOptions o = Opts();
    o.overwrite = true;
    REQUIRE(WriteAll(pat, samples, o).ok());
    CHECK_FALSE(io::Exists(t / "o/x.manifest.json.partial"));
  }
  SECTION("a committed shard's index or checksum file torn since (a remote output's staging is not synced)") {
    interrupted();
    for (std::string side : {"o/x-000001.idx", "o/x-000000.tar.xxh3"}) {
      INFO(side);
      const std::string good = sk_test::ReadFile(t / side);
      REQUIRE(good.size() > 10);
      sk_test::WriteFile(t / side, std::string(good.size(), '\0'));  // what a crash leaves: the size, no data
      Status st = WriteAll(pat, samples, Opts(true));
      INFO(st.ToString());
      CHECK(st.code() == Code::kCorrupt);
      CHECK(st.where().file == t / side);
      CHECK(st.message().find("differs from the journal") != std::string::npos);
      sk_test::WriteFile(t / side, good);
    }
    REQUIRE(WriteAll(pat, samples, Opts(true)).ok());
  }
  SECTION("resume without a journal starts from scratch; a finished write leaves none") {
    Status st = WriteAll(t / "n/x-%06d.tar", samples, Opts(true));
    REQUIRE(st.ok());
    CHECK_FALSE(io::Exists(t / "n/x.manifest.json.partial"));
    // Resuming a complete output: it exists.
    st = WriteAll(t / "n/x-%06d.tar", samples, Opts(true));
    CHECK(st.code() == Code::kAlreadyExists);
  }
  SECTION("a resumable writer destroyed unfinished keeps its shards; a plain one does not") {
    {
      auto w = Create(t / "r/x-%06d.tar", Opts(true));
      REQUIRE(w.ok());
      for (int i = 0; i < 7; ++i) REQUIRE((*w)->Write(samples[i]).ok());
    }
    CHECK(io::Exists(t / "r/x-000001.tar"));
    CHECK(io::Exists(t / "r/x.manifest.json.partial"));
    {
      auto w = Create(t / "p/x-%06d.tar", Opts(false));
      REQUIRE(w.ok());
      for (int i = 0; i < 7; ++i) REQUIRE((*w)->Write(samples[i]).ok());
    }
    CHECK(fs::is_empty(t / "p"));
  }
}

namespace {

// Every sample of a dataset, in order, as (key, checksum).
std::vector<std::pair<std::string, uint64_t>> Contents(const std::string& address) {
  std::vector<std::pair<std::string, uint64_t>> out;
  auto ds = Open(address);
  INFO(address << ": " << ds.status().ToString());
  REQUIRE(ds.ok());
  auto r = (*ds)->NewReader();
  REQUIRE(r.ok());
  Sample s;
  for (;;) {
    auto more = (*r)->Next(&s);
    REQUIRE(more.ok());
    if (!*more) break;
    out.emplace_back(s.key, s.checksum());
  }
  return out;
}

}  // namespace

TEST_CASE("resume: an lmdb write killed at every file operation resumes to the same samples", "[resume]") {
  TempDir t;
  formats::lmdb::SetBatchSamplesForTest(4);
  for (std::string layout : {"shardkit", "caffe"}) {
    auto samples = MakeSamples(18);
    if (layout == "caffe")  // one image and a label
      for (auto& s : samples) s.erase("json");
    WriteOptions o;
    o.format_options["lmdb.layout"] = layout;
    o.class_names = {"a", "b", "c"};
    REQUIRE(WriteAll(t / (layout + "-ref.lmdb"), samples, o).ok());
    auto ref = Contents(t / (layout + "-ref.lmdb"));
    REQUIRE(ref.size() == 18);
    int killed = 0;
    for (int n = 1;; ++n) {
      std::string out = t / fmt::format("{}-k{}.lmdb", layout, n);
      WriteOptions plain = o, resume = o;
      resume.resume = true;
      if (!KillAt(out, samples, plain, n)) break;
      ++killed;
      INFO(layout << ": killed at file operation " << n);
      if (io::Exists(out)) {
        // Killed after the rename into place (the parent directory's fsync): complete.
        CHECK_FALSE(io::Exists(out + ".partial"));
        CHECK(Contents(out) == ref);
        continue;
      }
      if (io::Exists(out + ".partial/resume.json")) {
        auto again = Create(out, plain);
        REQUIRE_FALSE(again.ok());
        CHECK(again.status().message().find("--resume") != std::string::npos);
      }
      if (n % 3 == 0) (void)KillAt(out, samples, resume, 2);
      Status st = WriteAll(out, samples, resume);
      INFO(st.ToString());
      REQUIRE(st.ok());
      CHECK(Contents(out) == ref);
      CHECK_FALSE(io::Exists(out + ".partial"));
      CHECK_FALSE(io::Exists(out + "/resume.json"));
    }
    CHECK(killed > 8);
  }
  formats::lmdb::SetBatchSamplesForTest(0);
}

TEST_CASE("resume: lmdb disk full keeps the committed samples, a changed source is refused", "[resume]") {
  TempDir t;
  formats::lmdb::SetBatchSamplesForTest(4);
  auto samples = MakeSamples(18);
  REQUIRE(WriteAll(t / "ref.lmdb", samples, {}).ok());
  auto ref = Contents(t / "ref.lmdb");
  int commits = 0;
  // ENOSPC at the third commit: 8 samples committed.
  WriteOptions faulty;
  faulty.filesystem = FaultFs([&](const std::string& p, std::string_view op) {
    return op == "write" && p.find("data.mdb") != std::string::npos && ++commits == 3 ? ENOSPC : 0;
  });
  Status st = WriteAll(t / "o.lmdb", samples, faulty);
  INFO(st.ToString());
  CHECK(st.code() == Code::kIOError);
  CHECK(st.message().find("8 samples committed") != std::string::npos);
  CHECK(st.message().find("--resume") != std::string::npos);
  CHECK(io::Exists(t / "o.lmdb.partial/resume.json"));
  CHECK_FALSE(io::Exists(t / "o.lmdb"));

  WriteOptions resume;
  resume.resume = true;
  auto other = samples;
  other[5].set("json", Bytes::Take("{}"));
  st = WriteAll(t / "o.lmdb", other, resume);
  CHECK(st.code() == Code::kInvalidArgument);
  CHECK(st.message().find("first 8 samples differ") != std::string::npos);
  WriteOptions caffe = resume;
  caffe.format_options["lmdb.layout"] = "caffe";
  st = WriteAll(t / "o.lmdb", samples, caffe);
  CHECK(st.code() == Code::kInvalidArgument);
  CHECK(st.message().find("layout") != std::string::npos);
  REQUIRE(WriteAll(t / "o.lmdb", samples, resume).ok());
  CHECK(Contents(t / "o.lmdb") == ref);
  formats::lmdb::SetBatchSamplesForTest(0);
}

// ---------------------------------------------------------------------------
// Through the shardkit command.

namespace {

// A class folder of n files of `size` pseudo-random bytes (convert copies bytes; nothing decodes them).
void MakeBigFolder(const std::string& root, int n, size_t size) {
  uint64_t x = 88172645463325252ull;
  for (int i = 0; i < n; ++i) {
    std::string bytes(size, '\0');
    for (auto& c : bytes) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      c = char(x);
    }
    bytes.replace(0, 4, "\xFF\xD8\xFF\xE0");  // a JPEG's signature: a class folder takes image files only
    fs::create_directories(root + fmt::format("/c{}", i % 4));
    sk_test::WriteFile(root + fmt::format("/c{}/img{:05d}.jpg", i % 4, i), bytes);
  }
}

size_t JournalShards(const std::string& path) {
  std::string text;
  try {
    text = sk_test::ReadFile(path);
  } catch (...) {
    return 0;
  }
  size_t n = 0;
  for (size_t p = 0; (p = text.find("\"digest\"", p)) != std::string::npos; ++p) ++n;
  return n;
}

}  // namespace

TEST_CASE("resume: shardkit convert killed with SIGKILL, then --resume, equals an uninterrupted run", "[resume]") {
  TempDir t;
  MakeBigFolder(t / "in", 240, 48 << 10);
  const std::string flags = "--samples-per-shard 8 --threads 1";
  auto ref = sk_test::Cli(fmt::format("convert {} wds:{} {}", sk_test::Q(t / "in"), sk_test::Q(t / "ref/x-%06d.tar"), flags));
  INFO(ref.err);
  REQUIRE(ref.exit_code == 0);
  auto want = Snapshot(t / "ref");
  REQUIRE(want.size() == 91);  // 30 shards, 30 indexes, 30 checksum files, the manifest
  int interrupted = 0;
  for (size_t k : {1u, 7u, 19u}) {
    std::string out = t / fmt::format("k{}", k);
    std::string journal = out + "/x.manifest.json.partial";
    pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      std::string in = t / "in", dst = "wds:" + out + "/x-%06d.tar";
      ::execl(SHARDKIT_CLI, SHARDKIT_CLI, "convert", in.c_str(), dst.c_str(), "--samples-per-shard", "8", "--threads",
              "1", static_cast<char*>(nullptr));
      ::_exit(127);
    }
    // Kill it as soon as its journal lists k complete shards.
    int status = 0;
    bool exited = false;
    for (;;) {
      if (::waitpid(pid, &status, WNOHANG) == pid) {
        exited = true;
        break;
      }
      if (JournalShards(journal) >= k) {
        ::kill(pid, SIGKILL);
        REQUIRE(::waitpid(pid, &status, 0) == pid);
        break;
      }
      ::usleep(200);
    }
    if (exited) {
      WARN("the conversion finished before it could be killed at shard " << k);
      continue;
    }
    ++interrupted;
    INFO("killed after " << JournalShards(journal) << " shards");
    CHECK_FALSE(io::Exists(out + "/x.manifest.json"));
    // Without --resume: refused, pointing to --resume.
    auto plain = sk_test::Cli(fmt::format("convert {} wds:{} {}", sk_test::Q(t / "in"), sk_test::Q(out + "/x-%06d.tar"), flags));
    CHECK(plain.exit_code == 1);
    CHECK_THAT(plain.err, Catch::Contains("--resume"));
    auto res = sk_test::Cli(
        fmt::format("convert {} wds:{} {} --resume", sk_test::Q(t / "in"), sk_test::Q(out + "/x-%06d.tar"), flags));
    INFO(res.err);
    REQUIRE(res.exit_code == 0);
    CHECK(Snapshot(out) == want);
    auto v = sk_test::Cli(fmt::format("verify {} --against {}", sk_test::Q(out + "/x.manifest.json"), sk_test::Q(t / "in")));
    INFO("verify: " << v.out << v.err);
    CHECK(v.exit_code == 0);
  }
  CHECK(interrupted > 0);
}

TEST_CASE("resume: disk full on a small tmpfs: exit 1 naming the shard, then --resume on more space", "[resume]") {
  TempDir t;
  MakeBigFolder(t / "in", 96, 48 << 10);  // about 4.6 MB
  const std::string flags = "--samples-per-shard 8 --threads 1";
  auto ref = sk_test::Cli(fmt::format("convert {} wds:{} {}", sk_test::Q(t / "in"), sk_test::Q(t / "ref/x-%06d.tar"), flags));
  REQUIRE(ref.exit_code == 0);
  fs::create_directories(t / "small");
  auto m = sk_test::Run(fmt::format("mount -t tmpfs -o size=2m tmpfs {}", sk_test::Q(t / "small")));
  if (m.exit_code != 0) {
    WARN("skipped: cannot mount a tmpfs here (" << m.err << "); the ENOSPC fault-hook tests cover the library");
    return;
  }
  struct Unmount {
    std::string dir;
    ~Unmount() { (void)sk_test::Run("umount " + sk_test::Q(dir)); }
  } unmount{t / "small"};
  std::string dst = "wds:" + (t / "small/x-%06d.tar");
  auto full = sk_test::Cli(fmt::format("convert {} {} {}", sk_test::Q(t / "in"), sk_test::Q(dst), flags));
  INFO(full.err);
  CHECK(full.exit_code == 1);
  CHECK_THAT(full.err, Catch::Contains("No space left on device"));
  CHECK_THAT(full.err, Catch::Contains("--resume"));
  CHECK_THAT(full.err, Catch::Contains("small/x-0000"));
  CHECK(io::Exists(t / "small/x.manifest.json.partial"));
  CHECK_FALSE(io::Exists(t / "small/x.manifest.json"));
  for (const auto& [name, _] : Snapshot(t / "small")) CHECK(name.find(".tmp-") == std::string::npos);
  REQUIRE(sk_test::Run(fmt::format("mount -o remount,size=64m {}", sk_test::Q(t / "small"))).exit_code == 0);
  auto res = sk_test::Cli(fmt::format("convert {} {} {} --resume", sk_test::Q(t / "in"), sk_test::Q(dst), flags));
  INFO(res.err);
  REQUIRE(res.exit_code == 0);
  CHECK(Snapshot(t / "small") == Snapshot(t / "ref"));
}

namespace {

// An output of each writing format: its address, what appears when it is published,
// the names an interrupted write may keep for --resume (prefixes), and its flags.
// `opened`: the address that reads it back; `temp_name`: a name its killed writes' temporary
// files and staging directories carry ("" for LMDB, which stages in its resumable
// "<dir>.partial"); `stages`: a directory output, staged in "NAME.partial-PID-XXXXXX".
struct Output {
  const char* format;
  std::string address, published;
  std::vector<std::string> resumable;
  std::string flags, opened, temp_name;
  bool stages = false;
};
std::vector<Output> EveryOutput(const std::string& d) {
  return {
      {"wds", "wds:" + d + "/x-%06d.tar", d + "/x.manifest.json", {"x-", "x.manifest.json.partial"},
       "--samples-per-shard 5", d + "/x.manifest.json", "x-000001.tar"},
      {"tfrecord", "tfrecord:" + d + "/x-%05d.tfrecord", d + "/x.tfrecord.json", {}, "--samples-per-shard 5",
       d + "/x.tfrecord.json", "x-00002.tfrecord"},
      {"mds", "mds:" + d + "/x", d + "/x/index.json", {}, "", "mds:" + d + "/x", "x", true},
      {"lmdb", d + "/x.lmdb", d + "/x.lmdb", {"x.lmdb.partial"}, "", d + "/x.lmdb", ""},
      {"hdf5", d + "/x.h5", d + "/x.h5", {}, "", d + "/x.h5", "x.h5"},
      {"recordio", "recordio:" + d + "/x.rec", d + "/x.rec", {}, "", "recordio:" + d + "/x.rec", "x.rec"},
      {"folder", "folder:" + d + "/x", d + "/x/.shardkit-folder.json", {}, "", "folder:" + d + "/x", "x", true},
  };
}

// The entries of `dir` that are neither published output nor resumable state.
std::vector<std::string> Debris(const std::string& dir, const std::vector<std::string>& resumable) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    std::string n = e.path().filename().string();
    bool keep = false;
    for (const auto& p : resumable) keep = keep || (n.rfind(p, 0) == 0 && n.find(".tmp-") == std::string::npos);
    if (!keep) out.push_back(n);
  }
  return out;
}

// A PID that no process has now: a child that has exited and been reaped.
pid_t DeadPid() {
  pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) ::_exit(0);
  int st = 0;
  REQUIRE(::waitpid(pid, &st, 0) == pid);
  return pid;
}

}  // namespace

TEST_CASE("interrupt: SIGINT or SIGTERM stops every format cleanly, says how to resume, and --resume finishes",
          "[resume][interrupt]") {
  TempDir t;
  sk_test::MakeImageFolder(t / "in", 3, 8);  // 24 samples
  const std::string in = sk_test::Q(t / "in");
  struct Point {
    int sig;
    int at;
  };
  // Before the first sample, mid-way (mid-shard and at a shard's end), before Finish().
  for (Point p : {Point{SIGINT, 0}, Point{SIGINT, 7}, Point{SIGTERM, 10}, Point{SIGINT, 24}}) {
    std::string d = t / fmt::format("s{}-{}", p.sig, p.at);
    for (const Output& o : EveryOutput(d)) {
      INFO(o.format << ": signal " << p.sig << " before sample " << p.at);
      auto r = sk_test::Run(fmt::format("SHARDKIT_TEST_RAISE={}@{} {} convert {} {} {} --threads 1", p.sig, p.at,
                                        sk_test::Q(SHARDKIT_CLI), in, sk_test::Q(o.address), o.flags));
      INFO(r.err);
      CHECK(r.exit_code == 128 + p.sig);
      CHECK_THAT(r.err, Catch::Contains(fmt::format("interrupted by {} after {} of 24 samples",
                                                    p.sig == SIGINT ? "SIGINT" : "SIGTERM", p.at)));
      CHECK_THAT(r.err, Catch::Contains("--resume"));
      CHECK_FALSE(fs::exists(o.published));
      CHECK(Debris(d, o.resumable).empty());
      auto res = sk_test::Cli(fmt::format("convert {} {} {} --threads 1 --resume", in, sk_test::Q(o.address), o.flags));
      INFO(res.err);
      REQUIRE(res.exit_code == 0);
      CHECK(fs::exists(o.published));
      auto v = sk_test::Cli(fmt::format("verify {} --against {}", sk_test::Q(o.opened), in));
      INFO(v.out << v.err);
      CHECK(v.exit_code == 0);
      CHECK(Debris(d, {"x"}).empty());
      for (const auto& e : fs::directory_iterator(d)) {
        CHECK(e.path().filename().string().find(".tmp-") == std::string::npos);
        CHECK(e.path().filename().string().find(".partial") == std::string::npos);
      }
      fs::remove_all(d);
    }
  }
}

TEST_CASE("interrupt: after kill -9 no output looks finished, and --resume or a fresh run removes the debris",
          "[resume][interrupt]") {
  TempDir t;
  sk_test::MakeImageFolder(t / "in", 3, 8);  // 24 samples
  const std::string in = sk_test::Q(t / "in");
  for (int at : {3, 12, 24}) {
    std::string d = t / fmt::format("k{}", at);
    for (const Output& o : EveryOutput(d)) {
      INFO(o.format << ": SIGKILL before sample " << at);
      auto r = sk_test::Run(fmt::format("SHARDKIT_TEST_RAISE={}@{} {} convert {} {} {} --threads 1", SIGKILL, at,
                                        sk_test::Q(SHARDKIT_CLI), in, sk_test::Q(o.address), o.flags));
      CHECK(r.exit_code == 128 + SIGKILL);
      CHECK_FALSE(fs::exists(o.published));
      auto res = sk_test::Cli(fmt::format("convert {} {} {} --threads 1 --resume", in, sk_test::Q(o.address), o.flags));
      INFO(res.err);
      REQUIRE(res.exit_code == 0);
      CHECK(fs::exists(o.published));
      for (const auto& e : fs::directory_iterator(d)) {
        INFO(e.path());
        CHECK(e.path().filename().string().find(".tmp-") == std::string::npos);
        CHECK(e.path().filename().string().find(".partial") == std::string::npos);
      }
      fs::remove_all(d);
    }
  }
  // What a killed writer leaves where the file system has no O_TMPFILE (".x.h5.tmp-PID")
  // or in a directory output's staging ("x.partial-PID-XXXXXX") goes with the next
  // successful write; a live process's stays.
  for (const Output& o : EveryOutput(t / "stale")) {
    INFO(o.format);
    if (o.temp_name.empty()) continue;
    std::string d = t / "stale";
    fs::create_directories(d);
    const std::string& base = o.temp_name;
    const pid_t dead = DeadPid();
    const std::string stale = fmt::format("{}/.{}.tmp-{}", d, base, dead);
    const std::string live = fmt::format("{}/.{}.tmp-{}", d, base, ::getpid());
    const std::string stage = fmt::format("{}/{}.partial-{}-AbC123", d, base, dead);
    sk_test::WriteFile(stale, "half");
    sk_test::WriteFile(live, "busy");
    fs::create_directories(stage);
    sk_test::WriteFile(stage + "/shard.00000.mds", "half");
    auto r = sk_test::Cli(fmt::format("convert {} {} {} --threads 1", in, sk_test::Q(o.address), o.flags));
    INFO(r.err);
    REQUIRE(r.exit_code == 0);
    CHECK_FALSE(fs::exists(stale));
    CHECK(fs::exists(live));
    if (o.stages) CHECK_FALSE(fs::exists(stage));
    fs::remove_all(d);
  }
}
