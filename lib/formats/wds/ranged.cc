// Shards read through the seam by ranges (ranged.h).
#include "formats/wds/ranged.h"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "formats/tar/tar.h"
#include "formats/wds/names.h"

namespace shardkit::formats::wds {

Status RangedSource::Fetch(size_t min) {
  uint64_t size = file_->size();
  uint64_t want = std::min<uint64_t>(std::max<uint64_t>(min, chunk_), size - pos_);
  auto next = std::make_shared<std::string>(size_t(want), '\0');
  uint64_t have = 0;
  // Keep what is buffered past the position (a header already fetched).
  if (buf_ && pos_ >= buf_start_ && pos_ < buf_start_ + buf_->size()) {
    have = std::min<uint64_t>(want, buf_start_ + buf_->size() - pos_);
    std::memcpy(next->data(), buf_->data() + (pos_ - buf_start_), size_t(have));
  }
  if (have < want) {
    SK_ASSIGN_OR_RETURN(size_t n, file_->ReadAt(pos_ + have, size_t(want - have), next->data() + have));
    if (n != want - have)
      return Status::IOError(fmt::format("short read: {} of {} bytes (the object changed while being read?)", n,
                                         want - have),
                             Location{.file = file_->path(), .offset = int64_t(pos_ + have)});
  }
  buf_ = std::move(next);
  buf_start_ = pos_;
  return Status::OK();
}

Result<std::span<const uint8_t>> RangedSource::Ahead(size_t min) {
  uint64_t left = file_->size() - pos_;
  uint64_t need = std::min<uint64_t>(min, left);
  bool covered = buf_ && pos_ >= buf_start_ && pos_ + need <= buf_start_ + buf_->size();
  if (!covered) SK_RETURN_IF_ERROR(Fetch(size_t(need)));
  const auto* base = reinterpret_cast<const uint8_t*>(buf_->data()) + (pos_ - buf_start_);
  return std::span<const uint8_t>(base, size_t(buf_start_ + buf_->size() - pos_));
}

Result<uint64_t> RangedSource::Consume(uint64_t n) {
  uint64_t k = std::min<uint64_t>(n, file_->size() - pos_);
  pos_ += k;
  return k;
}

Result<Bytes> RangedSource::Take(uint64_t n) {
  uint64_t k = std::min<uint64_t>(n, file_->size() - pos_);
  if (k == 0) return Bytes();
  bool covered = buf_ && pos_ >= buf_start_ && pos_ + k <= buf_start_ + buf_->size();
  if (!covered && k > chunk_) {
    // A large member: a range of its own.
    auto own = std::make_shared<std::string>(size_t(k), '\0');
    SK_ASSIGN_OR_RETURN(size_t got, file_->ReadAt(pos_, size_t(k), own->data()));
    if (got != k)
      return Status::IOError(fmt::format("short read: {} of {} bytes", got, k),
                             Location{.file = file_->path(), .offset = int64_t(pos_)});
    pos_ += k;
    const auto* d = reinterpret_cast<const uint8_t*>(own->data());
    return Bytes(std::shared_ptr<const void>(own, own.get()), d, size_t(k));
  }
  if (!covered) SK_RETURN_IF_ERROR(Fetch(size_t(k)));
  const auto* d = reinterpret_cast<const uint8_t*>(buf_->data()) + (pos_ - buf_start_);
  pos_ += k;
  return Bytes(std::shared_ptr<const void>(buf_, buf_.get()), d, size_t(k));
}

namespace {

class RangedShardReader : public SampleReader {
 public:
  RangedShardReader(std::string path, int64_t shard) : path_(path), shard_(shard), group_(std::move(path), shard) {}

  Result<bool> Next(Sample* out) override {
    if (!error_.ok()) return error_;
    if (!scan_) {
      auto fs = FileSystemFor(path_);
      if (!fs.ok()) return error_ = fs.status();
      auto f = (*fs)->OpenForRead(path_);
      if (!f.ok()) {
        error_ = f.status();
        error_.At(Location{.file = path_, .shard = shard_});
        return error_;
      }
      src_ = std::make_unique<RangedSource>(std::shared_ptr<ReadableFile>(std::move(f).value()));
      scan_ = std::make_unique<tar::Scanner>(src_.get(), path_);
    }
    auto r = group_.Next(*scan_, out);
    if (!r.ok()) {
      error_ = r.status();
      error_.At(Location{.shard = shard_});
    }
    return r;
  }

 private:
  std::string path_;
  int64_t shard_;
  std::unique_ptr<RangedSource> src_;
  std::unique_ptr<tar::Scanner> scan_;
  SampleGrouper group_;
  Status error_;
};

}  // namespace

std::unique_ptr<SampleReader> NewRangedShardReader(std::string path, int64_t shard) {
  return std::make_unique<RangedShardReader>(std::move(path), shard);
}

}  // namespace shardkit::formats::wds
