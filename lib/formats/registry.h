// Internal: the format registry. One row per format in registry.cc.
//
// A format is one table row of hooks (libarchive's shape): bids that score how
// sure it is that an address is its own, open and create, and the few typed
// answers the pipeline (verify, convert, the streamed loader, bench) needs so
// that no code outside lib/formats/ names or compares a format.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <deque>
#include <functional>

#include "shardkit/convert.h"
#include "shardkit/dataset.h"

namespace shardkit::formats {

// The files of a dataset whose files can each be read on their own (tar
// shards), listed from the address or the metadata it names without opening
// the shards: what verify checks one by one.
struct ShardListing {
  // The metadata file the list comes from (a manifest); empty when the address
  // names the shards itself.
  std::string metadata;
  // The metadata exists but cannot be parsed: why (shards is then empty).
  std::string unreadable;
  std::optional<uint64_t> num_samples;   // the metadata's total
  std::vector<std::string> class_names;  // the metadata's
  std::string channel_order;             // of decoded arrays, as the metadata records it: "bgr", "rgb" or ""
  struct Shard {
    std::string path;                  // the file
    std::string address;               // what Open() takes to read this shard alone
    std::optional<uint64_t> samples;   // as the metadata records them
    std::optional<uint64_t> bytes;
    std::string checksum;              // whole-file checksum ("xxh3:..."), empty if none
  };
  std::vector<Shard> shards;
};

// Where one sample of a shard starts: its key and the byte offset of its first
// field's data, as the format's reader groups the file.
struct SampleExtent {
  std::string key;
  uint64_t offset = 0;
};

// One option of a format's writer or reader, read from WriteOptions::format_options
// (OpenOptions::format_options) under "<format>.<name>" (WriteOption() gives a writer's
// value or this default). The CLI's flags
// (--<format>-<name>, '_' as '-') and Python's keyword arguments (<format>_<name>) are
// made from these tables (FormatOptions()), so a new format's options need no edit
// outside its folder.
struct OptionSpec {
  const char* name;                  // "layout" (key "lmdb.layout")
  const char* default_value;         // as text
  std::vector<std::string> choices;  // the allowed values; empty: the format checks the text
  const char* help;                  // one line for --help
};

// Bids score content first ("bits verified", as libarchive's bids do):
//   100  the content is verified (a tar header's magic and checksum, LMDB's
//        meta page, the HDF5 signature, a manifest naming the format)
//   50..95  the name or the layout says so but the content was not verified
//   0    not this format
// The registry takes the highest bid; a tie goes to the earlier row.
struct Format {
  const char* name;         // the scheme: "folder", "wds", "lmdb", "hdf5"
  const char* description;  // one line for `--help`
  // How sure (0..100) that a path without a scheme is of this format, for reading.
  int (*bid_read)(const std::string& path);
  // How sure (0..100) that a path without a scheme names an output of this format.
  int (*bid_write)(const std::string& path);
  Result<std::unique_ptr<Dataset>> (*open)(const std::string& path, const OpenOptions& opts);
  Result<std::unique_ptr<SampleWriter>> (*create)(const std::string& path, const WriteOptions& opts);
  // File name extensions this format reads or writes (lower case, no dot), so
  // that another format does not take such a name for its own output.
  std::vector<std::string> extensions = {};
  // Address prefixes other than its name that this format reads ("pipe" for
  // `pipe:CMD`): not an unknown scheme.
  std::vector<std::string> prefixes = {};
  // Its writer cuts the output into shards and follows a shard plan
  // (WriteOptions::shard_plan): what `Shard()` writes.
  bool writes_shards = false;
  // Its output is a set of shard files (ConvertSummary::destination_shards: the summary
  // counts them), whether or not it follows a shard plan.
  bool output_is_shards = false;
  // Its writer continues an interrupted write (WriteOptions::resume) from what it
  // committed; an interrupted write of the others is started over by --resume.
  bool resumes = false;
  // Its writer records an order for decoded arrays it is not told the order of (HDF5's
  // channel_order attribute, the LMDB pickle layout's "channels": RGB): a conversion from
  // a source that records none refuses colour arrays rather than have one invented.
  bool records_assumed_channel_order = false;
  // Optional (null: the dataset is one unit): the shards of an address (see
  // ShardListing). Errors: the address names no dataset of this format at all; a file
  // the metadata names lies outside the dataset (Detail::kOutsideDataset, unless
  // opts.trust_manifest).
  Result<ShardListing> (*list_shards)(const std::string& path, const OpenOptions& opts) = nullptr;
  // Optional: where each sample of one shard starts, for pointing at bytes.
  Result<std::vector<SampleExtent>> (*locate_samples)(const std::string& shard_path, int64_t shard) = nullptr;
  // Optional: scans one file of this format and writes the index the format
  // itself defines (recordio: FILE.idx beside FILE.rec) at `output` (empty: its
  // default place, returned in *written). Returns the number of records indexed.
  Result<uint64_t> (*write_index)(const std::string& path, const std::string& output, std::string* written) = nullptr;
  // Optional: DALI's index of one file of this format (`shardkit index --format dali`,
  // WriteDaliIndex()) when it is not the tar shards' one: its default path beside the
  // file, and the writer (to `output`, or the default when empty; returns the records).
  std::string (*dali_index_path)(const std::string& path) = nullptr;
  Result<uint64_t> (*write_dali_index)(const std::string& path, const std::string& output) = nullptr;
  // Optional, for a writer that writes shards and can be split into parts
  // (WriteOptions::part; `--part I/N`): the sample counts of the shards a write with
  // these options cuts `n` samples into by size, from the samples in write order
  // (`get(i, &s)`), the same for every part.
  Result<std::vector<uint64_t>> (*plan_by_size)(const WriteOptions& opts, uint64_t n,
                                                const std::function<Status(uint64_t, Sample*)>& get,
                                                int threads) = nullptr;
  // Optional: whether the write `opts` describes (the whole output, or one part)
  // already finished, checked (`--resume` on a finished output); nullopt: not finished.
  Result<std::optional<WriteSummary>> (*finished)(const std::string& path, const WriteOptions& opts) = nullptr;
  // Optional: `shardkit merge` of the parts written to this address (Merge()).
  Result<MergeSummary> (*merge)(const std::string& path, const MergeOptions& opts) = nullptr;
  // Optional, for writers of shard patterns (out/x-%05d.ext): the files written beside
  // one shard (its index, checksum list, sidecar). After a whole write with overwrite,
  // the shards of the same pattern that the new output does not hold are removed with
  // these (pipeline RemoveStaleOutputs), so that no glob of the pattern finds them.
  std::vector<std::string> (*files_beside_shard)(const std::string& shard_path) = nullptr;
  // Optional: which of `names` (base names in the pattern's directory) are records of
  // partial writes of `pattern` (wds: the part records, their journals and locks); a
  // finished whole write with overwrite removes them too.
  std::vector<std::string> (*part_files)(const std::string& pattern, const std::vector<std::string>& names) = nullptr;
  // The shard size a write with WriteOptions::shard_size 0 gets (ApplyFormatDefaults).
  uint64_t default_shard_size = 1ull << 30;
  // Its writer's options (OptionSpec).
  std::vector<OptionSpec> write_options = {};
  // Its reader's options, read from OpenOptions::format_options (the CLI's
  // --source-option KEY=VALUE, Python's source_options=); checked by Open().
  std::vector<OptionSpec> read_options = {};
};

// `opts` with what it leaves to the format filled in from `f` (shard_size 0: the
// format's default), so that journals, part plans and writers see one figure.
WriteOptions ApplyFormatDefaults(const Format& f, WriteOptions opts);
// kInvalidArgument naming the key for an option of `f` that its table does not declare or
// a value outside its choices; other formats' keys are ignored (one map serves any output).
Status CheckWriteOptions(const Format& f, const WriteOptions& opts);
// The same for OpenOptions::format_options against f.read_options (keys of other
// formats are left alone: the environment's options reach every open).
Status CheckReadOptions(const Format& f, const OpenOptions& opts);
// A writer option's value: opts.format_options[key], else the default of the declared
// option `key` ("<format>.<name>").
std::string WriteOption(const WriteOptions& opts, std::string_view key);
// A list option's value split at commas (empty items dropped; "none" is no item).
std::vector<std::string> WriteOptionList(const WriteOptions& opts, std::string_view key);

// Every format, in registry order (the built-in ones, then those Register()ed).
const std::deque<Format>& All();
// Adds a format after the built-in ones (a test's toy format, an embedder's own). Call it
// before anything reads the registry; not thread-safe with readers. kAlreadyExists for a
// name that is taken.
Status Register(Format f);
// The format of that registry name, or null.
const Format* Find(std::string_view name);
// The first format whose writer writes shards (Format::writes_shards), or null.
const Format* ShardWriter();
// Whether a format other than `except` claims this file name extension (lower
// case, no dot; Format::extensions).
bool ClaimedByAnother(std::string_view ext, const Format& except);

// Each format file defines one of these.
Format FolderFormat();
Format WdsFormat();
Format LmdbFormat();
Format Hdf5Format();
Format MdsFormat();
Format RecordioFormat();
Format TfrecordFormat();

// Splits "scheme:rest" when scheme is a registered name; otherwise {"", address}.
std::pair<std::string, std::string> SplitScheme(std::string_view address);

// kInvalidArgument when the address starts with what reads as a scheme (2+
// letters and digits, then ':') that is neither a format's name nor one of
// their prefixes: `parquet:x`, `wsd:x`. `./odd:name`, `/a:b`, `c:x` pass.
Status CheckScheme(std::string_view address);

// The format an address resolves to (its scheme, else the highest bid) and the
// path without the scheme. kInvalidArgument for an empty address, an unknown
// scheme (`parquet:x`; `./odd:name` is a path) and an address no format bids on.
Result<const Format*> Resolve(std::string_view address, bool for_write, std::string* path);

}  // namespace shardkit::formats
