// wds format. (Placeholder: not implemented yet.)
#include "formats/registry.h"

namespace shardkit::formats {

Format WdsFormat() {
  return Format{
      .name = "wds",
      .description = "wds (not implemented yet)",
      .bid_read = [](const std::string&) { return 0; },
      .bid_write = [](const std::string&) { return 0; },
      .open = [](const std::string& path, const OpenOptions&) -> Result<std::unique_ptr<Dataset>> {
        return Status::Unsupported("the wds format is not implemented yet", Location{.file = path});
      },
      .create = [](const std::string& path, const WriteOptions&) -> Result<std::unique_ptr<SampleWriter>> {
        return Status::Unsupported("the wds format is not implemented yet", Location{.file = path});
      },
  };
}

}  // namespace shardkit::formats
