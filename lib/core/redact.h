// Internal: the one place where an address is made safe to show (issue 14: secrets
// never appear in an error, a log line, `--json`, `info` or a manifest).
//
// An address may carry a secret in two places: userinfo ("http://user:password@host/")
// and a query credential (an S3 presigned URL's X-Amz-Signature, X-Amz-Credential,
// X-Amz-Security-Token; other services' token=, sig=, key=, ...). Everything that
// shows an address goes through these functions: Status (its message and
// Location::file, at construction and in ToString()), the remote client's messages
// (remote::SafeUrl is RedactAddress), and the command's output (tools/: summaries,
// `info`, `verify`, `merge`, `index`, `--json`). Manifests and part records hold
// relative shard names, never addresses.
//
// Thread safety: plain functions.
#pragma once

#include <string>
#include <string_view>

namespace shardkit::io {

// One address as it may be shown: the userinfo ("user:pw@") is removed, and a query
// holding a credential becomes "?<redacted>". Anything else (a local path) is returned unchanged.
std::string RedactAddress(std::string_view address);

// Free text (a message, a line of output, a JSON document) with every
// "scheme://..." address in it redacted as RedactAddress does. An address ends at
// white space, a quote, '<', '>' or '`'. Idempotent.
std::string RedactText(std::string_view text);

// RedactText in place; cheap when the text holds no "://".
void RedactInPlace(std::string* text);

}  // namespace shardkit::io
