// shardkit.verify(): the library's integrity check (shardkit/verify.h), run with the
// GIL released. Compiled only when the library has verify.h (python/CMakeLists.txt).
#include <map>
#include <optional>
#include <string>

#include "common.h"
#include "shardkit/verify.h"

namespace shardkit::python {
namespace {

py::object OptStr(const std::string& s) { return s.empty() ? py::none() : py::object(py::str(s)); }
py::object OptInt(int64_t v) { return v < 0 ? py::none() : py::object(py::int_(v)); }

py::dict ReportToDict(const VerifyReport& r) {
  py::dict d;
  d["ok"] = r.ok();
  d["address"] = r.address;
  d["format"] = r.format;
  d["samples"] = r.samples;
  d["bytes"] = r.bytes;
  d["shards"] = r.shards;
  d["source_samples"] = r.source_samples;
  d["sample_checksums"] = r.sample_checksums;
  d["shard_checksums"] = r.shard_checksums;
  d["images_decoded"] = r.images_decoded;
  d["seconds"] = r.seconds;
  py::list findings;
  for (const Finding& f : r.findings) {
    py::dict x;
    x["kind"] = FindingKindName(f.kind);
    x["message"] = f.message;
    x["file"] = OptStr(f.where.file);
    x["shard"] = OptInt(f.where.shard);
    x["offset"] = OptInt(f.where.offset);
    x["key"] = OptStr(f.where.key);
    x["index"] = OptInt(f.where.index);
    findings.append(x);
  }
  d["findings"] = findings;
  py::dict counts;
  for (int k = 0; k < kNumFindingKinds; ++k) counts[FindingKindName(FindingKind(k))] = r.counts[size_t(k)];
  d["counts"] = counts;
  d["total_findings"] = r.total_findings();
  d["notes"] = r.notes;
  py::list dups;
  for (const auto& [k, o] : r.duplicate_images) {
    py::dict e;
    e["key"] = k;
    e["duplicate_of"] = o;
    dups.append(e);
  }
  d["duplicate_images"] = dups;
  return d;
}

}  // namespace

void BindVerify(py::module_& m) {
  m.attr("HAVE_VERIFY") = true;
  m.def("verify",
        [](const std::string& address, const std::optional<std::string>& against, bool decode, int threads,
           uint64_t max_findings, const std::map<std::string, std::string>& field_map,
           const py::object& progress, bool trust_manifest, uint64_t max_pixels, bool duplicates) {
          VerifyOptions o;
          o.against = against.value_or("");
          o.decode = decode;
          o.duplicates = duplicates;
          o.threads = threads;
          if (max_pixels == 0) throw py::value_error("max_pixels must be positive");
          o.max_pixels = max_pixels;
          o.max_findings = max_findings;
          o.open.field_map = field_map;
          o.open.trust_manifest = o.against_open.trust_manifest = trust_manifest;
          OptionsFromEnvironment(&o.open);
          OptionsFromEnvironment(&o.against_open);
          std::optional<py::error_already_set> callback_error;
          if (!progress.is_none()) {
            o.progress = [&](const VerifyProgress& p) {
              py::gil_scoped_acquire gil;
              if (callback_error) return;
              try {
                py::dict d;
                d["phase"] = p.phase;
                d["samples"] = p.samples;
                d["bytes"] = p.bytes;
                d["total"] = p.total ? py::object(py::int_(*p.total)) : py::object(py::none());
                d["elapsed"] = p.elapsed;
                progress(d);
              } catch (py::error_already_set& e) {
                callback_error.emplace(std::move(e));
              }
            };
          }
          Result<VerifyReport> r = Status::Internal("unset");
          {
            py::gil_scoped_release nogil;
            r = Verify(address, o);
          }
          if (callback_error) throw std::move(*callback_error);
          return ReportToDict(Unwrap(std::move(r)));
        },
        py::arg("address"), py::kw_only(), py::arg("against") = py::none(), py::arg("decode") = false,
        py::arg("threads") = 0, py::arg("max_findings") = 0,
        py::arg("field_map") = std::map<std::string, std::string>{}, py::arg("progress") = py::none(),
        py::arg("trust_manifest") = false, py::arg("max_pixels") = VerifyOptions{}.max_pixels,
        py::arg("duplicates") = false,
        R"doc(Reads the whole dataset at `address` and reports what is wrong with it.

Returns a dict: ok (True only with no finding), findings [{kind, message, file, shard,
offset, key, index}] in the order found (at most max_findings; 0 = all), counts by kind,
total_findings, samples, bytes, shards, notes, ... Damage is reported as findings, not
raised; shardkit.Error is raised only when the check cannot run (no such dataset, bad
address, unreadable `against`). against: a source dataset to compare with, sample by
sample by key. decode: decode every image (on `threads` threads, 0 = one per core);
an image declaring more than max_pixels (width * height, default 200_000_000) is a
decode finding, refused before its pixels are allocated. duplicates: also list, under
duplicate_images [{key, duplicate_of}], the samples whose image bytes repeat an earlier
sample's (what convert(dedup=True) drops); they are not findings.
progress: a callable taking {phase, samples, bytes, total, elapsed}.)doc");
}

}  // namespace shardkit::python
