// pipeline/stream.h (internal): streamed input for the Loader.
//
// A StreamReader yields one rank's samples of one epoch in the order of the streamed
// plan (plan.h: shard order -> this rank's segments -> bounded shuffle buffer), reading
// each shard front to back through a SampleReader (no random access needed). Its
// position (StreamPos) can be taken between any two samples and given back to a new
// StreamReader, which re-reads what the buffer held and continues identically.
//
// Threading: one thread at a time. Memory: at most `capacity` samples in the buffer
// (plus the one being read); a shard reader is open for at most one shard at a time
// (two during Seek()).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "pipeline/plan.h"
#include "shardkit/dataset.h"

namespace shardkit::pipeline {

// One shard of a streamed dataset.
struct StreamShard {
  std::string name;      // for messages (a path, or the dataset's address)
  uint64_t samples = 0;  // from the dataset's metadata (or counted)
  uint64_t first = 0;    // dataset index of its first sample
};

// A reader over one shard, from its first sample. `dataset` (may be null) owns what the
// reader reads from and is destroyed after it (members are destroyed in reverse order;
// StreamReader resets `reader` before replacing a ShardReader).
struct ShardReader {
  std::unique_ptr<Dataset> dataset;
  std::unique_ptr<SampleReader> reader;
};
using ShardOpener = std::function<Result<ShardReader>(uint64_t shard)>;

// A sample in the buffer, named by where it came from.
struct BufferEntry {
  uint64_t shard = 0, offset = 0;  // offset: its position within its shard
  std::string key;
};

struct StreamPos {
  uint64_t emitted = 0;   // samples handed out so far in this epoch
  uint64_t segment = 0;   // the next sample to read: segment index ...
  uint64_t offset = 0;    // ... and its offset within that segment's shard
  std::vector<BufferEntry> buffer;  // in buffer order (the order matters for the picks)
};

class StreamReader {
 public:
  // `capacity` < 2 means no shuffling (samples come out in stream order).
  StreamReader(std::vector<StreamShard> shards, ShardOpener opener, uint64_t capacity, uint64_t seed, bool shuffle);

  // Starts epoch e for this rank from its beginning, or from `at` (re-reading the
  // buffered samples and checking their keys).
  Status Start(uint64_t epoch, uint32_t rank, uint32_t world, uint64_t batch_size, bool drop_last,
               const StreamPos* at = nullptr);
  // The next sample and its dataset index. NotFound-free: the caller knows how many
  // samples the rank has (PartitionEpoch); asking for more is kInvalidArgument.
  Status Next(Sample* out, uint64_t* index);
  // Skips `count` samples (picks and reads them, no copies kept): replay to a position.
  Status Skip(uint64_t count);

  StreamPos Position() const;
  uint64_t max_buffered() const { return max_buffered_; }  // the most samples held, this epoch
  uint64_t samples_read() const { return samples_read_; }  // reads from shards, this epoch
  uint64_t shards_opened() const { return shards_opened_; }
  const std::vector<Segment>& segments() const { return segs_; }

 private:
  struct Item {
    Sample sample;
    uint64_t shard = 0, offset = 0;
  };
  Status ReadOne(Item* out);                        // the next sample of the segments
  Status OpenAt(uint64_t shard, uint64_t offset);   // reader_ positioned before `offset`
  Status ReadRaw(Sample* out);                      // reader_->Next with shard context

  std::vector<StreamShard> shards_;
  ShardOpener opener_;
  uint64_t capacity_;
  uint64_t seed_;
  bool shuffle_;

  uint64_t epoch_ = 0, rank_ = 0;
  std::vector<Segment> segs_;
  uint64_t emitted_ = 0, seg_ = 0, off_ = 0;
  std::vector<Item> buf_;
  ShardReader cur_;
  uint64_t cur_shard_ = UINT64_MAX, cur_off_ = 0;  // what cur_ reads next
  uint64_t max_buffered_ = 0, samples_read_ = 0, shards_opened_ = 0;
};

}  // namespace shardkit::pipeline
