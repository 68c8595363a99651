// Internal: the format registry. One row per format in registry.cc.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "shardkit/dataset.h"

namespace shardkit::formats {

struct Format {
  const char* name;         // scheme: "folder", "wds", "lmdb", "hdf5"
  const char* description;  // one line for `--help`
  // How sure (0..100) that a path without a scheme is of this format, for reading.
  int (*bid_read)(const std::string& path);
  // How sure (0..100) that a path without a scheme names an output of this format.
  int (*bid_write)(const std::string& path);
  Result<std::unique_ptr<Dataset>> (*open)(const std::string& path, const OpenOptions& opts);
  Result<std::unique_ptr<SampleWriter>> (*create)(const std::string& path, const WriteOptions& opts);
};

// Every format, in registry order.
const std::vector<Format>& All();

// Each format file defines one of these.
Format FolderFormat();
Format WdsFormat();
Format LmdbFormat();
Format Hdf5Format();

// Splits "scheme:rest" when scheme is a registered name; otherwise {"", address}.
std::pair<std::string, std::string> SplitScheme(std::string_view address);

}  // namespace shardkit::formats
