// Internal: checked reads of members of JSON files a dataset carries. nlohmann's
// get<uint64_t>() converts a float by a cast (undefined behaviour when it is out of
// range: fuzz_manifest found 2e88) and a negative integer by wrapping, and value(key,
// std::string()) throws when the member is there but not a string (fuzz_manifest: a
// "format" of 1 ended the process). A count must be a non-negative integer.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace shardkit::json_count {

// j (an unsigned integer) as uint64_t; throws nlohmann::json::other_error naming `what`
// otherwise (the readers report it as a malformed file).
inline uint64_t Get(const nlohmann::json& j, const char* what) {
  if (!j.is_number_unsigned() && !(j.is_number_integer() && j.get<int64_t>() >= 0))
    throw nlohmann::json::other_error::create(
        501, std::string(what) + " is not a count (a non-negative integer): " + j.dump().substr(0, 40), &j);
  return j.get<uint64_t>();
}

// Whether the object j has a string member `key` equal to `want` (never throws).
inline bool MemberIs(const nlohmann::json& j, const char* key, std::string_view want) {
  if (!j.is_object()) return false;
  auto it = j.find(key);
  return it != j.end() && it->is_string() && it->get_ref<const std::string&>() == want;
}

// j[key] as a count, or `fallback` when j has no such member.
inline uint64_t Value(const nlohmann::json& j, const char* key, uint64_t fallback) {
  auto it = j.find(key);
  return it == j.end() ? fallback : Get(*it, key);
}

}  // namespace shardkit::json_count
