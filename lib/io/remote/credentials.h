// Internal: S3 settings the way the AWS tools find them.
//
// Credentials: AWS_ACCESS_KEY_ID + AWS_SECRET_ACCESS_KEY (+ AWS_SESSION_TOKEN), else
// the profile AWS_PROFILE (default "default") of the shared credentials file
// (AWS_SHARED_CREDENTIALS_FILE, default ~/.aws/credentials), else none (requests
// go unsigned, as for a public bucket). Region: AWS_REGION, else AWS_DEFAULT_REGION,
// else us-east-1. Endpoint: AWS_ENDPOINT_URL_S3, else AWS_ENDPOINT_URL, else real
// AWS; an explicit endpoint (an S3-compatible store) is addressed path-style
// (ENDPOINT/BUCKET/KEY), AWS virtual-host style (https://BUCKET.s3.REGION.amazonaws.com/KEY).
//
// Secrets (the secret key and the session token) never appear in a Status, a log
// line or an exception text: every message built from a response goes through
// Redact(), and `source` names where the credentials came from, never what they are.
//
// Thread safety: plain values and pure functions (they read the environment and
// the credentials file, nothing else).
#pragma once

#include <functional>
#include <string>

#include "shardkit/status.h"

namespace shardkit::remote {

struct AwsCredentials {
  std::string access_key_id;
  std::string secret_access_key;
  std::string session_token;  // empty: none
  // Where they came from, for messages: "environment", "profile 'x' of /root/.aws/credentials", "none".
  std::string source = "none";

  bool empty() const { return access_key_id.empty(); }
};

struct S3Settings {
  AwsCredentials credentials;
  std::string region = "us-east-1";
  // "" for AWS itself; else the store's base URL, e.g. "http://127.0.0.1:4568".
  std::string endpoint;
  // Path-style addressing (ENDPOINT/BUCKET/KEY); true whenever endpoint is set.
  bool path_style = false;
};

// getenv, or a stand-in for tests. Returns nullptr for an unset variable.
using EnvLookup = std::function<const char*(const char*)>;
const char* RealEnv(const char* name);

// The settings from the environment (and the credentials file). Fails only on a
// malformed setting: one of the key pair without the other, a missing profile
// that AWS_PROFILE names, an endpoint that is not http(s)://.
Result<S3Settings> S3SettingsFromEnvironment(const EnvLookup& env = RealEnv);

// The profile `profile` of an INI credentials file (aws_access_key_id,
// aws_secret_access_key, aws_session_token). kNotFound when the file or the
// profile is missing; the message names the file and profile, never a value.
Result<AwsCredentials> ReadCredentialsFile(const std::string& path, const std::string& profile);

// `text` with every occurrence of the secret key and the session token replaced
// by "<redacted>".
std::string Redact(std::string text, const AwsCredentials& c);

}  // namespace shardkit::remote
