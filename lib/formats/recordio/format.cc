// The recordio format's registry row (MXNet RecordIO: FILE.rec + FILE.idx), its
// bids and `shardkit index` for .rec files. Reading: reader.cc; writing:
// writer.cc; the bytes: framing.h. Documented in docs/formats-recordio.md.
#include <fmt/format.h>

#include "io/any_file.h"
#include "core/paths.h"
#include "formats/recordio/recordio.h"
#include "formats/channel_order.h"
#include "formats/registry.h"

namespace shardkit::formats {

namespace recordio {

namespace {

// 100 when the file starts with a record header (the magic, a cflag of 0 or 1
// and a length that fits the file), 0 when it does not, -1 when unreadable.
int Content(const std::string& path) {
  if (io::IsUrl(path)) return -1;  // (a remote address is bid on by its name: no request per bid)
  auto size = io::RegularFileSize(path);
  auto head = size.ok() ? io::ReadAnyHead(path, 8) : Result<std::string>(size.status());
  if (!head.ok() || head->size() != 8) return -1;
  const auto* h = reinterpret_cast<const uint8_t*>(head->data());
  uint32_t lrec = Load32(h + 4);
  bool ok = Load32(h) == kMagic && (lrec >> 29) <= 1 && uint64_t(lrec & kMaxPart) + 8 <= *size;
  return ok ? 100 : 0;
}

int BidRead(const std::string& path) {
  if (path.find('{') != std::string::npos || path.find("::") != std::string::npos) {
    auto r = paths::ExpandBraces(path);
    if (!r.ok() || r->empty()) return 0;
    for (const auto& e : *r)
      if (!paths::HasExtension(e, {".rec"})) return 0;
    return 90;
  }
  int c = Content(path);
  if (c == 100) return 100;
  return paths::HasExtension(path, {".rec"}) ? 90 : 0;  // a damaged first record is still ours to report on
}

int BidWrite(const std::string& path) { return paths::HasExtension(path, {".rec"}) ? 90 : 0; }

}  // namespace

Result<uint64_t> WriteIdx(const std::string& rec_path, const std::string& output, std::string* written) {
  if (!io::RegularFileSize(rec_path).ok()) return Status::NotFound("no such RecordIO file", Location{.file = rec_path});
  SK_ASSIGN_OR_RETURN(auto map, io::MapAny(rec_path, {}));
  std::string text, scratch;
  uint64_t offset = 0, n = 0;
  while (offset < map->size()) {
    Record rec;
    SK_RETURN_IF_ERROR(ReadRecord(map->data(), map->size(), offset, rec_path, &scratch, &rec));
    ImageRecord ir;
    uint64_t id = ParseImageRecord(rec.payload, Location{}, &ir).ok() ? ir.id : n;
    text += fmt::format("{}\t{}\n", id, offset);
    offset = rec.next;
    ++n;
  }
  std::string path = output.empty() ? IdxPathFor(rec_path) : output;
  if (path == rec_path) return Status::Invalid("index path would overwrite the .rec", Location{.file = path});
  SK_ASSIGN_OR_RETURN(auto out_fs, io::FileSystemOf(path));
  SK_RETURN_IF_ERROR(io::WriteFileAtomic(path, text, true, out_fs));
  if (written) *written = path;
  return n;
}

}  // namespace recordio

Format RecordioFormat() {
  return Format{
      .name = "recordio",
      .description = "MXNet RecordIO (read: x.rec with x.idx beside it, x-{000..009}.rec, a.rec::b.rec; "
                     "write: out/x.rec or out/x-%05d.rec)",
      .bid_read = recordio::BidRead,
      .bid_write = recordio::BidWrite,
      .open = recordio::Open,
      .create = recordio::MakeWriter,
      .extensions = {"rec", "idx"},
      .output_is_shards = true,
      .write_index = recordio::WriteIdx,
      .files_beside_shard = [](const std::string& shard) -> std::vector<std::string> {
        return {recordio::IdxPathFor(shard), recordio::MetaPathFor(shard)};
      },
      .read_options = {ChannelsReadOption()},
  };
}

}  // namespace shardkit::formats
