#include "formats/array_sample.h"

#include <string>

#include <fmt/format.h>

namespace shardkit::formats {

Result<ArraySample> ParseArraySample(const Sample& s, const Location& at, std::string_view layout,
                                     std::string_view instead) {
  ArraySample out;
  const Field* npy = nullptr;
  for (const auto& f : s.fields) {
    if (f.ext == "npy") {
      npy = &f;
    } else if (f.ext == "cls") {
      out.label = s.label();
      if (!out.label || std::to_string(*out.label) != f.data.view())
        return Status::Invalid(
            fmt::format("sample '{}': cls '{}' is not a canonical integer label ({})", s.key, f.data.str(), instead), at);
    } else {
      return Status::Invalid(fmt::format("sample '{}': {} holds one decoded array and its label, not field '{}' ({})",
                                         s.key, layout, f.ext, instead),
                             at);
    }
  }
  if (!npy)
    return Status::Invalid(fmt::format("sample '{}' has no decoded array (npy field), which every sample of {} holds ({})",
                                       s.key, layout, instead),
                           at);
  auto arr = pickle::ParseNpy(npy->data);
  if (!arr.ok()) return Status::Invalid(fmt::format("sample '{}': field npy: {}", s.key, arr.status().message()), at);
  out.arr = std::move(arr).value();
  return out;
}

}  // namespace shardkit::formats
