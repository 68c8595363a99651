// folder format. (Placeholder: not implemented yet.)
#include "formats/registry.h"

namespace shardkit::formats {

Format FolderFormat() {
  return Format{
      .name = "folder",
      .description = "folder (not implemented yet)",
      .bid_read = [](const std::string&) { return 0; },
      .bid_write = [](const std::string&) { return 0; },
      .open = [](const std::string& path, const OpenOptions&) -> Result<std::unique_ptr<Dataset>> {
        return Status::Unsupported("the folder format is not implemented yet", Location{.file = path});
      },
      .create = [](const std::string& path, const WriteOptions&) -> Result<std::unique_ptr<SampleWriter>> {
        return Status::Unsupported("the folder format is not implemented yet", Location{.file = path});
      },
  };
}

}  // namespace shardkit::formats
