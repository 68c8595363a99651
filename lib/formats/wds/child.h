// Internal: the child process behind a `pipe:CMD` shard: `/bin/sh -c CMD`,
// its standard output on a pipe. The child leads a process group of its own,
// so that an early end (Close() before the end of the output, or destruction)
// stops the commands it started too.
//
// Thread safety: used by one thread.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <string_view>

#include "formats/wds/names.h"
#include "shardkit/status.h"

namespace shardkit::formats::wds {

class ChildStream {
 public:
  ChildStream(std::string address, int64_t shard) : address_(std::move(address)), shard_(shard) {}
  ~ChildStream() { Close(); }
  ChildStream(const ChildStream&) = delete;
  ChildStream& operator=(const ChildStream&) = delete;

  std::string_view command() const { return std::string_view(address_).substr(kPipe.size()); }
  Location Where(int64_t offset = -1) const { return Location{.file = address_, .shard = shard_, .offset = offset}; }

  // Starts the command; fd() is then the read end of its standard output.
  Status Start();
  int fd() const { return fd_; }

  // After the end of the output (`bytes` long): waits for the command; an
  // error unless it exited with status 0.
  Status Finish(uint64_t bytes);

  // Stops the command if it still runs (SIGTERM to its group, SIGKILL after
  // 200 ms) and reaps it. Never blocks longer than that.
  void Close();

 private:
  std::string address_;
  int64_t shard_;
  pid_t pid_ = -1;
  int fd_ = -1;
  Status exit_;
};

}  // namespace shardkit::formats::wds
