#include "io/remote/xml.h"

#include <algorithm>

#include <expat.h>
#include <fmt/format.h>

namespace shardkit::remote {
namespace {

// S3's answers nest four or five elements deep. A deeper document is refused while it
// is parsed: the tree is freed recursively, so an answer of a million nested elements
// (3 MB) would overflow the stack.
constexpr size_t kMaxDepth = 64;

struct Builder {
  XML_Parser parser = nullptr;
  std::unique_ptr<XmlElement> root;
  std::vector<XmlElement*> stack;
  bool too_deep = false;
};

void OnStart(void* ud, const XML_Char* name, const XML_Char**) {
  auto* b = static_cast<Builder*>(ud);
  if (b->stack.size() >= kMaxDepth) {
    b->too_deep = true;
    XML_StopParser(b->parser, XML_FALSE);
    return;
  }
  auto e = std::make_unique<XmlElement>();
  std::string_view n(name);
  size_t sep = n.rfind('\x01');  // namespace separator given to XML_ParserCreateNS
  e->name = std::string(sep == std::string_view::npos ? n : n.substr(sep + 1));
  XmlElement* raw = e.get();
  if (b->stack.empty()) {
    if (!b->root) b->root = std::move(e);
  } else {
    b->stack.back()->children.push_back(std::move(e));
  }
  b->stack.push_back(raw);
}

void OnEnd(void* ud, const XML_Char*) {
  auto* b = static_cast<Builder*>(ud);
  if (!b->stack.empty()) b->stack.pop_back();
}

void OnText(void* ud, const XML_Char* s, int len) {
  auto* b = static_cast<Builder*>(ud);
  if (!b->stack.empty()) b->stack.back()->text.append(s, static_cast<size_t>(len));
}

}  // namespace

const XmlElement* XmlElement::Child(std::string_view n) const {
  for (const auto& c : children)
    if (c->name == n) return c.get();
  return nullptr;
}

std::string XmlElement::ChildText(std::string_view n) const {
  const XmlElement* c = Child(n);
  return c ? c->text : std::string();
}

Result<std::unique_ptr<XmlElement>> ParseXml(std::string_view doc, const std::string& what) {
  XML_Parser p = XML_ParserCreateNS(nullptr, '\x01');
  if (!p) return Status::Internal("XML_ParserCreateNS failed");
  Builder b;
  b.parser = p;
  XML_SetUserData(p, &b);
  XML_SetElementHandler(p, &OnStart, &OnEnd);
  XML_SetCharacterDataHandler(p, &OnText);
  // In pieces that an int can count (XML_Parse's length), however long the answer.
  constexpr size_t kPiece = size_t(1) << 30;
  bool ok = true;
  for (size_t at = 0; ok;) {
    const size_t n = std::min(doc.size() - at, kPiece);
    const bool last = at + n == doc.size();
    ok = XML_Parse(p, doc.data() + at, static_cast<int>(n), last) == XML_STATUS_OK;
    at += n;
    if (last) break;
  }
  std::string err = ok ? ""
                   : b.too_deep ? fmt::format("elements nested deeper than {} at line {}", kMaxDepth,
                                              XML_GetCurrentLineNumber(p))
                                : fmt::format("{} at line {}", XML_ErrorString(XML_GetErrorCode(p)),
                                              XML_GetCurrentLineNumber(p));
  XML_ParserFree(p);
  if (!ok || !b.root) return Status::Corrupt(fmt::format("{}: malformed XML answer: {}", what, ok ? "empty" : err));
  return std::move(b.root);
}

}  // namespace shardkit::remote
