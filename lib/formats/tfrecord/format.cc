// The tfrecord format's registry row: TensorFlow TFRecord files of
// tf.train.Example records. Reading: dataset.cc; writing: writer.cc; framing:
// frames.h; records <-> samples: example.h. docs/formats-tfrecord.md.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "io/any_file.h"
#include "core/json_count.h"
#include "core/paths.h"
#include "formats/channel_order.h"
#include "formats/registry.h"
#include "formats/tfrecord/frames.h"
#include "formats/tfrecord/tfrecord.h"

namespace shardkit::formats {

namespace {

// A name that says TFRecord: x.tfrecord, x.tfrecords, or TFDS's x.tfrecord-00000-of-00010.
bool TfName(const std::string& path) {
  std::string p = paths::Lower(path);
  std::string_view base = paths::BaseName(p);
  return paths::EndsWith(base, ".tfrecord") || paths::EndsWith(base, ".tfrecords") ||
         base.find(".tfrecord-") != std::string_view::npos || base.find(".tfrecords-") != std::string_view::npos;
}

int BidRead(const std::string& path) {
  if (paths::EndsWith(paths::Lower(path), tfrecord::kManifestSuffix)) {
    auto text = io::ReadFile(path);
    if (!text.ok()) return 90;
    auto j = nlohmann::json::parse(*text, nullptr, false);
    if (j.is_discarded() || !j.is_object()) return 90;  // opens with a clear error
    return json_count::MemberIs(j, "format", "tfrecord") ? 100 : 0;
  }
  if (path.find('{') != std::string::npos || path.find("::") != std::string::npos) {
    auto r = paths::ExpandBraces(path);
    if (!r.ok() || r->empty()) return 0;
    for (const auto& e : *r)
      if (!TfName(e) && tfrecord::ContentBid(e) != 100) return 0;
    return 90;
  }
  int c = tfrecord::ContentBid(path);
  if (c == 100) return 100;
  return TfName(path) ? 90 : 0;  // a damaged first record is still a file to report on
}

int BidWrite(const std::string& path) {
  std::string p = paths::Lower(path);
  if (!(paths::EndsWith(p, ".tfrecord") || paths::EndsWith(p, ".tfrecords"))) return 0;
  if (path.find('%') == std::string::npos) return 90;
  return paths::CheckShardPattern(path).ok() ? 90 : 0;
}

Result<uint64_t> WriteDaliIndex(const std::string& path, const std::string& output) {
  SK_ASSIGN_OR_RETURN(tfrecord::FileData f, tfrecord::LoadFile(path));
  if (f.compression != tfrecord::Compression::kNone)
    return Status::Unsupported(fmt::format("the file is {}-compressed; DALI's TFRecord reader (and its index) needs "
                                           "uncompressed files",
                                           tfrecord::CompressionName(f.compression)),
                               Location{.file = path});
  SK_ASSIGN_OR_RETURN(auto frames, tfrecord::ScanFrames(f));
  if (frames.empty()) return Status::Invalid("file holds no records", Location{.file = path});
  std::string out = output.empty() ? tfrecord::IdxPathFor(path) : output;
  if (out == path) return Status::Invalid("index path would overwrite the file", Location{.file = out});
  SK_ASSIGN_OR_RETURN(auto out_fs, io::FileSystemOf(out));
  SK_RETURN_IF_ERROR(io::WriteFileAtomic(out, tfrecord::DaliIndexText(frames), true, out_fs));
  return uint64_t(frames.size());
}

}  // namespace

Format TfrecordFormat() {
  return Format{
      .name = "tfrecord",
      .description = "TensorFlow TFRecord files of tf.train.Example (read: x.tfrecord, x-{00000..00009}.tfrecord, "
                     "a::b, x.tfrecord.json; GZIP/ZLIB files too; write: out/x-%05d.tfrecord or one file)",
      .bid_read = BidRead,
      .bid_write = BidWrite,
      .open = tfrecord::OpenTfrecord,
      .create = tfrecord::CreateTfrecord,
      .extensions = {"tfrecord", "tfrecords"},
      .writes_shards = true,
      .output_is_shards = true,
      .list_shards = tfrecord::ListShards,
      .dali_index_path = tfrecord::IdxPathFor,
      .write_dali_index = WriteDaliIndex,
      .files_beside_shard = [](const std::string& shard) -> std::vector<std::string> {
        return {tfrecord::IdxPathFor(shard)};
      },
      .write_options = {
          {"preset", "imagenet", {"imagenet", "tfds"},
           "which tf.train.Example features the fields become: 'imagenet' (TF's ImageNet scripts) or 'tfds'"},
          {"field_map", "", {},
           "FEATURE=FIELD,... instead of the preset (FIELD: __key__, cls, cls-1 for a 1-based label, or an "
           "extension)"},
          {"compression", "none", {"none", "gzip", "zlib"}, "whole-file compression, as TFRecordOptions"},
      },
      .read_options = {ChannelsReadOption()},
  };
}

}  // namespace shardkit::formats
