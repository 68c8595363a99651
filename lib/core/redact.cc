// Addresses made safe to show (redact.h). In core: Status redacts what it holds, and
// nothing in core reaches up to io.
#include "core/redact.h"
#include "shardkit/filesystem.h"  // the public shardkit::RedactAddress below: its SHARDKIT_API export

#include <cctype>

namespace shardkit::io {

namespace {

std::string Lower(std::string_view s) {
  std::string r(s);
  for (char& c : r) c = char(std::tolower(static_cast<unsigned char>(c)));
  return r;
}

bool EndsAddress(char c) {
  return std::isspace(static_cast<unsigned char>(c)) || c == '"' || c == '\'' || c == '<' || c == '>' || c == '`' ||
         c == '\0';
}

bool SchemeChar(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '+' || c == '-' || c == '.'; }

}  // namespace

std::string RedactAddress(std::string_view url) {
  std::string u(url);
  size_t scheme = u.find("://");
  if (scheme == std::string::npos) return u;  // a local path: nothing to redact
  {
    size_t host = scheme + 3;
    size_t end = u.find_first_of("/?#", host);
    if (end == std::string::npos) end = u.size();
    size_t at = u.rfind('@', end);
    if (at != std::string::npos && at >= host) u.erase(host, at + 1 - host);
  }
  size_t q = u.find('?');
  if (q != std::string::npos) {
    std::string query = Lower(std::string_view(u).substr(q));
    for (const char* secret : {"signature", "x-amz-credential", "x-amz-security-token", "token", "key=", "sig=",
                               "password", "secret"})
      if (query.find(secret) != std::string::npos) {
        u = u.substr(0, q) + "?<redacted>";
        break;
      }
  }
  return u;
}

std::string RedactText(std::string_view text) {
  std::string out;
  size_t done = 0;  // text[0, done) is in `out`
  for (size_t sep = text.find("://"); sep != std::string_view::npos; sep = text.find("://", sep + 3)) {
    size_t start = sep;
    while (start > done && SchemeChar(text[start - 1])) --start;
    if (start == sep) continue;  // no scheme before "://"
    size_t end = sep + 3;
    while (end < text.size() && !EndsAddress(text[end])) ++end;
    std::string_view addr = text.substr(start, end - start);
    std::string safe = RedactAddress(addr);
    if (safe != addr) {
      out.append(text.substr(done, start - done));
      out += safe;
      done = end;
    }
    sep = end - 3;  // the next search starts after this address
  }
  if (done == 0) return std::string(text);
  out.append(text.substr(done));
  return out;
}

void RedactInPlace(std::string* text) {
  if (text->find("://") == std::string::npos) return;
  *text = RedactText(*text);
}

}  // namespace shardkit::io

namespace shardkit {
std::string RedactAddress(std::string_view address) { return io::RedactAddress(address); }
}  // namespace shardkit
