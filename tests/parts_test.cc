// Conversions split into parts (--part I/N, --part env, mpirun) and `shardkit merge`
// (issue 15): every split is compared byte for byte with a single-process run of the
// same command, for every source format, every way to cut shards, with and without
// --shuffle; then the faults: a killed part resumed, a part that never ran, the same
// part twice, parts with different flags or source, a shard damaged after its part
// finished, and --resume on a finished output.
#include <catch2/catch.hpp>

#include <fmt/format.h>
#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>

#include "shardkit/convert.h"
#include "support.h"

using namespace sk_test;
namespace fs = std::filesystem;

namespace {

// Every file of a directory -> its bytes, except the parts' own bookkeeping
// (records, locks): what a reader of the output sees.
std::map<std::string, std::string> Tree(const std::string& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    std::string name = e.path().filename().string();
    if (name.find(".part-") != std::string::npos) continue;
    out[name] = ReadFile(e.path().string());
  }
  return out;
}

void ExpectSameTree(const std::string& a, const std::string& b) {
  auto ta = Tree(a), tb = Tree(b);
  std::string names_a, names_b;
  for (auto& [k, v] : ta) names_a += k + " ";
  for (auto& [k, v] : tb) names_b += k + " ";
  INFO("single: " << names_a);
  INFO("parts:  " << names_b);
  REQUIRE(ta.size() == tb.size());
  for (auto& [k, v] : ta) {
    INFO("file " << k);
    REQUIRE(tb.count(k) == 1);
    CHECK(tb[k] == v);
  }
}

// A source with varied sample sizes and names, including one over 100 bytes and one
// not ASCII (both need pax headers in a tar), in all four formats.
struct Sources {
  TempDir t;
  std::map<std::string, std::string> by_format;
  Sources() {
    std::string root = t / "images";
    MakeImageFolder(root, 3, 9, 7);
    WriteFile(root + "/c0/" + std::string(110, 'l') + ".JPEG", MakeJpeg(64, 40, 99));
    WriteFile(root + "/c1/\xc3\xa9t\xc3\xa9.JPEG", MakeJpeg(40, 64, 98));
    by_format["folder"] = root;
    for (auto [fmt_name, addr] : {std::pair{"wds", "wds:" + (t / "src/s-%03d.tar")},
                                  std::pair{"lmdb", "lmdb:" + (t / "src.lmdb")},
                                  std::pair{"hdf5", "hdf5:" + (t / "src.h5")}}) {
      auto r = Cli(fmt::format("convert {} {} --samples-per-shard 10", Q(root), Q(addr)));
      REQUIRE(r.exit_code == 0);
      by_format[fmt_name] = std::string(fmt_name) == "wds" ? t / "src/s.manifest.json" : addr;
    }
  }
};

Sources& Src() {
  static Sources s;
  return s;
}

// Runs `cmd SRC DST flags` once in one process (into dir/single) and as n parts
// plus a merge (into dir/parts-n); both must hold the same bytes.
void CompareSplit(const std::string& cmd, const std::string& src, const std::string& flags, int n,
                  const std::string& launcher = "part") {
  TempDir d;
  std::string single = d / "single", parts = d / "parts";
  auto one = Cli(fmt::format("{} {} {} {}", cmd, Q(src), Q("wds:" + single + "/t-%05d.tar"), flags));
  INFO(one.err);
  REQUIRE(one.exit_code == 0);
  const std::string dst = "wds:" + parts + "/t-%05d.tar";
  for (int i = 0; i < n; ++i) {
    std::string env, part = "--part env";
    if (launcher == "part") {
      part = fmt::format("--part {}/{}", i, n);
    } else if (launcher == "slurm-array") {  // sbatch --array=1-N: ids start at 1
      env = fmt::format("SLURM_ARRAY_TASK_ID={} SLURM_ARRAY_TASK_COUNT={} SLURM_ARRAY_TASK_MIN=1 ", i + 1, n);
    } else if (launcher == "srun") {
      env = fmt::format("SLURM_PROCID={} SLURM_NTASKS={} ", i, n);
    } else if (launcher == "torchrun") {
      env = fmt::format("RANK={} WORLD_SIZE={} ", i, n);
    }
    auto r = Run(fmt::format("env -u OMPI_COMM_WORLD_RANK -u PMI_RANK -u SLURM_ARRAY_TASK_ID -u SLURM_PROCID "
                             "-u RANK {}{} {} {} {} {} {}",
                             env, Q(SHARDKIT_CLI), cmd, Q(src), Q(dst), flags, part));
    INFO(launcher << " part " << i << "/" << n << ": " << r.err);
    REQUIRE(r.exit_code == 0);
    if (launcher != "part") CHECK(r.err.find(fmt::format("part {}/{}", i, n)) != std::string::npos);
    // No manifest until merge runs.
    CHECK_FALSE(fs::exists(parts + "/t.manifest.json"));
  }
  auto m = Cli(fmt::format("merge {}", Q(dst)));
  INFO(m.err);
  REQUIRE(m.exit_code == 0);
  ExpectSameTree(single, parts);
  auto again = Cli(fmt::format("merge {}", Q(dst)));
  CHECK(again.exit_code == 0);
  CHECK(again.out.find("unchanged") != std::string::npos);
  auto v = Cli(fmt::format("verify {}", Q(parts + "/t.manifest.json")));
  INFO(v.out << v.err);
  CHECK(v.exit_code == 0);
}

}  // namespace

TEST_CASE("parts: N parts write byte for byte what one process writes, every source and cut", "[parts]") {
#if defined(__SANITIZE_ADDRESS__)
  // Under ASan (scripts/test-sanitize.sh, several times slower) the shuffled cuts run for
  // the first source only: the plain build runs them all, and the code under test does
  // not depend on the pair.
  constexpr bool kEveryShuffle = false;
#else
  constexpr bool kEveryShuffle = true;
#endif
  bool first_source = true;
  for (const auto& [format, src] : Src().by_format) {
    const bool shuffles = kEveryShuffle || first_source;
    first_source = false;
    for (const char* shuffle : {"", " --shuffle --seed 5"}) {
      if (*shuffle && !shuffles) continue;
      DYNAMIC_SECTION(format << shuffle) {
        CompareSplit("convert", src, std::string("--samples-per-shard 4") + shuffle, 3);
        CompareSplit("convert", src, std::string("--shard-size 20KB") + shuffle, 3);
        CompareSplit("shard", src, std::string("--num-shards 5") + shuffle, 3);
        CompareSplit("shard", src, std::string("--shard-size 30KB --no-index") + shuffle, 2);
      }
    }
  }
}

TEST_CASE("parts: 1 to 4 parts and more parts than shards", "[parts]") {
  const std::string src = Src().by_format["folder"];
  for (int n = 1; n <= 4; ++n) CompareSplit("convert", src, "--shard-size 16KB --shuffle", n);
  CompareSplit("shard", src, "--num-shards 3", 5);  // parts 3 and 4 of 5 write no shard
}

TEST_CASE("parts: --part env from Slurm job arrays, srun and torchrun", "[parts]") {
  const std::string src = Src().by_format["lmdb"];
  CompareSplit("convert", src, "--samples-per-shard 5 --shuffle", 3, "slurm-array");
  CompareSplit("convert", src, "--shard-size 20KB", 4, "srun");
  CompareSplit("shard", src, "--num-shards 4", 2, "torchrun");
}

#ifdef SHARDKIT_TEST_MPI
TEST_CASE("parts: mpirun -np 1..4 converts and merges in one command", "[parts][mpi]") {
  const std::string src = Src().by_format["wds"];
  for (int np = 1; np <= 4; ++np) {
    TempDir d;
    auto one = Cli(fmt::format("convert {} {} --shard-size 20KB --shuffle", Q(src), Q("wds:" + (d / "one/t-%05d.tar"))));
    REQUIRE(one.exit_code == 0);
    // Under the sanitizers: no leak report for the MPI runs, whose leaks are OpenMPI's own
    // (in MCA components unloaded before LeakSanitizer reports, so no suppression can name
    // them); the same code paths are leak-checked by the separate-process tests above.
    auto r = Run(fmt::format("ASAN_OPTIONS=\"${{ASAN_OPTIONS:-}}:detect_leaks=0\" "
                             "mpirun --oversubscribe --allow-run-as-root -np {} {} convert {} {} --shard-size 20KB "
                             "--shuffle --part env",
                             np, Q(SHARDKIT_CLI), Q(src), Q("wds:" + (d / "mpi/t-%05d.tar"))));
    INFO("np " << np << ": " << r.out << r.err);
    REQUIRE(r.exit_code == 0);
    CHECK(r.out.find("merge:") != std::string::npos);
    ExpectSameTree(d / "one", d / "mpi");
  }
  // A rank that fails fails the job with its message, and nothing is merged.
  TempDir d;
  auto r = Run(fmt::format("ASAN_OPTIONS=\"${{ASAN_OPTIONS:-}}:detect_leaks=0\" "
                           "mpirun --oversubscribe --allow-run-as-root -np 3 {} convert {} {} --part env", Q(SHARDKIT_CLI),
                           Q(src), Q("hdf5:" + (d / "x.h5"))));
  CHECK(r.exit_code != 0);
  CHECK(r.err.find("cannot write side by side") != std::string::npos);
}
#endif

TEST_CASE("parts: merge refuses missing parts, different flags or source, damaged shards", "[parts]") {
  const std::string src = Src().by_format["folder"];
  TempDir d;
  const std::string dst = "wds:" + (d / "o/t-%05d.tar");
  auto part = [&](int i, int n, const std::string& extra) {
    return Cli(fmt::format("convert {} {} --samples-per-shard 3 --part {}/{} {}", Q(src), Q(dst), i, n, extra));
  };
  REQUIRE(part(0, 3, "").exit_code == 0);
  REQUIRE(part(2, 3, "").exit_code == 0);
  SECTION("a part that never ran") {
    auto m = Cli("merge " + Q(dst));
    CHECK(m.exit_code == 1);
    CHECK(m.err.find("part 1/3 (never ran") != std::string::npos);
    CHECK_FALSE(fs::exists(d / "o/t.manifest.json"));
  }
  SECTION("different flags") {
    REQUIRE(part(1, 3, "--key-dots replace").exit_code == 0);
    auto m = Cli("merge " + Q(dst));
    CHECK(m.exit_code == 1);
    CHECK(m.err.find("key_dots") != std::string::npos);
    CHECK(m.err.find("part 1/3") != std::string::npos);
    CHECK_FALSE(fs::exists(d / "o/t.manifest.json"));
  }
  SECTION("a different source") {
    REQUIRE(part(1, 3, "").exit_code == 0);
    // Part 2 again from a copy of the source with one image more.
    fs::copy(src, d / "src2", fs::copy_options::recursive);
    WriteFile(d / "src2/c2/extra.JPEG", MakeJpeg(30, 30, 5));
    auto r = Cli(fmt::format("convert {} {} --samples-per-shard 3 --part 2/3 --overwrite", Q(d / "src2"), Q(dst)));
    REQUIRE(r.exit_code == 0);
    auto m = Cli("merge " + Q(dst));
    CHECK(m.exit_code == 1);
    CHECK(m.err.find("not run with the same flags and source") != std::string::npos);
    CHECK(m.err.find("source") != std::string::npos);
  }
  SECTION("the same part twice: one at a time, and while another holds it") {
    auto again = part(2, 3, "");
    CHECK(again.exit_code == 1);
    CHECK(again.err.find("--overwrite") != std::string::npos);
    auto resumed = part(2, 3, "--resume");
    CHECK(resumed.exit_code == 0);
    CHECK(resumed.out.find("already complete") != std::string::npos);
    // A process that holds the part's lock (as a running part does).
    auto held = Run(fmt::format("flock {} {} convert {} {} --samples-per-shard 3 --part 1/3", Q(d / "o/t.part-00001-of-00003.json.lock"),
                                Q(SHARDKIT_CLI), Q(src), Q(dst)));
    CHECK(held.exit_code == 1);
    CHECK(held.err.find("another process") != std::string::npos);
  }
  SECTION("a shard damaged after its part finished") {
    REQUIRE(part(1, 3, "").exit_code == 0);
    std::string shard = d / "o/t-00000.tar";
    std::string bytes = ReadFile(shard);
    SECTION("truncated: merge finds it") {
      WriteFile(shard, bytes.substr(0, bytes.size() - 512));
      auto m = Cli("merge " + Q(dst));
      CHECK(m.exit_code == 1);
      CHECK(m.err.find("t-00000.tar") != std::string::npos);
      CHECK_FALSE(fs::exists(d / "o/t.manifest.json"));
    }
    SECTION("a byte flipped: merge --checksums and verify find it") {
      bytes[700] ^= 1;
      WriteFile(shard, bytes);
      auto m = Cli("merge --checksums " + Q(dst));
      CHECK(m.exit_code == 1);
      CHECK(m.err.find("checksum") != std::string::npos);
      REQUIRE(Cli("merge " + Q(dst)).exit_code == 0);
      auto v = Cli("verify " + Q(d / "o/t.manifest.json"));
      CHECK(v.exit_code != 0);
      CHECK((v.out + v.err).find("t-00000.tar") != std::string::npos);
    }
  }
}

TEST_CASE("parts: a part killed with SIGKILL is rerun with --resume", "[parts]") {
  const std::string src = Src().by_format["hdf5"];
  TempDir d;
  const std::string dst = "wds:" + (d / "o/t-%05d.tar");
  const std::string flags = "--samples-per-shard 1 --threads 1 --shuffle --seed 3";
  REQUIRE(Cli(fmt::format("convert {} {} {}", Q(src), Q("wds:" + (d / "one/t-%05d.tar")), flags)).exit_code == 0);
  REQUIRE(Cli(fmt::format("convert {} {} {} --part 0/2", Q(src), Q(dst), flags)).exit_code == 0);
  // Part 1 is killed once its first shard is on disk (or after it finished, on a fast machine).
  auto killed = Run(fmt::format("{} convert {} {} {} --part 1/2 --resume & pid=$!; "
                                "while [ ! -e {} ] && kill -0 $pid 2>/dev/null; do sleep 0.002; done; "
                                "kill -9 $pid 2>/dev/null; wait $pid; true",
                                Q(SHARDKIT_CLI), Q(src), Q(dst), flags, Q(d / "o/t-00015.tar")));
  CHECK(killed.exit_code == 0);
  auto early = Cli("merge " + Q(dst));
  if (!fs::exists(d / "o/t.part-00001-of-00002.json")) {
    CHECK(early.exit_code == 1);
    CHECK(early.err.find("part 1/2 (interrupted: rerun it with --resume)") != std::string::npos);
  }
  auto r = Cli(fmt::format("convert {} {} {} --part 1/2 --resume", Q(src), Q(dst), flags));
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  REQUIRE(Cli("merge " + Q(dst)).exit_code == 0);
  ExpectSameTree(d / "one", d / "o");
}

TEST_CASE("resume on a finished conversion checks it and writes nothing", "[parts][resume]") {
  const std::string src = Src().by_format["folder"];
  TempDir d;
  for (std::string dst : {"wds:" + (d / "out/s-%06d.tar"), "lmdb:" + (d / "x.lmdb"), "hdf5:" + (d / "x.h5")}) {
    INFO(dst);
    REQUIRE(Cli(fmt::format("convert {} {}", Q(src), Q(dst))).exit_code == 0);
    auto again = Cli(fmt::format("convert {} {}", Q(src), Q(dst)));
    CHECK(again.exit_code == 1);
    CHECK(again.err.find("--overwrite") != std::string::npos);
    auto r = Cli(fmt::format("convert {} {} --resume", Q(src), Q(dst)));
    INFO(r.err);
    CHECK(r.exit_code == 0);
    CHECK(r.out.find("already complete") != std::string::npos);
  }
  auto before = Tree(d / "out");
  // A shard that went missing is found, not taken as complete.
  fs::remove(d / "out/s-000000.tar");
  auto r = Cli(fmt::format("convert {} {} --resume", Q(src), Q("wds:" + (d / "out/s-%06d.tar"))));
  CHECK(r.exit_code == 1);
  CHECK(r.err.find("s-000000.tar") != std::string::npos);
  CHECK(before.size() > 2);
}

TEST_CASE("parts: outputs that cannot be split and malformed --part", "[parts]") {
  const std::string src = Src().by_format["folder"];
  TempDir d;
  for (std::string dst : {"lmdb:" + (d / "x.lmdb"), "hdf5:" + (d / "x.h5"), "folder:" + (d / "f")}) {
    auto r = Cli(fmt::format("convert {} {} --part 0/2", Q(src), Q(dst)));
    CHECK(r.exit_code == 1);
    CHECK(r.err.find("cannot write side by side") != std::string::npos);
  }
  auto bad = Cli(fmt::format("convert {} {} --part 2/2", Q(src), Q("wds:" + (d / "o/t-%03d.tar"))));
  CHECK(bad.exit_code == 2);
  CHECK(bad.err.find("0 <= I < N") != std::string::npos);
  auto noenv = Run(fmt::format("env -u OMPI_COMM_WORLD_RANK -u PMI_RANK -u SLURM_ARRAY_TASK_ID -u SLURM_PROCID -u RANK "
                               "{} convert {} {} --part env",
                               Q(SHARDKIT_CLI), Q(src), Q("wds:" + (d / "o/t-%03d.tar"))));
  CHECK(noenv.exit_code == 2);
  CHECK(noenv.err.find("no launcher variables") != std::string::npos);
  auto nomerge = Cli("merge " + Q("wds:" + (d / "none/t-%03d.tar")));
  CHECK(nomerge.exit_code == 1);
  CHECK(nomerge.err.find("no part records") != std::string::npos);
}

TEST_CASE("ParsePart and PartFromEnvironment", "[parts]") {
  using shardkit::ParsePart;
  auto p = ParsePart("3/16");
  REQUIRE(p.ok());
  CHECK(p->index == 3);
  CHECK(p->count == 16);
  for (const char* bad : {"16/16", "1/0", "a/2", "1", "-1/2", "1/2/3", ""}) CHECK_FALSE(ParsePart(bad).ok());
  for (const char* v : {"SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT", "SLURM_ARRAY_TASK_MIN", "SLURM_ARRAY_TASK_STEP",
                        "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE", "SLURM_PROCID",
                        "SLURM_NTASKS", "RANK", "WORLD_SIZE"})
    ::unsetenv(v);
  CHECK_FALSE(shardkit::PartFromEnvironment().ok());
  ::setenv("RANK", "2", 1);
  ::setenv("WORLD_SIZE", "4", 1);
  auto t = shardkit::PartFromEnvironment();
  REQUIRE(t.ok());
  CHECK((t->index == 2 && t->count == 4 && t->from == "RANK/WORLD_SIZE"));
  // mpirun under Slurm: the MPI rank wins over srun's task id.
  ::setenv("SLURM_PROCID", "0", 1);
  ::setenv("SLURM_NTASKS", "1", 1);
  ::setenv("OMPI_COMM_WORLD_RANK", "1", 1);
  ::setenv("OMPI_COMM_WORLD_SIZE", "3", 1);
  auto o = shardkit::PartFromEnvironment();
  REQUIRE(o.ok());
  CHECK((o->index == 1 && o->count == 3 && o->from == "OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE"));
  // A job array --array=10-40:10 (4 tasks): task 30 is part 2.
  ::setenv("SLURM_ARRAY_TASK_ID", "30", 1);
  ::setenv("SLURM_ARRAY_TASK_COUNT", "4", 1);
  ::setenv("SLURM_ARRAY_TASK_MIN", "10", 1);
  ::setenv("SLURM_ARRAY_TASK_STEP", "10", 1);
  auto a = shardkit::PartFromEnvironment();
  REQUIRE(a.ok());
  CHECK((a->index == 2 && a->count == 4));
  ::setenv("SLURM_ARRAY_TASK_ID", "x", 1);
  CHECK_FALSE(shardkit::PartFromEnvironment().ok());
  ::setenv("SLURM_ARRAY_TASK_ID", "50", 1);
  CHECK_FALSE(shardkit::PartFromEnvironment().ok());  // 4 tasks: part 4 of 4 is out of range
}

#include "pipeline/plan.h"
#include "shardkit/loader.h"

TEST_CASE("Bijection: a keyed permutation of 0..n-1 evaluated per position", "[parts][plan]") {
  using shardkit::pipeline::Bijection;
  for (uint64_t n : {0ull, 1ull, 2ull, 3ull, 4ull, 5ull, 15ull, 16ull, 17ull, 255ull, 256ull, 257ull, 1000ull, 4097ull}) {
    Bijection b(n, 42, 7);
    std::vector<bool> seen(n, false);
    for (uint64_t i = 0; i < n; ++i) {
      uint64_t v = b(i);
      REQUIRE(v < n);
      CHECK_FALSE(seen[v]);
      seen[v] = true;
    }
    if (n >= 16) {
      // Keyed: another seed or stream gives another order; not the identity.
      std::vector<uint64_t> a, c, d;
      Bijection b2(n, 43, 7), b3(n, 42, 8);
      uint64_t fixed = 0;
      for (uint64_t i = 0; i < n; ++i) {
        a.push_back(b(i));
        c.push_back(b2(i));
        d.push_back(b3(i));
        fixed += b(i) == i;
      }
      CHECK(a != c);
      CHECK(a != d);
      CHECK(fixed < n / 4);
    }
  }
  Bijection id(100, 1, 2, /*shuffle=*/false);
  for (uint64_t i = 0; i < 100; ++i) CHECK(id(i) == i);
  // Huge domains cost nothing to set up and evaluate.
  Bijection big(10'000'000'000ull, 5, 1);
  CHECK(big(9'999'999'999ull) < 10'000'000'000ull);
  CHECK(big(0) != big(1));
}

TEST_CASE("LoaderEpochOrder is the rank's share of EpochPermutation, computed per position", "[parts][plan]") {
  using namespace shardkit::pipeline;
  for (uint64_t n : {1ull, 7ull, 100ull, 1001ull})
    for (uint32_t world : {1u, 3u, 8u})
      for (bool drop_last : {false, true})
        for (bool shuffle : {false, true}) {
          shardkit::LoaderOptions o;
          o.world_size = int(world);
          o.batch_size = 4;
          o.drop_last = drop_last;
          o.shuffle = shuffle;
          o.seed = 9;
          for (uint32_t r = 0; r < world; ++r) {
            o.rank = int(r);
            CHECK(LoaderEpochOrder(n, o, 2) == RankIndices(EpochPermutation(n, 9, 2, shuffle), r, world, 4, drop_last));
          }
        }
}
