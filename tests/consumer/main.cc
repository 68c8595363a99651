// Uses the installed headers and library: prints the version and the formats, then
// calls across the library boundary (exported classes, a failed Result's Status).
#include <cstdio>

#include <shardkit/shardkit.h>

int main() {
  std::printf("shardkit %s formats:", shardkit::Version());
  for (const auto& name : shardkit::FormatNames()) std::printf(" %s", name.c_str());
  std::printf("\n");
  shardkit::Sample s;
  s.key = "a/b";
  s.set("cls", shardkit::Bytes::Copy("3"));
  if (s.label() != 3 || s.checksum() == 0) return 2;
  auto r = shardkit::Open("wds:/nonexistent/consumer-%06d.tar");
  if (r.ok()) return 3;
  std::printf("open error: %s\n", r.status().ToString().c_str());
  return shardkit::FormatNames().empty() ? 1 : 0;
}
