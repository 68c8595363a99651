// Internal: a small element tree parsed by expat, for S3's XML answers
// (ListObjectsV2, multipart uploads, errors). Thread safety: plain values.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "shardkit/status.h"

namespace shardkit::remote {

struct XmlElement {
  std::string name;  // local name (a namespace prefix is dropped)
  std::string text;  // character data directly inside
  std::vector<std::unique_ptr<XmlElement>> children;

  // The first child named `name`, or nullptr.
  const XmlElement* Child(std::string_view name) const;
  // The text of the first child named `name`, or "".
  std::string ChildText(std::string_view name) const;
};

// The document's root element; kCorrupt (naming `what`) when it is not well-formed XML.
Result<std::unique_ptr<XmlElement>> ParseXml(std::string_view doc, const std::string& what);

}  // namespace shardkit::remote
