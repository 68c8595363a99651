// Streamed shards (pipe.h).
#include "formats/wds/pipe.h"

#include <fmt/format.h>

#include "formats/tar/source.h"
#include "formats/tar/tar.h"
#include "formats/wds/child.h"
#include "formats/wds/names.h"

namespace shardkit::formats::wds {

namespace {

// Members are taken from the stream one at a time (with their extended
// headers); the fields of a sample are views of the buffers they arrived in.
class PipeShardReader : public SampleReader {
 public:
  PipeShardReader(std::string address, int64_t shard)
      : address_(address),
        child_(address, shard),
        group_(
            std::move(address), shard, [this](Status s) { return Fail(std::move(s)); },
            [this] { exit_ = child_.Finish(src_->bytes_read()); }) {}

  // Starts the command on the first call. An error is sticky: every later call returns it again.
  Result<bool> Next(Sample* out) override {
    if (!error_.ok()) return error_;
    if (!started_) {
      started_ = true;
      error_ = child_.Start();
      if (!error_.ok()) return error_;
      src_ = std::make_unique<tar::FdSource>(child_.fd(), fmt::format("the output of command '{}'", child_.command()),
                                             child_.Where());
      scan_ = std::make_unique<tar::Scanner>(src_.get(), address_);
    }
    auto r = group_.Next(*scan_, out);
    if (!r.ok()) {
      error_ = r.status();
    } else if (!*r && !exit_.ok()) {
      error_ = exit_;  // the archive was whole, but the command failed: after the last sample, not instead of it
      return error_;
    }
    return r;
  }

 private:
  // A failure of the archive: when the output has ended, the command's exit
  // status is the first cause (`cat missing.tar` writes nothing and fails).
  Status Fail(Status s) {
    if (src_->ended()) {
      Status exit = child_.Finish(src_->bytes_read());
      if (!exit.ok()) return exit;
      if (src_->bytes_read() == 0)
        return Status::Corrupt(fmt::format("command '{}' wrote nothing: not a tar archive", child_.command()),
                               child_.Where());
    }
    s.At(child_.Where());
    return s;
  }

  std::string address_;
  ChildStream child_;  // declared before the source and scanner, which read its pipe
  std::unique_ptr<tar::FdSource> src_;
  std::unique_ptr<tar::Scanner> scan_;
  // Members into samples; at the end of the archive, the command's exit status into exit_.
  SampleGrouper group_;
  bool started_ = false;
  Status exit_;   // the command's, once the archive has ended
  Status error_;
};

}  // namespace

std::unique_ptr<SampleReader> NewPipeShardReader(std::string address, int64_t shard) {
  return std::make_unique<PipeShardReader>(std::move(address), shard);
}

}  // namespace shardkit::formats::wds
