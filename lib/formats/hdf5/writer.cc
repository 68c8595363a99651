// formats/hdf5/writer.cc: the hdf5 writer (the write rules: format.cc's header comment).
#include "formats/hdf5/internal.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>

#include "core/per_thread.h"
#include <fmt/ranges.h>

#include "formats/array_sample.h"
#include "formats/transform_record.h"
#include "formats/hdf5/arrays.h"

namespace shardkit::formats::hdf5 {

namespace {

constexpr size_t kSpillBuf = 1 << 20;
constexpr size_t kCopyBlock = 8 << 20;


// Where the payloads of the direct field start in the output file, and the
// alignment libhdf5 is told to give every allocation of at least that size:
// the direct field's `data` dataset, created first when the file is reopened
// at Finish() (with only a few KB of metadata below it), then lands exactly
// here. Holes left by the alignment are never written (sparse).
constexpr uint64_t kDirectAt = 64 << 10;

// One payload field being written: its bytes go either straight into the
// output file at kDirectAt (the direct field) or into an unlinked spill file.
struct SpillField {
  std::string ext;
  bool direct = false;
  int fd = -1;                     // spill file (not for the direct field)
  std::string buf;
  uint64_t size = 0;               // bytes appended so far (written + buffered)
  uint64_t flushed = 0;            // bytes written out
  std::vector<uint64_t> offsets;   // N+1 once every sample is written
  ~SpillField() {
    if (fd >= 0) ::close(fd);
  }
};

// File access properties of the writer: the alignment above. Lock held.
Hid WriterFapl() {
  Hid fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  H5Pset_alignment(fapl.get(), kDirectAt, kDirectAt);
  return fapl;
}

Status WriteAll(int fd, const char* p, size_t len, uint64_t off, const std::string& what, const Location& at) {
  while (len > 0) {
    ssize_t w = ::pwrite(fd, p, len, off_t(off));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      Location l = at;
      l.offset = int64_t(off);
      return Status::FromErrno(w < 0 ? errno : EIO, what, l);
    }
    p += w;
    off += uint64_t(w);
    len -= size_t(w);
  }
  return Status::OK();
}

Status ReadAll(int fd, char* p, size_t len, uint64_t off, const std::string& what, const Location& at) {
  while (len > 0) {
    ssize_t r = ::pread(fd, p, len, off_t(off));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return Status::FromErrno(r < 0 ? errno : EIO, what, at);
    p += r;
    off += uint64_t(r);
    len -= size_t(r);
  }
  return Status::OK();
}

class Hdf5Writer : public SampleWriter {
 public:
  Hdf5Writer(std::string path, WriteOptions opts)
      : path_(std::move(path)), opts_(std::move(opts)), fs_(FileSystem::OrLocal(opts_.filesystem)) {
    key_end_.push_back(0);
  }
  ~Hdf5Writer() override {
    if (fd_ >= 0) ::close(fd_);
    if (!temp_.empty() && !finished_) ::unlink(temp_.c_str());
  }

  Status Write(const Sample& s) override {
    if (finished_) return Status::Invalid("write after Finish()", Location{.file = path_});
    if (!failed_.ok()) return failed_;
    Status st = DoWrite(s);
    if (!st.ok()) failed_ = st;
    return st;
  }

  Result<WriteSummary> Finish() override {
    if (finished_) return Status::Invalid("Finish() called twice", Location{.file = path_});
    if (!failed_.ok()) return failed_;
    auto r = DoFinish();
    if (!r.ok()) {
      failed_ = r.status();
      if (fd_ >= 0) ::close(fd_);
      fd_ = -1;
      if (!temp_.empty()) ::unlink(temp_.c_str());
      temp_.clear();
    }
    return r;
  }

 private:
  uint64_t n() const { return labels_.size(); }

  // Creates the output file, unnamed (O_TMPFILE) where the file system allows
  // it, else as `.NAME.tmp-PID`, as an HDF5 file with only its root group.
  // Payloads are then written at kDirectAt, beyond its end; libhdf5 reopens it
  // through h5name_ at Finish().
  Status Start() {
    std::string dir = io::DirName(path_);
    auto base = std::filesystem::path(path_).filename().string();
    H5Lock lock;
    Hid fapl = WriterFapl();
    int fd = ::open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0666);
    if (fd >= 0) {
      h5name_ = fmt::format("/proc/self/fd/{}", fd);
      Hid f(H5Fcreate(h5name_.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get()), H5Fclose);
      if (f.ok() && f.close() >= 0) {
        fd_ = fd;
        return Status::OK();
      }
      H5Eclear2(H5E_DEFAULT);
      ::close(fd);  // no /proc, or libhdf5 cannot reopen it: use a name
    }
    temp_ = fmt::format("{}/.{}.tmp-{}", dir, base, ::getpid());
    h5name_ = temp_;
    ::unlink(temp_.c_str());
    Hid f(H5Fcreate(h5name_.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get()), H5Fclose);
    if (!f.ok() || f.close() < 0)
      return Status::IOError(fmt::format("cannot create HDF5 file: {}", H5Message()), Location{.file = temp_});
    fd_ = ::open(temp_.c_str(), O_RDWR | O_CLOEXEC);
    if (fd_ < 0) return Status::FromErrno(errno, "cannot open temporary file", Location{.file = temp_});
    return Status::OK();
  }

  Status DoWrite(const Sample& s) {
    Location at{.file = path_, .key = s.key, .index = int64_t(n())};
    if (s.key.empty()) return Status::Invalid("empty sample key", at);
    if (s.key.find('\0') != std::string::npos) return Status::Invalid("sample key holds a NUL byte", at);
    if (fd_ < 0) SK_RETURN_IF_ERROR(Start());
    if (n() == 0 && !decided_) {
      decided_ = true;
      // Only when the first sample fits the layout: any other sample (a field beside the
      // array, a non-uint8 array, ...) keeps shardkit's byte layout, which holds everything.
      arrays_ = WriteOption(opts_, "hdf5.arrays") == "native" && s.find("npy") && CheckArraySample(s, at).ok();
    }
    if (arrays_) return WriteArray(s, at);
    int64_t label = -1;
    bool cls_in_labels = false;
    if (const Field* c = s.find("cls")) {
      auto l = s.label();
      // Only a canonical non-negative decimal goes to /labels alone; anything
      // else is kept byte-exact in fields/cls.
      if (l && *l >= 0 && std::to_string(*l) == c->data.view()) {
        label = *l;
        cls_in_labels = true;
      }
    }
    for (const auto& f : s.fields) {
      if (f.ext == "cls" && cls_in_labels) continue;
      if (f.ext.empty() || f.ext.find('/') != std::string::npos || f.ext.find('\0') != std::string::npos ||
          f.ext == "." || f.ext == "..")
        return Status::Invalid(fmt::format("field extension '{}' cannot name an HDF5 group", f.ext), at);
      // The direct field: the largest payload of the first sample that has one.
      if (direct_ext_.empty() || (n() == 0 && spills_.empty() && f.data.size() > direct_size0_)) {
        direct_ext_ = f.ext;
        direct_size0_ = f.data.size();
      }
    }
    for (const auto& f : s.fields) {
      if (f.ext == "cls" && cls_in_labels) continue;
      SK_ASSIGN_OR_RETURN(SpillField * sf, GetSpill(f.ext));
      SK_RETURN_IF_ERROR(Append(sf, f.data.data(), f.data.size()));
    }
    for (auto& [ext, sf] : spills_) sf->offsets.push_back(sf->size);
    key_blob_ += s.key;
    key_end_.push_back(key_blob_.size());
    labels_.push_back(label);
    checksums_.push_back(s.checksum());
    return Status::OK();
  }

  // Whether `s` fits the images layout (else the error WriteArray gives).
  Status CheckArraySample(const Sample& s, const Location& at) {
    auto st = ParseArraySample(s, at);
    return st.ok() ? Status::OK() : st.status();
  }
  // A sample of the images layout: a decoded uint8 [H, W] or [H, W, C] array in C order
  // and a non-negative label (formats/array_sample.h).
  Result<ArraySample> ParseArraySample(const Sample& s, const Location& at) {
    SK_ASSIGN_OR_RETURN(ArraySample out, formats::ParseArraySample(s, at, "the HDF5 images layout",
                                                                   "--hdf5-arrays fields keeps any sample"));
    if (out.label && *out.label < 0)
      return Status::Invalid(fmt::format("sample '{}': label {} is negative, which the HDF5 images layout does not "
                                         "store (--hdf5-arrays fields keeps any bytes)",
                                         s.key, *out.label),
                             at);
    const pickle::NdArray& arr = out.arr;
    if (arr.dtype.descr() != "|u1" || arr.fortran_order || (arr.shape.size() != 2 && arr.shape.size() != 3))
      return Status::Invalid(
          fmt::format("sample '{}': the HDF5 images layout holds uint8 [H, W] or [H, W, C] arrays in C order, not "
                      "{} {}{} (--hdf5-arrays fields keeps the .npy bytes as they are)",
                      s.key, arr.dtype.descr(), fmt::join(arr.shape, "x"), arr.fortran_order ? " Fortran order" : ""),
          at);
    for (uint64_t d : arr.shape)
      if (d == 0) return Status::Invalid(fmt::format("sample '{}': an empty array ({})", s.key, fmt::join(arr.shape, "x")), at);
    return out;
  }

  // option hdf5.arrays "native": a sample is a decoded uint8 array ("npy", [H, W] or
  // [H, W, C], C order) and at most a canonical label; its pixels go to the spill file of
  // "npy" (offsets per sample), its shape to shapes_. Finish() writes `images`.
  Status WriteArray(const Sample& s, const Location& at) {
    SK_ASSIGN_OR_RETURN(ArraySample a, ParseArraySample(s, at));
    const pickle::NdArray* arr = &a.arr;
    const int64_t label = a.label.value_or(-1);
    if (rank_ == 0) rank_ = arr->shape.size();
    if (rank_ != arr->shape.size())
      return Status::Invalid(fmt::format("sample '{}': a {}-D array after {}-D ones: the HDF5 images layout keeps one "
                                         "rank (--hdf5-arrays fields keeps any)",
                                         s.key, arr->shape.size(), rank_),
                             at);
    SK_ASSIGN_OR_RETURN(SpillField * sf, GetSpill("npy"));
    SK_RETURN_IF_ERROR(Append(sf, arr->data.data(), arr->data.size()));
    sf->offsets.push_back(sf->size);
    if (!shapes_.empty() && !std::equal(arr->shape.begin(), arr->shape.end(), shapes_.begin())) same_shape_ = false;
    shapes_.insert(shapes_.end(), arr->shape.begin(), arr->shape.end());
    key_blob_ += s.key;
    key_end_.push_back(key_blob_.size());
    labels_.push_back(label);
    return Status::OK();
  }

  Result<SpillField*> GetSpill(const std::string& ext) {
    auto it = spills_.find(ext);
    if (it != spills_.end()) return it->second.get();
    auto sf = std::make_unique<SpillField>();
    sf->ext = ext;
    sf->offsets.assign(n() + 1, 0);  // earlier samples lack this field: empty ranges
    sf->buf.reserve(kSpillBuf);
    if (ext == direct_ext_) {
      sf->direct = true;
    } else {
      std::string dir = io::DirName(path_);
      auto base = std::filesystem::path(path_).filename().string();
      std::string spill = fmt::format("{}/.{}.spill-{}-{}", dir, base, ::getpid(), spills_.size());
      sf->fd = ::open(spill.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
      if (sf->fd < 0) return Status::FromErrno(errno, "cannot create spill file", Location{.file = spill});
      ::unlink(spill.c_str());  // anonymous from now on: nothing is left behind on a crash
    }
    SpillField* p = sf.get();
    spills_.emplace(ext, std::move(sf));
    return p;
  }

  Status FlushSpill(SpillField* sf, const char* p, size_t len) {
    SK_RETURN_IF_ERROR(fs_->ExternalIo(path_, ExternalOp::kWrite));
    if (sf->direct) {
      SK_RETURN_IF_ERROR(WriteAll(fd_, p, len, kDirectAt + sf->flushed,
                                  fmt::format("write of field '{}' failed", sf->ext), Location{.file = path_}));
      sf->flushed += len;
      return Status::OK();
    }
    while (len > 0) {
      ssize_t w = ::write(sf->fd, p, len);
      if (w < 0) {
        if (errno == EINTR) continue;
        return Status::FromErrno(errno, fmt::format("write to the spill file of field '{}' failed", sf->ext),
                                 Location{.file = path_});
      }
      p += w;
      len -= size_t(w);
      sf->flushed += uint64_t(w);
    }
    return Status::OK();
  }

  Status Append(SpillField* sf, const uint8_t* data, size_t len) {
    const char* p = reinterpret_cast<const char*>(data);
    sf->size += len;
    if (sf->buf.size() + len > kSpillBuf) {
      SK_RETURN_IF_ERROR(FlushSpill(sf, sf->buf.data(), sf->buf.size()));
      sf->buf.clear();
      if (len >= kSpillBuf) return FlushSpill(sf, p, len);
    }
    sf->buf.append(p, len);
    return Status::OK();
  }

  Result<WriteSummary> DoFinish() {
    if (fd_ < 0) SK_RETURN_IF_ERROR(Start());  // no sample at all
    for (auto& [ext, sf] : spills_) {
      SK_RETURN_IF_ERROR(FlushSpill(sf.get(), sf->buf.data(), sf->buf.size()));
      sf->buf.clear();
      sf->buf.shrink_to_fit();
    }
    if (!opts_.overwrite) {
      SK_ASSIGN_OR_RETURN(bool present, fs_->OutputPresent(path_, OutputKind::kFile));
      if (present) return io::OutputExists(path_);
    }
    std::string dir = io::DirName(path_);
    auto base = std::filesystem::path(path_).filename().string();

    std::map<std::string, haddr_t> addrs;
    if (arrays_) {
      SK_RETURN_IF_ERROR(fs_->ExternalIo(path_, ExternalOp::kWrite));
      SK_RETURN_IF_ERROR(WriteArraysHdf5());
    } else {
      SK_RETURN_IF_ERROR(WriteHdf5(&addrs));
      SK_RETURN_IF_ERROR(CopySpills(addrs));
    }

    SK_RETURN_IF_ERROR(fs_->ExternalIo(path_, ExternalOp::kSync));
    struct stat st{};
    ::fstat(fd_, &st);
    if (::fsync(fd_) != 0) return Status::FromErrno(errno, "fsync failed", Location{.file = path_});
    if (temp_.empty()) {  // unnamed: give it the temporary name, then rename as usual
      std::string t = fmt::format("{}/.{}.tmp-{}", dir, base, ::getpid());
      ::unlink(t.c_str());
      if (::linkat(AT_FDCWD, h5name_.c_str(), AT_FDCWD, t.c_str(), AT_SYMLINK_FOLLOW) != 0)
        return Status::FromErrno(errno, "cannot name the temporary file", Location{.file = t});
      temp_ = t;
    }
    ::close(fd_);
    fd_ = -1;
    Status published = fs_->Publish(temp_, path_, PublishOptions{.replace = opts_.overwrite, .published = &finished_});
    if (finished_) temp_.clear();
    SK_RETURN_IF_ERROR(published);
    spills_.clear();  // closes the spill files, freeing their blocks
    // What killed writes of this file left (a ".NAME.tmp-PID" where O_TMPFILE is not had).
    io::RemoveDebrisOf(path_);

    WriteSummary sum;
    sum.samples = n();
    sum.bytes = uint64_t(st.st_size);
    sum.shards.push_back(ShardInfo{.path = path_, .samples = n(), .bytes = uint64_t(st.st_size), .checksum = ""});
    return sum;
  }

  // Creates a contiguous uint8 dataset of `size` bytes whose space is
  // reserved now and never written by libhdf5; returns its file address
  // (HADDR_UNDEF when size is 0). Lock held.
  Result<haddr_t> CreateDataDataset(hid_t group, const std::string& ext, uint64_t size) {
    Hid dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
    H5Pset_layout(dcpl.get(), H5D_CONTIGUOUS);
    H5Pset_alloc_time(dcpl.get(), H5D_ALLOC_TIME_EARLY);
    H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER);
    hsize_t dims[1] = {size};
    Hid space(H5Screate_simple(1, dims, nullptr), H5Sclose);
    Hid d(H5Dcreate2(group, "data", H5T_STD_U8LE, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT), H5Dclose);
    if (!d.ok())
      return Status::IOError(fmt::format("cannot create dataset 'fields/{}/data': {}", ext, H5Message()),
                             Location{.file = path_});
    if (size == 0) return HADDR_UNDEF;
    haddr_t a = H5Dget_offset(d.get());
    if (a == HADDR_UNDEF)
      return Status::IOError(fmt::format("dataset 'fields/{}/data' has no file address", ext), Location{.file = path_});
    return a;
  }

  // Moves len bytes of the output file from `from` to `to` (ranges may overlap).
  Status MoveRange(uint64_t from, uint64_t to, uint64_t len) {
    std::string buf(std::min<uint64_t>(kCopyBlock, len), '\0');
    Location at{.file = path_};
    for (uint64_t done = 0; done < len;) {
      size_t n = size_t(std::min<uint64_t>(buf.size(), len - done));
      uint64_t off = to < from ? done : len - done - n;  // front to back when moving down, else back to front
      SK_RETURN_IF_ERROR(ReadAll(fd_, buf.data(), n, from + off, "read of the output file failed", at));
      SK_RETURN_IF_ERROR(WriteAll(fd_, buf.data(), n, to + off, "write failed", at));
      done += n;
    }
    return Status::OK();
  }

  // Reopens the file made by Start() and creates every object; the direct
  // field's data dataset first, so that it lands on the bytes already written
  // at kDirectAt (if libhdf5 puts it elsewhere, the bytes are moved there at
  // once, before anything else is allocated). Returns the address of every
  // other field's data dataset, for CopySpills after the file is closed.
  Status WriteHdf5(std::map<std::string, haddr_t>* addrs) {
    H5Lock lock;
    Location at{.file = path_};
    auto fail = [&](std::string what) { return Status::IOError(fmt::format("{}: {}", what, H5Message()), at); };
    Hid fapl = WriterFapl();
    Hid file(H5Fopen(h5name_.c_str(), H5F_ACC_RDWR, fapl.get()), H5Fclose);
    if (!file.ok()) return fail("cannot reopen the HDF5 file being written");
    const hsize_t N = n();

    Hid fields(H5Gcreate2(file.get(), "fields", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
    if (!fields.ok()) return fail("cannot create group 'fields'");
    std::map<std::string, Hid> groups;
    auto group = [&](const std::string& ext) -> Result<hid_t> {
      auto it = groups.find(ext);
      if (it != groups.end()) return it->second.get();
      Hid g(H5Gcreate2(fields.get(), ext.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
      if (!g.ok()) return fail(fmt::format("cannot create group 'fields/{}'", ext));
      hid_t id = g.get();
      groups.emplace(ext, std::move(g));
      return id;
    };
    if (auto it = spills_.find(direct_ext_); it != spills_.end()) {
      SpillField* sf = it->second.get();
      SK_ASSIGN_OR_RETURN(hid_t g, group(sf->ext));
      SK_ASSIGN_OR_RETURN(haddr_t a, CreateDataDataset(g, sf->ext, sf->size));
      if (sf->size > 0 && a != kDirectAt) SK_RETURN_IF_ERROR(MoveRange(kDirectAt, a, sf->size));
    }

    SK_RETURN_IF_ERROR(WriteRootAttributes(file.get(), at));
    SK_RETURN_IF_ERROR(WriteKeys(file.get(), at));
    SK_RETURN_IF_ERROR(WriteDataset(file.get(), "labels", H5T_STD_I64LE, H5T_NATIVE_INT64, N, labels_.data(), at));
    SK_RETURN_IF_ERROR(
        WriteDataset(file.get(), "checksums", H5T_STD_U64LE, H5T_NATIVE_UINT64, N, checksums_.data(), at));

    for (auto& [ext, sf] : spills_) {
      SK_ASSIGN_OR_RETURN(hid_t g, group(ext));
      SK_RETURN_IF_ERROR(WriteDataset(g, "offsets", H5T_STD_U64LE, H5T_NATIVE_UINT64, N + 1, sf->offsets.data(), at));
      if (sf->direct) continue;
      SK_ASSIGN_OR_RETURN(haddr_t a, CreateDataDataset(g, ext, sf->size));
      if (sf->size > 0) (*addrs)[ext] = a;
    }
    groups.clear();
    fields.reset();
    if (file.close() < 0) return fail("cannot close HDF5 file");
    return Status::OK();
  }

  // The keys dataset (vlen strings, UTF-8 when every key is). Lock held.
  Status WriteKeys(hid_t file, const Location& at) {
    const hsize_t N = n();
    std::vector<const char*> ptrs(N);
    std::string blob;  // NUL-terminated copies
    blob.reserve(key_blob_.size() + N);
    std::vector<size_t> at0(N);
    bool utf8 = true;
    for (hsize_t i = 0; i < N; ++i) {
      std::string_view k(key_blob_.data() + key_end_[i], key_end_[i + 1] - key_end_[i]);
      utf8 = utf8 && paths::IsValidUtf8(k);
      at0[i] = blob.size();
      blob.append(k);
      blob.push_back('\0');
    }
    for (hsize_t i = 0; i < N; ++i) ptrs[i] = blob.data() + at0[i];
    Hid type(H5Tcopy(H5T_C_S1), H5Tclose);
    H5Tset_size(type.get(), H5T_VARIABLE);
    H5Tset_cset(type.get(), utf8 ? H5T_CSET_UTF8 : H5T_CSET_ASCII);
    SK_RETURN_IF_ERROR(WriteDataset(file, "keys", type.get(), type.get(), N, ptrs.data(), at));
    return Status::OK();
  }

  // Root attributes: shardkit_format_version, class_names (when given) and transform
  // (WriteOptions::transform, when given: compact JSON text). Lock held.
  Status WriteRootAttributes(hid_t file, const Location& at) {
    auto fail = [&](std::string what) { return Status::IOError(fmt::format("{}: {}", what, H5Message()), at); };
    {
      Hid space(H5Screate(H5S_SCALAR), H5Sclose);
      Hid attr(H5Acreate2(file, "shardkit_format_version", H5T_STD_I32LE, space.get(), H5P_DEFAULT,
                          H5P_DEFAULT),
               H5Aclose);
      int32_t v = kFormatVersion;
      if (!attr.ok() || H5Awrite(attr.get(), H5T_NATIVE_INT32, &v) < 0) return fail("cannot write attribute");
    }
    if (!opts_.class_names.empty()) {
      bool utf8 = true;
      std::vector<const char*> ptrs;
      for (const auto& c : opts_.class_names) {
        if (c.find('\0') != std::string::npos)
          return Status::Invalid(fmt::format("class name '{}' holds a NUL byte", c), at);
        utf8 = utf8 && paths::IsValidUtf8(c);
        ptrs.push_back(c.c_str());
      }
      Hid type(H5Tcopy(H5T_C_S1), H5Tclose);
      H5Tset_size(type.get(), H5T_VARIABLE);
      H5Tset_cset(type.get(), utf8 ? H5T_CSET_UTF8 : H5T_CSET_ASCII);
      hsize_t dims[1] = {ptrs.size()};
      Hid space(H5Screate_simple(1, dims, nullptr), H5Sclose);
      Hid attr(H5Acreate2(file, "class_names", type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
      if (!attr.ok() || H5Awrite(attr.get(), type.get(), ptrs.data()) < 0)
        return fail("cannot write attribute 'class_names'");
    }
    if (!opts_.transform.empty()) {  // the transform applied at conversion, as compact JSON text
      SK_ASSIGN_OR_RETURN(nlohmann::json record, TransformRecord(opts_.transform, at));
      const std::string text = record.dump();
      Hid type(H5Tcopy(H5T_C_S1), H5Tclose);
      H5Tset_size(type.get(), H5T_VARIABLE);
      H5Tset_cset(type.get(), H5T_CSET_UTF8);
      Hid space(H5Screate(H5S_SCALAR), H5Sclose);
      Hid attr(H5Acreate2(file, "transform", type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
      const char* p = text.c_str();
      if (!attr.ok() || H5Awrite(attr.get(), type.get(), &p) < 0) return fail("cannot write attribute 'transform'");
    }
    return Status::OK();
  }

  // option hdf5.arrays "native": reopens the file made by Start() (without the
  // payload alignment: no direct field here) and writes, as h5py users read them:
  //   images  uint8 [N, H, W(, C)], chunked [1, H, W(, C)] (one image per chunk), when every
  //           array has one shape; else 1-D vlen uint8 (each array flattened) + shapes
  //           int64 [N, rank];
  //   labels  int64 [N] (-1: none), keys (vlen strings), root attributes
  //   shardkit_format_version, class_names and transform, and images' attribute channel_order
  //   ("rgb", or "bgr" when the source said so: WriteOptions::array_channels).
  Status WriteArraysHdf5() {
    H5Lock lock;
    Location at{.file = path_};
    auto fail = [&](std::string what) { return Status::IOError(fmt::format("{}: {}", what, H5Message()), at); };
    Hid file(H5Fopen(h5name_.c_str(), H5F_ACC_RDWR, H5P_DEFAULT), H5Fclose);
    if (!file.ok()) return fail("cannot reopen the HDF5 file being written");
    const hsize_t N = n();
    SpillField* sf = spills_.at("npy").get();
    SK_RETURN_IF_ERROR(WriteRootAttributes(file.get(), at));
    SK_RETURN_IF_ERROR(WriteKeys(file.get(), at));
    SK_RETURN_IF_ERROR(WriteDataset(file.get(), "labels", H5T_STD_I64LE, H5T_NATIVE_INT64, N, labels_.data(), at));
    const size_t rank = rank_;
    Hid images;
    std::string buf;
    if (same_shape_) {
      std::vector<hsize_t> dims{N}, chunk{1};
      for (size_t k = 0; k < rank; ++k) dims.push_back(shapes_[k]), chunk.push_back(shapes_[k]);
      const uint64_t one = sf->offsets[1] - sf->offsets[0];
      Hid space(H5Screate_simple(int(dims.size()), dims.data(), nullptr), H5Sclose);
      Hid dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
      H5Pset_chunk(dcpl.get(), int(chunk.size()), chunk.data());
      H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER);
      images = Hid(H5Dcreate2(file.get(), "images", H5T_STD_U8LE, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT),
                   H5Dclose);
      if (!images.ok()) return fail("cannot create dataset 'images'");
      // Written in runs of whole images (about 16 MiB), each run one hyperslab.
      const hsize_t per = std::max<hsize_t>(1, (16u << 20) / std::max<uint64_t>(one, 1));
      for (hsize_t i = 0; i < N; i += per) {
        const hsize_t k = std::min<hsize_t>(per, N - i);
        buf.resize(size_t(k * one));
        SK_RETURN_IF_ERROR(ReadAll(sf->fd, buf.data(), buf.size(), sf->offsets[i],
                                   "read of the spill file of the arrays failed", at));
        std::vector<hsize_t> start(dims.size(), 0), count = dims;
        start[0] = i;
        count[0] = k;
        Hid fspace(H5Dget_space(images.get()), H5Sclose);
        H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr);
        Hid mspace(H5Screate_simple(int(count.size()), count.data(), nullptr), H5Sclose);
        if (H5Dwrite(images.get(), H5T_NATIVE_UINT8, mspace.get(), fspace.get(), H5P_DEFAULT, buf.data()) < 0)
          return fail(fmt::format("cannot write images [{}, {}) of dataset 'images'", i, i + k));
      }
    } else {
      Hid vtype(H5Tvlen_create(H5T_STD_U8LE), H5Tclose);
      Hid mtype(H5Tvlen_create(H5T_NATIVE_UINT8), H5Tclose);
      hsize_t dims[1] = {N};
      Hid space(H5Screate_simple(1, dims, nullptr), H5Sclose);
      images = Hid(H5Dcreate2(file.get(), "images", vtype.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                   H5Dclose);
      if (!images.ok()) return fail("cannot create dataset 'images'");
      std::vector<hvl_t> elems;
      for (hsize_t i = 0; i < N;) {
        hsize_t j = i + 1;  // a run of about 16 MiB (at least one image)
        while (j < N && sf->offsets[j + 1] - sf->offsets[i] <= (16u << 20)) ++j;
        buf.resize(size_t(sf->offsets[j] - sf->offsets[i]));
        SK_RETURN_IF_ERROR(ReadAll(sf->fd, buf.data(), buf.size(), sf->offsets[i],
                                   "read of the spill file of the arrays failed", at));
        elems.resize(size_t(j - i));
        for (hsize_t x = i; x < j; ++x)
          elems[size_t(x - i)] = hvl_t{size_t(sf->offsets[x + 1] - sf->offsets[x]),
                                       buf.data() + (sf->offsets[x] - sf->offsets[i])};
        hsize_t start[1] = {i}, count[1] = {j - i};
        Hid fspace(H5Dget_space(images.get()), H5Sclose);
        H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, start, nullptr, count, nullptr);
        Hid mspace(H5Screate_simple(1, count, nullptr), H5Sclose);
        if (H5Dwrite(images.get(), mtype.get(), mspace.get(), fspace.get(), H5P_DEFAULT, elems.data()) < 0)
          return fail(fmt::format("cannot write images [{}, {}) of dataset 'images'", i, j));
        i = j;
      }
      std::vector<int64_t> shapes;
      shapes.reserve(size_t(N * rank));
      for (uint64_t d : shapes_) shapes.push_back(int64_t(d));
      hsize_t sdims[2] = {N, rank};
      Hid sspace(H5Screate_simple(2, sdims, nullptr), H5Sclose);
      Hid sd(H5Dcreate2(file.get(), "shapes", H5T_STD_I64LE, sspace.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
             H5Dclose);
      if (!sd.ok() || H5Dwrite(sd.get(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, shapes.data()) < 0)
        return fail("cannot write dataset 'shapes'");
    }
    {
      const std::string order = opts_.array_channels == "bgr" ? "bgr" : "rgb";
      Hid type(H5Tcopy(H5T_C_S1), H5Tclose);
      H5Tset_size(type.get(), H5T_VARIABLE);
      H5Tset_cset(type.get(), H5T_CSET_UTF8);
      Hid space(H5Screate(H5S_SCALAR), H5Sclose);
      Hid attr(H5Acreate2(images.get(), "channel_order", type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
      const char* p = order.c_str();
      if (!attr.ok() || H5Awrite(attr.get(), type.get(), &p) < 0) return fail("cannot write attribute 'channel_order'");
    }
    images.reset();
    if (file.close() < 0) return fail("cannot close HDF5 file");
    return Status::OK();
  }

  Status WriteDataset(hid_t parent, const char* name, hid_t ftype, hid_t mtype, hsize_t count, const void* buf,
                      const Location& at) {
    hsize_t dims[1] = {count};
    Hid space(H5Screate_simple(1, dims, nullptr), H5Sclose);
    Hid d(H5Dcreate2(parent, name, ftype, space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Dclose);
    if (!d.ok() || (count > 0 && H5Dwrite(d.get(), mtype, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf) < 0))
      return Status::IOError(fmt::format("cannot write dataset '{}': {}", name, H5Message()), at);
    return Status::OK();
  }

  // Copies each spill file into its dataset's byte range of the closed file.
  Status CopySpills(const std::map<std::string, haddr_t>& addrs) {
    std::string buf;
    for (auto& [ext, a] : addrs) {
      SpillField* sf = spills_.at(ext).get();
      SK_RETURN_IF_ERROR(fs_->ExternalIo(path_, ExternalOp::kWrite));
      uint64_t done = 0;
      bool use_cfr = true;
      while (done < sf->size) {
        size_t len = size_t(std::min<uint64_t>(kCopyBlock * 8, sf->size - done));
        if (use_cfr) {
          loff_t in_off = loff_t(done), out_off = loff_t(a + done);
          ssize_t c = ::copy_file_range(sf->fd, &in_off, fd_, &out_off, len, 0);
          if (c > 0) {
            done += uint64_t(c);
            continue;
          }
          if (c < 0 && errno == EINTR) continue;
          if (c < 0 && (errno == EXDEV || errno == ENOSYS || errno == EINVAL || errno == EOPNOTSUPP)) {
            use_cfr = false;
            continue;
          }
          return Status::FromErrno(c < 0 ? errno : EIO, fmt::format("copy of field '{}' failed", ext),
                                   Location{.file = path_, .offset = int64_t(a + done)});
        }
        len = std::min(len, kCopyBlock);
        buf.resize(kCopyBlock);
        SK_RETURN_IF_ERROR(ReadAll(sf->fd, buf.data(), len, done,
                                   fmt::format("read of the spill file of '{}' failed", ext), Location{.file = path_}));
        SK_RETURN_IF_ERROR(WriteAll(fd_, buf.data(), len, a + done, "write failed", Location{.file = path_}));
        done += len;
      }
    }
    return Status::OK();
  }

  std::string path_;
  std::string temp_;    // the output's temporary name, once it has one
  std::string h5name_;  // the name libhdf5 opens the output by
  int fd_ = -1;         // the output file
  WriteOptions opts_;
  std::shared_ptr<FileSystem> fs_;  // opts_.filesystem or the local one
  std::string direct_ext_;
  size_t direct_size0_ = 0;
  std::string key_blob_;
  std::vector<uint64_t> key_end_;
  std::vector<int64_t> labels_;
  std::vector<uint64_t> checksums_;
  std::map<std::string, std::unique_ptr<SpillField>> spills_;
  // option hdf5.arrays "native", decided at the first sample (it holds "npy").
  bool decided_ = false, arrays_ = false, same_shape_ = true;
  std::vector<uint64_t> shapes_;  // each array's shape, rank_ numbers per sample
  size_t rank_ = 0;
  Status failed_;
  bool finished_ = false;
};

}  // namespace

Result<std::unique_ptr<SampleWriter>> CreateHdf5(const std::string& path, const WriteOptions& opts) {
  // libhdf5 and the payload writes need a local file; the existence checks,
  // the directory, the publish and the fault points go through the seam.
  const std::shared_ptr<FileSystem>& fs = FileSystem::OrLocal(opts.filesystem);
  SK_RETURN_IF_ERROR(fs->LocalPath(path).status());
  if (!opts.overwrite) {
    SK_ASSIGN_OR_RETURN(bool present, fs->OutputPresent(path, OutputKind::kFile));
    if (present) return io::OutputExists(path);
  }
  if (fs->IsDir(path)) return Status::Invalid("output is a directory", Location{.file = path});
  std::string dir = io::DirName(path);
  if (!fs->IsDir(dir)) SK_RETURN_IF_ERROR(fs->MakeDirs(dir));
  return std::unique_ptr<SampleWriter>(new Hdf5Writer(path, opts));
}

}  // namespace shardkit::formats::hdf5
