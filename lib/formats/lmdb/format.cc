// lmdb format (format.cc: the registry row; internal.h lists the other files): one LMDB environment directory (data.mdb, lock.mdb) plus
// shardkit.json. Two layouts; docs/formats-lmdb.md describes both byte for byte.
//
//  "shardkit": LMDB key = "%010d" sample index; value = one msgpack map
//      {"key": str (bin if not UTF-8), "fields": {ext: bin, ...}, "xxh3": uint64}.
//  "caffe":    LMDB key = "%08d_<key>.<image ext>"; value = caffe Datum
//      (encoded = true, data = image bytes, label, channels/height/width).
//
// Writing: into "<dir>.partial", MDB_APPEND, batches of 1000 samples or 2 MiB
// per transaction (not synced), a durable point (sync + resume.json) every
// 1 GiB or 30 s, MDB_MAP_FULL handled by aborting, growing the map and
// replaying the batch; in Finish() mdb_env_sync(1) while data.mdb is hashed,
// shardkit.json, then rename and fsync of the parent directory.
//
// Reading: MDB_RDONLY | MDB_NOTLS, plus MDB_NOLOCK when the directory has no
// lock.mdb or is not writable, so a reader never creates a lock file. Values are
// zero-copy views into LMDB's map. Read transactions live in a pool owned by the
// shared Env and are never reset; random access gives each calling thread one of
// them (a ReadSlot, found without a lock). Every Bytes handed out keeps its slot or
// the Env (and so the read transaction it came from) alive, which pins the
// snapshot the bytes belong to: a writer in another process cannot reuse those
// pages while the bytes exist.
#include "formats/lmdb/internal.h"
#include "formats/channel_order.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstring>

namespace shardkit::formats {

namespace {

namespace fs = std::filesystem;

// Whether a data file starts with an LMDB meta page: MDB_meta's mm_magic
// (0xBEEFC0DE, host order) right after the 16-byte page header of page 0.
bool HasMetaPage(const std::string& data_path) {
  int fd = ::open(data_path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  uint8_t head[20];
  ssize_t r = ::pread(fd, head, sizeof head, 0);
  ::close(fd);
  uint32_t magic = 0;
  if (r == ssize_t(sizeof head)) std::memcpy(&magic, head + 16, 4);
  return magic == 0xBEEFC0DEu;
}

int BidRead(const std::string& path) {
  std::string p = paths::StripTrailingSlashes(path);
  // An address is bid on by its name (no request per bid).
  if (io::IsUrl(p)) return p.ends_with(".lmdb") || fs::path(p).filename() == "data.mdb" ? 90 : 0;
  std::string data;
  if (io::IsDir(p)) data = p + "/data.mdb";
  else if (fs::path(p).filename() == "data.mdb") data = p;
  else return 0;
  if (!io::Exists(data)) return 0;
  return HasMetaPage(data) ? 100 : 95;  // a damaged data.mdb is still LMDB's to report on
}

int BidWrite(const std::string& path) {
  std::string p = paths::StripTrailingSlashes(path);
  return p.size() > 5 && p.ends_with(".lmdb") ? 90 : 0;
}


}  // namespace

Format LmdbFormat() {
  return Format{
      .name = "lmdb",
      .description = "LMDB environment directory (layouts: shardkit msgpack records, caffe Datum, image bytes, pickles)",
      .bid_read = BidRead,
      .bid_write = BidWrite,
      .open = [](const std::string& path, const OpenOptions& opts) { return lmdb::OpenDataset(path, opts); },
      .create = [](const std::string& path, const WriteOptions& opts) { return lmdb::CreateWriter(path, opts); },
      .extensions = {"mdb", "lmdb"},
      .resumes = true,
      .records_assumed_channel_order = true,
      .write_options = {
          {"layout", "shardkit", {"shardkit", "caffe"},
           "record layout: 'shardkit' (msgpack records) or 'caffe' (Datum records, \"%08d_<key>\" keys)"},
          {"arrays", "pickle", {"pickle", "record"},
           "samples that are a decoded array (npy) and a label: 'pickle' (keys f\"{idx}\", values "
           "pickle.dumps((array, label)), as the common scripts write them) or 'record' (shardkit records)"},
      },
      .read_options = {
          {"layout", "", {},
           "read the records as this layout instead of the one detected: shardkit, caffe, image (image file "
           "bytes) or pickle (pickle.dumps((array, label)))"},
          ChannelsReadOption(),
      },
  };
}


}  // namespace shardkit::formats
