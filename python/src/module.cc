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
  // The image codecs beyond JPEG and PNG this build decodes (cmake/ShardkitDeps.cmake).
#ifdef SHARDKIT_HAVE_WEBP
  m.attr("HAVE_WEBP") = true;
#else
  m.attr("HAVE_WEBP") = false;
#endif
#ifdef SHARDKIT_HAVE_AVIF
  m.attr("HAVE_AVIF") = true;
#else
  m.attr("HAVE_AVIF") = false;
#endif
#ifdef SHARDKIT_HAVE_JXL
  m.attr("HAVE_JXL") = true;
#else
  m.attr("HAVE_JXL") = false;
#endif
#if SHARDKIT_PY_HAVE_VERIFY
  shardkit::python::BindVerify(m);
#else
  m.attr("HAVE_VERIFY") = false;
#endif
}
