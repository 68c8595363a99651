// Uses the installed headers and library: prints the version and the formats.
#include <cstdio>

#include <shardkit/shardkit.h>

int main() {
  std::printf("shardkit %s formats:", shardkit::Version());
  for (const auto& name : shardkit::FormatNames()) std::printf(" %s", name.c_str());
  std::printf("\n");
  return shardkit::FormatNames().empty() ? 1 : 0;
}
