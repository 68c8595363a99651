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
  PipeShardReader(std::string address, int64_t shard) : address_(address), shard_(shard), child_(address, shard) {}

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
    auto r = NextSample(out);
    if (!r.ok()) {
      error_ = r.status();
    } else if (!*r && !exit_.ok()) {
      error_ = exit_;  // the archive was whole, but the command failed: after the last sample, not instead of it
      return error_;
    }
    return r;
  }

 private:
  Result<bool> NextSample(Sample* out) {
    if (!have_pending_) {
      SK_ASSIGN_OR_RETURN(bool more, Pull());
      if (!more) return false;
    }
    out->clear();
    out->key = std::move(pending_key_);
    out->set(pending_ext_, std::move(pending_data_));
    have_pending_ = false;
    for (;;) {
      SK_ASSIGN_OR_RETURN(bool more, Pull());
      if (!more || pending_key_ != out->key) return true;
      for (const auto& f : out->fields)
        if (f.ext == pending_ext_)
          return Status::Corrupt(fmt::format("field '{}' appears twice in sample '{}'", f.ext, out->key),
                                 Location{.file = address_, .shard = shard_, .offset = int64_t(pending_header_),
                                          .key = out->key});
      out->set(pending_ext_, std::move(pending_data_));
      have_pending_ = false;
    }
  }

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

  // Reads the next data member into pending_*; false after the end-of-archive
  // blocks and the end of the output, the command's exit status then in exit_.
  Result<bool> Pull() {
    if (done_) return false;
    for (;;) {
      tar::Member m;
      auto r = scan_->Next(&m);
      if (!r.ok()) return Fail(std::move(r).take_status());
      if (!*r) {
        done_ = true;
        exit_ = child_.Finish(src_->bytes_read());
        return false;
      }
      std::string key, ext;
      SK_ASSIGN_OR_RETURN(NameKind kind, Classify(m, address_, shard_, &key, &ext));
      if (kind == NameKind::kSkip) continue;
      auto data = scan_->TakeData();
      if (!data.ok()) return Fail(std::move(data).take_status());
      pending_key_ = std::move(key);
      pending_ext_ = std::move(ext);
      pending_header_ = m.header_offset;
      pending_data_ = std::move(data).value();
      have_pending_ = true;
      return true;
    }
  }

  std::string address_;
  int64_t shard_;
  ChildStream child_;  // declared before the source and scanner, which read its pipe
  std::unique_ptr<tar::FdSource> src_;
  std::unique_ptr<tar::Scanner> scan_;
  bool started_ = false;
  bool done_ = false;
  Status exit_;   // the command's, once the archive has ended
  Status error_;
  bool have_pending_ = false;
  std::string pending_key_, pending_ext_;
  Bytes pending_data_;
  uint64_t pending_header_ = 0;
};

}  // namespace

std::unique_ptr<SampleReader> NewPipeShardReader(std::string address, int64_t shard) {
  return std::make_unique<PipeShardReader>(std::move(address), shard);
}

}  // namespace shardkit::formats::wds
