// shardkit.convert() / shardkit.shard(): the library's convert pipeline
// (shardkit/convert.h), run with the GIL released.
#include "core/front_end.h"
#include "common.h"

#include "shardkit/convert.h"

#include <csignal>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace shardkit::python {

namespace {

py::dict SummaryToDict(const ConvertSummary& s) {
  py::dict d;
  d["source"] = s.source;
  d["destination"] = s.destination;
  d["source_format"] = s.source_format;
  d["destination_format"] = s.destination_format;
  d["samples"] = s.samples;
  d["payload_bytes"] = s.payload_bytes;
  d["bytes"] = s.bytes;
  d["seconds"] = s.seconds;
  py::list shards;
  for (const ShardInfo& sh : s.shards) shards.append(ShardToDict(sh));
  d["shards"] = shards;
  if (s.part.count > 0) {
    d["part"] = s.part.index;
    d["parts"] = s.part.count;
  }
  d["already_complete"] = s.already_complete;
  d["source_checksums_checked"] = s.source_checksums_checked;
  d["notes"] = s.notes;
  if (!s.transform.empty()) d["transform"] = py::module_::import("json").attr("loads")(s.transform);
  if (s.source_samples > 0) {
    d["source_samples"] = s.source_samples;
    d["selected"] = s.selected;
    d["duplicates"] = s.duplicates;
    if (!s.duplicates_file.empty()) d["duplicates_file"] = s.duplicates_file;
  }
  if (!s.skipped_file.empty() || s.skipped > 0) {  // (a part: its record lists them; merge writes the file)
    d["skipped"] = s.skipped;
    if (!s.skipped_file.empty()) d["skipped_file"] = s.skipped_file;
  }
  return d;
}

// part=None (the whole output), "I/N", "env" or a tuple (I, N).
PartSpec ParsePartArg(const py::object& v) {
  if (v.is_none()) return PartSpec{};
  if (py::isinstance<py::str>(v)) return Unwrap(ParsePart(v.cast<std::string>()));
  auto t = v.cast<std::pair<uint64_t, uint64_t>>();
  return Unwrap(ParsePart(std::to_string(t.first) + "/" + std::to_string(t.second)));
}

// An int, or a string such as "1GiB" / "500MB"; None = 0 (the library's default).
uint64_t ByteSize(const py::object& v) {
  if (v.is_none()) return 0;
  if (py::isinstance<py::str>(v)) return Unwrap(ParseByteSize(v.cast<std::string>()));
  return v.cast<uint64_t>();
}

KeyDots ParseKeyDots(const std::string& s) {
  if (s == "error") return KeyDots::kError;
  if (s == "replace") return KeyDots::kReplace;
  throw py::value_error("key_dots must be \"error\" or \"replace\", not \"" + s + "\"");
}

// While a conversion runs on the main thread, SIGINT asks the library to stop
// (RequestStop, async-signal-safe) instead of waiting for the interpreter, which runs
// its handlers only between bytecodes: Ctrl-C then stops before the next sample, as the
// command's does, and nothing is published. The interpreter's handler is put back
// afterwards and given the signal (PyErr_SetInterruptEx): by default it raises
// KeyboardInterrupt; a handler of the program's own runs as it would have.
class SigintStopsConversion {
 public:
  SigintStopsConversion() {
    py::module_ threading = py::module_::import("threading");
    if (!threading.attr("current_thread")().is(threading.attr("main_thread")())) return;
    struct sigaction sa {};
    sa.sa_handler = [](int) { RequestStop(SIGINT); };
    sigemptyset(&sa.sa_mask);
    active_ = ::sigaction(SIGINT, &sa, &old_) == 0;
  }
  ~SigintStopsConversion() {
    if (active_) ::sigaction(SIGINT, &old_, nullptr);
  }
  // After the work (GIL held): the handler restored, and the signal handed to Python if
  // one stopped the work. True when Python raised (an exception is set).
  bool Deliver() {
    if (!active_) return false;
    ::sigaction(SIGINT, &old_, nullptr);
    active_ = false;
    if (StopRequested() != SIGINT) return false;
    ClearStopRequest();
    PyErr_SetInterruptEx(SIGINT);
    return PyErr_CheckSignals() != 0;
  }

 private:
  bool active_ = false;
  struct sigaction old_ {};
};

// Runs `work` without the GIL; `progress` (a Python callable or None) is called with a
// dict from the calling thread, under the GIL. An exception raised by the callback
// cannot stop the library's work: the first one is re-raised when the work is done.
// Ctrl-C: see SigintStopsConversion.
template <class Work>
py::dict RunWithProgress(const py::object& progress, Work&& work) {
  std::optional<py::error_already_set> callback_error;
  ProgressFn fn;
  if (!progress.is_none()) {
    fn = [&](const ConvertProgress& p) {
      py::gil_scoped_acquire gil;
      if (callback_error) return;
      try {
        py::dict d;
        d["samples"] = p.samples;
        d["bytes"] = p.bytes;
        d["elapsed"] = p.elapsed;
        d["total"] = p.total ? py::object(py::int_(*p.total)) : py::object(py::none());
        progress(d);
      } catch (py::error_already_set& e) {
        callback_error.emplace(std::move(e));
      }
    };
  }
  Result<ConvertSummary> r = Status::Internal("unset");
  SigintStopsConversion sigint;
  {
    py::gil_scoped_release nogil;
    r = work(fn);
  }
  if (sigint.Deliver()) throw py::error_already_set();  // KeyboardInterrupt, by default
  if (callback_error) throw std::move(*callback_error);
  return SummaryToDict(Unwrap(std::move(r)));  // stopped, and Python's handler did not raise: the error says so
}

}  // namespace

void BindConvert(py::module_& m) {
  m.attr("HAVE_CONVERT") = true;
  m.def("format_options", [](const std::string& kind) {
    if (kind != "write" && kind != "read" && kind != "all")
      throw py::value_error("kind must be \"write\", \"read\" or \"all\", not \"" + kind + "\"");
    py::list out;
    for (const FormatOption& o : FormatOptions()) {
      if (kind != "all" && o.write != (kind == "write")) continue;
      py::dict d;
      d["write"] = o.write;
      d["format"] = o.format;
      d["name"] = o.name;
      d["key"] = o.key();
      d["default"] = o.default_value;
      d["choices"] = o.choices;
      d["help"] = o.help;
      out.append(d);
    }
    return out;
  }, py::arg("kind") = "write",
     "The formats' options from their tables: dicts {write, format, name, key, default, choices, help}. kind="
     "\"write\" (the default): the writers', which convert() takes as keyword arguments <format>_<name>; "
     "\"read\": the readers', given as source_options={key: value} (open, convert, Loader); \"all\".");
  m.def("convert",
        [](const std::string& src, const std::string& dst, bool shuffle, uint64_t seed,
           std::optional<int> threads, size_t window, const py::object& shard_size, uint64_t samples_per_shard,
           const std::vector<std::string>& class_names, bool overwrite, const std::string& key_dots,
           bool write_index, const std::map<std::string, std::string>& field_map, const py::object& progress,
           const py::object& part, bool resume, const std::map<std::string, std::string>& source_options,
           const std::string& encode, const std::string& staging_dir, bool trust_manifest, bool verify_source,
           bool allow_empty, const std::map<std::string, std::string>& format_options, const std::string& resize,
           bool skip_bad, uint64_t max_pixels, const std::string& select, bool dedup) {
          ConvertOptions o;
          o.select = select;
          o.dedup = dedup;
          o.resize = resize;
          o.skip_bad = skip_bad;
          o.max_pixels = max_pixels;
          o.verify_source = verify_source;
          o.allow_empty = allow_empty;
          o.write.format_options = format_options;
          o.part = ParsePartArg(part);
          o.write.resume = resume;
          o.shuffle = shuffle;
          o.seed = seed;
          o.threads = threads.value_or(0) == 0 ? DefaultCopyThreads() : *threads;
          o.window = window;
          if (uint64_t b = ByteSize(shard_size)) o.write.shard_size = b;
          o.write.samples_per_shard = samples_per_shard;
          o.write.class_names = class_names;
          o.write.overwrite = overwrite;
          o.write.key_dots = ParseKeyDots(key_dots);
          o.write.write_index = write_index;
          o.open.field_map = field_map;
          o.open.format_options = source_options;
          o.open.trust_manifest = trust_manifest;
          OptionsFromEnvironment(&o.open);
          o.staging_dir = StagingDirOr(staging_dir);
          o.encode = encode;
          py::dict d = RunWithProgress(progress, [&](const ProgressFn& fn) { return Convert(src, dst, o, fn); });
          d["threads"] = o.threads;
          return d;
        },
        py::arg("src"), py::arg("dst"), py::kw_only(), py::arg("shuffle") = false, py::arg("seed") = 0,
        py::arg("threads") = py::none(), py::arg("window") = 256, py::arg("shard_size") = py::none(),
        py::arg("samples_per_shard") = 0, py::arg("class_names") = std::vector<std::string>{},
        py::arg("overwrite") = false, py::arg("key_dots") = "error",
        py::arg("write_index") = true, py::arg("field_map") = std::map<std::string, std::string>{},
        py::arg("progress") = py::none(), py::arg("part") = py::none(), py::arg("resume") = false,
        py::arg("source_options") = std::map<std::string, std::string>{},
        py::arg("encode") = "", py::arg("staging_dir") = "", py::arg("trust_manifest") = false,
        py::arg("verify_source") = true, py::arg("allow_empty") = false,
        py::arg("format_options") = std::map<std::string, std::string>{}, py::arg("resize") = "",
        py::arg("skip_bad") = false, py::arg("max_pixels") = 0, py::arg("select") = "", py::arg("dedup") = false,
        R"doc(Copies every sample of the dataset `src` into a new dataset `dst` (any formats).

Keeps dataset order, or with shuffle=True writes a seeded global permutation (needs random
access). wds outputs: shard_size (bytes, or a string such as "1GiB"), samples_per_shard,
write_index (DALI .idx files). key_dots: "error" or "replace" (keys with a dot in their
last component). Each format's writer options are keyword arguments <format>_<name>
(shardkit.format_options() lists them with their defaults and choices), e.g.
lmdb_layout="caffe", mds_compression="zstd:3", mds_hashes=["xxh3_64", "md5"],
tfrecord_preset="tfds", tfrecord_field_map={"image/encoded": "jpg"}, lmdb_arrays="record",
hdf5_arrays="fields"; or format_options={"lmdb.layout": "caffe", ...}. class_names: default the source's.
threads: reader threads, default (None or 0) what the `shardkit convert` command uses: the
cores, 2 to 8 (the output is the same for any number). allow_empty: write an empty dataset
when the source holds no samples (otherwise an error). field_map: HDF5 source dataset
names to fields; TFRecord source feature names to fields ("__key__", "cls", "cls-1" or an
extension). source_options: read options of the source, e.g. {"lmdb.layout": "pickle",
"lmdb.channels": "bgr-to-rgb", "hdf5.order": "nchw"} (docs/existing-data.md). resize:
"short:S", "max:M" or "fit:WxH" shrinks every image (never enlarging one), after turning it
upright by its EXIF orientation. encode: "" or "keep" copies image bytes (decoded arrays stay
.npy); "jpeg[:Q]", "webp[:Q]" or "png" re-encodes every image (and writes decoded arrays as
images); with resize the default is "jpeg:90". The output's metadata records the transform
(docs/formats.md, "Transforms"). skip_bad: leave out samples whose image does not decode,
listed in skipped.json beside the output (summary: skipped, skipped_file). max_pixels: the
decoder's limit (width * height) for those images, 0 the default (200,000,000). select:
"classes=a,b" (names or label numbers), "keys-from=FILE" or "fraction=F" (exactly
round(F * n) samples, chosen by seed) writes only those, in source order (shuffle after).
dedup: drop samples whose image bytes repeat an earlier one's, listed in duplicates.json
beside the output (summary: source_samples, selected, duplicates, duplicates_file); both
read every sample once first and need random access. progress: a callable taking a dict
{samples, bytes, elapsed, total}, called about ten times a second on this thread.
part: write only part I of N of a tar shard output ("I/N", (I, N), or "env" for the
launcher's variables); merge(dst) then writes the manifest (docs/cluster.md). resume:
continue an interrupted run; on a finished one, check it and write nothing
(already_complete=True in the summary). staging_dir: where a remote dst (s3://,
http(s)://) is written before its upload (default: SHARDKIT_STAGING_DIR, else TMPDIR,
else /tmp). verify_source: check every sample against the checksums the source records
(a mismatch raises, naming the sample; False converts damaged data as it is). The source is read with SHARDKIT_CACHE_DIR / _BYTES / SHARDKIT_INDEX_BUDGET
when set (docs/remote.md).
Returns a summary dict (with the `threads` used). Nothing appears under `dst` unless it
succeeds.)doc");

  m.def("shard",
        [](const std::string& src, const std::string& dst, uint64_t num_shards, uint64_t samples_per_shard,
           const py::object& shard_size, bool shuffle, uint64_t seed, std::optional<int> threads, bool overwrite,
           const std::string& key_dots, const std::map<std::string, std::string>& field_map,
           const py::object& progress, const py::object& part, bool resume, const std::string& staging_dir,
           bool verify_source, bool allow_empty, const std::string& resize, const std::string& encode,
           bool skip_bad, uint64_t max_pixels, const std::string& select, bool dedup) {
          ShardOptions o;
          o.select = select;
          o.dedup = dedup;
          o.resize = resize;
          o.encode = encode;
          o.skip_bad = skip_bad;
          o.max_pixels = max_pixels;
          o.verify_source = verify_source;
          o.allow_empty = allow_empty;
          o.part = ParsePartArg(part);
          o.resume = resume;
          o.num_shards = num_shards;
          o.samples_per_shard = samples_per_shard;
          o.shard_size = ByteSize(shard_size);
          o.shuffle = shuffle;
          o.seed = seed;
          o.threads = threads.value_or(0) == 0 ? DefaultCopyThreads() : *threads;
          o.overwrite = overwrite;
          o.key_dots = ParseKeyDots(key_dots);
          o.open.field_map = field_map;
          OptionsFromEnvironment(&o.open);
          o.staging_dir = StagingDirOr(staging_dir);
          py::dict d = RunWithProgress(progress, [&](const ProgressFn& fn) { return Shard(src, dst, o, fn); });
          d["threads"] = o.threads;
          return d;
        },
        py::arg("src"), py::arg("dst"), py::kw_only(), py::arg("num_shards") = 0,
        py::arg("samples_per_shard") = 0, py::arg("shard_size") = py::none(), py::arg("shuffle") = false,
        py::arg("seed") = 0, py::arg("threads") = py::none(), py::arg("overwrite") = false,
        py::arg("key_dots") = "error", py::arg("field_map") = std::map<std::string, std::string>{},
        py::arg("progress") = py::none(), py::arg("part") = py::none(), py::arg("resume") = false,
        py::arg("staging_dir") = "", py::arg("verify_source") = true, py::arg("allow_empty") = false,
        py::arg("resize") = "", py::arg("encode") = "", py::arg("skip_bad") = false, py::arg("max_pixels") = 0,
        py::arg("select") = "", py::arg("dedup") = false,
        R"doc(Re-shards any dataset into WebDataset tar shards named by the printf pattern `dst`
(e.g. "out/train-%06d.tar"). Cut by exactly one of num_shards (counts differ by at most
one), samples_per_shard, shard_size (bytes or "1GiB"); none given: 1 GiB shards.
Other arguments as in convert() (part, resume, staging_dir, verify_source, resize, encode,
skip_bad, max_pixels, select and dedup included). Returns a summary dict.)doc");

  m.def("merge",
        [](const std::string& dst, bool checksums) {
          MergeOptions o;
          o.checksums = checksums;
          Result<MergeSummary> r = Status::Internal("unset");
          {
            py::gil_scoped_release nogil;
            r = Merge(dst, o);
          }
          MergeSummary s = Unwrap(std::move(r));
          py::dict d;
          d["destination"] = s.destination;
          d["metadata"] = s.metadata;
          d["parts"] = s.parts;
          d["shards"] = s.shards;
          d["samples"] = s.samples;
          d["bytes"] = s.bytes;
          d["unchanged"] = s.unchanged;
          if (s.skipped) {
            d["skipped"] = s.skipped->size();
            d["skipped_file"] = s.skipped_file;
          }
          return d;
        },
        py::arg("dst"), py::kw_only(), py::arg("checksums") = false,
        R"doc(Finishes a conversion written in parts (convert/shard with part=...): checks that every
part finished with the same flags and source and that no shard is missing or twice, then
writes the manifest. Idempotent (unchanged=True when it was already written). Parts run
with skip_bad: skipped.json beside it lists what they left out (skipped, skipped_file).
checksums: also hash every shard. Raises on any problem, naming the part or shard.)doc");
}


}  // namespace shardkit::python
