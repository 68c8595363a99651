// libFuzzer target: the strict tar member scanner (lib/formats/tar/tar.h) over
// arbitrary bytes, read from memory (the mapped shards' source) and from a file
// descriptor (the streamed shards' source), which must agree on every member
// and on the error; then the same bytes as a one-shard WebDataset (member
// classification, sample grouping, random access).
#include <sys/mman.h>

#include <vector>

#include "common.h"
#include "formats/tar/source.h"
#include "formats/tar/tar.h"

namespace {

struct Seen {
  std::vector<shardkit::tar::Member> members;
  std::vector<std::string> data;
  shardkit::Status end;
};

Seen Scan(shardkit::tar::Source* src, size_t size) {
  Seen out;
  shardkit::tar::Scanner scan(src, "fuzz.tar");
  shardkit::tar::Member m;
  for (int i = 0; i < 100000; ++i) {
    auto r = scan.Next(&m);
    if (!r.ok()) {
      out.end = r.status();
      break;
    }
    if (!*r) break;
    if (m.data_offset > size || m.size > size - m.data_offset) abort();  // a member outside the bytes
    out.members.push_back(m);
    if (i % 2 == 0) {
      auto d = scan.TakeData();
      if (!d.ok() || d->size() != m.size) abort();  // Next() vouched for these bytes
      out.data.push_back(d->str());
    }
  }
  return out;
}

bool Same(const Seen& a, const Seen& b) {
  if (a.members.size() != b.members.size() || a.data != b.data || a.end.code() != b.end.code() ||
      a.end.message() != b.end.message() || a.end.where().offset != b.end.where().offset)
    return false;
  for (size_t i = 0; i < a.members.size(); ++i) {
    const auto &x = a.members[i], &y = b.members[i];
    if (x.name != y.name || x.type != y.type || x.header_offset != y.header_offset ||
        x.data_offset != y.data_offset || x.size != y.size)
      return false;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  shardkit::tar::MemorySource mem(data, size);
  Seen a = Scan(&mem, size);
  int fd = memfd_create("fuzz-tar", MFD_CLOEXEC);
  if (fd < 0) abort();
  for (size_t at = 0; at < size;) {
    ssize_t n = ::write(fd, data + at, size - at);
    if (n <= 0) abort();
    at += size_t(n);
  }
  if (::lseek(fd, 0, SEEK_SET) != 0) abort();
  Seen b;
  {
    shardkit::tar::FdSource stream(fd, "the fuzz input", shardkit::Location{.file = "fuzz.tar"});
    b = Scan(&stream, size);
  }
  ::close(fd);
  if (!Same(a, b)) abort();  // one set of tar rules, whatever the source

  static const std::string path = fuzz::Scratch() + "/x-000000.tar";
  fuzz::WriteBytes(path, data, size);
  auto ds = shardkit::Open("wds:" + path);
  if (ds.ok()) fuzz::Drain(**ds);
  return 0;
}
