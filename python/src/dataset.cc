// shardkit.open() / shardkit.info(): datasets for scripts and notebooks.
//
// Dataset objects are safe to share between Python threads: the library calls run
// with the GIL released (RandomAccess::Get is thread-safe; each iterator owns its
// own SampleReader).
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "core/front_end.h"
#include "common.h"
#include "shardkit/convert.h"
#include "shardkit/filesystem.h"

namespace shardkit::python {
namespace {

py::dict SampleToDict(const Sample& s) {
  py::dict d;
  d["__key__"] = py::str(s.key);
  for (const Field& f : s.fields) {
    d[py::str(f.ext)] = py::bytes(reinterpret_cast<const char*>(f.data.data()), f.data.size());
  }
  return d;
}

// Iterates a dataset in its order through its own SampleReader.
class SampleIterator {
 public:
  SampleIterator(std::shared_ptr<const Dataset> ds, std::unique_ptr<SampleReader> reader)
      : ds_(std::move(ds)), reader_(std::move(reader)) {}
  ~SampleIterator() { reader_.reset(); }  // the reader goes before the dataset

  py::dict Next() {
    if (!reader_) throw py::stop_iteration();
    Sample s;
    Result<bool> more = false;
    {
      py::gil_scoped_release nogil;
      std::lock_guard<std::mutex> lock(mu_);
      more = reader_->Next(&s);
    }
    if (!more.ok()) Throw(std::move(more).take_status());
    if (!*more) {
      reader_.reset();
      throw py::stop_iteration();
    }
    return SampleToDict(s);
  }

 private:
  std::shared_ptr<const Dataset> ds_;
  std::unique_ptr<SampleReader> reader_;
  std::mutex mu_;  // a SampleReader is used by one thread at a time
};

class PyDataset {
 public:
  static std::shared_ptr<PyDataset> Open(const std::string& address,
                                         const std::map<std::string, std::string>& field_map,
                                         const std::string& cache_dir = "", uint64_t cache_bytes = 0,
                                         bool trust_manifest = false,
                                         const std::map<std::string, std::string>& source_options = {}) {
    OpenOptions opts;
    opts.format_options = source_options;
    opts.trust_manifest = trust_manifest;
    opts.field_map = field_map;
    opts.cache_dir = cache_dir;
    opts.cache_bytes = cache_bytes;
    OptionsFromEnvironment(&opts);
    Result<std::unique_ptr<Dataset>> ds = Status::Internal("unset");
    {
      py::gil_scoped_release nogil;
      ds = shardkit::Open(address, opts);
    }
    auto self = std::make_shared<PyDataset>();
    self->ds_ = Unwrap(std::move(ds));
    return self;
  }
  ~PyDataset() {
    py::gil_scoped_release nogil;
    ra_.reset();  // before the dataset
    ds_.reset();
  }

  const DatasetInfo& info() const { return ds_->info(); }

  uint64_t Len() {
    if (info().num_samples) return *info().num_samples;
    return RandomAccessOrThrow()->size();
  }

  py::dict GetItem(int64_t i) {
    std::shared_ptr<RandomAccess> ra = RandomAccessOrThrow();
    const int64_t n = int64_t(ra->size());
    if (i < 0) i += n;
    if (i < 0 || i >= n) throw py::index_error("sample index out of range (dataset has " + std::to_string(n) + " samples)");
    Sample s;
    Status st;
    {
      py::gil_scoped_release nogil;
      st = ra->Get(uint64_t(i), &s);
    }
    Check(std::move(st));
    return SampleToDict(s);
  }

  py::list GetSlice(const py::slice& slice) {
    std::shared_ptr<RandomAccess> ra = RandomAccessOrThrow();
    size_t start, stop, step, count;
    if (!slice.compute(ra->size(), &start, &stop, &step, &count)) throw py::error_already_set();
    py::list out;
    for (size_t k = 0; k < count; ++k) out.append(GetItem(int64_t(start + k * step)));
    return out;
  }

  std::unique_ptr<SampleIterator> Iter() {
    Result<std::unique_ptr<SampleReader>> r = Status::Internal("unset");
    {
      py::gil_scoped_release nogil;
      r = ds_->NewReader();
    }
    return std::make_unique<SampleIterator>(ds_, Unwrap(std::move(r)));
  }

  bool HasRandomAccess() {
    EnsureRandomAccess();
    return ra_ != nullptr;
  }

 private:
  void EnsureRandomAccess() {
    // Made on first use: building it may scan the dataset (e.g. tar shards without index).
    // The GIL is released before call_once: a thread waiting there must not hold it while
    // the thread running the initializer works (and takes the GIL back at its end).
    py::gil_scoped_release nogil;
    std::call_once(ra_once_, [this] {
      Result<std::shared_ptr<RandomAccess>> r = ds_->NewRandomAccess();
      if (r.ok()) ra_ = std::move(r).value();
      else ra_status_ = std::move(r).take_status();
    });
  }
  std::shared_ptr<RandomAccess> RandomAccessOrThrow() {
    EnsureRandomAccess();
    if (!ra_) Throw(ra_status_);
    return ra_;
  }

  std::shared_ptr<const Dataset> ds_;
  std::once_flag ra_once_;
  std::shared_ptr<RandomAccess> ra_;
  Status ra_status_;
};

}  // namespace

py::dict ShardToDict(const ShardInfo& s) {
  py::dict d;
  d["path"] = RedactAddress(s.path);
  d["samples"] = s.samples;
  d["bytes"] = s.bytes;
  d["checksum"] = s.checksum.empty() ? py::object(py::none()) : py::object(py::str(s.checksum));
  return d;
}

void OptionsFromEnvironment(OpenOptions* o) { Check(OpenOptionsFromEnvironment(o)); }

std::string StagingDirOr(const std::string& given) { return given.empty() ? StagingDirFromEnvironment() : given; }

py::dict InfoToDict(const DatasetInfo& i) {
  py::dict d;
  d["format"] = i.format;
  d["address"] = RedactAddress(i.address);
  d["num_samples"] = i.num_samples ? py::object(py::int_(*i.num_samples)) : py::object(py::none());
  d["class_names"] = i.class_names;
  d["fields"] = i.fields;
  py::list shards;
  for (const ShardInfo& s : i.shards) shards.append(ShardToDict(s));
  d["shards"] = shards;
  d["total_bytes"] = i.total_bytes;
  d["extra"] = i.extra;
  return d;
}

void BindDataset(py::module_& m) {
  py::class_<SampleIterator>(m, "_SampleIterator")
      .def("__iter__", [](py::object self) { return self; })
      .def("__next__", &SampleIterator::Next);

  py::class_<PyDataset, std::shared_ptr<PyDataset>>(m, "Dataset", R"doc(
A dataset opened by shardkit.open(address).

len(ds) is the number of samples; ds[i] (negative i counts from the end; slices give
lists) is a dict {field extension: bytes, ..., "__key__": key}; iterating reads the
samples in dataset order (sequentially, without needing random access); ds.info is the
dataset's metadata as a dict. Calls release the GIL; a Dataset may be shared by threads.
)doc")
      .def_property_readonly("info", [](const PyDataset& d) { return InfoToDict(d.info()); })
      .def_property_readonly("class_names", [](const PyDataset& d) { return d.info().class_names; })
      .def_property_readonly("format", [](const PyDataset& d) { return d.info().format; })
      .def_property_readonly("address", [](const PyDataset& d) { return d.info().address; })
      .def_property_readonly("random_access", &PyDataset::HasRandomAccess,
                             "True when ds[i] works (the format offers random access)")
      .def("__len__", &PyDataset::Len)
      .def("__getitem__", &PyDataset::GetItem, py::arg("index"))
      .def("__getitem__", &PyDataset::GetSlice, py::arg("slice"))
      .def("__iter__", &PyDataset::Iter)
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](py::object, py::args) { return false; })
      .def("__repr__", [](const PyDataset& d) {
        const DatasetInfo& i = d.info();
        std::string n = i.num_samples ? std::to_string(*i.num_samples) : std::string("?");
        return "<shardkit.Dataset " + i.format + " '" + RedactAddress(i.address) + "', " + n + " samples>";
      });

  m.def("open", &PyDataset::Open, py::arg("address"), py::kw_only(),
        py::arg("field_map") = std::map<std::string, std::string>{}, py::arg("cache_dir") = "",
        py::arg("cache_bytes") = 0, py::arg("trust_manifest") = false,
        py::arg("source_options") = std::map<std::string, std::string>{},
        R"doc(Opens a dataset for reading: shardkit.open("train-{000000..000009}.tar").

address: a path (format detected) or "folder:DIR", "wds:PATTERN", "lmdb:DIR", "hdf5:FILE".
field_map: HDF5 dataset names to fields, e.g. {"images": "jpg", "labels": "cls"}.
cache_dir, cache_bytes: remote shards (http(s)://, s3://) are downloaded whole on first
use into cache_dir (bounded by cache_bytes, 0 = unbounded, least recently used first) and
read from there; without one, random access reads each sample by a range request.
Unset, they come from SHARDKIT_CACHE_DIR / SHARDKIT_CACHE_BYTES; SHARDKIT_INDEX_BUDGET
sets the tar shards' index budget (docs/formats-wds.md).
trust_manifest: take the files a manifest names as written, even outside its directory
(absolute paths, '..'); by default such entries are refused (docs/reliability.md).
source_options: the reader's options {"<format>.<name>": value}, e.g. {"hdf5.channels":
"rgb"}; format_options(kind="read") lists them.
Raises shardkit.Error naming the file when it cannot be opened.)doc");

  m.def("info", [](const std::string& address, const std::map<std::string, std::string>& field_map) {
        std::shared_ptr<PyDataset> d = PyDataset::Open(address, field_map);
        return InfoToDict(d->info());
      }, py::arg("address"), py::kw_only(), py::arg("field_map") = std::map<std::string, std::string>{},
      "The metadata of the dataset at `address` as a dict: format, address, num_samples, "
      "class_names, fields, shards [{path, samples, bytes, checksum}], total_bytes, extra.");

  m.def("formats", &shardkit::FormatNames, "The registered format names.");
  m.def("detect_format", [](const std::string& address) {
        Result<std::string> r = Status::Internal("unset");
        {
          py::gil_scoped_release nogil;
          r = shardkit::DetectFormat(address);
        }
        return Unwrap(std::move(r));
      }, py::arg("address"), "The format an address resolves to, without opening it.");
}

}  // namespace shardkit::python
