// Shared helpers of the libFuzzer targets: a scratch directory per process
// (under $TMPDIR, else /dev/shm or /tmp) and whole-file writes.
#pragma once

#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>

#include "shardkit/shardkit.h"

namespace fuzz {

inline const std::string& Scratch() {
  // Never destroyed: the atexit handler that removes it runs after static destructors.
  static const std::string* dir = [] {
    const char* base = getenv("TMPDIR");
    std::string b = base && *base ? base : (std::filesystem::is_directory("/dev/shm") ? "/dev/shm" : "/tmp");
    auto* tmpl = new std::string(b + "/shardkit-fuzz-XXXXXX");
    if (!mkdtemp(tmpl->data())) abort();
    atexit([] { std::error_code ec; std::filesystem::remove_all(Scratch(), ec); });
    return tmpl;
  }();
  return *dir;
}

inline void WriteBytes(const std::string& path, const uint8_t* data, size_t size) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) abort();
  while (size > 0) {
    ssize_t n = ::write(fd, data, size);
    if (n <= 0) abort();
    data += n;
    size -= size_t(n);
  }
  ::close(fd);
}

// Reads every sample of a dataset in order and through random access; errors
// are fine, crashes, hangs and sanitizer reports are not. Touches every byte.
inline void Drain(const shardkit::Dataset& ds) {
  volatile uint8_t sink = 0;
  auto touch = [&](const shardkit::Sample& s) {
    for (const auto& f : s.fields)
      for (size_t i = 0; i < f.data.size(); i += 61) sink = sink + f.data.data()[i];
    (void)s.checksum();
  };
  if (auto r = ds.NewReader(); r.ok()) {
    shardkit::Sample s;
    for (int i = 0; i < 100000; ++i) {
      auto more = (*r)->Next(&s);
      if (!more.ok() || !*more) break;
      touch(s);
    }
  }
  if (auto ra = ds.NewRandomAccess(); ra.ok()) {
    shardkit::Sample s;
    uint64_t n = (*ra)->size();
    for (uint64_t i = 0; i < n && i < 100000; ++i)
      if ((*ra)->Get(i, &s).ok()) touch(s);
    (void)(*ra)->Get(n, &s);  // out of range: an error, not a crash
  }
  (void)ds.RecordedChecksums();
}

}  // namespace fuzz
