// shardkit/status.h: errors as values.
//
// Every fallible call in shardkit returns a Status or a Result<T>. No exception
// crosses the library's API. A failed Status carries a Code, a message and a
// Location (file, shard, byte offset, key) so that a tool can name the culprit.
//
// Thread safety: Status and Result are plain values; distinct objects may be
// used from distinct threads, a shared one only for reading.
#pragma once

#include <cassert>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>

#include "shardkit/export.h"

namespace shardkit {

enum class Code : int {
  kOk = 0,
  kInvalidArgument,  // the caller asked for something malformed (bad address, flag)
  kNotFound,         // file, dataset or key does not exist
  kAlreadyExists,    // output exists and overwrite was not asked for
  kIOError,          // the OS failed a read, write, fsync, rename
  kCorrupt,          // the data is damaged or not of the expected format
  kUnsupported,      // valid request that this format or build cannot serve
  kCancelled,        // the operation was stopped (loader destroyed, signal)
  kInternal,         // a bug in shardkit
};

SHARDKIT_API const char* CodeName(Code c);

// A finer, typed kind of failure where callers must tell kinds apart (verify
// counts a sample-checksum failure apart from a structure failure). Callers never
// parse messages: they read Status::detail(). kNone for most statuses.
enum class Detail : int {
  kNone = 0,
  kSampleChecksum,  // kCorrupt: a sample's bytes do not match the checksum recorded for it
  kOutputExists,    // kAlreadyExists: the output is there and overwrite was not asked for;
                    // WriteOptions::overwrite would replace it (the CLI says "--overwrite")
  kShardChecksum,   // kCorrupt: a whole file's size or hash differs from what the dataset's metadata
                    // records for it (MDS: index.json's bytes and hashes of a shard file)
  kRecordFraming,   // kCorrupt: a record's framing is broken (a bad magic number, a length past the
                    // end of the file, a continuation that never ends or runs out of order)
  kIndexEntry,      // kCorrupt: an index entry points outside its data file or not at a record start
  kOutsideDataset,  // kInvalidArgument: a dataset description (manifest, index.json) names a file
                    // outside the dataset's own location (docs/reliability.md, "Confinement");
                    // OpenOptions::trust_manifest allows it
  kAccessDenied,    // kIOError: a store answered 401 or 403 (credentials or permissions refused)
  kUnknownScheme,   // kInvalidArgument: an address's "scheme:" is none shardkit knows (the CLI
                    // treats it as a usage error: exit 2)
};

// Where a problem is. Unset members are empty / -1 and are not printed.
struct SHARDKIT_API Location {
  std::string file;     // file or directory path
  int64_t shard = -1;   // shard index within a dataset
  int64_t offset = -1;  // byte offset within `file`
  std::string key;      // sample key
  int64_t index = -1;   // sample index within the dataset

  bool empty() const { return file.empty() && shard < 0 && offset < 0 && key.empty() && index < 0; }
  // "file 'x.tar', shard 3, offset 1024, key 'n01/a'"
  std::string ToString() const;
};

class [[nodiscard]] SHARDKIT_API Status {
 public:
  Status() = default;  // OK
  // An address in the message or the location is shown without its secrets
  // (userinfo, query credentials: issue 14).
  Status(Code code, std::string message, Location where = {});

  static Status OK() { return Status(); }
  static Status Invalid(std::string m, Location w = {}) { return {Code::kInvalidArgument, std::move(m), std::move(w)}; }
  static Status NotFound(std::string m, Location w = {}) { return {Code::kNotFound, std::move(m), std::move(w)}; }
  static Status Exists(std::string m, Location w = {}) { return {Code::kAlreadyExists, std::move(m), std::move(w)}; }
  static Status IOError(std::string m, Location w = {}) { return {Code::kIOError, std::move(m), std::move(w)}; }
  static Status Corrupt(std::string m, Location w = {}) { return {Code::kCorrupt, std::move(m), std::move(w)}; }
  static Status Unsupported(std::string m, Location w = {}) { return {Code::kUnsupported, std::move(m), std::move(w)}; }
  static Status Cancelled(std::string m, Location w = {}) { return {Code::kCancelled, std::move(m), std::move(w)}; }
  static Status Internal(std::string m, Location w = {}) { return {Code::kInternal, std::move(m), std::move(w)}; }
  // An IOError from errno: "<what>: <strerror(err)>".
  static Status FromErrno(int err, std::string what, Location w = {});

  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  const std::string& message() const { return message_; }
  const Location& where() const { return where_; }
  Location& where() { return where_; }
  Detail detail() const { return detail_; }
  // Sets the typed detail; returns *this for chaining.
  Status& With(Detail d) {
    detail_ = d;
    return *this;
  }

  // Fills location members that are still unset; returns *this for chaining.
  Status& At(const Location& outer);
  // "corrupt: file 'a.tar', offset 512: truncated member"
  std::string ToString() const;

 private:
  Code code_ = Code::kOk;
  std::string message_;
  Location where_;
  Detail detail_ = Detail::kNone;
};

// A value or a failed Status. Move-only when T is.
template <class T>
class [[nodiscard]] Result {
 public:
  Result(Status s) : v_(std::move(s)) { assert(!std::get<1>(v_).ok() && "Result from an OK Status"); }
  template <class U = T,
            std::enable_if_t<std::is_constructible_v<T, U&&> &&
                                 !std::is_same_v<std::decay_t<U>, Status> &&
                                 !std::is_same_v<std::decay_t<U>, Result>,
                             int> = 0>
  Result(U&& v) : v_(std::in_place_index<0>, std::forward<U>(v)) {}

  bool ok() const { return v_.index() == 0; }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<1>(v_);
  }
  Status take_status() && { return ok() ? Status() : std::move(std::get<1>(v_)); }

  T& value() & { assert(ok()); return std::get<0>(v_); }
  const T& value() const& { assert(ok()); return std::get<0>(v_); }
  T&& value() && { assert(ok()); return std::get<0>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace shardkit

#define SK_CONCAT_INNER_(a, b) a##b
#define SK_CONCAT_(a, b) SK_CONCAT_INNER_(a, b)

// Returns the Status from the enclosing function if `expr` (a Status) failed.
#define SK_RETURN_IF_ERROR(expr)                  \
  do {                                            \
    ::shardkit::Status sk_st_ = (expr);           \
    if (!sk_st_.ok()) return sk_st_;              \
  } while (0)

// `lhs = value of expr` (a Result<T>), or returns its Status on failure.
#define SK_ASSIGN_OR_RETURN(lhs, expr) SK_ASSIGN_OR_RETURN_IMPL_(SK_CONCAT_(sk_res_, __LINE__), lhs, expr)
#define SK_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  if (!tmp.ok()) return std::move(tmp).take_status(); \
  lhs = std::move(tmp).value()
