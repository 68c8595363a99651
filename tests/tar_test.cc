// The tar scanner itself (lib/formats/tar/): every rule over hand-made archives,
// read once from memory (tar::MemorySource, the mapped shards' source) and once
// from a pipe fed in small pieces (tar::FdSource, the `pipe:` shards' source),
// with identical results: members, their data, and the error (code, message,
// offset) where the archive is damaged.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "formats/tar/source.h"
#include "formats/tar/tar.h"

using namespace shardkit;

namespace {

constexpr size_t kB = 512;

// One ustar header block: name (and prefix), size, type; checksum filled in.
std::string Header(const std::string& name, uint64_t size, char type = '0', const std::string& prefix = "") {
  std::string h(kB, '\0');
  h.replace(0, std::min<size_t>(name.size(), 100), name.substr(0, 100));
  h.replace(100, 8, "0000444\0", 8);
  h.replace(108, 8, "0000000\0", 8);
  h.replace(116, 8, "0000000\0", 8);
  h.replace(124, 12, fmt::format("{:011o}", size) + std::string(1, '\0'));
  h.replace(136, 12, "00000000000\0", 12);
  h[156] = type;
  h.replace(257, 8, std::string("ustar\0" "00", 8));
  if (!prefix.empty()) h.replace(345, prefix.size(), prefix);
  h.replace(148, 8, "        ");
  unsigned sum = 0;
  for (unsigned char c : h) sum += c;
  h.replace(148, 8, fmt::format("{:06o}", sum) + std::string("\0 ", 2));
  return h;
}

std::string Pad(std::string data) {
  data.resize((data.size() + kB - 1) / kB * kB, '\0');
  return data;
}

std::string Member(const std::string& name, const std::string& data, char type = '0',
                   const std::string& prefix = "") {
  return Header(name, data.size(), type, prefix) + Pad(data);
}

// A pax record "LEN key=value\n" (LEN counts itself).
std::string PaxRecord(const std::string& key, const std::string& value) {
  std::string body = " " + key + "=" + value + "\n";
  size_t len = body.size() + 1;
  while (std::to_string(len).size() + body.size() != len) ++len;
  return std::to_string(len) + body;
}

const std::string kEnd(2 * kB, '\0');

// What a scan saw: one line per member, then "end" or the error.
struct Scan {
  std::vector<std::string> members;  // "name|type|header|data|size|bytes"
  std::vector<const uint8_t*> data_ptrs;
  bool ended = false;
  Code code = Code::kOk;
  std::string message;
  int64_t offset = -1;
  std::string file;

  bool operator==(const Scan& o) const {
    return members == o.members && ended == o.ended && code == o.code && message == o.message &&
           offset == o.offset && file == o.file;
  }
};

std::ostream& operator<<(std::ostream& os, const Scan& s) {
  for (const auto& m : s.members) os << m << "\n";
  return os << (s.ended ? "end" : fmt::format("error {} at {}: {}", int(s.code), s.offset, s.message));
}

// Scans the whole archive, taking every other member's data through TakeData()
// (the others are skipped by the next Next()).
Scan Run(tar::Source* src) {
  Scan out;
  tar::Scanner scan(src, "x.tar");
  tar::Member m;
  for (int i = 0;; ++i) {
    auto r = scan.Next(&m);
    if (!r.ok()) {
      out.code = r.status().code();
      out.message = r.status().message();
      out.offset = r.status().where().offset;
      out.file = r.status().where().file;
      return out;
    }
    if (!*r) {
      out.ended = true;
      return out;
    }
    std::string bytes = "-";
    if (i % 2 == 0) {
      auto d = scan.TakeData();
      REQUIRE(d.ok());
      bytes = d->str();
      out.data_ptrs.push_back(d->data());
    }
    out.members.push_back(
        fmt::format("{}|{}|{}|{}|{}|{}", m.name, m.type, m.header_offset, m.data_offset, m.size, bytes));
  }
}

Scan FromMemory(const std::string& archive) {
  tar::MemorySource src(reinterpret_cast<const uint8_t*>(archive.data()), archive.size());
  return Run(&src);
}

// The archive written into a pipe in pieces of `piece` bytes by another thread.
Scan FromPipe(const std::string& archive, size_t piece) {
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  std::thread writer([&] {
    for (size_t at = 0; at < archive.size(); at += piece) {
      size_t n = std::min(piece, archive.size() - at);
      size_t done = 0;
      while (done < n) {
        ssize_t w = ::write(fds[1], archive.data() + at + done, n - done);
        if (w <= 0) break;  // the reader stopped early (EPIPE)
        done += size_t(w);
      }
      if (done < n) break;
    }
    ::close(fds[1]);
  });
  Scan out;
  {
    tar::FdSource src(fds[0], "the test pipe", Location{.file = "x.tar"});
    out = Run(&src);
  }
  ::close(fds[0]);  // a writer blocked on a full pipe gets EPIPE (SIGPIPE is ignored below)
  writer.join();
  return out;
}

// Both sources, several piece sizes: identical results; returns the memory one.
Scan Both(const std::string& archive) {
  ::signal(SIGPIPE, SIG_IGN);
  Scan mem = FromMemory(archive);
  for (size_t piece : {size_t(1) << 20, size_t(512), size_t(100), size_t(7)}) {
    INFO("pipe written in pieces of " << piece);
    Scan pipe = FromPipe(archive, piece);
    INFO("memory:\n" << mem << "\npipe:\n" << pipe);
    CHECK(pipe == mem);
  }
  return mem;
}

// Two plain members: a.txt (5 bytes at 512), dir/b.bin (600 bytes at 1536, ustar prefix).
std::string TwoMembers() { return Member("a.txt", "hello") + Member("b.bin", std::string(600, 'b'), '0', "dir"); }

}  // namespace

TEST_CASE("tar: well-formed ustar members, names with a prefix, data as zero-copy views of memory", "[tar]") {
  std::string ar = TwoMembers() + kEnd;
  Scan s = Both(ar);
  INFO(s);
  CHECK(s.ended);
  REQUIRE(s.members.size() == 2);
  CHECK(s.members[0] == "a.txt|0|0|512|5|hello");
  CHECK(s.members[1] == "dir/b.bin|0|1024|1536|600|-");
  // From memory, TakeData() is a view of the archive's own bytes.
  REQUIRE(s.data_ptrs.size() == 1);
  CHECK(s.data_ptrs[0] == reinterpret_cast<const uint8_t*>(ar.data()) + 512);
  // Types: '\0' is a regular file, a name ending in '/' a directory.
  Scan t = Both(Member("old", "x", '\0') + Member("d/", "", '0') + Member("l", "", '2') + kEnd);
  REQUIRE(t.members.size() == 3);
  CHECK(t.members[0] == "old|0|0|512|1|x");
  CHECK(t.members[1] == "d/|5|1024|1536|0|-");
  CHECK(t.members[2] == "l|2|1536|2048|0|");
}

TEST_CASE("tar: pax path and size records, a global header, a GNU long name", "[tar]") {
  std::string long_name = std::string(150, 'n') + "/sample.jpg";
  // pax: the path replaces the ustar name, the size replaces the header's (0 here).
  std::string pax = PaxRecord("path", long_name) + PaxRecord("size", "3") + PaxRecord("mtime", "0");
  std::string ar = Member("././@PaxHeader", "global=1\n", 'g') + Member("PaxHeader/x", pax, 'x') +
                   Header("short", 0) + Pad("abc") + Member("plain.txt", "p") + kEnd;
  Scan s = Both(ar);
  INFO(s);
  CHECK(s.ended);
  REQUIRE(s.members.size() == 2);
  // The member starts at its first extended header (the global one, at 0); its data at 2560.
  CHECK(s.members[0] == long_name + "|0|0|2560|3|abc");
  CHECK(s.members[1] == "plain.txt|0|3072|3584|1|-");

  // GNU: an 'L' record holds the name (NUL-terminated) of the member that follows.
  std::string gnu = Member("././@LongLink", long_name + std::string(1, '\0'), 'L') +
                    Member(long_name.substr(0, 99), "gnu") + kEnd;
  Scan g = Both(gnu);
  INFO(g);
  CHECK(g.ended);
  REQUIRE(g.members.size() == 1);
  CHECK(g.members[0] == long_name + "|0|0|1536|3|gnu");

  // A pax size larger than what follows is a truncation, named at the member's header.
  Scan big = Both(Member("PaxHeader/x", PaxRecord("size", "100000"), 'x') + Header("y", 0) + kEnd);
  CHECK(big.code == Code::kCorrupt);
  CHECK(big.offset == 1024);
  CHECK(big.message == "member declares 100000 bytes but only 1024 remain in the file (truncated?)");
  // Broken pax records and an extended header without a member.
  Scan bad = Both(Member("PaxHeader/x", "99 path=x\n", 'x') + Header("y", 0) + kEnd);
  CHECK(bad.code == Code::kCorrupt);
  CHECK(bad.offset == 0);
  CHECK(bad.message == "pax record length exceeds the header");
  Scan lonely = Both(Member("PaxHeader/x", PaxRecord("path", "z"), 'x') + kEnd);
  CHECK(lonely.code == Code::kCorrupt);
  CHECK(lonely.offset == 0);
  CHECK(lonely.message == "extended header not followed by a member");
  // Sparse members are refused as unsupported.
  Scan sparse = Both(Member("s", "", 'S') + kEnd);
  CHECK(sparse.code == Code::kUnsupported);
}

TEST_CASE("tar: a flipped header byte is a checksum mismatch naming the header's offset", "[tar]") {
  std::string ar = TwoMembers() + kEnd;
  ar[1024 + 3] ^= 0x01;  // a byte of the second header's name field
  Scan s = Both(ar);
  INFO(s);
  REQUIRE(s.members.size() == 1);  // the first member is read, then the damage
  CHECK(s.code == Code::kCorrupt);
  CHECK(s.file == "x.tar");
  CHECK(s.offset == 1024);
  CHECK(s.message.find("tar header checksum mismatch") != std::string::npos);
  // A checksum field that is not a number: not a tar.
  std::string junk(2048, 'j');
  Scan j = Both(junk);
  CHECK(j.code == Code::kCorrupt);
  CHECK(j.offset == 0);
  CHECK(j.message == "bad tar header checksum field (not a tar archive, or damaged)");
}

TEST_CASE("tar: truncated header, body and padding are errors at the offsets where they start", "[tar]") {
  std::string ar = TwoMembers() + kEnd;
  SECTION("header") {
    Scan s = Both(ar.substr(0, 1024 + 100));
    CHECK(s.members.size() == 1);
    CHECK(s.code == Code::kCorrupt);
    CHECK(s.offset == 1024);
    CHECK(s.message == "truncated tar header: 100 bytes left, 512 needed");
  }
  SECTION("body") {
    Scan s = Both(ar.substr(0, 1536 + 100));
    CHECK(s.members.size() == 1);
    CHECK(s.code == Code::kCorrupt);
    CHECK(s.offset == 1024);
    CHECK(s.message == "member declares 600 bytes but only 100 remain in the file (truncated?)");
  }
  SECTION("padding") {
    Scan s = Both(ar.substr(0, 1536 + 700));
    CHECK(s.code == Code::kCorrupt);
    CHECK(s.offset == 1536 + 600);
    CHECK(s.message == "truncated padding after the last member");
  }
  SECTION("every cut is an error at or before the cut, never a short archive") {
    for (size_t cut = 0; cut < TwoMembers().size() + kB; cut += 61) {
      INFO("cut at " << cut);
      Scan s = Both(ar.substr(0, cut));
      CHECK_FALSE(s.ended);
      CHECK(s.code == Code::kCorrupt);
      CHECK(s.offset >= 0);
      CHECK(s.offset <= int64_t(cut));
    }
  }
}

TEST_CASE("tar: the end of the archive: zero blocks, EOF after one, padding, and what may not follow", "[tar]") {
  std::string m = TwoMembers();
  // Two zero blocks; one zero block then EOF; zero padding to a 10 KiB record.
  for (const std::string& ar : {m + kEnd, m + std::string(kB, '\0'), m + std::string(10240 - m.size(), '\0')}) {
    INFO("archive of " << ar.size() << " bytes");
    Scan s = Both(ar);
    CHECK(s.ended);
    CHECK(s.members.size() == 2);
  }
  // EOF where a header should be: the end blocks are missing.
  Scan eof = Both(m);
  CHECK(eof.members.size() == 2);
  CHECK(eof.code == Code::kCorrupt);
  CHECK(eof.offset == int64_t(m.size()));
  CHECK(eof.message == "missing end-of-archive blocks (truncated shard?)");
  // An empty input is not a tar.
  Scan empty = Both("");
  CHECK(empty.code == Code::kCorrupt);
  CHECK(empty.offset == 0);
  CHECK(empty.message == "empty file: not a tar archive");
  // A lone zero block followed by a header (a concatenated or damaged tar).
  Scan lone = Both(m + std::string(kB, '\0') + Member("c", "c") + kEnd);
  CHECK(lone.code == Code::kCorrupt);
  CHECK(lone.offset == int64_t(m.size() + kB));
  CHECK(lone.message.find("lone zero block") != std::string::npos);
  // Anything but zeros after the end blocks, named at its first byte.
  Scan trail = Both(m + kEnd + std::string(3000, '\0') + "x");
  CHECK(trail.code == Code::kCorrupt);
  CHECK(trail.offset == int64_t(m.size() + kEnd.size() + 3000));
  CHECK(trail.message == "trailing garbage after the end-of-archive blocks");
}

TEST_CASE("tar: the pipe source hands out data that outlives its buffer, the memory source is zero-copy", "[tar]") {
  ::signal(SIGPIPE, SIG_IGN);
  std::string ar;
  for (int i = 0; i < 40; ++i)
    ar += Member(fmt::format("m{:02d}.bin", i), std::string(3000 + i * 977, char('a' + i % 26)));
  ar += kEnd;
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  std::thread writer([&] {
    for (size_t at = 0; at < ar.size(); at += 4096) {
      if (::write(fds[1], ar.data() + at, std::min<size_t>(4096, ar.size() - at)) <= 0) break;
    }
    ::close(fds[1]);
  });
  std::vector<Bytes> kept;
  {
    tar::FdSource src(fds[0], "the test pipe", Location{});
    tar::Scanner scan(&src, "p");
    tar::Member m;
    for (;;) {
      auto r = scan.Next(&m);
      REQUIRE(r.ok());
      if (!*r) break;
      auto d = scan.TakeData();
      REQUIRE(d.ok());
      kept.push_back(*d);
    }
    CHECK(src.ended());
    CHECK(src.bytes_read() == ar.size());
    CHECK(src.position() == ar.size());
  }
  ::close(fds[0]);
  writer.join();
  // Every member's bytes are intact after the source and its buffers are gone.
  REQUIRE(kept.size() == 40);
  for (int i = 0; i < 40; ++i) CHECK(kept[size_t(i)].str() == std::string(3000 + i * 977, char('a' + i % 26)));

  // Ahead / Consume / Take on both sources.
  tar::MemorySource mem(reinterpret_cast<const uint8_t*>(ar.data()), ar.size());
  CHECK(mem.size() == int64_t(ar.size()));
  auto a = mem.Ahead(10);
  REQUIRE(a.ok());
  CHECK(a->data() == reinterpret_cast<const uint8_t*>(ar.data()));
  CHECK(*mem.Consume(100) == 100);
  auto t = mem.Take(50);
  REQUIRE(t.ok());
  CHECK(t->data() == reinterpret_cast<const uint8_t*>(ar.data()) + 100);
  CHECK(*mem.Consume(ar.size()) == ar.size() - 150);
  CHECK(mem.Ahead(1)->empty());
}
