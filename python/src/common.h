// Internal to the Python module: how library Statuses become Python exceptions,
// and the binding functions of each source file.
#pragma once

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <exception>
#include <string>
#include <utility>

#include "shardkit/dataset.h"
#include "shardkit/status.h"

namespace py = pybind11;

namespace shardkit::python {

// Carries a failed Status out of a binding; the translator registered by
// BindErrors() turns it into a shardkit.Error with the Status's location.
class StatusError : public std::exception {
 public:
  explicit StatusError(Status s) : status_(std::move(s)), text_(status_.ToString()) {}
  const Status& status() const { return status_; }
  const char* what() const noexcept override { return text_.c_str(); }

 private:
  Status status_;
  std::string text_;
};

[[noreturn]] inline void Throw(Status s) { throw StatusError(std::move(s)); }
inline void Check(Status s) {
  if (!s.ok()) Throw(std::move(s));
}
template <class T>
T Unwrap(Result<T>&& r) {
  if (!r.ok()) Throw(std::move(r).take_status());
  return std::move(r).value();
}

// A shardkit.Error instance for `s` (not raised). Needs the GIL.
py::object MakeError(const Status& s);
// "invalid_argument", "not_found", ...: the `code` attribute of shardkit.Error.
const char* CodeId(Code c);

// The environment the module honours for compatibility (the library reads none):
// SHARDKIT_CACHE_DIR / SHARDKIT_CACHE_BYTES fill cache_dir / cache_bytes when the
// arguments left them empty, SHARDKIT_INDEX_BUDGET fills
// format_options["wds.index_budget"] unless given; raises (invalid_argument, naming
// the variable) when a size does not parse.
void OptionsFromEnvironment(OpenOptions* o);
// ConvertOptions::staging_dir when the argument is empty: SHARDKIT_STAGING_DIR, else
// TMPDIR, else "" (/tmp).
std::string StagingDirOr(const std::string& given);

py::dict InfoToDict(const DatasetInfo& info);
py::dict ShardToDict(const ShardInfo& s);

void BindErrors(py::module_& m);
void BindDataset(py::module_& m);
void BindConvert(py::module_& m);
void BindLoader(py::module_& m);
void BindVerify(py::module_& m);  // only when the library has shardkit/verify.h

}  // namespace shardkit::python
