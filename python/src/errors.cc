// shardkit.Error: a RuntimeError carrying the library's code, message and location.
#include "common.h"

namespace shardkit::python {
namespace {

PyObject* g_error_type = nullptr;  // owned by the module for the process's life

py::object OptStr(const std::string& s) { return s.empty() ? py::none() : py::object(py::str(s)); }
py::object OptInt(int64_t v) { return v < 0 ? py::none() : py::object(py::int_(v)); }

}  // namespace

const char* CodeId(Code c) {
  switch (c) {
    case Code::kOk: return "ok";
    case Code::kInvalidArgument: return "invalid_argument";
    case Code::kNotFound: return "not_found";
    case Code::kAlreadyExists: return "already_exists";
    case Code::kIOError: return "io_error";
    case Code::kCorrupt: return "corrupt";
    case Code::kUnsupported: return "unsupported";
    case Code::kCancelled: return "cancelled";
    case Code::kInternal: return "internal";
  }
  return "unknown";
}

py::object MakeError(const Status& s) {
  py::object type = py::reinterpret_borrow<py::object>(g_error_type);
  std::string text = s.ToString();
  // The library says what is wrong; Python says which argument changes it.
  if (s.detail() == Detail::kOutputExists) text += " (pass overwrite=True to replace it)";
  py::object e = type(text);
  const Location& w = s.where();
  e.attr("code") = CodeId(s.code());
  e.attr("message") = s.message();
  e.attr("file") = OptStr(w.file);
  e.attr("shard") = OptInt(w.shard);
  e.attr("offset") = OptInt(w.offset);
  e.attr("key") = OptStr(w.key);
  e.attr("index") = OptInt(w.index);
  return e;
}

void BindErrors(py::module_& m) {
  g_error_type = PyErr_NewExceptionWithDoc(
      "shardkit.Error",
      "An error from the shardkit library. str(e) is the full message with its location.\n\n"
      "Attributes: code (\"invalid_argument\", \"not_found\", \"already_exists\", \"io_error\",\n"
      "\"corrupt\", \"unsupported\", \"cancelled\", \"internal\"), message (without the\n"
      "location), and the location: file, shard, offset, key, index (None when unknown).",
      PyExc_RuntimeError, nullptr);
  if (!g_error_type) throw py::error_already_set();
  m.add_object("Error", py::reinterpret_borrow<py::object>(g_error_type));
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const StatusError& e) {
      py::object exc = MakeError(e.status());
      PyErr_SetObject(g_error_type, exc.ptr());
    }
  });
}

}  // namespace shardkit::python
