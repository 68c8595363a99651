// The wds format's registry row: WebDataset tar shards. Reading: reader.h
// (mapped shards through the strict tar scanner, formats/tar/; `pipe:` shards,
// pipe.h); writing: writer.h. The layout is documented in docs/formats-wds.md.
#include "core/paths.h"
#include "formats/channel_order.h"
#include "formats/registry.h"
#include "formats/wds/index.h"
#include "formats/wds/names.h"
#include "formats/wds/parts.h"
#include "formats/wds/reader.h"
#include "formats/wds/shards.h"
#include "formats/wds/writer.h"

namespace shardkit::formats {


Format WdsFormat() {
  return Format{
      .name = "wds",
      .description = "WebDataset tar shards (read: x.tar, x-{000..009}.tar, a.tar::b.tar, x.manifest.json, 'pipe:CMD' "
                     "(streamed, in order only); "
                     "write: out/x-%06d.tar)",
      .bid_read = wds::BidRead,
      .bid_write = [](const std::string& path) -> int {
        return paths::EndsWith(paths::Lower(path), ".tar") && paths::CheckShardPattern(path).ok() ? 90 : 0;
      },
      .open = wds::OpenWds,
      .create = wds::WdsWriter::Make,
      .extensions = {"tar", "tgz", "gz", "json", "idx"},
      .prefixes = {"pipe"},
      .writes_shards = true,
      .output_is_shards = true,
      .resumes = true,
      .list_shards = wds::ListShards,
      .locate_samples = wds::LocateSamples,
      .plan_by_size = wds::WdsWriter::PlanBySize,
      .finished = wds::FinishedOutput,
      .merge = wds::MergeParts,
      .files_beside_shard = [](const std::string& shard) -> std::vector<std::string> {
        return {wds::IdxPathFor(shard), wds::SumsPath(shard)};
      },
      .part_files = wds::PartFiles,
      .read_options = {
          ChannelsReadOption(),
          {"index_budget", "64MiB", {},
           "memory for the random-access index of shards without a .idx (bytes, e.g. 64MiB, 1GB; "
           "SHARDKIT_INDEX_BUDGET)"},
      },
  };
}

}  // namespace shardkit::formats
