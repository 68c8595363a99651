// Internal: the recordio format (MXNet RecordIO, .rec + .idx), split as
// framing.h (bytes on disk), reader.cc (Open: sequential reader and random
// access through the .idx), writer.cc (the writer), format.cc (the registry row,
// bids, `shardkit index`). The layout and the field mapping are documented in
// docs/formats-recordio.md.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "formats/recordio/framing.h"
#include "shardkit/dataset.h"

namespace shardkit::formats::recordio {

// FILE.rec -> FILE (the path itself when it does not end in .rec).
std::string StemOf(const std::string& rec_path);
// FILE.idx beside FILE.rec.
std::string IdxPathFor(const std::string& rec_path);
// FILE.shardkit.json beside FILE.rec: what shardkit adds (keys, class names,
// per-sample checksums, payload extensions that sniffing would not guess).
std::string MetaPathFor(const std::string& rec_path);

// The fields of a sample made from one image record (shared by the reader and
// the writer, which checks that what it writes reads back the same):
//   flag == 0, label an integer (|label| < 2^31):  cls = the label in decimal
//   flag == 0, any other label:                     labels.json = the label, a JSON number
//   flag > 0:                                       labels.json = the `flag` labels, a JSON array
// Non-finite labels are the JSON strings "nan", "inf", "-inf".
void SetLabelFields(const ImageRecord& r, Sample* out);

Result<std::unique_ptr<Dataset>> Open(const std::string& path, const OpenOptions& opts);
Result<std::unique_ptr<SampleWriter>> MakeWriter(const std::string& path, const WriteOptions& opts);

// Scans FILE.rec and writes FILE.idx (or `output`): `id<TAB>offset` per
// record, the id from each record's image header (the ordinal when a record has
// none). Returns the number of records and the index path.
Result<uint64_t> WriteIdx(const std::string& rec_path, const std::string& output, std::string* written);

}  // namespace shardkit::formats::recordio
