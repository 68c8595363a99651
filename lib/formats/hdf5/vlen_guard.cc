// formats/hdf5/vlen_guard.cc: the guarded vlen conversion (vlen_guard.h).
#include "formats/hdf5/vlen_guard.h"

#include <exception>

namespace shardkit::formats::hdf5 {

VlenCheck*& ActiveVlenCheck() {
  static VlenCheck* v = nullptr;
  return v;
}

uint64_t Le(const uint8_t* p, size_t n) {
  uint64_t v = 0;
  for (size_t i = n; i-- > 0;) v = (v << 8) | p[i];
  return v;
}

namespace {

H5T_conv_t& LibraryVlenConv() {
  static H5T_conv_t f = nullptr;
  return f;
}

herr_t GuardedVlenConv(hid_t src, hid_t dst, H5T_cdata_t* cdata, size_t nelmts, size_t buf_stride,
                       size_t bkg_stride, void* buf, void* bkg, hid_t dxpl) {
  VlenCheck* check = ActiveVlenCheck();
  if (check && cdata->command == H5T_CONV_CONV && nelmts > 0 && buf) {
    size_t elem = H5Tget_size(src);
    // The base type comes from the file, for strings too (normally 1-byte
    // characters): libhdf5 sizes its buffer as length x base size.
    hid_t super = H5Tget_super(src);
    size_t base_size = super >= 0 ? H5Tget_size(super) : 0;
    if (super >= 0) H5Tclose(super);
    bool is_string = H5Tget_class(src) == H5T_STRING;
    bool ok = false;
    try {  // called from C: nothing may be thrown through libhdf5
      check->what = is_string ? "a variable-length string" : "a variable-length sequence";
      ok = base_size > 0 && check->Check(static_cast<const uint8_t*>(buf), nelmts, buf_stride ? buf_stride : elem,
                                         elem, base_size);
    } catch (const std::exception& e) {
      check->refusal = std::string("cannot check it: ") + e.what();
    }
    if (!ok) {
      if (check->refusal.empty()) check->refusal = "cannot size its base type";
      H5Epush2(H5E_DEFAULT, __FILE__, __func__, __LINE__, H5E_ERR_CLS, H5E_DATATYPE, H5E_BADVALUE, "%s",
               check->refusal.c_str());
      return -1;
    }
  }
  // libhdf5 1.10.8's own conversion functions take no trailing transfer
  // property list (H5Tfind hands them out as H5T_conv_t all the same); the
  // extra last argument lies on the stack, where the callee never looks and
  // the caller removes it (x86-64 and AArch64 calling conventions).
  return LibraryVlenConv()(src, dst, cdata, nelmts, buf_stride, bkg_stride, buf, bkg, dxpl);
}

}  // namespace

Status InstallVlenGuard(const std::string& path) {
  static bool installed = false;
  if (installed) return Status::OK();
  // The call through H5Tfind's pointer relies on the internal signature of libhdf5 1.10
  // (where it is tested and fuzzed). Elsewhere (1.12 and 1.14 changed the internals)
  // the guard is not installed: files read as before, without the bound on elements.
  unsigned maj = 0, min = 0, rel = 0;
  if (H5get_libversion(&maj, &min, &rel) < 0 || maj != 1 || min != 10) {
    installed = true;
    return Status::OK();
  }
  Hid a(H5Tvlen_create(H5T_NATIVE_UINT8), H5Tclose), b(H5Tvlen_create(H5T_NATIVE_UINT16), H5Tclose);
  H5T_cdata_t* cdata = nullptr;
  H5T_conv_t lib = a.ok() && b.ok() ? H5Tfind(a.get(), b.get(), &cdata) : nullptr;
  if (!lib)
    return Status::Internal("cannot find libhdf5's variable-length conversion: " + H5Message(),
                            Location{.file = path});
  LibraryVlenConv() = lib;  // before registering: H5Tregister initialises existing paths through it
  if (H5Tregister(H5T_PERS_SOFT, "shardkit_vlen_guard", a.get(), a.get(), GuardedVlenConv) < 0)
    return Status::Internal("cannot install the check on variable-length elements: " + H5Message(),
                            Location{.file = path});
  installed = true;
  return Status::OK();
}

}  // namespace shardkit::formats::hdf5
