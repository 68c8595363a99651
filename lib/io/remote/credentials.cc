#include "io/remote/credentials.h"

#include <fstream>

#include <fmt/format.h>

namespace shardkit::remote {
namespace {

std::string Trim(std::string s) {
  size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  size_t e = s.find_last_not_of(" \t\r\n");
  return s.substr(b, e - b + 1);
}

std::string Get(const EnvLookup& env, const char* name) {
  const char* v = env(name);
  return v ? std::string(v) : std::string();
}

}  // namespace

const char* RealEnv(const char* name) { return std::getenv(name); }

Result<AwsCredentials> ReadCredentialsFile(const std::string& path, const std::string& profile) {
  std::ifstream in(path);
  if (!in) return Status::NotFound(fmt::format("AWS credentials file '{}' does not exist", path));
  AwsCredentials c;
  bool found = false, in_profile = false;
  std::string line;
  while (std::getline(in, line)) {
    line = Trim(line);
    if (line.empty() || line[0] == '#' || line[0] == ';') continue;
    if (line.front() == '[' && line.back() == ']') {
      in_profile = Trim(line.substr(1, line.size() - 2)) == profile;
      found = found || in_profile;
      continue;
    }
    if (!in_profile) continue;
    size_t eq = line.find('=');
    if (eq == std::string::npos) continue;
    std::string k = Trim(line.substr(0, eq)), v = Trim(line.substr(eq + 1));
    if (k == "aws_access_key_id") c.access_key_id = v;
    else if (k == "aws_secret_access_key") c.secret_access_key = v;
    else if (k == "aws_session_token") c.session_token = v;
  }
  if (!found) return Status::NotFound(fmt::format("AWS credentials file '{}' has no profile '{}'", path, profile));
  if (c.access_key_id.empty() || c.secret_access_key.empty())
    return Status::Invalid(fmt::format(
        "profile '{}' of AWS credentials file '{}' lacks aws_access_key_id or aws_secret_access_key", profile, path));
  c.source = fmt::format("profile '{}' of {}", profile, path);
  return c;
}

Result<S3Settings> S3SettingsFromEnvironment(const EnvLookup& env) {
  S3Settings s;
  std::string id = Get(env, "AWS_ACCESS_KEY_ID"), secret = Get(env, "AWS_SECRET_ACCESS_KEY");
  if (!id.empty() || !secret.empty()) {
    if (id.empty() || secret.empty())
      return Status::Invalid("AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY must be set together");
    s.credentials.access_key_id = id;
    s.credentials.secret_access_key = secret;
    s.credentials.session_token = Get(env, "AWS_SESSION_TOKEN");
    s.credentials.source = "environment";
  } else {
    std::string profile = Get(env, "AWS_PROFILE");
    bool named = !profile.empty();
    if (!named) profile = "default";
    std::string file = Get(env, "AWS_SHARED_CREDENTIALS_FILE");
    if (file.empty()) {
      std::string home = Get(env, "HOME");
      if (!home.empty()) file = home + "/.aws/credentials";
    }
    if (!file.empty()) {
      auto c = ReadCredentialsFile(file, profile);
      if (c.ok()) {
        s.credentials = std::move(c).value();
      } else if (named || c.status().code() != Code::kNotFound) {
        // AWS_PROFILE names a profile that must exist; a malformed file is an error too.
        return Status(c.status().code(), c.status().message() + " (AWS_PROFILE)");
      }
    }
  }
  s.region = Get(env, "AWS_REGION");
  if (s.region.empty()) s.region = Get(env, "AWS_DEFAULT_REGION");
  if (s.region.empty()) s.region = "us-east-1";
  s.endpoint = Get(env, "AWS_ENDPOINT_URL_S3");
  if (s.endpoint.empty()) s.endpoint = Get(env, "AWS_ENDPOINT_URL");
  if (!s.endpoint.empty()) {
    if (s.endpoint.rfind("http://", 0) != 0 && s.endpoint.rfind("https://", 0) != 0)
      return Status::Invalid(fmt::format("AWS_ENDPOINT_URL '{}' is not an http:// or https:// URL", s.endpoint));
    while (!s.endpoint.empty() && s.endpoint.back() == '/') s.endpoint.pop_back();
    s.path_style = true;
  }
  return s;
}

std::string Redact(std::string text, const AwsCredentials& c) {
  for (const std::string* secret : {&c.secret_access_key, &c.session_token}) {
    if (secret->empty()) continue;
    for (size_t p = text.find(*secret); p != std::string::npos; p = text.find(*secret, p))
      text.replace(p, secret->size(), "<redacted>");
  }
  return text;
}

}  // namespace shardkit::remote
