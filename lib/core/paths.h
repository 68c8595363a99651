// Internal: address and key helpers shared by the formats.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <xxhash.h>

#include "shardkit/status.h"

namespace shardkit::paths {

// Expands "a-{000..003}.tar" (zero-padded to the width of the first bound) and
// "x.tar::y.tar" lists. A string without braces expands to itself.
Result<std::vector<std::string>> ExpandBraces(std::string_view pattern);

// Checks that `pattern` holds exactly one integer conversion (%d, %06d, %u, ...)
// and no other '%' except "%%".
Status CheckShardPattern(std::string_view pattern);
// The pattern with its conversion applied to `index`.
std::string FormatShardPattern(std::string_view pattern, uint64_t index);
// The number in `name` (a base name) where `pattern`'s base name has its conversion:
// the digits after the pattern's literal prefix, or nullopt when `name` does not start
// with that prefix and a digit. The caller compares `name` with the files of shard N.
std::optional<uint64_t> ShardNumberIn(std::string_view pattern, std::string_view name);

// A relative key safe to use as a path below an output directory: non-empty,
// not absolute, no "." or ".." components, no empty components, no NUL.
Status CheckSafeKey(std::string_view key);

// Confinement (docs/reliability.md): every file a dataset description (a manifest,
// an index.json) names resolves inside the description's own location.
//   local:     under the description's directory, symbolic links resolved;
//   http(s)://: same scheme, host and port, under the description's path prefix;
//   s3://:     same bucket, under the description's key prefix.
// Refused: an empty entry, absolute paths, '..' that climbs out, a scheme
// ("file://", "http://", another host or bucket), `pipe:` commands, brace ranges and
// "::" lists that do not name exactly one file, NUL; for remote descriptions also
// '%', '?', '#' and '\' (a server would decode or split them). With `trust` (OpenOptions::
// trust_manifest) an entry is taken as written: absolute, or relative to the directory,
// '..' allowed; never a command. Immutable after construction: safe to share.
class Confinement {
 public:
  // offer_trust: whether the error points at --trust-manifest (false where a format
  // never trusts its description, as MDS's index.json).
  Confinement(std::string description, bool trust, bool offer_trust = true);
  // The address of `entry`, recorded at `what` in the description ("shards[3].path"),
  // or kInvalidArgument with Detail::kOutsideDataset naming the description, `what`,
  // the entry and the rule.
  Result<std::string> Resolve(std::string_view entry, std::string_view what) const;
  // The directory (or URL prefix, without a trailing '/') entries are resolved in.
  const std::string& dir() const { return dir_; }

 private:
  Result<std::string> Resolve(std::string_view entry, std::string_view what, std::string_view whole) const;
  Status Refuse(std::string_view entry, std::string_view what, std::string_view rule) const;
  std::string description_;
  std::string dir_;
  std::string real_dir_;  // local: dir_ with symbolic links resolved (empty if it does not resolve)
  bool remote_ = false;
  bool trust_ = false;
  bool offer_trust_ = true;
};

// The last path component of a key.
std::string_view BaseName(std::string_view key);

// "xxh3:0123456789abcdef"
std::string ChecksumString(uint64_t h);
// The inverse: nullopt unless `s` is "xxh3:" and 16 hex digits.
std::optional<uint64_t> ParseChecksumString(std::string_view s);
// XXH3-64 of a whole file, streamed.
Result<uint64_t> HashFile(const std::string& path);
uint64_t Hash(const void* data, size_t size);
// The resume journals' running digest of committed samples: each sample's checksum,
// key length and key fed to an XXH3 state (wds per shard, LMDB per environment).
void AddSampleToDigest(XXH3_state_t* st, std::string_view key, uint64_t sample_sum);

// Lowercases ASCII.
std::string Lower(std::string_view s);

// Helpers the formats share (one copy each).
// Whether s ends with suffix (case-sensitive).
bool EndsWith(std::string_view s, std::string_view suffix);
// Whether path is longer than one of exts (".h5") and ends with it, ignoring ASCII case.
bool HasExtension(std::string_view path, std::initializer_list<std::string_view> exts);
// The path without trailing slashes; "/" stays "/".
std::string StripTrailingSlashes(std::string p);
// `path` relative to the directory `base` (both made absolute against the working
// directory first; no link is resolved), or `path` itself when there is no such form.
std::string RelativeTo(const std::string& path, const std::string& base);
// Whether s is well-formed UTF-8 by its lead and continuation bytes (1 to 4 bytes).
bool IsValidUtf8(std::string_view s);
// An image's type from its magic number: "jpg", "png", "gif", "webp", "avif", "jxl", "bmp",
// else "bin". WebP: "RIFF" <size> "WEBP"; AVIF: IsAvifFileType; JPEG XL: a bare codestream
// (FF 0A) or the container's signature box (00 00 00 0C "JXL " 0D 0A 87 0A).
std::string SniffImageExt(const uint8_t* p, size_t n);
// Whether the bytes start with an ISO-BMFF 'ftyp' box whose major brand or one of whose
// compatible brands is "avif" (still image) or "avis" (image sequence).
bool IsAvifFileType(const uint8_t* p, size_t n);
// "a=b,c=d" -> {a: b, c: d} (empty items skipped; a later name wins): the field maps of
// the CLI and the TFRecord writer. kInvalidArgument "<what>: 'ITEM' is not <shape>" for
// an item without a name or a value.
Result<std::map<std::string, std::string>> ParsePairs(std::string_view text, std::string_view what,
                                                      std::string_view shape = "NAME=VALUE");

}  // namespace shardkit::paths
