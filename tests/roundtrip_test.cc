// Every (source, destination) pair of registered formats converts without
// loss: keys, labels, class names, field names and payload bytes come out
// identical. Driven by shardkit::FormatNames(): a new format is covered without
// editing this file. A format whose writer is not built yet (Unsupported) is
// skipped with a WARN.
#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>

#include "io/file.h"
#include "formats/registry.h"
#include "shardkit/shardkit.h"
#include "support.h"
#include "read_all.h"

using namespace shardkit;
using namespace sk_test;

namespace {

const std::vector<std::string> kClasses = {"cat", "dog", "fish"};

// The fixture: 3 classes, keys in dataset (sorted) order, jpg + cls in each,
// with a grayscale and a progressive JPEG among them.
std::vector<Sample> Fixture() {
  std::vector<Sample> out;
  for (int c = 0; c < 3; ++c)
    for (int i = 0; i < 4; ++i) {
      Sample s;
      s.key = fmt::format("{}/s{:03d}", kClasses[c], c * 4 + i);
      JpegKind kind = i == 1 ? JpegKind::kGray : i == 2 ? JpegKind::kProgressive : JpegKind::kBaseline420;
      s.set("jpg", Bytes::Copy(MakeJpeg(16 + 8 * i, 16 + 4 * c, uint32_t(c * 10 + i), kind)));
      s.set_label(c);
      out.push_back(std::move(s));
    }
  return out;
}

// A path under `dir` that `format` claims for writing (its highest write bid
// among a few generic shapes), always used with the scheme.
std::string WriteAddress(const std::string& format, const std::string& dir) {
  static const char* kShapes[] = {"data", "data.lmdb", "data.h5", "data-%06d.tar",
                                  "data.rec"};
  std::string best = "data";
  int best_bid = 0;
  for (const auto& f : formats::All()) {
    if (format != f.name) continue;
    for (const char* shape : kShapes) {
      int b = f.bid_write(dir + "/" + shape);
      if (b > best_bid) best_bid = b, best = shape;
    }
  }
  return format + ":" + dir + "/" + best;
}

// The address to read back what was written at `write_addr` (in the otherwise
// empty directory `dir`): the first that opens and carries class names among
// the write address itself and each entry of `dir` (e.g. a manifest beside
// tar shards); else the output files joined with "::".
std::string ReadAddress(const std::string& format, const std::string& write_addr, const std::string& dir,
                        const std::vector<ShardInfo>& shards) {
  std::vector<std::string> candidates = {write_addr};
  std::vector<std::string> entries;
  for (auto& e : std::filesystem::directory_iterator(dir)) entries.push_back(e.path().string());
  std::sort(entries.begin(), entries.end());
  for (auto& e : entries) candidates.push_back(format + ":" + e);
  for (const auto& c : candidates) {
    auto ds = Open(c);
    if (ds.ok() && !(*ds)->info().class_names.empty()) return c;
  }
  std::string joined;
  for (const auto& s : shards) joined += (joined.empty() ? "" : "::") + s.path;
  return format + ":" + joined;
}

std::vector<Sample> ReadAll(const std::string& addr, DatasetInfo* info) {
  auto ds = Open(addr);
  INFO("open " << addr << ": " << ds.status().ToString());
  REQUIRE(ds.ok());
  *info = (*ds)->info();
  return sk_test::ReadAllSamples(**ds);
}

bool Available(const std::string& format) {
  TempDir t;
  auto w = Create(WriteAddress(format, t.path()));
  if (!w.ok() && w.status().code() == Code::kUnsupported) {
    WARN("skipping the " << format << " format: " << w.status().ToString());
    return false;
  }
  return true;
}

}  // namespace

TEST_CASE("roundtrip: every (source, destination) pair keeps keys, labels, classes and bytes") {
  const auto names = FormatNames();
  REQUIRE(!names.empty());
  const auto want = Fixture();
  for (const auto& src : names) {
    for (const auto& dst : names) {
      DYNAMIC_SECTION(src << " -> " << dst) {
        if (!Available(src) || !Available(dst)) continue;
        TempDir t;
        // Write the fixture in the source format.
        std::string src_w = WriteAddress(src, t / "src");
        REQUIRE(io::MakeDirs(t / "src").ok());
        WriteOptions wo;
        wo.class_names = kClasses;
        auto w = Create(src_w, wo);
        INFO("create " << src_w << ": " << w.status().ToString());
        REQUIRE(w.ok());
        for (const auto& s : want) REQUIRE((*w)->Write(s).ok());
        auto ws = (*w)->Finish();
        INFO("finish: " << ws.status().ToString());
        REQUIRE(ws.ok());
        std::string src_r = ReadAddress(src, src_w, t / "src", ws->shards);

        // Convert it.
        REQUIRE(io::MakeDirs(t / "dst").ok());
        std::string dst_w = WriteAddress(dst, t / "dst");
        auto sum = Convert(src_r, dst_w);
        INFO("convert " << src_r << " -> " << dst_w << ": " << sum.status().ToString());
        REQUIRE(sum.ok());
        CHECK(sum->samples == want.size());
        CHECK(sum->source_format == src);
        CHECK(sum->destination_format == dst);

        DatasetInfo info;
        auto got = ReadAll(ReadAddress(dst, dst_w, t / "dst", sum->shards), &info);
        CHECK(info.format == dst);
        CHECK(info.class_names == kClasses);
        REQUIRE(got.size() == want.size());
        for (size_t i = 0; i < want.size(); ++i) {
          INFO("sample " << i << " key " << want[i].key);
          CHECK(got[i].key == want[i].key);
          CHECK(got[i].label() == want[i].label());
          REQUIRE(got[i].fields.size() == want[i].fields.size());
          for (size_t k = 0; k < want[i].fields.size(); ++k) {
            CHECK(got[i].fields[k].ext == want[i].fields[k].ext);
            CHECK(got[i].fields[k].data == want[i].fields[k].data);
          }
        }
      }
    }
  }
}
