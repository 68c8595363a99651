#include "shardkit/status.h"

#include <cstring>

#include <fmt/format.h>

#include "core/redact.h"

namespace shardkit {

const char* CodeName(Code c) {
  switch (c) {
    case Code::kOk: return "ok";
    case Code::kInvalidArgument: return "invalid argument";
    case Code::kNotFound: return "not found";
    case Code::kAlreadyExists: return "already exists";
    case Code::kIOError: return "I/O error";
    case Code::kCorrupt: return "corrupt";
    case Code::kUnsupported: return "unsupported";
    case Code::kCancelled: return "cancelled";
    case Code::kInternal: return "internal error";
  }
  return "unknown";
}

std::string Location::ToString() const {
  std::string out;
  auto add = [&](std::string part) {
    if (!out.empty()) out += ", ";
    out += part;
  };
  if (!file.empty()) add(fmt::format("file '{}'", file));
  if (shard >= 0) add(fmt::format("shard {}", shard));
  if (offset >= 0) add(fmt::format("offset {}", offset));
  if (index >= 0) add(fmt::format("sample {}", index));
  if (!key.empty()) add(fmt::format("key '{}'", key));
  return out;
}

Status::Status(Code code, std::string message, Location where)
    : code_(code), message_(std::move(message)), where_(std::move(where)) {
  io::RedactInPlace(&message_);
  io::RedactInPlace(&where_.file);
}

Status Status::FromErrno(int err, std::string what, Location w) {
  return Status(Code::kIOError, fmt::format("{}: {}", what, std::strerror(err)), std::move(w));
}

Status& Status::At(const Location& o) {
  if (where_.file.empty()) {
    where_.file = o.file;
    io::RedactInPlace(&where_.file);
  }
  if (where_.shard < 0) where_.shard = o.shard;
  if (where_.offset < 0) where_.offset = o.offset;
  if (where_.index < 0) where_.index = o.index;
  if (where_.key.empty()) where_.key = o.key;
  return *this;
}

std::string Status::ToString() const {
  if (ok()) return "ok";
  // where() is writable: redacted again here, the one way a Status is shown.
  if (where_.empty()) return io::RedactText(fmt::format("{}: {}", CodeName(code_), message_));
  return io::RedactText(fmt::format("{}: {}: {}", CodeName(code_), where_.ToString(), message_));
}

}  // namespace shardkit
