// The mds format's registry row: MosaicML Streaming MDS directories (index.json
// version 2 + shard.NNNNN.mds[.zstd]). Layout and field mapping:
// docs/formats-mds.md.
#include "formats/mds/mds.h"
#include "formats/channel_order.h"
#include "formats/registry.h"

namespace shardkit::formats {

Format MdsFormat() {
  return Format{
      .name = "mds",
      .description = "MosaicML Streaming MDS (read: a directory holding index.json, or one shard.NNNNN.mds of it; "
                     "write: out/train.mds or mds:DIR)",
      .bid_read = mds::BidRead,
      .bid_write = mds::BidWrite,
      .open = mds::OpenMds,
      .create = mds::CreateMds,
      .extensions = {"mds", "zstd"},
      .output_is_shards = true,
      .list_shards = mds::ListShards,
      .locate_samples = mds::LocateSamples,
      // Streaming's own default size_limit (1 << 26): a shard is the unit it downloads
      // and caches, so a smaller one starts training sooner and evicts in finer steps.
      .default_shard_size = 64ull << 20,
      .write_options = {
          {"compression", "", {}, "compress each shard with 'zstd' or 'zstd:LEVEL' (1..22), as streaming names it "
                                  "(default: none)"},
          {"hashes", "xxh3_64", {}, "comma-separated hashes of each shard file for index.json (md5, sha1, xxh32, "
                                    "xxh64, xxh3_64, xxh3_128, xxh128; 'none' for none)"},
      },
      .read_options = {ChannelsReadOption()},
  };
}

}  // namespace shardkit::formats
