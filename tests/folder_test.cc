// Tests of the image folder format (lib/formats/folder/folder.cc).
#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <map>
#include <set>
#include <thread>

#include "io/file.h"
#include "core/paths.h"
#include "shardkit/shardkit.h"
#include "fault_fs.h"
#include "support.h"
#include "read_all.h"

using namespace shardkit;
namespace fs = std::filesystem;
using sk_test::TempDir;

namespace {

// These tests use placeholder bytes ("1", "LATIN1") for image files and lone sidecars:
// they read every file as it is (folder.files=all). The default, image files only, is
// tested in cli_test.cc and verify_test.cc.
std::unique_ptr<Dataset> MustOpen(const std::string& addr) {
  OpenOptions all;
  all.format_options["folder.files"] = "all";
  auto r = Open(addr, all);
  INFO(r.status().ToString());
  REQUIRE(r.ok());
  return std::move(r).value();
}

std::vector<Sample> ReadAll(const Dataset& ds) {
  return sk_test::ReadAllSamples(ds);
}

void MkDir(const std::string& p) { fs::create_directories(p); }

// All regular files below root (relative path -> bytes), hidden files included.
std::map<std::string, std::string> Tree(const std::string& root) {
  std::map<std::string, std::string> out;
  for (auto& e : fs::recursive_directory_iterator(root))
    if (e.is_regular_file()) out[fs::relative(e.path(), root).string()] = sk_test::ReadFile(e.path().string());
  return out;
}

std::unique_ptr<SampleWriter> MustCreate(const std::string& addr, const WriteOptions& o = {}) {
  auto w = Create(addr, o);
  INFO(w.status().ToString());
  REQUIRE(w.ok());
  return std::move(w).value();
}

Sample Make(std::string key, std::vector<std::pair<std::string, std::string>> fields) {
  Sample s;
  s.key = std::move(key);
  for (auto& [e, b] : fields) s.set(e, Bytes::Copy(b));
  return s;
}

}  // namespace

TEST_CASE("class folder: classes sorted by bytes, labels, keys, .JPEG matched, bytes equal the files", "[folder]") {
  TempDir t;
  std::string root = t / "train";
  // Byte order: "C" < "a_cls" < "b_cls" (uppercase sorts first).
  std::map<std::string, std::string> files = {
      {"b_cls/n1_10026.JPEG", sk_test::MakeJpeg(16, 12, 1)},
      {"b_cls/n1_2.jpg", sk_test::MakeJpeg(8, 8, 2)},
      {"a_cls/x.png", sk_test::MakePng(5, 5, 3)},
      {"a_cls/deep/er/y.Jpeg", sk_test::MakeJpeg(9, 7, 4)},
      {"C/cat.0.jpg", sk_test::MakeJpeg(6, 6, 5)},  // Kaggle style name: key keeps "cat.0"
      {"C/cat.0.json", "{\"a\":1}"},                // a sidecar joins its image
  };
  for (auto& [rel, bytes] : files) {
    MkDir(fs::path(root + "/" + rel).parent_path());
    sk_test::WriteFile(root + "/" + rel, bytes);
  }
  sk_test::WriteFile(root + "/README", "not a sample");         // beside class folders: ignored
  sk_test::WriteFile(root + "/a_cls/.hidden.jpg", "ignored");   // hidden: ignored
  MkDir(root + "/.git");                                         // hidden dir: not a class
  MkDir(root + "/empty");                                        // an empty class still counts

  auto ds = MustOpen(root);
  const DatasetInfo& info = ds->info();
  CHECK(info.format == "folder");
  CHECK(info.extra.at("layout") == "classes");
  CHECK(info.class_names == std::vector<std::string>{"C", "a_cls", "b_cls", "empty"});
  REQUIRE(info.num_samples == 5);
  CHECK(info.fields == std::vector<std::string>{"cls", "jpeg", "jpg", "json", "png"});
  uint64_t total = 0;
  for (auto& [rel, bytes] : files) total += bytes.size();
  CHECK(info.total_bytes == total);
  REQUIRE(info.shards.size() == 1);
  CHECK(info.shards[0].path == root);
  CHECK(info.extra.at("ignored_root_files") == "1");

  auto all = ReadAll(*ds);
  REQUIRE(all.size() == 5);
  std::vector<std::string> keys;
  for (auto& s : all) keys.push_back(s.key);
  CHECK(keys == std::vector<std::string>{"C/cat.0", "a_cls/deep/er/y", "a_cls/x", "b_cls/n1_10026", "b_cls/n1_2"});
  CHECK(all[0].label() == 0);
  CHECK(all[1].label() == 1);
  CHECK(all[2].label() == 1);
  CHECK(all[3].label() == 2);
  CHECK(all[4].label() == 2);
  CHECK(all[0].find("jpg")->data.view() == files["C/cat.0.jpg"]);
  CHECK(all[0].find("json")->data.view() == files["C/cat.0.json"]);
  CHECK(all[1].find("jpeg")->data.view() == files["a_cls/deep/er/y.Jpeg"]);
  CHECK(all[2].find("png")->data.view() == files["a_cls/x.png"]);
  REQUIRE(all[3].find("jpeg") != nullptr);  // .JPEG -> field "jpeg"
  CHECK(all[3].find("jpeg")->data.view() == files["b_cls/n1_10026.JPEG"]);
  CHECK(all[3].find("cls")->data.view() == "2");
  CHECK(all[4].fields.size() == 2);

  // Detection without a scheme picks the folder format for a directory.
  CHECK(DetectFormat(root).value() == "folder");
  CHECK(DetectFormat("folder:" + root).value() == "folder");
}

TEST_CASE("class folder from MakeImageFolder (ImageNet-like .JPEG names)", "[folder]") {
  TempDir t;
  int n = sk_test::MakeImageFolder(t / "in", 3, 4);
  auto ds = MustOpen("folder:" + t / "in");
  CHECK(ds->info().num_samples == uint64_t(n));
  CHECK(ds->info().class_names == std::vector<std::string>{"c0", "c1", "c2"});
  auto all = ReadAll(*ds);
  for (auto& s : all) {
    CHECK(s.key.substr(0, 3) == "c" + std::to_string(*s.label()) + "/");
    REQUIRE(s.find("jpeg"));
  }
}

TEST_CASE("flat folder: sidecars form one sample, first-dot split, sorted keys", "[folder]") {
  TempDir t;
  std::string root = t / "flat";
  MkDir(root + "/sub");
  sk_test::WriteFile(root + "/x.jpg", "JPGX");
  sk_test::WriteFile(root + "/x.cls", "7\n");
  sk_test::WriteFile(root + "/x.json", "{}");
  sk_test::WriteFile(root + "/a.seg.png", "SEG");
  sk_test::WriteFile(root + "/a.JPG", "JPGA");
  sk_test::WriteFile(root + "/sub/z.txt", "hello");
  sk_test::WriteFile(root + "/LICENSE", "no extension: not a sample");
  sk_test::WriteFile(root + "/.DS_Store", "hidden");

  auto ds = MustOpen(root);
  const auto& info = ds->info();
  CHECK(info.extra.at("layout") == "flat");
  CHECK(info.class_names.empty());
  CHECK(info.num_samples == 3);
  CHECK(info.fields == std::vector<std::string>{"cls", "jpg", "json", "seg.png", "txt"});
  CHECK(info.extra.at("skipped_files") == "1");
  CHECK(info.extra.at("skipped_example") == root + "/LICENSE");
  CHECK(info.total_bytes == 4 + 2 + 2 + 3 + 4 + 5);
  auto all = ReadAll(*ds);
  REQUIRE(all.size() == 3);
  CHECK(all[0].key == "a");
  CHECK(all[0].find("seg.png")->data.view() == "SEG");
  CHECK(all[0].find("jpg")->data.view() == "JPGA");
  CHECK_FALSE(all[0].label().has_value());
  CHECK(all[1].key == "sub/z");
  CHECK(all[1].find("txt")->data.view() == "hello");
  CHECK(all[2].key == "x");
  CHECK(all[2].label() == 7);
  CHECK(all[2].find("cls")->data.view() == "7\n");  // flat: the cls file's bytes as they are
  CHECK(all[2].fields.size() == 3);

  // A damaged layout marker is an error naming it, not a guess.
  sk_test::WriteFile(root + "/.shardkit-folder.json", "{\"layout\": 3");
  auto r = Open(root);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == Code::kCorrupt);
  CHECK(r.status().where().file == root + "/.shardkit-folder.json");
  // A marker saying "flat" wins over the class-folder look of a root holding only folders.
  std::string nested = t / "nested";
  MkDir(nested + "/a");
  sk_test::WriteFile(nested + "/a/x.jpg", "X");
  CHECK(MustOpen(nested)->info().extra.at("layout") == "classes");
  sk_test::WriteFile(nested + "/.shardkit-folder.json", "{\"layout\": \"flat\"}\n");
  auto fl = MustOpen(nested);
  CHECK(fl->info().extra.at("layout") == "flat");
  CHECK(fl->info().class_names.empty());
}

TEST_CASE("class folder: a cls sidecar must agree with the folder", "[folder]") {
  TempDir t;
  std::string root = t / "d";
  MkDir(root + "/a");
  MkDir(root + "/b");
  sk_test::WriteFile(root + "/a/x.jpg", "1");
  sk_test::WriteFile(root + "/b/y.jpg", "2");
  sk_test::WriteFile(root + "/b/y.cls", "1\n");
  {
    auto ds = MustOpen(root);
    auto all = ReadAll(*ds);
    REQUIRE(all.size() == 2);
    CHECK(all[1].find("cls")->data.view() == "1");
    CHECK(ds->info().total_bytes == 1 + 1 + 2);
  }
  sk_test::WriteFile(root + "/b/y.cls", "0");
  auto r = Open(root);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().where().key == "b/y");
  CHECK(r.status().where().file == root + "/b/y.cls");
  CHECK(r.status().message().find("label conflict") != std::string::npos);
  sk_test::WriteFile(root + "/b/y.cls", "one");
  r = Open(root);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().where().file == root + "/b/y.cls");
}

TEST_CASE("round trip folder -> folder is byte-identical (keys, labels, class names)", "[folder]") {
  TempDir t;
  std::string in = t / "in";
  sk_test::MakeImageFolder(in, 3, 3);
  sk_test::WriteFile(in + "/c1/extra.json", "{\"x\":2}");
  sk_test::WriteFile(in + "/c1/img4.json", "{\"note\":1}");
  MkDir(in + "/c3_empty");
  auto src = MustOpen(in);
  WriteOptions o;
  o.class_names = src->info().class_names;
  std::string out = t / "out";
  auto w = MustCreate("folder:" + out, o);
  auto a = ReadAll(*src);
  for (auto& s : a) REQUIRE(w->Write(s).ok());
  CHECK_FALSE(fs::exists(out));  // nothing under the final name before Finish()
  auto sum = w->Finish();
  REQUIRE(sum.ok());
  CHECK(sum->samples == a.size());
  CHECK(sum->bytes == src->info().total_bytes);

  auto dst = MustOpen(out);
  CHECK(dst->info().class_names == src->info().class_names);
  CHECK(dst->info().extra.at("layout") == "classes");
  auto b = ReadAll(*dst);
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    CHECK(a[i].key == b[i].key);
    CHECK(a[i].label() == b[i].label());
    REQUIRE(a[i].fields.size() == b[i].fields.size());
    for (size_t j = 0; j < a[i].fields.size(); ++j) {
      CHECK(a[i].fields[j].ext == b[i].fields[j].ext);
      CHECK(a[i].fields[j].data == b[i].fields[j].data);
    }
  }
  // The files themselves: same names (extensions lowercased), same bytes.
  auto ta = Tree(in), tb = Tree(out);
  tb.erase(".shardkit-folder.json");
  std::map<std::string, std::string> ta_lower;
  for (auto& [k, v] : ta) ta_lower[k.substr(0, k.rfind('.')) + "." + paths::Lower(k.substr(k.rfind('.') + 1))] = v;
  CHECK(ta_lower == tb);
  CHECK(fs::is_directory(out + "/c3_empty"));
  // No partial directory left beside the output.
  for (auto& e : fs::directory_iterator(t.path())) CHECK(e.path().filename().string().find("partial") == std::string::npos);

  // Flat round trip: sidecars, compound extensions, nested keys (read back as flat thanks to the marker).
  std::string flat = t / "flat", flat2 = t / "flat2";
  {
    auto w2 = MustCreate(flat);
    REQUIRE(w2->Write(Make("n1/x", {{"jpg", "J"}, {"cls", "3"}, {"seg.png", "S"}})).ok());
    REQUIRE(w2->Write(Make("n2/y", {{"txt", "T"}})).ok());
    REQUIRE(w2->Finish().ok());
  }
  auto f = MustOpen(flat);
  CHECK(f->info().extra.at("layout") == "flat");
  auto fa = ReadAll(*f);
  REQUIRE(fa.size() == 2);
  CHECK(fa[0].key == "n1/x");
  CHECK(fa[0].find("seg.png")->data.view() == "S");
  CHECK(fa[0].label() == 3);
  {
    auto w3 = MustCreate(flat2);
    for (auto& s : fa) REQUIRE(w3->Write(s).ok());
    REQUIRE(w3->Finish().ok());
  }
  CHECK(Tree(flat) == Tree(flat2));
}

TEST_CASE("random access equals sequential, also from many threads", "[folder]") {
  TempDir t;
  sk_test::MakeImageFolder(t / "in", 4, 8);
  auto ds = MustOpen(t / "in");
  auto seq = ReadAll(*ds);
  auto ra = ds->NewRandomAccess();
  REQUIRE(ra.ok());
  REQUIRE((*ra)->size() == seq.size());
  std::atomic<int> bad{0};
  std::vector<std::thread> th;
  for (int k = 0; k < 4; ++k)
    th.emplace_back([&, k] {
      for (size_t n = 0; n < seq.size(); ++n) {
        size_t i = (n * 7 + size_t(k) * 3) % seq.size();
        Sample s;
        if (!(*ra)->Get(i, &s).ok() || s.key != seq[i].key || s.fields.size() != seq[i].fields.size()) {
          ++bad;
          continue;
        }
        for (size_t j = 0; j < s.fields.size(); ++j)
          if (!(s.fields[j].ext == seq[i].fields[j].ext && s.fields[j].data == seq[i].fields[j].data)) ++bad;
      }
    });
  for (auto& x : th) x.join();
  CHECK(bad == 0);
  Sample s;
  auto st = (*ra)->Get(seq.size(), &s);
  CHECK(st.code() == Code::kInvalidArgument);
}

TEST_CASE("write: keys that would escape the output are refused", "[folder]") {
  TempDir t;
  std::string out = t / "out";
  auto w = MustCreate(out);
  for (std::string key : {"../x", "/abs/x", "a/../../x", "a//b", ".hidden", "a/.b"}) {
    INFO(key);
    Status st = w->Write(Make(key, {{"jpg", "x"}}));
    CHECK(st.code() == Code::kInvalidArgument);
    CHECK(st.where().key == key);
  }
  CHECK(w->Write(Make("../x", {{"jpg", "x"}})).message().find("escape") != std::string::npos);
  CHECK(w->Write(Make("/abs/x", {{"jpg", "x"}})).message().find("escape") != std::string::npos);
  REQUIRE(w->Write(Make("ok", {{"jpg", "x"}})).ok());  // validation errors do not break the writer
  REQUIRE(w->Finish().ok());
  CHECK_FALSE(fs::exists(t / "x.jpg"));
  CHECK_FALSE(fs::exists("/abs/x.jpg"));
  CHECK(Tree(out).size() == 2);  // ok.jpg and the marker

  // Class names that are not safe directory names.
  WriteOptions o;
  o.class_names = {"..", "b"};
  CHECK(Create("folder:" + t / "o2", o).status().code() == Code::kInvalidArgument);
  o.class_names = {"a/b"};
  CHECK(Create("folder:" + t / "o2", o).status().code() == Code::kInvalidArgument);
}

TEST_CASE("write: refuses to write through a symlinked directory inside the output", "[folder]") {
  TempDir t;
  std::string out = t / "out";
  MkDir(t / "elsewhere");
  auto w = MustCreate(out);
  std::string partial;
  for (auto& e : fs::directory_iterator(t.path()))
    if (e.path().filename().string().rfind("out.partial-", 0) == 0) partial = e.path().string();
  REQUIRE_FALSE(partial.empty());
  fs::create_directory_symlink(t / "elsewhere", partial + "/evil");
  Status st = w->Write(Make("evil/x", {{"jpg", "x"}}));
  CHECK_FALSE(st.ok());
  CHECK(st.message().find("symlink") != std::string::npos);
  CHECK(st.where().file == partial + "/evil");
  CHECK(fs::is_empty(t / "elsewhere"));
  // The failed writer publishes nothing.
  CHECK_FALSE(w->Finish().ok());
  w.reset();
  CHECK_FALSE(fs::exists(out));
  CHECK_FALSE(fs::exists(partial));
}

TEST_CASE("write: existing output, overwrite, abandon, layout rules", "[folder]") {
  TempDir t;
  std::string out = t / "out";
  MkDir(out);
  sk_test::WriteFile(out + "/old.txt", "old");
  auto r = Create("folder:" + out);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == Code::kAlreadyExists);
  CHECK(r.status().where().file == out);
  WriteOptions ow;
  ow.overwrite = true;
  {
    auto w = MustCreate("folder:" + out, ow);
    REQUIRE(w->Write(Make("new", {{"txt", "N"}})).ok());
    REQUIRE(w->Finish().ok());
  }
  CHECK_FALSE(fs::exists(out + "/old.txt"));
  CHECK(sk_test::ReadFile(out + "/new.txt") == "N");
  // An empty existing directory is fine.
  MkDir(t / "empty");
  {
    auto w = MustCreate("folder:" + t / "empty");
    REQUIRE(w->Write(Make("a", {{"txt", "A"}})).ok());
    REQUIRE(w->Finish().ok());
  }
  // Abandoned writer: nothing left.
  {
    auto w = MustCreate(t / "gone");
    REQUIRE(w->Write(Make("a", {{"txt", "A"}})).ok());
  }
  CHECK_FALSE(fs::exists(t / "gone"));
  for (auto& e : fs::directory_iterator(t.path())) CHECK(e.path().filename().string().find("partial") == std::string::npos);

  // Flat: a dot in the key's last component is refused, or replaced on request.
  {
    auto w = MustCreate(t / "dots");
    Status st = w->Write(Make("d/img.v2", {{"jpg", "x"}}));
    CHECK(st.code() == Code::kInvalidArgument);
    CHECK(st.where().key == "d/img.v2");
    CHECK(st.message().find("dot") != std::string::npos);
    WriteOptions rep;
    rep.key_dots = KeyDots::kReplace;
    auto w2 = MustCreate(t / "dots2", rep);
    REQUIRE(w2->Write(Make("d.x/img.v2", {{"jpg", "x"}})).ok());
    REQUIRE(w2->Finish().ok());
    CHECK(fs::exists(t / "dots2/d.x/img_v2.jpg"));
  }
  // Same key twice: refused, naming the file.
  {
    auto w = MustCreate(t / "dup");
    REQUIRE(w->Write(Make("a", {{"txt", "A"}})).ok());
    Status st = w->Write(Make("a", {{"txt", "B"}}));
    CHECK(st.code() == Code::kAlreadyExists);
    CHECK(st.where().file == t / "dup/a.txt");
  }
  // Classes: sorted unique names, labels in range, keys prefixed by their class unless already.
  {
    WriteOptions o;
    o.class_names = {"dog", "cat"};
    auto bad = Create("folder:" + t / "cls0", o);
    CHECK(bad.status().code() == Code::kInvalidArgument);
    CHECK(bad.status().message().find("sorted") != std::string::npos);
    o.class_names = {"cat", "dog", "eel"};
    auto w = MustCreate("folder:" + t / "cls", o);
    REQUIRE(w->Write(Make("cat/a", {{"jpg", "1"}, {"cls", "0"}})).ok());
    REQUIRE(w->Write(Make("b.1", {{"jpg", "2"}, {"cls", "1"}, {"json", "{}"}})).ok());
    REQUIRE(w->Write(Make("cat", {{"jpg", "3"}, {"cls", "1"}})).ok());  // one component: gets the class folder
    CHECK(w->Write(Make("x", {{"jpg", "4"}, {"cls", "3"}})).message().find("out of range") != std::string::npos);
    CHECK(w->Write(Make("y", {{"jpg", "4"}})).message().find("no label") != std::string::npos);
    CHECK(w->Write(Make("z", {{"seg.png", "4"}, {"cls", "0"}})).message().find("dot") != std::string::npos);
    auto sum = w->Finish();
    REQUIRE(sum.ok());
    CHECK(sum->samples == 3);
    auto tree = Tree(t / "cls");
    CHECK(tree.count("cat/a.jpg"));
    CHECK(tree.count("dog/b.1.jpg"));
    CHECK(tree.count("dog/b.1.json"));
    CHECK(tree.count("dog/cat.jpg"));
    CHECK(tree.size() == 5);  // no cls sidecars
    CHECK(fs::is_directory(t / "cls/eel"));
    auto ds = MustOpen(t / "cls");
    CHECK(ds->info().class_names == o.class_names);
    auto all = ReadAll(*ds);
    REQUIRE(all.size() == 3);
    CHECK(all[1].key == "dog/b.1");
    CHECK(all[1].label() == 1);
    CHECK(all[1].find("json"));
  }
}

TEST_CASE("write: an injected write failure leaves no output", "[folder]") {
  TempDir t;
  std::string out = t / "out";
  auto faults = sk_test::FaultFs();
  WriteOptions o;
  o.filesystem = faults;
  auto w = MustCreate(out, o);
  REQUIRE(w->Write(Make("a", {{"txt", "A"}})).ok());
  faults->SetFault([](const std::string& p, std::string_view op) { return (op == "write" && p.find("b.txt") != std::string::npos) ? ENOSPC : 0; });
  Status st = w->Write(Make("b", {{"txt", "B"}}));
  faults->SetFault(nullptr);
  CHECK(st.code() == Code::kIOError);
  CHECK(st.where().key == "b");
  CHECK(st.message().find("No space") != std::string::npos);
  CHECK_FALSE(w->Finish().ok());
  w.reset();
  CHECK_FALSE(fs::exists(out));
  // An fsync failure at Finish(): nothing published either.
  auto w2 = MustCreate(out, o);
  REQUIRE(w2->Write(Make("a", {{"txt", "A"}})).ok());
  faults->SetFault([](const std::string&, std::string_view op) { return op == "fsync" ? EIO : 0; });
  auto sum = w2->Finish();
  faults->SetFault(nullptr);
  CHECK_FALSE(sum.ok());
  CHECK_FALSE(fs::exists(out));
}

TEST_CASE("read errors: a.JPG beside a.jpg names both files", "[folder]") {
  TempDir t;
  std::string root = t / "d";
  MkDir(root + "/c");
  sk_test::WriteFile(root + "/c/a.jpg", "1");
  sk_test::WriteFile(root + "/c/a.JPG", "2");
  auto r = Open(root);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().where().key == "c/a");
  CHECK(r.status().message().find(root + "/c/a.jpg") != std::string::npos);
  CHECK(r.status().message().find(root + "/c/a.JPG") != std::string::npos);
}

TEST_CASE("read errors: unreadable entries are errors naming the file, not skips", "[folder]") {
  // Tests run as root, so chmod 000 does not make a file unreadable. Instead:
  // a dangling symlink and a FIFO (which would block a plain open()), both fail
  // as root; and a file removed after Open() fails at Get().
  TempDir t;
  std::string root = t / "d";
  MkDir(root + "/c");
  sk_test::WriteFile(root + "/c/ok.jpg", "1");
  fs::create_symlink(t / "nowhere.jpg", root + "/c/dangling.jpg");
  auto r = Open(root);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().where().file == root + "/c/dangling.jpg");
  CHECK(r.status().message().find("dangling") != std::string::npos);
  fs::remove(root + "/c/dangling.jpg");

  REQUIRE(::mkfifo((root + "/c/pipe.jpg").c_str(), 0644) == 0);
  auto t0 = std::chrono::steady_clock::now();
  r = Open(root);
  REQUIRE_FALSE(r.ok());
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
  CHECK(r.status().where().file == root + "/c/pipe.jpg");
  CHECK(r.status().message().find("not a regular file") != std::string::npos);
  fs::remove(root + "/c/pipe.jpg");

  sk_test::WriteFile(root + "/c/later.jpg", "2");
  auto ds = MustOpen(root);
  auto ra = ds->NewRandomAccess();
  REQUIRE(ra.ok());
  fs::remove(root + "/c/later.jpg");
  Sample s;
  Status st = (*ra)->Get(0, &s);
  CHECK(st.code() == Code::kIOError);
  CHECK(st.where().file == root + "/c/later.jpg");
  CHECK(st.where().key == "c/later");
  CHECK(st.where().index == 0);
  // The same file replaced by a FIFO after Open(): an error, not a hang.
  REQUIRE(::mkfifo((root + "/c/later.jpg").c_str(), 0644) == 0);
  st = (*ra)->Get(0, &s);
  CHECK(st.code() == Code::kIOError);
  CHECK(st.where().file == root + "/c/later.jpg");
}

TEST_CASE("read: symlink loops do not hang, symlinks to files and to other directories are followed", "[folder]") {
  TempDir t;
  std::string root = t / "d";
  MkDir(root + "/c/sub");
  MkDir(t / "outside/k");
  sk_test::WriteFile(root + "/c/sub/a.jpg", "A");
  sk_test::WriteFile(t / "outside/k/b.jpg", "B");
  sk_test::WriteFile(t / "target.png", "P");
  fs::create_directory_symlink(t / "outside/k", root + "/k");   // a class folder elsewhere
  fs::create_symlink(t / "target.png", root + "/c/linked.png");  // a symlinked file
  {
    auto ds = MustOpen(root);
    CHECK(ds->info().class_names == std::vector<std::string>{"c", "k"});
    auto all = ReadAll(*ds);
    REQUIRE(all.size() == 3);
    CHECK(all[0].key == "c/linked");
    CHECK(all[0].find("png")->data.view() == "P");
    CHECK(all[2].key == "k/b");
    CHECK(all[2].label() == 1);
  }
  // A directory symlink to an ancestor.
  fs::create_directory_symlink("..", root + "/c/sub/loop");
  auto t0 = std::chrono::steady_clock::now();
  auto r = Open(root);
  REQUIRE_FALSE(r.ok());
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
  CHECK(r.status().message().find("loop") != std::string::npos);
  CHECK(r.status().where().file == root + "/c/sub/loop");
  fs::remove(root + "/c/sub/loop");
  // A symlink to itself.
  fs::create_symlink("self.jpg", root + "/c/self.jpg");
  r = Open(root);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().where().file == root + "/c/self.jpg");
  CHECK(r.status().message().find("loop") != std::string::npos);
  fs::remove(root + "/c/self.jpg");
  // A flat folder pointing at its own root.
  std::string flat = t / "flat";
  MkDir(flat);
  sk_test::WriteFile(flat + "/x.txt", "x");
  fs::create_directory_symlink(flat, flat + "/again");
  r = Open(flat);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().where().file == flat + "/again");
}

TEST_CASE("non-UTF-8 file names round-trip byte-exact", "[folder]") {
  TempDir t;
  std::string root = t / "in";
  std::string cls = "cl\xff\xfe";         // not UTF-8
  std::string name = "caf\xe9";           // Latin-1 e-acute
  MkDir(root + "/" + cls);
  MkDir(root + "/plain");
  sk_test::WriteFile(root + "/" + cls + "/" + name + ".JPG", "LATIN1");
  sk_test::WriteFile(root + "/plain/p.jpg", "P");
  auto ds = MustOpen(root);
  CHECK(ds->info().class_names == std::vector<std::string>{cls, "plain"});
  auto all = ReadAll(*ds);
  REQUIRE(all.size() == 2);
  CHECK(all[0].key == cls + "/" + name);
  CHECK(all[0].find("jpg")->data.view() == "LATIN1");
  WriteOptions o;
  o.class_names = ds->info().class_names;
  std::string out = t / "out";
  auto w = MustCreate(out, o);
  for (auto& s : all) REQUIRE(w->Write(s).ok());
  REQUIRE(w->Finish().ok());
  CHECK(sk_test::ReadFile(out + "/" + cls + "/" + name + ".jpg") == "LATIN1");
  auto back = ReadAll(*MustOpen(out));
  REQUIRE(back.size() == 2);
  CHECK(back[0].key == all[0].key);
  CHECK(back[0].label() == 0);
}

TEST_CASE("bids: directories read as folders unless LMDB, paths without a known extension write as folders", "[folder]") {
  TempDir t;
  MkDir(t / "lm");
  sk_test::WriteFile(t / "lm/data.mdb", "");
  MkDir(t / "plain");
  sk_test::WriteFile(t / "x.tar", "");
  auto d = DetectFormat(t / "plain");
  REQUIRE(d.ok());
  CHECK(*d == "folder");
  auto lm = DetectFormat(t / "lm");
  CHECK((!lm.ok() || *lm != "folder"));
  auto tar = DetectFormat(t / "x.tar");
  CHECK((!tar.ok() || *tar != "folder"));
  // Writing: a plain path falls back to the folder format.
  auto w = Create(t / "newdir");
  REQUIRE(w.ok());
  REQUIRE((*w)->Write(Make("k", {{"txt", "v"}})).ok());
  REQUIRE((*w)->Finish().ok());
  CHECK(sk_test::ReadFile(t / "newdir/k.txt") == "v");
  // Missing directory / a file given as a folder.
  auto r = Open("folder:" + t / "missing");
  CHECK(r.status().code() == Code::kNotFound);
  r = Open("folder:" + t / "x.tar");
  CHECK(r.status().code() == Code::kInvalidArgument);
}
