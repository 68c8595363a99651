#include "pipeline/stream.h"

#include <algorithm>
#include <map>

#include <fmt/format.h>

namespace shardkit::pipeline {

StreamReader::StreamReader(std::vector<StreamShard> shards, ShardOpener opener, uint64_t capacity, uint64_t seed,
                           bool shuffle)
    : shards_(std::move(shards)),
      opener_(std::move(opener)),
      capacity_(std::max<uint64_t>(capacity, 1)),
      seed_(seed),
      shuffle_(shuffle) {
  if (!shuffle_) capacity_ = 1;
}

Status StreamReader::OpenAt(uint64_t shard, uint64_t offset) {
  const bool reuse = cur_.reader && cur_shard_ == shard && cur_off_ <= offset;
  if (!reuse) {
    cur_.reader.reset();
    cur_.dataset.reset();
    Result<ShardReader> r = opener_(shard);
    if (!r.ok()) {
      Status st = r.status();
      return st.At(Location{.file = shards_[shard].name, .shard = int64_t(shard)});
    }
    cur_ = std::move(r).value();
    cur_shard_ = shard;
    cur_off_ = 0;
    ++shards_opened_;
  }
  Sample skip;
  while (cur_off_ < offset) SK_RETURN_IF_ERROR(ReadRaw(&skip));
  return Status::OK();
}

Status StreamReader::ReadRaw(Sample* out) {
  const StreamShard& sh = shards_[cur_shard_];
  Location where{.file = sh.name, .shard = int64_t(cur_shard_), .index = int64_t(sh.first + cur_off_)};
  out->clear();
  Result<bool> more = cur_.reader->Next(out);
  if (!more.ok()) {
    Status st = more.status();
    return st.At(where);
  }
  if (!*more)
    return Status::Corrupt(fmt::format("shard ended after {} samples but its metadata says {}", cur_off_, sh.samples),
                           where);
  ++cur_off_;
  ++samples_read_;
  // At the end of the shard, make sure it holds no more than its metadata says (a
  // sample beyond the count would otherwise be silently left out).
  if (cur_off_ == sh.samples) {
    Sample extra;
    Result<bool> again = cur_.reader->Next(&extra);
    if (!again.ok()) {
      Status st = again.status();
      return st.At(Location{.file = sh.name, .shard = int64_t(cur_shard_)});
    }
    if (*again)
      return Status::Corrupt(fmt::format("shard holds more samples than the {} its metadata says (next key '{}')",
                                         sh.samples, extra.key),
                             Location{.file = sh.name, .shard = int64_t(cur_shard_), .key = extra.key});
    cur_.reader.reset();  // done with it: free its mapping / file now
    cur_.dataset.reset();
    cur_shard_ = UINT64_MAX;
  }
  return Status::OK();
}

Status StreamReader::ReadOne(Item* out) {
  if (seg_ >= segs_.size()) return Status::Internal("streamed input read past the rank's segments");
  const Segment& s = segs_[seg_];
  if (!(cur_.reader && cur_shard_ == s.shard && cur_off_ == off_)) SK_RETURN_IF_ERROR(OpenAt(s.shard, off_));
  SK_RETURN_IF_ERROR(ReadRaw(&out->sample));
  out->shard = s.shard;
  out->offset = off_;
  if (++off_ >= s.end) {
    ++seg_;
    off_ = seg_ < segs_.size() ? segs_[seg_].begin : 0;
  }
  return Status::OK();
}

Status StreamReader::Start(uint64_t epoch, uint32_t rank, uint32_t world, uint64_t batch_size, bool drop_last,
                           const StreamPos* at) {
  epoch_ = epoch;
  rank_ = rank;
  std::vector<uint64_t> counts(shards_.size());
  for (size_t i = 0; i < shards_.size(); ++i) counts[i] = shards_[i].samples;
  segs_ = RankSegments(counts, ShardOrder(shards_.size(), seed_, epoch, shuffle_), rank, world, batch_size, drop_last);
  buf_.clear();
  cur_.reader.reset();
  cur_.dataset.reset();
  cur_shard_ = UINT64_MAX;
  cur_off_ = 0;
  max_buffered_ = samples_read_ = shards_opened_ = 0;
  emitted_ = 0;
  seg_ = 0;
  off_ = segs_.empty() ? 0 : segs_[0].begin;
  if (!at) return Status::OK();

  // Restore: check the position against this epoch's segments, then re-read the
  // buffered samples shard by shard (each shard once, front to its last needed offset).
  if (at->segment > segs_.size() || at->buffer.size() > capacity_ ||
      (at->segment < segs_.size() &&
       (at->offset < segs_[at->segment].begin || at->offset >= segs_[at->segment].end)))
    return Status::Invalid(fmt::format("streamed loader state (segment {}, offset {}, {} buffered) does not fit "
                                       "epoch {} of rank {} ({} segments, buffer {})",
                                       at->segment, at->offset, at->buffer.size(), epoch, rank, segs_.size(),
                                       capacity_));
  std::map<uint64_t, std::multimap<uint64_t, size_t>> want;  // shard -> offset -> buffer slot
  for (size_t i = 0; i < at->buffer.size(); ++i) {
    const BufferEntry& e = at->buffer[i];
    if (e.shard >= shards_.size() || e.offset >= shards_[e.shard].samples)
      return Status::Invalid(fmt::format("streamed loader state names sample {} of shard {}, which does not exist",
                                         e.offset, e.shard),
                             Location{.key = e.key});
    want[e.shard].emplace(e.offset, i);
  }
  buf_.assign(at->buffer.size(), Item{});
  for (const auto& [shard, offsets] : want) {
    for (auto it = offsets.begin(); it != offsets.end();) {
      uint64_t off = it->first;
      SK_RETURN_IF_ERROR(OpenAt(shard, off));
      Sample s;
      SK_RETURN_IF_ERROR(ReadRaw(&s));
      for (; it != offsets.end() && it->first == off; ++it) {
        const BufferEntry& e = at->buffer[it->second];
        if (s.key != e.key)
          return Status::Corrupt(fmt::format("resuming: sample {} of the shard has key '{}' but the saved shuffle "
                                             "buffer says '{}' (the dataset changed since the state was saved?)",
                                             off, s.key, e.key),
                                 Location{.file = shards_[shard].name, .shard = int64_t(shard), .key = e.key,
                                          .index = int64_t(shards_[shard].first + off)});
        buf_[it->second] = Item{s, shard, off};
      }
    }
  }
  emitted_ = at->emitted;
  seg_ = at->segment;
  off_ = seg_ < segs_.size() ? at->offset : 0;
  max_buffered_ = buf_.size();
  return Status::OK();
}

Status StreamReader::Next(Sample* out, uint64_t* index) {
  // Top the buffer up to capacity (the stream permitting), pick one, swap-remove it.
  while (buf_.size() < capacity_ && seg_ < segs_.size()) {
    Item it;
    SK_RETURN_IF_ERROR(ReadOne(&it));
    buf_.push_back(std::move(it));
  }
  if (buf_.empty()) return Status::Invalid(fmt::format("the rank's streamed epoch has only {} samples", emitted_));
  max_buffered_ = std::max<uint64_t>(max_buffered_, buf_.size());
  uint64_t k = BufferPick(seed_, epoch_, rank_, emitted_, buf_.size());
  Item& it = buf_[k];
  *index = shards_[it.shard].first + it.offset;
  *out = std::move(it.sample);
  if (k + 1 != buf_.size()) it = std::move(buf_.back());
  buf_.pop_back();
  ++emitted_;
  return Status::OK();
}

Status StreamReader::Skip(uint64_t count) {
  Sample s;
  uint64_t i;
  for (uint64_t c = 0; c < count; ++c) SK_RETURN_IF_ERROR(Next(&s, &i));
  return Status::OK();
}

StreamPos StreamReader::Position() const {
  StreamPos p;
  p.emitted = emitted_;
  p.segment = seg_;
  p.offset = off_;
  p.buffer.reserve(buf_.size());
  for (const Item& it : buf_) p.buffer.push_back(BufferEntry{it.shard, it.offset, it.sample.key});
  return p;
}

}  // namespace shardkit::pipeline
