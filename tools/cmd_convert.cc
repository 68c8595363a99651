// `shardkit convert` and `shardkit shard`.
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <thread>

#include "core/front_end.h"
#include "core/paths.h"
#include "pipeline/select.h"
#include "cli.h"

namespace shardkit::cli {

namespace {

const char* const kStagingHelp =
    "A remote DST (s3://, http(s)://) is written into a local staging directory below\n"
    "$SHARDKIT_STAGING_DIR, else $TMPDIR, else /tmp, and uploaded file by file.\n";

// Flags shared by convert and shard.
struct CopyFlags {
  std::string src, dst;
  bool shuffle = false;
  uint64_t seed = 0;
  // Default: the cores, at least 2 (reading overlaps writing), at most 8.
  int threads = DefaultCopyThreads();
  std::string key_dots = "error";
  bool overwrite = false;
  bool resume = false;
  bool json = false;
  bool no_index = false;
  bool no_verify_source = false;
  bool allow_empty = false;
  std::string select;
  bool dedup = false;
  CLI::Option* seed_flag = nullptr;  // given without --shuffle or a fraction: a usage error
  std::string part;
  std::string resize, encode;  // --resize, --encode (ConvertOptions)
  bool skip_bad = false;
  uint64_t max_pixels = 0;
  OpenOptions cache;  // --cache-dir / --cache-bytes / --trust-manifest / --source-option
};

// The source's options from the flags, then the environment below them
// (OpenOptions::format_options from --source-option, the cache, SHARDKIT_*); false
// (and a message, *rc set) when one does not parse.
bool TakeSourceEnvironment(const CopyFlags& f, OpenOptions* o, int* rc) {
  o->cache_dir = f.cache.cache_dir;
  o->cache_bytes = f.cache.cache_bytes;
  o->trust_manifest = f.cache.trust_manifest;
  for (const auto& [k, v] : f.cache.format_options) o->format_options[k] = v;
  if (Status st = OpenOptionsFromEnvironment(o); !st.ok()) {
    *rc = UsageError(st.message());
    return false;
  }
  return true;
}

void AddCopyFlags(CLI::App* sub, CopyFlags* f) {
  sub->add_option("SRC", f->src, "Source dataset address, e.g. images/ or wds:train-{000000..000009}.tar")
      ->required();
  sub->add_option("DST", f->dst,
                  "Destination address, e.g. wds:out/train-%06d.tar or s3://bucket/out/train-%06d.tar (a remote "
                  "output is written in a local staging directory and uploaded file by file as each is finished, "
                  "the manifest last; LMDB and HDF5, single local files by nature, are uploaded once complete; "
                  "docs/remote.md)")
      ->required();
  auto* shuffle = sub->add_flag("--shuffle", f->shuffle,
                                "Write the samples in a seeded global random order (the source needs "
                                "random access by index)");
  (void)shuffle;
  f->seed_flag = sub->add_option("--seed", f->seed,
                  "Seed of --shuffle and of --select fraction=F (default 0): same seed, same order and choice");
  sub->add_option("--threads", f->threads,
                  "Threads reading ahead of the writer (default, or 0: the cores this process may run on (its CPU "
                  "affinity), 2 to 8); the output is the same for any N")
      ->check(CLI::Range(0, 1024));
  sub->add_option("--key-dots", f->key_dots,
                  "What to do with a key whose last path component holds a dot (it would split "
                  "wrongly in a tar shard): 'error' (default) refuses it, 'replace' writes '_' for "
                  "each such '.'")
      ->check(CLI::IsMember({"error", "replace"}));
  sub->add_flag("--overwrite", f->overwrite, "Replace an existing output");
  sub->add_flag("--allow-empty", f->allow_empty,
                "Write an empty dataset when the source holds no samples (by default that is an error: an "
                "empty source is usually a wrong path or filter)");
  sub->add_option("--select", f->select,
                  "Write only some samples: 'classes=A,B' (class names or label numbers), 'keys-from=FILE' (one "
                  "key per line; keys the source lacks are counted in a note), or 'fraction=F' (exactly round(F*n) "
                  "samples, chosen by --seed). Source order; --shuffle applies after. Reads every sample once first "
                  "(the source needs random access); every --part chooses alike");
  sub->add_flag("--dedup", f->dedup,
                "Drop each sample whose image bytes equal an earlier sample's (source order, after --select); "
                "the dropped keys and what they repeat go to duplicates.json beside the output (the shard "
                "pattern's directory, else OUTPUT.duplicates.json). Reads every sample once first");
  sub->add_flag("--no-verify-source", f->no_verify_source,
                "Do not check the samples against the checksums the source records (by default a sample "
                "that does not match stops the conversion, naming it, so that damaged bytes are not written "
                "under fresh checksums)");
  sub->add_option("--resize", f->resize,
                  "Shrink every image, never enlarging one: 'short:S' (short side S, the long one in proportion), "
                  "'max:M' (long side M) or 'fit:WxH' (inside WxH, aspect ratio kept). Images are decoded, turned "
                  "upright by their EXIF orientation, resized and re-encoded (--encode, default jpeg:90 with "
                  "--resize); the manifest records the transform");
  sub->add_option("--encode", f->encode,
                  "The output's image codec: 'keep' (default: image bytes copied as they are), 'jpeg[:Q]', "
                  "'webp[:Q]' (quality 1-100, default 90) or 'png' (lossless). Any but keep decodes every image, "
                  "applies its EXIF orientation and --resize, and writes it without metadata as .jpg/.webp/.png "
                  "(the key is unchanged). Decoded arrays (field npy, uint8 [H,W(,C)], RGB) are written as images "
                  "too");
  sub->add_flag("--skip-bad", f->skip_bad,
                "With --resize or --encode: leave out a sample whose image does not decode (corrupt, over "
                "--max-pixels, an unknown codec) and list it with the reason in skipped.json beside the output "
                "(the shard pattern's directory, else OUTPUT.skipped.json); by default it stops the conversion, "
                "naming the key, and nothing is published");
  sub->add_option("--max-pixels", f->max_pixels,
                  "With --resize or --encode: refuse an image that declares more than N pixels (width x height) "
                  "before decoding it (default 200000000), naming its key and size")
      ->check(AtLeastOne());
  sub->add_flag("--no-index", f->no_index,
                "Tar shards: do not write DALI's .idx beside each shard (`shardkit index` makes them later)");
  sub->add_flag("--resume", f->resume,
                "Continue an interrupted run (killed, power lost, disk full) of the same command: "
                "tar shards from the last complete shard (same bytes as an uninterrupted run), "
                "LMDB from the last durable point (a sync every 1 GiB or 30 s); HDF5 and folder outputs start over. "
                "The source is read again from the start and checked against what was written");
  sub->add_option("--part", f->part,
                  "Write only part I of N of the output (I/N, 0 <= I < N), or 'env': I and N from the launcher "
                  "(Slurm job array or srun, mpirun, torchrun). Every part plans the same shards and writes "
                  "its own under their final names plus a part record; `shardkit merge DST` then writes the "
                  "manifest (under mpirun in an MPI build, rank 0 merges). Tar shard outputs only; the output "
                  "is byte for byte that of one process (docs/cluster.md)");
  AddSourceOptions(sub, &f->cache);
  sub->add_flag("--json", f->json,
                "Print the summary as one JSON object: command, source, destination, "
                "source_format, destination_format, samples, bytes, payload_bytes, seconds, "
                "mb_per_s, shards [{path, samples, bytes, checksum}]");
}

KeyDots ToKeyDots(const std::string& s) { return s == "replace" ? KeyDots::kReplace : KeyDots::kError; }

// One flag per writer option in the formats' tables: --<format>-<name> ('_' as '-'),
// with the table's help, default and choices; a flag given lands in *out under its key.
void AddFormatOptionFlags(CLI::App* sub, std::map<std::string, std::string>* out) {
  for (const FormatOption& o : FormatOptions()) {
    if (!o.write) continue;  // (a reader's options: --source-option)
    std::string flag = "--" + o.format + "-" + o.name;
    std::replace(flag.begin(), flag.end(), '_', '-');
    std::string help = fmt::format("{} output: {}", o.format, o.help);
    if (!o.default_value.empty()) help += fmt::format(" (default: {})", o.default_value);
    auto* opt = sub->add_option_function<std::string>(
        flag, [out, key = o.key()](const std::string& v) { (*out)[key] = v; }, help);
    opt->type_name("TEXT");
    if (!o.choices.empty()) opt->check(CLI::IsMember(o.choices));
  }
}

bool ParseFieldMap(const char* flag, const std::string& text, std::map<std::string, std::string>* out) {
  auto pairs = paths::ParsePairs(text, flag, "NAME=FIELD");
  if (!pairs.ok()) {
    UsageError(std::string(pairs.status().message()));
    return false;
  }
  for (auto& [k, v] : *pairs) (*out)[k] = v;
  return true;
}

// --select (and --seed without --shuffle or a fraction): checked here so that a
// malformed one is a usage error (exit 2).
bool TakeSelect(const CopyFlags& f, int* rc) {
  if (f.seed_flag && f.seed_flag->count() > 0 && !f.shuffle && f.select.rfind("fraction=", 0) != 0) {
    *rc = UsageError("--seed requires --shuffle or --select fraction=F");
    return false;
  }
  if (f.select.empty()) return true;
  if (auto s = pipeline::ParseSelect(f.select); !s.ok()) {
    *rc = UsageError(s.status().message());
    return false;
  }
  return true;
}

// --resize / --encode: checked here so that a malformed value is a usage error (exit 2).
bool TakeTransform(const CopyFlags& f, int* rc) {
  if (Status st = CheckTransformOptions(f.resize, f.encode); !st.ok()) {
    *rc = st.code() == Code::kInvalidArgument ? UsageError(st.message()) : Fail(st, false);
    return false;
  }
  if ((f.skip_bad || f.max_pixels > 0) && f.resize.empty() && (f.encode.empty() || f.encode == "keep")) {
    *rc = UsageError(fmt::format("{} applies to images that are decoded: give --resize or --encode",
                                 f.skip_bad ? "--skip-bad" : "--max-pixels"));
    return false;
  }
  return true;
}

// --part: parsed and announced on stderr (which launcher variables gave it). False
// (after a usage error) when it is malformed.
bool TakePart(const CopyFlags& f, PartSpec* out, int* rc) {
  if (f.part.empty()) return true;
  auto p = ParsePart(f.part);
  if (!p.ok()) {
    *rc = UsageError(p.status().message());
    return false;
  }
  *out = *p;
  std::fprintf(stderr, "shardkit: writing part %llu/%llu (from %s)\n", static_cast<unsigned long long>(out->index),
               static_cast<unsigned long long>(out->count), out->from.c_str());
  return true;
}

}  // namespace

RunFn SetupConvert(CLI::App* sub) {
  struct Flags : CopyFlags {
    std::string shard_size;
    uint64_t samples_per_shard = 0;
    std::string field_map;
    // The formats' writer options, from their tables (FormatOptions()): key -> value given.
    std::map<std::string, std::string> format_options;
  };
  auto f = std::make_shared<Flags>();
  AddCacheOptions(sub, &f->cache);
  AddCopyFlags(sub, f.get());
  sub->add_option("--field-map", f->field_map,
                  "Source fields by name, 'NAME=FIELD,...': TFRecord feature names (FIELD: __key__, cls, "
                  "cls-1 for a 1-based label, or an extension), instead of the preset detected from the first "
                  "record; HDF5 dataset names");
  sub->add_option("--shard-size", f->shard_size,
                  "Sharded outputs (tar shards, TFRecord and RecordIO patterns, MDS): start a new shard at this "
                  "many bytes (default: 1GiB for tar shards, TFRecord and RecordIO; 64MiB for MDS, as MosaicML "
                  "Streaming's writer; with --samples-per-shard alone: no byte limit; the least is 1KiB for tar shards)");
  sub->add_option("--samples-per-shard", f->samples_per_shard,
                  "Sharded outputs: start a new shard every N samples (default: no limit)")
      ->check(AtLeastOne());
  AddFormatOptionFlags(sub, &f->format_options);
  sub->footer(std::string(
                  "Examples:\n"
                  "  shardkit convert images/ wds:out/train-%06d.tar --shard-size 500MB\n"
                  "  shardkit convert folder:images lmdb:train.lmdb --shuffle --seed 42 --threads 8\n"
                  "  shardkit convert out/train.manifest.json hdf5:train.h5 --json\n"
                  "  shardkit convert images/ lmdb:caffe.lmdb --lmdb-layout caffe\n"
                  "  shardkit convert 'train-{00000..01023}-of-01024' wds:out/train-%06d.tar  # TFRecords\n"
                  "  shardkit convert images/ tfrecord:out/train-%05d.tfrecord --tfrecord-preset tfds\n"
                  "  shardkit convert raw/ wds:out/x-%06d.tar --key-dots replace --overwrite\n") +
              kSizeHelp + kEnvironmentHelp + kStagingHelp + kExitHelp);
  return [f]() -> int {
    ConvertOptions o;
    if (!f->shard_size.empty() && !ParseSizeFlag("--shard-size", f->shard_size, &o.write.shard_size))
      return kExitUsage;
    o.write.samples_per_shard = f->samples_per_shard;
    o.write.overwrite = f->overwrite;
    o.write.resume = f->resume;
    o.verify_source = !f->no_verify_source;
    o.allow_empty = f->allow_empty;
    o.write.key_dots = ToKeyDots(f->key_dots);
    o.write.write_index = !f->no_index;
    o.write.format_options = f->format_options;
    if (!ParseFieldMap("--field-map", f->field_map, &o.open.field_map)) return kExitUsage;
    int rc = kExitOk;
    if (!TakeSourceEnvironment(*f, &o.open, &rc)) return rc;
    o.staging_dir = StagingDirFromEnvironment();
    o.encode = f->encode;
    o.resize = f->resize;
    o.skip_bad = f->skip_bad;
    o.max_pixels = f->max_pixels;
    if (!TakeTransform(*f, &rc)) return rc;
    o.shuffle = f->shuffle;
    o.seed = f->seed;
    o.threads = f->threads == 0 ? DefaultCopyThreads() : f->threads;
    o.select = f->select;
    o.dedup = f->dedup;
    if (!TakeSelect(*f, &rc)) return rc;
    if (!TakePart(*f, &o.part, &rc)) return rc;
    Result<ConvertSummary> r = [&] {
      ProgressPrinter progress;
      StopOnSignals();
      return Convert(f->src, f->dst, o, progress.fn());
    }();
    return FinishCopy("convert", r, f->dst, f->json, o.part);
  };
}

RunFn SetupShard(CLI::App* sub) {
  struct Flags : CopyFlags {
    uint64_t num_shards = 0;
    uint64_t samples_per_shard = 0;
    std::string shard_size;
  };
  auto f = std::make_shared<Flags>();
  AddCacheOptions(sub, &f->cache);
  AddCopyFlags(sub, f.get());
  auto* n = sub->add_option("--num-shards", f->num_shards,
                            "Write exactly N shards whose sample counts differ by at most one "
                            "(they divide evenly across ranks and loader workers)")
                ->check(AtLeastOne());
  auto* sps = sub->add_option("--samples-per-shard", f->samples_per_shard,
                              "Start a new shard every N samples")
                  ->check(AtLeastOne());
  auto* size = sub->add_option("--shard-size", f->shard_size,
                               "Start a new shard at this many bytes (the default, 1GiB, when no "
                               "other cut is given)");
  n->excludes(sps)->excludes(size);
  sps->excludes(size);
  sub->footer(std::string(
                  "DST is a printf pattern for the shard names, with or without the wds: scheme.\n"
                  "Examples:\n"
                  "  shardkit shard train.lmdb out/train-%06d.tar --num-shards 64\n"
                  "  shardkit shard images/ wds:out/train-%06d.tar --samples-per-shard 10000 --shuffle --seed 1\n"
                  "  shardkit shard 'old-{000..099}.tar' new-%04d.tar --shard-size 1GiB --json\n"
                  "  shardkit shard images/ tfrecord:out/train-%05d.tfrecord --num-shards 1024  # TFRecords\n") +
              kSizeHelp + kEnvironmentHelp + kStagingHelp + kExitHelp);
  return [f]() -> int {
    ShardOptions o;
    if (!f->shard_size.empty() && !ParseSizeFlag("--shard-size", f->shard_size, &o.shard_size))
      return kExitUsage;
    o.num_shards = f->num_shards;
    o.samples_per_shard = f->samples_per_shard;
    o.shuffle = f->shuffle;
    o.seed = f->seed;
    o.threads = f->threads == 0 ? DefaultCopyThreads() : f->threads;
    o.overwrite = f->overwrite;
    o.resume = f->resume;
    o.verify_source = !f->no_verify_source;
    o.allow_empty = f->allow_empty;
    o.key_dots = ToKeyDots(f->key_dots);
    o.write_index = !f->no_index;
    o.select = f->select;
    o.dedup = f->dedup;
    o.resize = f->resize;
    o.encode = f->encode;
    o.skip_bad = f->skip_bad;
    o.max_pixels = f->max_pixels;
    int rc = kExitOk;
    if (!TakeTransform(*f, &rc)) return rc;
    if (!TakeSelect(*f, &rc)) return rc;
    if (!TakePart(*f, &o.part, &rc)) return rc;
    if (!TakeSourceEnvironment(*f, &o.open, &rc)) return rc;
    o.staging_dir = StagingDirFromEnvironment();
    Result<ConvertSummary> r = [&] {
      ProgressPrinter progress;
      StopOnSignals();
      return Shard(f->src, f->dst, o, progress.fn());
    }();
    return FinishCopy("shard", r, f->dst, f->json, o.part);
  };
}

}  // namespace shardkit::cli
