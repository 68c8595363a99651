// The extension module shardkit._shardkit; the package shardkit (python/shardkit/)
// re-exports it with the Python-side Loader.
#include "common.h"

#include "shardkit/version.h"

PYBIND11_MODULE(_shardkit, m) {
  m.doc() = "shardkit's C++ library: datasets, conversion and the streaming loader";
  m.attr("__version__") = shardkit::Version();
  shardkit::python::BindErrors(m);
  shardkit::python::BindDataset(m);
  shardkit::python::BindConvert(m);
  shardkit::python::BindLoader(m);
#if SHARDKIT_PY_HAVE_VERIFY
  shardkit::python::BindVerify(m);
#else
  m.attr("HAVE_VERIFY") = false;
#endif
}
