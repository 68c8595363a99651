// The storage seam: the local FileSystem, the one publish helper, the scheme
// registry, and every writer going through WriteOptions::filesystem.
#include <catch2/catch.hpp>

#include <cerrno>
#include <filesystem>
#include <mutex>
#include <set>

#include <fmt/format.h>

#include "io/file.h"
#include "fault_fs.h"
#include "shardkit/shardkit.h"
#include "support.h"

using namespace shardkit;
using sk_test::FaultFs;
using sk_test::Q;
using sk_test::TempDir;
namespace fs = std::filesystem;

namespace {

Status WriteNew(FileSystem& f, const std::string& path, std::string_view text) {
  SK_ASSIGN_OR_RETURN(auto w, f.NewWritableFile(path, CreateMode::kTruncate));
  SK_RETURN_IF_ERROR(w->Append(text));
  SK_RETURN_IF_ERROR(w->Sync());
  return w->Close();
}

std::vector<Sample> Samples(int n) {
  std::vector<Sample> out;
  for (int i = 0; i < n; ++i) {
    Sample s;
    s.key = fmt::format("k{:03d}", i);
    s.set("jpg", Bytes::Take(sk_test::MakeJpeg(8 + i, 8, uint32_t(i))));
    s.set_label(i % 2);
    out.push_back(std::move(s));
  }
  return out;
}

Status WriteAll(const std::string& address, const std::vector<Sample>& samples, const WriteOptions& o) {
  SK_ASSIGN_OR_RETURN(auto w, Create(address, o));
  for (const auto& s : samples) SK_RETURN_IF_ERROR(w->Write(s));
  return w->Finish().status();
}

}  // namespace

TEST_CASE("local fs: write, ranged reads, map, stat, list, remove", "[io]") {
  TempDir t;
  auto local = FileSystem::Local();
  REQUIRE(local);
  CHECK(FileSystem::OrLocal(nullptr) == local);
  REQUIRE(local->MakeDirs(t / "a/b").ok());
  REQUIRE(local->MakeDirs(t / "a/b").ok());  // exists: fine
  REQUIRE(WriteNew(*local, t / "a/f.bin", "0123456789").ok());

  auto r = local->OpenForRead(t / "a/f.bin");
  REQUIRE(r.ok());
  CHECK((*r)->size() == 10);
  char buf[8] = {};
  auto n = (*r)->ReadAt(3, 4, buf);
  REQUIRE(n.ok());
  CHECK(*n == 4);
  CHECK(std::string(buf, 4) == "3456");
  n = (*r)->ReadAt(8, 8, buf);  // short at the end
  REQUIRE(n.ok());
  CHECK(*n == 2);
  CHECK(std::string(buf, 2) == "89");
  auto m = (*r)->Map();
  REQUIRE(m.ok());
  Bytes mapped = *m;
  r->reset();  // the mapping outlives the file
  CHECK(mapped.view() == "0123456789");
  CHECK(mapped.owner() != nullptr);
  CHECK(*local->ReadFile(t / "a/f.bin") == "0123456789");
  CHECK(local->OpenForRead(t / "a/none").status().code() == Code::kNotFound);

  auto st = local->Stat(t / "a/f.bin");
  REQUIRE(st.ok());
  CHECK(st->type == FileType::kFile);
  CHECK(st->size == 10);
  CHECK(st->name == "f.bin");
  CHECK(local->Stat(t / "a/b")->type == FileType::kDirectory);
  CHECK(local->Stat(t / "a/none")->type == FileType::kNotFound);
  CHECK(local->Stat(t / "a/none/deeper")->type == FileType::kNotFound);
  fs::create_symlink(t / "nowhere", t / "a/dangling");
  fs::create_directory_symlink(t / "a/b", t / "a/linkdir");
  CHECK(local->Stat(t / "a/dangling")->type == FileType::kOther);
  CHECK(local->Stat(t / "a/dangling")->symlink);
  CHECK(local->Stat(t / "a/linkdir")->type == FileType::kDirectory);
  CHECK(local->Stat(t / "a/linkdir")->symlink);
  CHECK_FALSE(local->Stat(t / "a/b")->symlink);
  CHECK(local->Exists(t / "a/dangling"));
  CHECK_FALSE(local->IsDir(t / "a/f.bin"));

  auto list = local->ListDir(t / "a");
  REQUIRE(list.ok());
  std::vector<std::string> names;
  for (const auto& e : *list) names.push_back(e.name);
  CHECK(names == std::vector<std::string>{"b", "dangling", "f.bin", "linkdir"});
  CHECK(list->at(2).path == t / "a/f.bin");
  CHECK(local->ListDir(t / "none").status().code() == Code::kNotFound);

  // Exclusive creation refuses an existing file and a symlink.
  CHECK(local->NewWritableFile(t / "a/f.bin", CreateMode::kExclusive).status().code() == Code::kAlreadyExists);
  CHECK_FALSE(local->NewWritableFile(t / "a/dangling", CreateMode::kExclusive).ok());
  CHECK_FALSE(fs::exists(t / "nowhere"));

  REQUIRE(local->Rename(t / "a/f.bin", t / "a/g.bin").ok());
  CHECK(local->Stat(t / "a/f.bin")->type == FileType::kNotFound);
  CHECK(local->Rename(t / "a/f.bin", t / "a/h.bin").code() == Code::kIOError);
  REQUIRE(local->SyncDir(t / "a").ok());
  REQUIRE(local->SyncTree(t / "a").ok());
  REQUIRE(local->Remove(t / "a/g.bin").ok());
  REQUIRE(local->Remove(t / "a/g.bin").ok());  // absent: fine
  REQUIRE(local->Remove(t / "a/b").ok());      // an empty directory
  REQUIRE(local->MakeDirs(t / "a/c/d").ok());
  REQUIRE(WriteNew(*local, t / "a/c/d/x", "x").ok());
  CHECK_FALSE(local->Remove(t / "a/c").ok());  // not empty
  REQUIRE(local->RemoveAll(t / "a").ok());
  REQUIRE(local->RemoveAll(t / "a").ok());
  CHECK_FALSE(fs::exists(t / "a"));
  CHECK(*local->LocalPath("/x/y") == "/x/y");
  CHECK(local->ExternalIo("/x/y", ExternalOp::kWrite).ok());
}

TEST_CASE("publish: a file or a directory takes the final name in one call", "[io]") {
  TempDir t;
  auto local = FileSystem::Local();
  SECTION("a file; an existing one only with replace") {
    REQUIRE(WriteNew(*local, t / "s1", "one").ok());
    bool published = false;
    REQUIRE(local->Publish(t / "s1", t / "out", PublishOptions{.published = &published}).ok());
    CHECK(published);
    CHECK(sk_test::ReadFile(t / "out") == "one");
    REQUIRE(WriteNew(*local, t / "s2", "two").ok());
    Status st = local->Publish(t / "s2", t / "out", PublishOptions{.published = &published});
    CHECK(st.code() == Code::kAlreadyExists);
    CHECK(st.detail() == Detail::kOutputExists);
    CHECK(st.where().file == t / "out");
    CHECK(st.message().find("--") == std::string::npos);  // library terms, no CLI flag
    CHECK_FALSE(published);
    CHECK(sk_test::ReadFile(t / "out") == "one");
    REQUIRE(local->Publish(t / "s2", t / "out", PublishOptions{.replace = true}).ok());
    CHECK(sk_test::ReadFile(t / "out") == "two");
    CHECK_FALSE(fs::exists(t / "s2"));
  }
  SECTION("a directory over a directory: the old one is moved aside, then removed") {
    fs::create_directories(t / "out/old");
    sk_test::WriteFile(t / "out/old/x", "old");
    fs::create_directories(t / "stage");
    sk_test::WriteFile(t / "stage/new", "new");
    REQUIRE(local->Publish(t / "stage", t / "out", PublishOptions{.replace = true}).ok());
    CHECK(sk_test::ReadFile(t / "out/new") == "new");
    CHECK_FALSE(fs::exists(t / "out/old"));
    std::vector<std::string> left;
    for (auto& e : fs::directory_iterator(t.path())) left.push_back(e.path().filename().string());
    CHECK(left == std::vector<std::string>{"out"});
  }
  SECTION("a failed rename puts the old output back") {
    fs::create_directories(t / "out");
    sk_test::WriteFile(t / "out/keep", "old");
    fs::create_directories(t / "stage");
    sk_test::WriteFile(t / "stage/new", "new");
    auto faults = FaultFs([&](const std::string& p, std::string_view op) {
      return op == "rename" && p == t / "stage" ? EIO : 0;
    });
    bool published = true;
    Status st = faults->Publish(t / "stage", t / "out", PublishOptions{.replace = true, .published = &published});
    CHECK(st.code() == Code::kIOError);
    CHECK(st.where().file == t / "out");
    CHECK_FALSE(published);
    CHECK(sk_test::ReadFile(t / "out/keep") == "old");
    CHECK(fs::exists(t / "stage/new"));
  }
  SECTION("a failed directory sync after the rename: published, and the error is reported") {
    REQUIRE(WriteNew(*local, t / "s", "x").ok());
    auto faults = FaultFs([](const std::string&, std::string_view op) { return op == "fsync" ? EIO : 0; });
    bool published = false;
    Status st = faults->Publish(t / "s", t / "out", PublishOptions{.published = &published});
    CHECK(st.code() == Code::kIOError);
    CHECK(published);
    CHECK(fs::exists(t / "out"));
  }
}

TEST_CASE("file system registry: plain paths and file:// are local, unknown schemes are named", "[io]") {
  CHECK(*FileSystemFor("/tmp/x") == FileSystem::Local());
  CHECK(*FileSystemFor("relative/x") == FileSystem::Local());
  CHECK(*FileSystemFor("file:///tmp/x") == FileSystem::Local());
  auto r = FileSystemFor("nosuchscheme://bucket/key");
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == Code::kInvalidArgument);
  CHECK(r.status().message().find("nosuchscheme") != std::string::npos);
  CHECK(r.status().message().find("file") != std::string::npos);
  auto mem = std::make_shared<sk_test::FileSystemWrapper>();
  REQUIRE(RegisterFileSystem("sktest", [mem](std::string_view) -> Result<std::shared_ptr<FileSystem>> {
            return std::shared_ptr<FileSystem>(mem);
          }).ok());
  CHECK(*FileSystemFor("sktest://a/b") == mem);
  CHECK(RegisterFileSystem("sktest", [](std::string_view) -> Result<std::shared_ptr<FileSystem>> {
          return FileSystem::Local();
        }).code() == Code::kAlreadyExists);
  CHECK_FALSE(RegisterFileSystem("file", [](std::string_view) -> Result<std::shared_ptr<FileSystem>> {
                return FileSystem::Local();
              }).ok());
  auto again = FileSystemFor("other://x");
  REQUIRE_FALSE(again.ok());
  CHECK(again.status().message().find("sktest") != std::string::npos);  // the known schemes are listed
}

// Every writer creates, syncs and publishes through WriteOptions::filesystem:
// a failed publish (the rename into place) leaves no output and keeps an old one.
TEST_CASE("every writer publishes through the seam, and a failed publish keeps the old output", "[io]") {
  TempDir t;
  auto samples = Samples(5);
  struct Case {
    std::string address, final_path;
  };
  for (const Case& c : {Case{"folder:" + t / "o/f", t / "o/f"}, Case{"lmdb:" + t / "o/l.lmdb", t / "o/l.lmdb"},
                        Case{"hdf5:" + t / "o/h.h5", t / "o/h.h5"},
                        Case{"wds:" + t / "o/w/x-%06d.tar", t / "o/w/x.manifest.json"}}) {
    INFO(c.address);
    std::set<std::string> ops;
    std::mutex mu;
    WriteOptions o;
    o.class_names = {"a", "b"};
    o.filesystem = FaultFs([&](const std::string& p, std::string_view op) {
      std::lock_guard lock(mu);
      if (p.find("/o/") != std::string::npos) ops.insert(std::string(op));
      return 0;
    });
    REQUIRE(WriteAll(c.address, samples, o).ok());
    CHECK(ops.count("rename"));  // the publish
    CHECK(ops.count("fsync"));
    CHECK(ops.count("write"));
    auto before = Open(c.final_path);
    REQUIRE(before.ok());
    CHECK((*before)->info().num_samples == 5u);
    if (c.address.starts_with("wds:")) continue;  // shards are files of their own, published one by one

    // Again with overwrite, failing the rename of the staged output into place
    // (a sibling of the final path): the old output stays.
    o.overwrite = true;
    const fs::path parent = fs::path(c.final_path).parent_path();
    o.filesystem = FaultFs([&](const std::string& p, std::string_view op) {
      return op == "rename" && fs::path(p).parent_path() == parent && p != c.final_path &&
                     p.find(".old-") == std::string::npos
                 ? EIO
                 : 0;
    });
    auto fewer = samples;
    fewer.pop_back();
    Status st = WriteAll(c.address, fewer, o);
    INFO(st.ToString());
    CHECK(st.code() == Code::kIOError);
    auto after = Open(c.final_path);
    REQUIRE(after.ok());
    CHECK((*after)->info().num_samples == 5u);
  }
}

TEST_CASE("an existing output: the library says so in its terms, the CLI adds the flag", "[io]") {
  TempDir t;
  auto samples = Samples(3);
  for (std::string address : {"folder:" + t / "f", "lmdb:" + t / "l.lmdb", "hdf5:" + t / "h.h5"}) {
    INFO(address);
    REQUIRE(WriteAll(address, samples, {}).ok());
    auto again = Create(address, {});
    Status st = again.ok() ? [&] {
      Status s;
      for (const auto& x : samples) s = (*again)->Write(x);
      return s.ok() ? (*again)->Finish().status() : s;
    }()
                           : again.status();
    CHECK(st.code() == Code::kAlreadyExists);
    CHECK(st.detail() == Detail::kOutputExists);
    CHECK(st.message().find("exists") != std::string::npos);
    CHECK(st.message().find("--overwrite") == std::string::npos);
  }
  sk_test::MakeImageFolder(t / "in", 2, 2);
  for (std::string dst : {"folder:" + t / "f", "lmdb:" + t / "l.lmdb", "hdf5:" + t / "h.h5"}) {
    auto r = sk_test::Cli(fmt::format("convert {} {}", Q(t / "in"), Q(dst)));
    INFO(r.err);
    CHECK(r.exit_code == 1);
    CHECK(r.err.find("exists") != std::string::npos);
    CHECK(r.err.find("pass --overwrite to replace it") != std::string::npos);
  }
}

TEST_CASE("AtomicFile on the seam: a failed publish leaves neither the file nor its temporary", "[io]") {
  TempDir t;
  std::string p = t / "d/out.bin";
  auto faults = FaultFs([](const std::string&, std::string_view op) { return op == "rename" ? EIO : 0; });
  auto f = io::AtomicFile::Create(p, false, faults);
  REQUIRE(f.ok());
  REQUIRE((*f)->Write("hello").ok());
  Status st = (*f)->Commit();
  CHECK(st.code() == Code::kIOError);
  CHECK(st.where().file == p);
  f->reset();
  CHECK(fs::is_empty(t / "d"));
  // Without the fault it appears; a second one without overwrite is "output exists".
  REQUIRE(io::WriteFileAtomic(p, "hello", false).ok());
  CHECK(sk_test::ReadFile(p) == "hello");
  Status again = io::WriteFileAtomic(p, "other", false);
  CHECK(again.code() == Code::kAlreadyExists);
  CHECK(again.detail() == Detail::kOutputExists);
  CHECK(again.message() == "output exists");
  CHECK(sk_test::ReadFile(p) == "hello");
}

TEST_CASE("MakeNewDir: a new directory, never one that is already there", "[io]") {
  TempDir t;
  auto fs = FileSystem::Local();
  const std::string d = t / "staging";
  REQUIRE(fs->MakeNewDir(d).ok());
  CHECK(fs::is_directory(d));
  // Anything already there fails with kAlreadyExists: a directory, a file, a symlink
  // (to a directory, or dangling), so a staging directory is always the caller's own.
  CHECK(fs->MakeNewDir(d).code() == Code::kAlreadyExists);
  REQUIRE(WriteNew(*fs, t / "file", "x").ok());
  CHECK(fs->MakeNewDir(t / "file").code() == Code::kAlreadyExists);
  fs::create_directory_symlink(d, t / "link");
  fs::create_symlink(t / "nowhere", t / "dangling");
  CHECK(fs->MakeNewDir(t / "link").code() == Code::kAlreadyExists);
  CHECK(fs->MakeNewDir(t / "dangling").code() == Code::kAlreadyExists);
  CHECK(!fs::exists(t / "nowhere"));
  // A missing parent is an error naming the directory, not a silent mkdir -p.
  Status miss = fs->MakeNewDir(t / "no/such/parent");
  CHECK(miss.code() != Code::kOk);
  CHECK(miss.where().file == t / "no/such/parent");
}
