// Internal: the checks a resumable writer (wds, lmdb) makes when it continues an
// interrupted write from its journal. One copy, so both formats refuse alike.
//
// Thread safety: plain functions.
#pragma once

#include <cstdint>

#include <nlohmann/json.hpp>

#include "shardkit/status.h"

namespace shardkit::resume {

// `recorded` is the journal's "options" object, `want` this write's: kInvalidArgument
// naming the first option whose value differs (or is missing), at `where`.
Status CheckSameOptions(const nlohmann::json& recorded, const nlohmann::json& want, const Location& where);

// Finish() of a resumed write whose source yielded `seen` samples, fewer than the
// `committed` ones the interrupted write had: kInvalidArgument at `where`.
Status SourceEndedEarly(uint64_t seen, uint64_t committed, const Location& where);

}  // namespace shardkit::resume
