// The one publish helper: FileSystem::Publish's default, used by every writer
// (AtomicFile for files; the folder, LMDB and HDF5 writers for their outputs).
#include <unistd.h>

#include <fmt/format.h>

#include <random>

#include "io/file.h"
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

namespace io {

Status CheckDirectoryOutput(FileSystem& fs, const std::string& root, bool overwrite) {
  SK_ASSIGN_OR_RETURN(FileInfo fi, fs.Stat(root));
  if (overwrite) return Status::OK();
  if (fi.type == FileType::kNotFound) {
    // Nothing here; a staging file system may still know of an output where it goes.
    SK_ASSIGN_OR_RETURN(bool present, fs.OutputPresent(root, OutputKind::kDirectory));
    return present ? OutputExists(root, "output directory exists and is not empty") : Status::OK();
  }
  if (fi.type != FileType::kDirectory || fi.symlink) return OutputExists(root, "output exists and is not a directory");
  SK_ASSIGN_OR_RETURN(auto entries, fs.ListDir(root));
  if (!entries.empty()) return OutputExists(root, "output directory exists and is not empty");
  return Status::OK();
}

Result<std::string> StageOutputDirectory(FileSystem& fs, const std::string& root, bool overwrite) {
  SK_RETURN_IF_ERROR(CheckDirectoryOutput(fs, root, overwrite));
  std::string parent = DirName(root);
  if (!fs.IsDir(parent)) SK_RETURN_IF_ERROR(fs.MakeDirs(parent));
  // A fresh name (mkdtemp's pattern), created with MakeNewDir: it fails when anything
  // is there, so the directory is the writer's own (not a link or a directory someone
  // made between a check and a mkdir -p, as before), and what it holds is the writer's.
  for (int attempt = 0; attempt < 100; ++attempt) {
    static const char kChars[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    std::string name = fmt::format("{}.partial-{}-", root, ::getpid());
    static thread_local std::mt19937_64 rng{std::random_device{}()};
    uint64_t r = rng();
    for (int i = 0; i < 6; ++i, r /= 62) name += kChars[r % 62];
    Status made = fs.MakeNewDir(name);
    if (made.ok()) return name;
    if (made.code() != Code::kAlreadyExists)
      return Status(made.code(), "cannot create output directory: " + made.message(), Location{.file = root});
  }
  return Status::IOError("cannot pick a staging directory name", Location{.file = root});
}

}  // namespace io
}  // namespace shardkit
