// The wds format's registry row: WebDataset tar shards. Reading: reader.h
// (mapped shards through the strict tar scanner, formats/tar/; `pipe:` shards,
// pipe.h); writing: writer.h. The layout is documented in docs/formats-wds.md.
#include "core/paths.h"
#include "formats/registry.h"
#include "formats/wds/names.h"
#include "formats/wds/reader.h"
#include "formats/wds/writer.h"

namespace shardkit::formats {

using wds::EndsWith;
using wds::IsPipe;

Format WdsFormat() {
  return Format{
      .name = "wds",
      .description = "WebDataset tar shards (read: x.tar, x-{000..009}.tar, a.tar::b.tar, x.manifest.json, 'pipe:CMD' "
                     "(streamed, in order only); "
                     "write: out/x-%06d.tar)",
      .bid_read = [](const std::string& path) -> int {
        std::string p = paths::Lower(path);
        if (EndsWith(p, ".manifest.json")) return 90;
        if (p.find('{') != std::string::npos || p.find("::") != std::string::npos) {
          auto r = paths::ExpandBraces(path);
          if (!r.ok() || r->empty()) return 0;
          for (const auto& e : *r)
            if (!EndsWith(paths::Lower(e), ".tar") && !IsPipe(e)) return 0;
          return 90;
        }
        return EndsWith(p, ".tar") || IsPipe(path) ? 90 : 0;
      },
      .bid_write = [](const std::string& path) -> int {
        return EndsWith(paths::Lower(path), ".tar") && paths::CheckShardPattern(path).ok() ? 90 : 0;
      },
      .open = wds::OpenWds,
      .create = wds::WdsWriter::Make,
  };
}

}  // namespace shardkit::formats
