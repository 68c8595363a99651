#include "core/resume.h"

#include <fmt/format.h>

namespace shardkit::resume {

Status CheckSameOptions(const nlohmann::json& recorded, const nlohmann::json& want, const Location& where) {
  for (const auto& [k, v] : want.items())
    if (!recorded.is_object() || !recorded.contains(k) || recorded[k] != v)
      return Status::Invalid(fmt::format("cannot resume: the interrupted write used {} = {}, this one {} = {}; "
                                         "resume with the same options, or start over with --overwrite",
                                         k, recorded.is_object() ? recorded.value(k, nlohmann::json()).dump() : "null",
                                         k, v.dump()),
                             where);
  return Status::OK();
}

Status SourceEndedEarly(uint64_t seen, uint64_t committed, const Location& where) {
  return Status::Invalid(fmt::format("the source ended after {} samples, but the interrupted write this one "
                                     "resumes had committed {}: resume needs the same source, in the same "
                                     "order, with the same options",
                                     seen, committed),
                         where);
}

}  // namespace shardkit::resume
