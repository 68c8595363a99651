// hdf5 format (format.cc: the registry row; internal.h lists the other files): one .h5 file that h5py users read without shardkit.
//
// Layout written (format version 1; docs/formats-hdf5.md has the full contract):
//   /keys                   1-D vlen string, N sample keys
//   /labels                 1-D int64, N labels (-1: the sample has none)
//   /checksums              1-D uint64, N per-sample XXH3 (Sample::checksum())
//   /fields/<ext>/data      1-D uint8, CONTIGUOUS, every payload of <ext> back to back
//   /fields/<ext>/offsets   1-D uint64, N+1: sample i is data[offsets[i]:offsets[i+1]]
//   attributes on /: shardkit_format_version (int32), class_names (vlen strings)
//
// Debian's HDF5 is the serial build: no two threads may be inside the library
// at once. Every H5* call in this file runs under H5Mutex(). Random reads of our
// layout never call HDF5: the payload datasets are contiguous, so their file
// address (H5Dget_offset) plus the in-memory offsets give each payload's byte
// range in an mmap of the whole file. Third-party files (vlen `images`) go
// through HDF5, under the mutex, one element at a time.
//
// Writing: the output is created at the first sample, unnamed (O_TMPFILE;
// else `.NAME.tmp-PID`), as an HDF5 file holding only its root group. The
// payloads of one field (the largest of the first sample) are then written
// straight into it at kDirectAt, past its end; other fields stream into
// unlinked spill files. Finish() reopens the file through libhdf5, creates
// that field's `data` dataset first (contiguous, allocated early, never
// filled; the file's alignment puts it exactly at kDirectAt), then everything
// else, closes it, copies the spill files into their datasets, fsyncs, links
// the file under its temporary name and renames it into place.
//
// Reading guards: every variable-length element libhdf5 converts for us is
// checked against the file first (VlenCheck), because libhdf5 1.10 allocates
// whatever length a descriptor declares.
#include "formats/hdf5/internal.h"
#include "formats/channel_order.h"


#include <cstring>

namespace shardkit::formats {

namespace {

using hdf5::kSignature;

int BidRead(const std::string& path) {
  // (A remote address is bid on by its name: no request per bid.)
  if (!io::IsUrl(path)) {
    auto st = io::StatAny(path);
    if (st.ok() && st->type == FileType::kFile) {
      auto head = io::ReadAnyHead(path, 8);
      if (head.ok() && *head == std::string_view(kSignature, 8)) return 100;  // the signature verified
    } else if (st.ok() && st->type != FileType::kNotFound) {
      return 0;  // a directory is never an HDF5 file
    }
  }
  return paths::HasExtension(path, {".h5", ".hdf5", ".hdf"}) ? 90 : 0;
}

int BidWrite(const std::string& path) { return paths::HasExtension(path, {".h5", ".hdf5"}) ? 90 : 0; }

}  // namespace

Format Hdf5Format() {
  return Format{
      .name = "hdf5",
      .description = "one HDF5 file (.h5): keys, labels, contiguous payload datasets; reads h5py's images/labels",
      .bid_read = BidRead,
      .bid_write = BidWrite,
      .open = hdf5::OpenHdf5,
      .create = hdf5::CreateHdf5,
      .extensions = {"h5", "hdf5", "hdf", "he5"},
      .records_assumed_channel_order = true,
      .write_options = {
          {"arrays", "native", {"native", "fields"},
           "samples that are a decoded array (npy) and a label: 'native' (images uint8 [N,H,W,C] + labels, as "
           "h5py scripts write them) or 'fields' (shardkit's byte layout)"},
      },
      .read_options = {
          {"order", "nhwc", {"nhwc", "nchw"}, "the axis order of a 4-D images dataset: nhwc or nchw"},
          ChannelsReadOption(),
      },
  };
}

}  // namespace shardkit::formats
