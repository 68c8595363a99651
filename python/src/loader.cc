// DLPack export and the binding of shardkit::Loader (shardkit/loader.h).
//
// Zero copy: a batch's image memory is the loader's pool buffer. _Batch.images()
// returns a DLPack producer (an object with __dlpack__ / __dlpack_device__) whose
// capsule holds a reference to the C++ Batch; when the consumer (torch, numpy) frees
// its tensor it calls the DLPack deleter, the Batch is destroyed and its buffer returns
// to the pool. The deleter touches no Python object, so any thread may call it, with
// or without the GIL. Device batches (GpuLoader, shardkit/gpu.h) are exported the same
// way with device kDLCUDA; __dlpack__(stream=s) makes s wait on the batch's ready event
// and the deleter releases the ring slot on s (see HeldDeviceBatch). Labels are copied (a few bytes per sample) so that keeping
// labels around never pins a pool buffer.
#include <atomic>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "common.h"
#include "dlpack.h"

#include "shardkit/feed.h"
#include "shardkit/gpu.h"
#include "shardkit/loader.h"

namespace shardkit::python {
namespace {

// One exported tensor: the DLPack struct M plus what its pointers refer to.
template <class M>
struct Export {
  M managed{};
  std::shared_ptr<const void> owner;
  std::vector<int64_t> shape, strides;
};

template <class M>
void DeleteExport(M* self) {
  delete static_cast<Export<M>*>(self->manager_ctx);
}

template <class M>
void CapsuleDestructor(PyObject* capsule, const char* name, const char* used_name) {
  if (PyCapsule_IsValid(capsule, used_name)) return;  // consumed: the consumer calls the deleter
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  auto* m = static_cast<M*>(PyCapsule_GetPointer(capsule, name));
  if (m == nullptr) {
    PyErr_WriteUnraisable(capsule);
  } else if (m->deleter) {
    m->deleter(m);
  }
  PyErr_Restore(type, value, tb);
}
void LegacyCapsuleDestructor(PyObject* c) {
  CapsuleDestructor<dl::ManagedTensor>(c, "dltensor", "used_dltensor");
}
void VersionedCapsuleDestructor(PyObject* c) {
  CapsuleDestructor<dl::ManagedTensorVersioned>(c, "dltensor_versioned", "used_dltensor_versioned");
}

// A DLPack producer for memory kept alive by `owner`.
class ExportTensor {
 public:
  std::shared_ptr<const void> owner;
  void* data = nullptr;
  dl::DataType dtype{dl::kDLUInt, 8, 1};
  dl::Device device{dl::kDLCPU, 0};
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;  // in elements; empty = compact row-major
  std::string dtype_name;
  // For device memory: makes the consumer's `stream` wait until the data is ready
  // (an event recorded by the producer). Unset for host memory.
  std::function<Status(intptr_t stream)> wait_on_stream;

  // The DLPack protocol (Python array API): stream, max_version, dl_device, copy.
  py::object DLPack(const py::object& stream, const py::object& max_version, const py::object& dl_device,
                    const py::object& copy) {
    if (!copy.is_none() && copy.cast<bool>()) {
      throw py::buffer_error("shardkit exports its batch memory without copying (copy=True is not supported)");
    }
    if (!dl_device.is_none()) {
      auto d = dl_device.cast<std::pair<int, int>>();
      if (d.first != device.device_type || d.second != device.device_id) {
        throw py::buffer_error("shardkit cannot export to another device than the batch's");
      }
    }
    if (device.device_type == dl::kDLCUDA) {
      // Stream protocol: None / 1 = the legacy default stream, 2 = per-thread default,
      // -1 = the consumer synchronises itself, anything else a cudaStream_t.
      intptr_t s = stream.is_none() ? 1 : stream.cast<intptr_t>();
      if (s != -1 && wait_on_stream) {
        Status st;
        {
          py::gil_scoped_release nogil;
          st = wait_on_stream(s);
        }
        Check(std::move(st));
      }
    } else if (!stream.is_none() && stream.cast<intptr_t>() != -1) {
      throw py::buffer_error("stream must be None for a host (CPU) tensor");
    }
    bool versioned = false;
    if (!max_version.is_none()) {
      auto v = max_version.cast<std::pair<int, int>>();
      versioned = v.first >= int(dl::kMajorVersion);
    }
    if (versioned) {
      auto* e = Fill(new Export<dl::ManagedTensorVersioned>());
      e->managed.version = {dl::kMajorVersion, dl::kMinorVersion};
      e->managed.flags = 0;
      PyObject* cap = PyCapsule_New(&e->managed, "dltensor_versioned", VersionedCapsuleDestructor);
      if (!cap) {
        delete e;
        throw py::error_already_set();
      }
      return py::reinterpret_steal<py::object>(cap);
    }
    auto* e = Fill(new Export<dl::ManagedTensor>());
    PyObject* cap = PyCapsule_New(&e->managed, "dltensor", LegacyCapsuleDestructor);
    if (!cap) {
      delete e;
      throw py::error_already_set();
    }
    return py::reinterpret_steal<py::object>(cap);
  }

  py::tuple DLPackDevice() const { return py::make_tuple(int(device.device_type), int(device.device_id)); }

  size_t nbytes() const {
    size_t n = dtype.bits / 8;
    for (int64_t d : shape) n *= size_t(d);
    return n;
  }

 private:
  template <class M>
  Export<M>* Fill(Export<M>* e) {
    e->owner = owner;
    e->shape = shape;
    e->strides = strides;
    dl::Tensor& t = e->managed.dl_tensor;
    t.data = data;
    t.device = device;
    t.ndim = int32_t(shape.size());
    t.dtype = dtype;
    t.shape = e->shape.data();
    t.strides = e->strides.empty() ? nullptr : e->strides.data();
    t.byte_offset = 0;
    e->managed.manager_ctx = e;
    e->managed.deleter = &DeleteExport<M>;
    return e;
  }
};

// Labels (int64) as an exportable tensor owning its own copy.
ExportTensor Int64Tensor(std::vector<int64_t> values) {
  auto v = std::make_shared<std::vector<int64_t>>(std::move(values));
  if (v->empty()) v->reserve(1);  // a valid pointer even for an empty batch
  ExportTensor t;
  t.data = v->data();
  t.shape = {int64_t(v->size())};
  t.dtype = {dl::kDLInt, 64, 1};
  t.dtype_name = "int64";
  t.owner = std::move(v);
  return t;
}

dl::DataType ToDL(DType d) {
  switch (d) {
    case DType::kUint8: return {dl::kDLUInt, 8, 1};
    case DType::kFloat32: return {dl::kDLFloat, 32, 1};
    case DType::kFloat16: return {dl::kDLFloat, 16, 1};
    case DType::kBFloat16: return {dl::kDLBfloat, 16, 1};
  }
  return {dl::kDLUInt, 8, 1};
}

DType ParseDType(const std::string& s) {
  if (s == "uint8") return DType::kUint8;
  if (s == "float32") return DType::kFloat32;
  if (s == "float16") return DType::kFloat16;
  if (s == "bfloat16") return DType::kBFloat16;
  throw py::value_error("dtype must be one of float32, float16, bfloat16, uint8; not \"" + s + "\"");
}

Layout ParseLayout(const std::string& s) {
  if (s == "NCHW") return Layout::kNCHW;
  if (s == "NHWC") return Layout::kNHWC;
  throw py::value_error("layout must be \"NCHW\" or \"NHWC\", not \"" + s + "\"");
}

// Each row's source in a mixture (LoaderOptions::sources; Batch::sources(),
// DeviceBatch::sources()) as an int64 tensor; 0 for every row of one dataset.
ExportTensor SourcesTensor(const std::vector<uint32_t>& sources, size_t rows) {
  std::vector<int64_t> v(rows, 0);
  for (size_t i = 0; i < sources.size() && i < rows; ++i) v[i] = int64_t(sources[i]);
  return Int64Tensor(std::move(v));
}

// LoaderOptions::fields of a batch: one list per field, bytes (None where absent) per row.
py::list FieldLists(size_t n, const std::function<const std::vector<std::optional<Bytes>>&(size_t)>& field) {
  py::list out;
  for (size_t f = 0; f < n; ++f) {
    py::list col;
    for (const auto& v : field(f)) {
      if (v) col.append(py::bytes(reinterpret_cast<const char*>(v->data()), v->size()));
      else col.append(py::none());
    }
    out.append(std::move(col));
  }
  return out;
}

// The read options of a loader's dataset: the source options and the cache of remote
// shards, then the environment (SHARDKIT_CACHE_DIR/_BYTES, SHARDKIT_INDEX_BUDGET) below them.
OpenOptions SourceOptions(const std::map<std::string, std::string>& source_options, const std::string& cache_dir,
                          uint64_t cache_bytes, bool trust_manifest) {
  OpenOptions oo;
  oo.trust_manifest = trust_manifest;
  oo.format_options = source_options;
  oo.cache_dir = cache_dir;
  oo.cache_bytes = cache_bytes;
  OptionsFromEnvironment(&oo);
  return oo;
}

// One batch handed to Python. Holds the C++ Batch (and so its pool buffer) until this
// object and every tensor exported from it are gone.
class PyBatch {
 public:
  explicit PyBatch(Batch b) : b_(std::make_shared<Batch>(std::move(b))) {}

  // The images. channels_last: an NHWC buffer seen as an NCHW tensor with NHWC
  // strides (torch.channels_last), instead of an NHWC tensor.
  ExportTensor Images(bool channels_last) const {
    const Batch& b = *b_;
    ExportTensor t;
    t.owner = b_;
    t.data = const_cast<void*>(b.data());
    t.dtype = ToDL(b.dtype());
    t.dtype_name = DTypeName(b.dtype());
    const int64_t* s = b.shape();
    t.shape.assign(s, s + 4);
    if (channels_last) {
      if (b.layout() != Layout::kNHWC) throw py::value_error("channels_last needs an NHWC batch");
      const int64_t n = s[0], h = s[1], w = s[2], c = s[3];
      t.shape = {n, c, h, w};
      t.strides = {h * w * c, 1, w * c, c};
    }
    // Device batches (shardkit/gpu.h): PyDeviceBatch::Images below.
    return t;
  }
  ExportTensor Labels() const { return Int64Tensor(b_->labels()); }
  ExportTensor Sources() const { return SourcesTensor(batch().sources(), batch().size()); }
  py::list Fields() const {
    const Batch& b = batch();
    return FieldLists(b.num_fields(), [&](size_t f) -> const std::vector<std::optional<Bytes>>& { return b.field(f); });
  }
  const Batch& batch() const {
    if (!b_) Throw(Status::Invalid("the batch was dropped"));
    return *b_;
  }
  // Drops this object's hold on the buffer (exported tensors keep theirs).
  void Drop() { b_.reset(); }
  bool alive() const { return b_ != nullptr; }

 private:
  std::shared_ptr<Batch> b_;
};

// The Python handle of a Feed (shardkit/feed.h): host batches (_Batch) or device
// batches (_DeviceBatch), as the library decided. The feed is used by one thread at a
// time (mu_), and never with the GIL held: the thread holding mu_ may need the GIL back.
class PyLoader {
 public:
  explicit PyLoader(const std::function<Result<std::unique_ptr<Feed>>()>& create) {
    Result<std::unique_ptr<Feed>> r = Status::Internal("unset");
    {
      py::gil_scoped_release nogil;
      r = create();
    }
    feed_ = Unwrap(std::move(r));
    // The epoch's size and a mixture's (samples, per-epoch count) per source, from the
    // state both paths keep (Feed has no accessor for them); fixed for the loader's life.
    LoaderState st;
    {
      py::gil_scoped_release nogil;
      st = feed_->save_state();
    }
    epoch_size_ = st.epoch_size;
    mixture_ = st.sources;
  }
  ~PyLoader() { Close(); }

  uint64_t epoch_size() const { return epoch_size_; }
  const std::vector<std::pair<uint64_t, uint64_t>>& mixture() const { return mixture_; }

  // f(feed) under the lock, without the GIL; f must not touch Python objects.
  template <class F>
  auto With(F f) {
    py::gil_scoped_release nogil;
    std::lock_guard<std::mutex> lock(mu_);
    return f(*Get());
  }

  void Close() {
    py::gil_scoped_release nogil;  // shutting down waits for the decoding threads
    std::unique_ptr<Feed> l;
    {
      std::lock_guard<std::mutex> lock(mu_);
      l = std::move(feed_);
    }
    l.reset();
  }

  // The next batch (_Batch or _DeviceBatch), or None at the end of the epoch.
  py::object Next();

  void SetEpoch(uint64_t e) {
    With([e](Feed& l) { l.set_epoch(e); });
  }
  std::string SaveState() {
    return With([](Feed& l) { return l.save_state().ToJson(); });
  }
  void Restore(const std::string& json) {
    LoaderState s = Unwrap(LoaderState::FromJson(json));
    Check(With([&s](Feed& l) { return l.restore(s); }));
  }
  py::list Skipped() {
    std::vector<Status> v = With([](Feed& l) { return l.skipped(); });
    py::list out;
    for (const Status& s : v) out.append(MakeError(s));
    return out;
  }

 private:
  Feed* Get() const {
    if (!feed_) Throw(Status::Invalid("the loader is closed"));
    return feed_.get();
  }
  std::mutex mu_;
  std::unique_ptr<Feed> feed_;
  uint64_t epoch_size_ = 0;
  std::vector<std::pair<uint64_t, uint64_t>> mixture_;
};

// DLPack's stream integer (Array API): 1 (or None) = the legacy default stream, 2 = the
// per-thread default stream (cudaStreamPerThread, whose handle is 0x2), else a
// cudaStream_t. shardkit/gpu.h takes nullptr for the legacy default stream.
void* ToCudaStream(intptr_t s) {
  if (s == 0 || s == 1) return nullptr;
  return reinterpret_cast<void*>(s);
}

// A DeviceBatch shared by the Python batch object and every tensor exported from it.
// Destroyed when the last of them goes; it then releases the ring slot on the stream the
// consumer named in __dlpack__(stream=...) (the last one, if several), so the slot is
// written again only after the work queued there has completed; without a named stream
// (stream=-1 or never exported) on GpuOptions::consumer_stream (the legacy default
// stream). Touches no Python object: any thread may destroy it.
struct HeldDeviceBatch {
  explicit HeldDeviceBatch(DeviceBatch x) : b(std::move(x)) {}
  ~HeldDeviceBatch() {
    if (has_stream.load()) b.Release(ToCudaStream(stream.load()));
    else b.Release();
  }
  DeviceBatch b;
  std::atomic<bool> has_stream{false};
  std::atomic<intptr_t> stream{0};
};

class PyDeviceBatch {
 public:
  explicit PyDeviceBatch(DeviceBatch b) : h_(std::make_shared<HeldDeviceBatch>(std::move(b))) {}

  ExportTensor Images(bool channels_last) const {
    const DeviceBatch& b = get();
    ExportTensor t;
    t.owner = h_;
    t.data = b.data();
    t.device = {dl::kDLCUDA, int32_t(b.device())};
    t.dtype = ToDL(b.dtype());
    t.dtype_name = DTypeName(b.dtype());
    const int64_t* s = b.shape();
    t.shape.assign(s, s + 4);
    if (channels_last) {
      if (b.layout() != Layout::kNHWC) throw py::value_error("channels_last needs an NHWC batch");
      const int64_t n = s[0], h = s[1], w = s[2], c = s[3];
      t.shape = {n, c, h, w};
      t.strides = {h * w * c, 1, w * c, c};
    }
    std::shared_ptr<HeldDeviceBatch> held = h_;
    t.wait_on_stream = [held](intptr_t stream) {
      held->stream.store(stream);
      held->has_stream.store(true);
      return held->b.WaitOn(ToCudaStream(stream));
    };
    return t;
  }
  ExportTensor Labels() const { return Int64Tensor(get().labels()); }
  ExportTensor Sources() const { return SourcesTensor(get().sources(), get().size()); }
  py::list Fields() const {
    const DeviceBatch& b = get();
    return FieldLists(b.num_fields(), [&](size_t f) -> const std::vector<std::optional<Bytes>>& { return b.field(f); });
  }
  const DeviceBatch& batch() const { return get(); }
  void Drop() { h_.reset(); }
  // Blocks until the data is complete (for callers that do not use the stream protocol).
  void Synchronize() const {
    Status st;
    {
      py::gil_scoped_release nogil;
      st = get().Synchronize();
    }
    Check(std::move(st));
  }

 private:
  const DeviceBatch& get() const {
    if (!h_) Throw(Status::Invalid("the device batch was dropped"));
    return h_->b;
  }
  std::shared_ptr<HeldDeviceBatch> h_;
};

py::object PyLoader::Next() {
  std::optional<Batch> host;
  std::optional<DeviceBatch> device;
  Status st;
  {
    py::gil_scoped_release nogil;
    std::lock_guard<std::mutex> lock(mu_);
    Feed* f = Get();
    if (f->on_device()) {
      Result<DeviceBatch> r = f->device()->Next();
      if (r.ok()) device.emplace(std::move(r).value());
      else st = r.status();
    } else {
      Result<Batch> r = f->host()->Next();
      if (r.ok()) host.emplace(std::move(r).value());
      else st = r.status();
    }
  }
  Check(std::move(st));
  if (device) {
    if (device->end_of_epoch()) return py::none();
    return py::cast(PyDeviceBatch(std::move(*device)));
  }
  if (host->end_of_epoch()) return py::none();
  return py::cast(PyBatch(std::move(*host)));
}

LoaderOptions MakeOptions(uint32_t batch_size, bool shuffle, uint64_t seed, int rank, int world_size, bool drop_last,
                          int threads, int prefetch, int output_height, int output_width, bool train,
                          std::pair<double, double> scale, std::pair<double, double> ratio, double flip_p,
                          int resize_size, bool dct_scaling, const std::vector<float>& mean,
                          const std::vector<float>& std_, const std::string& dtype, const std::string& layout,
                          const std::string& on_error, const std::string& image_field, bool stream,
                          uint32_t shuffle_buffer, bool prefetch_next_epoch, const std::vector<std::string>& fields,
                          const std::string& missing_fields) {
  LoaderOptions o;
  o.fields = fields;
  if (missing_fields == "raise" || missing_fields == "error") o.missing_fields = MissingFieldPolicy::kError;
  else if (missing_fields == "none") o.missing_fields = MissingFieldPolicy::kNull;
  else throw py::value_error("missing_fields must be \"raise\" or \"none\", not \"" + missing_fields + "\"");
  o.stream = stream;
  o.shuffle_buffer = shuffle_buffer;
  o.prefetch_next_epoch = prefetch_next_epoch;
  o.batch_size = batch_size;
  o.shuffle = shuffle;
  o.seed = seed;
  o.rank = rank;
  o.world_size = world_size;
  o.drop_last = drop_last;
  o.threads = threads;
  o.prefetch = prefetch;
  o.output_height = output_height;
  o.output_width = output_width;
  o.mode = train ? AugmentMode::kTrain : AugmentMode::kEval;
  o.scale_min = scale.first;
  o.scale_max = scale.second;
  o.ratio_min = ratio.first;
  o.ratio_max = ratio.second;
  o.flip_p = flip_p;
  o.resize_size = resize_size;
  o.dct_scaling = dct_scaling;
  if (mean.size() != 3 || std_.size() != 3) throw py::value_error("mean and std need 3 values");
  for (int c = 0; c < 3; ++c) {
    o.mean[c] = mean[c];
    o.std[c] = std_[c];
  }
  o.dtype = ParseDType(dtype);
  o.layout = ParseLayout(layout);
  if (on_error == "raise" || on_error == "error") o.on_error = DecodeErrorPolicy::kError;
  else if (on_error == "skip") o.on_error = DecodeErrorPolicy::kSkip;
  else throw py::value_error("on_error must be \"raise\" or \"skip\", not \"" + on_error + "\"");
  o.image_field = image_field;
  return o;
}

}  // namespace

void BindLoader(py::module_& m) {
  py::class_<ExportTensor>(m, "_Tensor", R"doc(
A DLPack producer over shardkit memory: torch.from_dlpack(t) / numpy.from_dlpack(t)
make a tensor that aliases it without copying. The memory stays valid until every
tensor made from it is freed.)doc")
      .def("__dlpack__", &ExportTensor::DLPack, py::kw_only(), py::arg("stream") = py::none(),
           py::arg("max_version") = py::none(), py::arg("dl_device") = py::none(),
           py::arg("copy") = py::none())
      .def("__dlpack_device__", &ExportTensor::DLPackDevice)
      .def_property_readonly("shape", [](const ExportTensor& t) { return py::tuple(py::cast(t.shape)); })
      .def_property_readonly("strides", [](const ExportTensor& t) -> py::object {
        if (t.strides.empty()) return py::none();
        return py::tuple(py::cast(t.strides));
      })
      .def_property_readonly("dtype", [](const ExportTensor& t) { return t.dtype_name; })
      .def_property_readonly("data_ptr", [](const ExportTensor& t) { return reinterpret_cast<uintptr_t>(t.data); })
      .def_property_readonly("nbytes", &ExportTensor::nbytes);

  m.attr("HAVE_LOADER") = true;

  py::class_<PyBatch>(m, "_Batch")
      .def("images", &PyBatch::Images, py::arg("channels_last") = false)
      .def("labels", &PyBatch::Labels)
      .def("sources", &PyBatch::Sources)
      .def("fields", &PyBatch::Fields)
      .def_property_readonly("keys", [](const PyBatch& b) { return b.batch().keys(); })
      .def_property_readonly("indices", [](const PyBatch& b) { return b.batch().indices(); })
      .def_property_readonly("epoch", [](const PyBatch& b) { return b.batch().epoch(); })
      .def_property_readonly("index", [](const PyBatch& b) { return b.batch().index(); })
      .def_property_readonly("buffer_id", [](const PyBatch& b) { return b.batch().buffer_id(); })
      .def_property_readonly("pinned", [](const PyBatch& b) { return b.batch().pinned(); })
      .def("__len__", [](const PyBatch& b) { return b.batch().size(); })
      .def("drop", &PyBatch::Drop);

  // The GPU feed (shardkit/gpu.h). Always bound: without CUDA, device batches are not
  // made (shardkit/feed.h says what _Loader does instead).
  m.attr("CUDA_COMPILED") = CudaCompiled();
  m.attr("NVJPEG_COMPILED") = NvjpegCompiled();
  m.def("cuda_device_count", [] { return CudaDeviceCount(); });
  m.def("cuda_unavailable_reason", [] { return CudaUnavailableReason(); });

  py::class_<PyDeviceBatch>(m, "_DeviceBatch")
      .def("images", &PyDeviceBatch::Images, py::arg("channels_last") = false)
      .def("labels", &PyDeviceBatch::Labels)
      .def("sources", &PyDeviceBatch::Sources)
      .def("fields", &PyDeviceBatch::Fields)
      .def("synchronize", &PyDeviceBatch::Synchronize)
      .def_property_readonly("keys", [](const PyDeviceBatch& b) { return b.batch().keys(); })
      .def_property_readonly("indices", [](const PyDeviceBatch& b) { return b.batch().indices(); })
      .def_property_readonly("epoch", [](const PyDeviceBatch& b) { return b.batch().epoch(); })
      .def_property_readonly("index", [](const PyDeviceBatch& b) { return b.batch().index(); })
      .def_property_readonly("slot", [](const PyDeviceBatch& b) { return b.batch().slot(); })
      .def_property_readonly("device", [](const PyDeviceBatch& b) { return b.batch().device(); })
      .def("__len__", [](const PyDeviceBatch& b) { return b.batch().size(); })
      .def("drop", &PyDeviceBatch::Drop);

  // The one loader binding: the library's front door (shardkit/feed.h) decides host or
  // device batches, the decoder and the fallback; next() returns _Batch or _DeviceBatch.
  py::class_<PyLoader>(m, "_Loader")
      .def(py::init([](const std::string& address, uint32_t batch_size, bool shuffle, uint64_t seed, int rank,
                       int world_size, bool drop_last, int threads, int prefetch, int output_height,
                       int output_width, bool train, std::pair<double, double> scale,
                       std::pair<double, double> ratio, double flip_p, int resize_size, bool dct_scaling,
                       std::vector<float> mean, std::vector<float> std_, const std::string& dtype,
                       const std::string& layout, const std::string& on_error, const std::string& image_field,
                       int device, const std::string& decoder, int ring, int buffer_wait_ms, bool stream,
                       uint32_t shuffle_buffer, bool prefetch_next_epoch, double hardware_load, bool profile,
                       std::vector<std::string> fields, const std::string& missing_fields,
                       std::map<std::string, std::string> source_options, const std::string& cache_dir,
                       uint64_t cache_bytes, bool trust_manifest, int local_world_size, uint64_t max_pixels,
                       const std::vector<std::tuple<std::string, double, double, uint64_t, int64_t>>& sources) {
             LoaderOptions o = MakeOptions(batch_size, shuffle, seed, rank, world_size, drop_last, threads, prefetch,
                                           output_height, output_width, train, scale, ratio, flip_p, resize_size,
                                           dct_scaling, mean, std_, dtype, layout, on_error, image_field, stream,
                                           shuffle_buffer, prefetch_next_epoch, fields, missing_fields);
             o.buffer_wait_ms = buffer_wait_ms;
             o.local_world_size = local_world_size;
             o.max_pixels = max_pixels;
             // How the address and, streamed, each shard are opened (LoaderOptions::open).
             o.open = SourceOptions(source_options, cache_dir, cache_bytes, trust_manifest);
             // A mixture (address empty): (address, weight, repeat, choose, label_offset)
             // per source, checked in Python (shardkit/loader.py) and again by the library.
             for (const auto& [addr, weight, repeat, choose, label_offset] : sources)
               o.sources.push_back(MixSourceSpec{addr, weight, repeat, choose, label_offset});
             FeedOptions f;
             f.device = device;
             if (decoder == "cpu") f.gpu.decoder = DecoderKind::kCpu;
             else if (decoder == "gpu") f.gpu.decoder = DecoderKind::kGpu;
             else if (decoder == "auto") f.gpu.decoder = DecoderKind::kAuto;
             else throw py::value_error("decoder must be \"auto\", \"cpu\" or \"gpu\", not \"" + decoder + "\"");
             f.gpu.ring = ring;
             f.gpu.hardware_load = hardware_load;
             f.gpu.profile = profile;
             return std::make_unique<PyLoader>([&]() -> Result<std::unique_ptr<Feed>> {
               return Feed::Create(address, o, f);
             });
           }),
           py::arg("address"), py::kw_only(), py::arg("batch_size"), py::arg("shuffle"), py::arg("seed"),
           py::arg("rank"), py::arg("world_size"), py::arg("drop_last"), py::arg("threads"), py::arg("prefetch"),
           py::arg("output_height"), py::arg("output_width"), py::arg("train"), py::arg("scale"),
           py::arg("ratio"), py::arg("flip_p"), py::arg("resize_size"), py::arg("dct_scaling"),
           py::arg("mean"), py::arg("std"), py::arg("dtype"), py::arg("layout"), py::arg("on_error"),
           py::arg("image_field"), py::arg("device") = -1, py::arg("decoder") = "auto", py::arg("ring") = 3,
           py::arg("buffer_wait_ms") = 0, py::arg("stream") = false, py::arg("shuffle_buffer") = 8192,
           py::arg("prefetch_next_epoch") = true, py::arg("hardware_load") = -1.0, py::arg("profile") = false,
           py::arg("fields") = std::vector<std::string>{}, py::arg("missing_fields") = "raise",
           py::arg("source_options") = std::map<std::string, std::string>{}, py::arg("cache_dir") = "",
           py::arg("cache_bytes") = 0, py::arg("trust_manifest") = false, py::arg("local_world_size") = 0,
           py::arg("max_pixels") = LoaderOptions{}.max_pixels,
           py::arg("sources") = std::vector<std::tuple<std::string, double, double, uint64_t, int64_t>>{})
      .def("next", &PyLoader::Next)
      .def("set_epoch", &PyLoader::SetEpoch, py::arg("epoch"))
      .def("save_state", &PyLoader::SaveState)
      .def("restore", &PyLoader::Restore, py::arg("state_json"))
      .def("skipped", &PyLoader::Skipped)
      .def("close", &PyLoader::Close)
      .def_property_readonly("epoch", [](PyLoader& l) { return l.With([](Feed& x) { return x.epoch(); }); })
      .def_property_readonly("num_batches",
                             [](PyLoader& l) { return l.With([](Feed& x) { return x.num_batches(); }); })
      .def_property_readonly("num_samples",
                             [](PyLoader& l) { return l.With([](Feed& x) { return x.num_samples(); }); })
      // Positions of an epoch's order, all ranks together (a mixture: the sum of its counts).
      .def_property_readonly("epoch_size", &PyLoader::epoch_size)
      // A mixture's (samples, samples per epoch) of each source; empty for one dataset.
      .def_property_readonly("mixture", &PyLoader::mixture)
      // The batch of this rank's current plan that the next next() hands out.
      .def_property_readonly("next_batch",
                             [](PyLoader& l) { return l.With([](Feed& x) { return x.save_state().next_batch; }); })
      .def_property_readonly("rank", [](PyLoader& l) { return l.With([](Feed& x) { return x.rank(); }); })
      .def_property_readonly("world_size",
                             [](PyLoader& l) { return l.With([](Feed& x) { return x.world_size(); }); })
      .def_property_readonly("class_names", [](PyLoader& l) {
        return l.With([](Feed& x) { return std::vector<std::string>(x.class_names()); });
      })
      .def_property_readonly("threads", [](PyLoader& l) { return l.With([](Feed& x) { return x.threads(); }); })
      .def_property_readonly("on_device", [](PyLoader& l) { return l.With([](Feed& x) { return x.on_device(); }); })
      .def_property_readonly("fallback",
                             [](PyLoader& l) { return l.With([](Feed& x) { return std::string(x.fallback()); }); })
      .def_property_readonly("decoder", [](PyLoader& l) {
        return std::string(DecoderName(l.With([](Feed& x) { return x.decoder(); })));
      })
      .def_property_readonly("stream", [](PyLoader& l) {
        return reinterpret_cast<uintptr_t>(
            l.With([](Feed& x) -> void* { return x.on_device() ? x.device()->stream() : nullptr; }));
      })
      .def("stats", [](PyLoader& l) {
        GpuLoader::Stats s = l.With([](Feed& x) { return x.on_device() ? x.device()->stats() : GpuLoader::Stats{}; });
        py::dict d;
        d["batches"] = s.batches;
        d["images_hardware"] = s.images_hardware;
        d["images_cuda"] = s.images_cuda;
        d["images_host"] = s.images_host;
        d["images_roi"] = s.images_roi;
        d["bytes_uploaded"] = s.bytes_uploaded;
        d["next_wait_s"] = s.next_wait_s;
        d["hardware_share"] = s.hardware_share;
        d["adaptive"] = s.adaptive;
        d["nvjpeg_device_bytes"] = s.nvjpeg_device_bytes;
        d["next_epoch_ready"] = s.next_epoch_ready;
        d["next_epoch_adopted"] = s.next_epoch_adopted;
        return d;
      })
      .def("profile", [](PyLoader& l) {
        GpuLoader::Profile p = l.With([](Feed& x) { return x.on_device() ? x.device()->profile() : GpuLoader::Profile{}; });
        py::dict d;
        d["enabled"] = p.enabled;
        d["batches"] = p.batches;
        d["acquire_s"] = p.acquire_s;
        d["wait_set_s"] = p.wait_set_s;
        d["phase1_s"] = p.phase1_s;
        d["handoff_s"] = p.handoff_s;
        d["pack_s"] = p.pack_s;
        d["hw_call_s"] = p.hw_call_s;
        d["cuda_rows_s"] = p.cuda_rows_s;
        d["tail_s"] = p.tail_s;
        d["rows_nvjpeg_s"] = p.rows_nvjpeg_s;
        d["rows_host_s"] = p.rows_host_s;
        d["gpu_hw_decode_ms"] = p.gpu_hw_decode_ms;
        d["gpu_resize_ms"] = p.gpu_resize_ms;
        d["gpu_timed"] = p.gpu_timed;
        return d;
      });
}

}  // namespace shardkit::python
