#include "io/remote/xml.h"

#include <expat.h>
#include <fmt/format.h>

namespace shardkit::remote {
namespace {

struct Builder {
  std::unique_ptr<XmlElement> root;
  std::vector<XmlElement*> stack;
};

void OnStart(void* ud, const XML_Char* name, const XML_Char**) {
  auto* b = static_cast<Builder*>(ud);
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
  XML_SetUserData(p, &b);
  XML_SetElementHandler(p, &OnStart, &OnEnd);
  XML_SetCharacterDataHandler(p, &OnText);
  bool ok = XML_Parse(p, doc.data(), static_cast<int>(doc.size()), 1) == XML_STATUS_OK;
  std::string err = ok ? "" : fmt::format("{} at line {}", XML_ErrorString(XML_GetErrorCode(p)),
                                           XML_GetCurrentLineNumber(p));
  XML_ParserFree(p);
  if (!ok || !b.root) return Status::Corrupt(fmt::format("{}: malformed XML answer: {}", what, ok ? "empty" : err));
  return std::move(b.root);
}

}  // namespace shardkit::remote
