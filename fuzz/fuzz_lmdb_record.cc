// libFuzzer target: the LMDB value decoders, the shardkit msgpack record and the
// caffe Datum. The first input byte picks the layout (and so the LMDB key), the
// rest is the value; a fresh environment holding that one entry (written with
// liblmdb directly, no shardkit.json: the reader detects the layout) is read.
#include <lmdb.h>

#include "common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  static int n = 0;
  std::string dir = fuzz::Scratch() + "/rec" + std::to_string(n++ % 2) + ".lmdb";
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  std::filesystem::create_directories(dir);
  MDB_env* env = nullptr;
  if (mdb_env_create(&env) || mdb_env_set_mapsize(env, 64 << 20) || mdb_env_open(env, dir.c_str(), 0, 0644)) abort();
  MDB_txn* txn = nullptr;
  MDB_dbi dbi;
  if (mdb_txn_begin(env, nullptr, 0, &txn) || mdb_dbi_open(txn, nullptr, 0, &dbi)) abort();
  std::string key = data[0] & 1 ? "00000000_a/b.jpg" : "0000000000";
  MDB_val k{key.size(), key.data()};
  MDB_val v{size - 1, const_cast<uint8_t*>(data + 1)};
  if (mdb_put(txn, dbi, &k, &v, 0) || mdb_txn_commit(txn)) abort();
  mdb_env_close(env);
  auto ds = shardkit::Open("lmdb:" + dir);
  if (ds.ok()) fuzz::Drain(**ds);
  return 0;
}
