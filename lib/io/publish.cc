// The one publish helper: FileSystem::Publish's default, used by every writer
// (AtomicFile for files; the folder, LMDB and HDF5 writers for their outputs).
#include <unistd.h>

#include <fmt/format.h>

#include "core/file.h"
#include "shardkit/filesystem.h"

namespace shardkit {

Status FileSystem::Publish(const std::string& staged, const std::string& final_path, const PublishOptions& opts) {
  if (opts.published) *opts.published = false;
  const Location at{.file = final_path};
  SK_ASSIGN_OR_RETURN(FileInfo old, Stat(final_path));
  std::string aside;
  if (old.type != FileType::kNotFound) {
    if (!opts.replace) return io::OutputExists(final_path, "output appeared while writing");
    SK_ASSIGN_OR_RETURN(FileInfo now, Stat(staged));
    // rename() replaces a file by a file in one step, but a directory output
    // cannot replace a non-empty directory (nor a file): move the old output
    // aside first. A file never replaces a directory (the rename fails).
    if (now.type == FileType::kDirectory) {
      aside = fmt::format("{}.old-{}", final_path, ::getpid());
      (void)RemoveAll(aside);
      Status moved = Rename(final_path, aside);
      if (!moved.ok()) return Status(moved.code(), "cannot move the old output aside: " + moved.message(), at);
    }
  }
  Status renamed = Rename(staged, final_path);
  if (!renamed.ok()) {
    if (!aside.empty()) (void)Rename(aside, final_path);  // put the old output back
    return Status(renamed.code(), "cannot rename the output into place: " + renamed.message(), at);
  }
  if (opts.published) *opts.published = true;
  Status synced = SyncDir(io::DirName(final_path));
  if (!aside.empty()) (void)RemoveAll(aside);
  return synced;
}

}  // namespace shardkit
