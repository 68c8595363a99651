// Internal: knobs of the lmdb format that tests need. Not installed.
#pragma once

#include <cstddef>

namespace shardkit::formats::lmdb {

// The map size a new environment starts with (default 1 TiB on 64-bit; the file
// grows only as pages are written). Tests set a tiny one to exercise the
// MDB_MAP_FULL path (abort, grow, replay the uncommitted batch). 0 restores the
// default. Not thread-safe to change while writers are being created.
void SetInitialMapSizeForTest(size_t bytes);
// Samples per write transaction (default 1000; a batch also ends at 2 MiB). While it is
// set, every commit is also a durable point (sync + resume.json), unless
// SetDurableBytesForTest says otherwise. 0 restores.
void SetBatchSamplesForTest(size_t n);
// A durable point after this much payload committed since the last one (default
// 1 GiB, or 30 s). 0 restores.
void SetDurableBytesForTest(size_t bytes);

}  // namespace shardkit::formats::lmdb
