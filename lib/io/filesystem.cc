// The FileSystem base: defaults shared by every implementation, and the scheme registry.
#include <map>
#include <mutex>

#include <fmt/format.h>

#include "shardkit/filesystem.h"

#if SHARDKIT_WITH_REMOTE
#include "io/remote/remote_fs.h"
#endif

namespace shardkit {

Result<Bytes> ReadableFile::Map() const {
  return Status::Unsupported("this file system cannot map files; read with ReadAt", Location{.file = path()});
}

const std::shared_ptr<FileSystem>& FileSystem::OrLocal(const std::shared_ptr<FileSystem>& fs) {
  static const std::shared_ptr<FileSystem> local = Local();
  return fs ? fs : local;
}

Result<std::string> FileSystem::ReadFile(const std::string& path) {
  SK_ASSIGN_OR_RETURN(auto f, OpenForRead(path));
  std::string out(size_t(f->size()), '\0');
  SK_ASSIGN_OR_RETURN(size_t n, f->ReadAt(0, out.size(), out.data()));
  out.resize(n);
  return out;
}

Result<std::unique_ptr<WritableFile>> FileSystem::NewStagedFile(const std::string& temp_path, const std::string&) {
  return NewWritableFile(temp_path, CreateMode::kTruncate);
}

bool FileSystem::Exists(const std::string& path) {
  auto st = Stat(path);
  return st.ok() && st->type != FileType::kNotFound;
}

// As Exists: a path that cannot be stat'ed is no output (writing it then fails, naming it).
Result<bool> FileSystem::OutputPresent(const std::string& path, OutputKind) { return Exists(path); }

bool FileSystem::IsDir(const std::string& path) {
  auto st = Stat(path);
  return st.ok() && st->type == FileType::kDirectory;
}

Result<std::string> FileSystem::LocalPath(const std::string& path) {
  return Status::Unsupported("this file system has no local files (a library that does its own I/O needs one)",
                             Location{.file = path});
}

Status FileSystem::ExternalIo(const std::string&, ExternalOp) { return Status::OK(); }

Status FileSystem::MakeNewDir(const std::string& dir) {
  SK_ASSIGN_OR_RETURN(FileInfo fi, Stat(dir));
  if (fi.type != FileType::kNotFound) return Status::Exists("already exists", Location{.file = dir});
  return MakeDirs(dir);
}

// ---------------------------------------------------------------- scheme registry

namespace {

struct Registry {
  std::mutex mu;
  std::map<std::string, FileSystemFactory> factories;
};

Registry& Schemes() {
  static Registry r;
  return r;
}

}  // namespace

Status RegisterFileSystem(const std::string& scheme, FileSystemFactory factory) {
  if (scheme.empty() || scheme == "file" || !factory)
    return Status::Invalid(fmt::format("cannot register file system scheme '{}'", scheme));
  Registry& r = Schemes();
  std::lock_guard lock(r.mu);
  if (!r.factories.emplace(scheme, std::move(factory)).second)
    return Status::Exists(fmt::format("file system scheme '{}' is registered already", scheme));
  return Status::OK();
}

Result<std::shared_ptr<FileSystem>> FileSystemFor(std::string_view address) {
  auto sep = address.find("://");
  if (sep == std::string_view::npos) return FileSystem::Local();
  std::string scheme(address.substr(0, sep));
  if (scheme == "file") return FileSystem::Local();
#if SHARDKIT_WITH_REMOTE
  remote::RegisterRemoteFileSystems();  // http, https, s3: on first use, not by a static initialiser
#endif
  FileSystemFactory factory;
  std::string known = "file";
  {
    Registry& r = Schemes();
    std::lock_guard lock(r.mu);
    auto it = r.factories.find(scheme);
    if (it != r.factories.end()) factory = it->second;
    for (const auto& [name, _] : r.factories) known += ", " + name;
  }
  if (!factory)
    return Status::Invalid(fmt::format("unknown storage scheme '{}://' (known: {})", scheme, known),
                           Location{.file = std::string(address)});
  return factory(address);
}

}  // namespace shardkit
