// The strict pickle subset reader (see pickle.h). Opcode facts are Python's
// (Lib/pickletools.py documents each); numpy's reduce forms are numpy's
// ndarray.__reduce__/__reduce_ex__ and dtype.__reduce__.
//
// The machine: objects live in an arena (indices, so a hostile memo can make a
// cycle without leaking or recursing); the stack and memo hold indices. The
// result is copied out of the arena into a Value tree with bounded depth and node
// count, which is where a cycle or a sharing bomb is stopped.
#include "core/pickle.h"

#include <cstring>
#include <memory>
#include <unordered_map>
#include <utility>

#include <fmt/format.h>

namespace shardkit::pickle {

std::string DType::descr() const { return fmt::format("{}{}{}", order, kind, itemsize); }

uint64_t NdArray::elements() const {
  uint64_t n = 1;
  for (uint64_t d : shape) n *= d;
  return n;
}

std::string_view Value::type_name() const {
  switch (kind) {
    case Kind::kNone: return "None";
    case Kind::kBool: return "bool";
    case Kind::kInt: return "int";
    case Kind::kFloat: return "float";
    case Kind::kStr: return "str";
    case Kind::kBytes: return "bytes";
    case Kind::kTuple: return "tuple";
    case Kind::kList: return "list";
    case Kind::kDict: return "dict";
    case Kind::kArray: return "numpy.ndarray";
  }
  return "?";
}

bool LooksLikePickle(std::string_view d) {
  return d.size() >= 3 && uint8_t(d[0]) == 0x80 && uint8_t(d[1]) >= 2 && uint8_t(d[1]) <= 5;
}

namespace {

enum class Global { kReconstruct, kNdarray, kDtype, kFrombuffer, kScalar, kCodecsEncode, kBytes };

struct AllowedGlobal {
  std::string_view module, name;
  Global g;
};
constexpr AllowedGlobal kAllowed[] = {
    {"numpy.core.multiarray", "_reconstruct", Global::kReconstruct},
    {"numpy._core.multiarray", "_reconstruct", Global::kReconstruct},
    {"numpy", "ndarray", Global::kNdarray},
    {"numpy", "dtype", Global::kDtype},
    {"numpy.core.numeric", "_frombuffer", Global::kFrombuffer},
    {"numpy._core.numeric", "_frombuffer", Global::kFrombuffer},
    {"numpy.core.multiarray", "scalar", Global::kScalar},
    {"numpy._core.multiarray", "scalar", Global::kScalar},
    {"_codecs", "encode", Global::kCodecsEncode},
    {"__builtin__", "bytes", Global::kBytes},
    {"builtins", "bytes", Global::kBytes},
};

// An object of the machine. Containers refer to other objects by arena index.
struct Obj {
  enum class T { kNone, kBool, kInt, kFloat, kStr, kBytes, kTuple, kList, kDict, kArray, kGlobal, kDType, kShell };
  T t = T::kNone;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;  // kStr; kGlobal: "module.name"
  Bytes bytes;
  std::vector<uint32_t> items;
  std::vector<std::pair<uint32_t, uint32_t>> dict;
  Global g = Global::kBytes;
  DType dt;
  bool dt_built = false;  // kDType: BUILD seen
  NdArray arr;
};

std::string_view TypeName(const Obj& o) {
  switch (o.t) {
    case Obj::T::kNone: return "None";
    case Obj::T::kBool: return "bool";
    case Obj::T::kInt: return "int";
    case Obj::T::kFloat: return "float";
    case Obj::T::kStr: return "str";
    case Obj::T::kBytes: return "bytes";
    case Obj::T::kTuple: return "tuple";
    case Obj::T::kList: return "list";
    case Obj::T::kDict: return "dict";
    case Obj::T::kArray: return "numpy.ndarray";
    case Obj::T::kGlobal: return "global";
    case Obj::T::kDType: return "numpy.dtype";
    case Obj::T::kShell: return "unfinished numpy.ndarray";
  }
  return "?";
}

// Parses numpy's dtype string: optional byte order, kind, item size ("u1", "<f4", "?", "b1").
bool ParseDescr(std::string_view s, DType* out) {
  char order = 0;
  if (!s.empty() && (s[0] == '<' || s[0] == '>' || s[0] == '|' || s[0] == '=')) {
    order = s[0];
    s.remove_prefix(1);
  }
  if (s.empty()) return false;
  char kind = s[0];
  s.remove_prefix(1);
  uint32_t size = 0;
  if (kind == '?' && s.empty()) {
    kind = 'b';
    size = 1;
  } else {
    if (s.empty() || s.size() > 2) return false;
    for (char c : s) {
      if (c < '0' || c > '9') return false;
      size = size * 10 + uint32_t(c - '0');
    }
  }
  bool ok = (kind == 'b' && size == 1) || ((kind == 'i' || kind == 'u') && (size == 1 || size == 2 || size == 4 || size == 8)) ||
            (kind == 'f' && (size == 2 || size == 4 || size == 8)) || (kind == 'c' && (size == 8 || size == 16));
  if (!ok) return false;
  out->kind = kind;
  out->itemsize = size;
  if (size == 1) out->order = '|';
  else if (order == '>') out->order = '>';
  else out->order = '<';  // '<', '=' (native: little-endian on every platform shardkit builds for), none
  return true;
}

class Machine {
 public:
  Machine(const Bytes& data, const Limits& lim) : data_(data), lim_(lim) {}

  Result<Value> Run() {
    const uint8_t* p = data_.data();
    const size_t n = data_.size();
    if (n < 2 || p[0] != 0x80) return Bad(0, "not a pickle of protocol 2-5 (no PROTO opcode at the start)");
    if (p[1] < 2 || p[1] > 5) return Unsup(0, fmt::format("pickle protocol {} is not read (2-5 are)", p[1]));
    pos_ = 2;
    while (true) {
      if (pos_ >= n) return Bad(pos_, "truncated: the stream ends before STOP");
      op_at_ = pos_;
      uint8_t op = p[pos_++];
      switch (op) {
        case 0x80: return Bad(op_at_, "PROTO after the start");
        case 0x95: {  // FRAME: 8-byte length of the frame that follows
          SK_ASSIGN_OR_RETURN(uint64_t len, Uint(8));
          if (len > n - pos_) return Bad(op_at_, fmt::format("FRAME of {} bytes runs past the end ({} left)", len, n - pos_));
          break;
        }
        case '.': {  // STOP
          if (!marks_.empty()) return Bad(op_at_, "STOP inside an open MARK");
          if (stack_.size() != 1) return Bad(op_at_, fmt::format("STOP with {} objects on the stack, not 1", stack_.size()));
          if (pos_ != n) return Bad(pos_, fmt::format("{} bytes after STOP", n - pos_));
          uint64_t nodes = 0;
          Value out;
          SK_RETURN_IF_ERROR(Export(stack_[0], 0, &nodes, &out));
          return out;
        }
        case 'N': SK_RETURN_IF_ERROR(Push(New(Obj::T::kNone))); break;
        case 0x88:
        case 0x89: {
          uint32_t o = New(Obj::T::kBool);
          arena_[o].b = op == 0x88;
          SK_RETURN_IF_ERROR(Push(o));
          break;
        }
        case 'J': {
          SK_ASSIGN_OR_RETURN(uint64_t v, Uint(4));
          SK_RETURN_IF_ERROR(PushInt(int64_t(int32_t(uint32_t(v)))));
          break;
        }
        case 'K': {
          SK_ASSIGN_OR_RETURN(uint64_t v, Uint(1));
          SK_RETURN_IF_ERROR(PushInt(int64_t(v)));
          break;
        }
        case 'M': {
          SK_ASSIGN_OR_RETURN(uint64_t v, Uint(2));
          SK_RETURN_IF_ERROR(PushInt(int64_t(v)));
          break;
        }
        case 0x8a:    // LONG1
        case 0x8b: {  // LONG4
          SK_ASSIGN_OR_RETURN(uint64_t len, Uint(op == 0x8a ? 1 : 4));
          if (op == 0x8b && int32_t(uint32_t(len)) < 0) return Bad(op_at_, "LONG4 with a negative length");
          if (len > 8) return Unsup(op_at_, fmt::format("integer of {} bytes does not fit 64 bits", len));
          SK_ASSIGN_OR_RETURN(const uint8_t* b, Take(len));
          uint64_t v = 0;
          for (uint64_t k = 0; k < len; ++k) v |= uint64_t(b[k]) << (8 * k);
          if (len > 0 && len < 8 && (b[len - 1] & 0x80)) v |= ~uint64_t(0) << (8 * len);  // sign-extend
          SK_RETURN_IF_ERROR(PushInt(int64_t(v)));
          break;
        }
        case 'G': {  // BINFLOAT, big-endian double
          SK_ASSIGN_OR_RETURN(const uint8_t* b, Take(8));
          uint64_t v = 0;
          for (int k = 0; k < 8; ++k) v = (v << 8) | b[k];
          uint32_t o = New(Obj::T::kFloat);
          std::memcpy(&arena_[o].f, &v, 8);
          SK_RETURN_IF_ERROR(Push(o));
          break;
        }
        case 0x8c: SK_RETURN_IF_ERROR(PushStr(1)); break;  // SHORT_BINUNICODE
        case 'X': SK_RETURN_IF_ERROR(PushStr(4)); break;   // BINUNICODE
        case 0x8d: SK_RETURN_IF_ERROR(PushStr(8)); break;  // BINUNICODE8
        case 'C': SK_RETURN_IF_ERROR(PushBytes(1)); break;  // SHORT_BINBYTES
        case 'B': SK_RETURN_IF_ERROR(PushBytes(4)); break;  // BINBYTES
        case 0x8e: SK_RETURN_IF_ERROR(PushBytes(8)); break;  // BINBYTES8
        case 0x96: SK_RETURN_IF_ERROR(PushBytes(8)); break;  // BYTEARRAY8 (read as bytes)
        case 'U': SK_RETURN_IF_ERROR(PushBytes(1)); break;  // SHORT_BINSTRING (Python 2 str: read as bytes)
        case 'T': SK_RETURN_IF_ERROR(PushBytes(4)); break;  // BINSTRING
        case 0x97: return Unsup(op_at_, "out-of-band buffer (protocol 5 NEXT_BUFFER): the pickle was written with a buffer_callback and its data is not in the stream");
        case 0x98: {  // READONLY_BUFFER
          SK_ASSIGN_OR_RETURN(uint32_t o, Top());
          if (arena_[o].t != Obj::T::kBytes) return Bad(op_at_, "READONLY_BUFFER on a non-buffer");
          break;
        }
        case ')': SK_RETURN_IF_ERROR(Push(New(Obj::T::kTuple))); break;
        case 0x85:
        case 0x86:
        case 0x87: {
          size_t k = op - 0x84;
          if (StackAboveMark() < k) return Bad(op_at_, fmt::format("TUPLE{} with {} objects on the stack", k, StackAboveMark()));
          uint32_t o = New(Obj::T::kTuple);
          arena_[o].items.assign(stack_.end() - long(k), stack_.end());
          stack_.resize(stack_.size() - k);
          SK_RETURN_IF_ERROR(Push(o));
          break;
        }
        case 't':    // TUPLE
        case 'l': {  // LIST
          SK_ASSIGN_OR_RETURN(size_t m, PopMark());
          uint32_t o = New(op == 't' ? Obj::T::kTuple : Obj::T::kList);
          arena_[o].items.assign(stack_.begin() + long(m), stack_.end());
          stack_.resize(m);
          SK_RETURN_IF_ERROR(Push(o));
          break;
        }
        case ']': SK_RETURN_IF_ERROR(Push(New(Obj::T::kList))); break;
        case '}': SK_RETURN_IF_ERROR(Push(New(Obj::T::kDict))); break;
        case 'd': {  // DICT
          SK_ASSIGN_OR_RETURN(size_t m, PopMark());
          if ((stack_.size() - m) % 2) return Bad(op_at_, "DICT with an odd number of objects");
          uint32_t o = New(Obj::T::kDict);
          for (size_t k = m; k < stack_.size(); k += 2) arena_[o].dict.emplace_back(stack_[k], stack_[k + 1]);
          stack_.resize(m);
          SK_RETURN_IF_ERROR(Push(o));
          break;
        }
        case 'a': {  // APPEND
          if (StackAboveMark() < 2) return Bad(op_at_, "APPEND without a list and an item");
          uint32_t item = stack_.back();
          stack_.pop_back();
          Obj& l = arena_[stack_.back()];
          if (l.t != Obj::T::kList) return Unsup(op_at_, fmt::format("APPEND to a {}, not a list", TypeName(l)));
          l.items.push_back(item);
          break;
        }
        case 'e': {  // APPENDS
          SK_ASSIGN_OR_RETURN(size_t m, PopMark());
          if (m == 0) return Bad(op_at_, "APPENDS without a list below the MARK");
          Obj& l = arena_[stack_[m - 1]];
          if (l.t != Obj::T::kList) return Unsup(op_at_, fmt::format("APPENDS to a {}, not a list", TypeName(l)));
          l.items.insert(l.items.end(), stack_.begin() + long(m), stack_.end());
          stack_.resize(m);
          break;
        }
        case 's': {  // SETITEM
          if (StackAboveMark() < 3) return Bad(op_at_, "SETITEM without a dict, a key and a value");
          uint32_t v = stack_.back(), k = stack_[stack_.size() - 2];
          stack_.resize(stack_.size() - 2);
          Obj& d = arena_[stack_.back()];
          if (d.t != Obj::T::kDict) return Unsup(op_at_, fmt::format("SETITEM on a {}, not a dict", TypeName(d)));
          d.dict.emplace_back(k, v);
          break;
        }
        case 'u': {  // SETITEMS
          SK_ASSIGN_OR_RETURN(size_t m, PopMark());
          if (m == 0) return Bad(op_at_, "SETITEMS without a dict below the MARK");
          if ((stack_.size() - m) % 2) return Bad(op_at_, "SETITEMS with an odd number of objects");
          Obj& d = arena_[stack_[m - 1]];
          if (d.t != Obj::T::kDict) return Unsup(op_at_, fmt::format("SETITEMS on a {}, not a dict", TypeName(d)));
          for (size_t k = m; k < stack_.size(); k += 2) d.dict.emplace_back(stack_[k], stack_[k + 1]);
          stack_.resize(m);
          break;
        }
        case '(':
          if (stack_.size() + marks_.size() >= lim_.max_stack) return Bad(op_at_, "stack limit exceeded");
          marks_.push_back(stack_.size());
          break;
        case '0':  // POP
          if (StackAboveMark() < 1) return Bad(op_at_, "POP on an empty stack");
          stack_.pop_back();
          break;
        case '1': {  // POP_MARK
          SK_ASSIGN_OR_RETURN(size_t m, PopMark());
          stack_.resize(m);
          break;
        }
        case '2': {  // DUP
          SK_ASSIGN_OR_RETURN(uint32_t o, Top());
          SK_RETURN_IF_ERROR(Push(o));
          break;
        }
        case 'q': SK_RETURN_IF_ERROR(Put(1)); break;   // BINPUT
        case 'r': SK_RETURN_IF_ERROR(Put(4)); break;   // LONG_BINPUT
        case 0x94: SK_RETURN_IF_ERROR(Put(0)); break;  // MEMOIZE
        case 'h': SK_RETURN_IF_ERROR(Get(1)); break;   // BINGET
        case 'j': SK_RETURN_IF_ERROR(Get(4)); break;   // LONG_BINGET
        case 'c': {  // GLOBAL "module\nname\n"
          SK_ASSIGN_OR_RETURN(std::string module, Line());
          SK_ASSIGN_OR_RETURN(std::string name, Line());
          SK_RETURN_IF_ERROR(PushGlobal(module, name));
          break;
        }
        case 0x93: {  // STACK_GLOBAL
          if (StackAboveMark() < 2) return Bad(op_at_, "STACK_GLOBAL without a module and a name");
          const Obj& name = arena_[stack_.back()];
          const Obj& module = arena_[stack_[stack_.size() - 2]];
          if (name.t != Obj::T::kStr || module.t != Obj::T::kStr) return Bad(op_at_, "STACK_GLOBAL of non-strings");
          std::string m = module.s, nm = name.s;
          stack_.resize(stack_.size() - 2);
          SK_RETURN_IF_ERROR(PushGlobal(m, nm));
          break;
        }
        case 'R': SK_RETURN_IF_ERROR(Reduce()); break;
        case 'b': SK_RETURN_IF_ERROR(Build()); break;
        default: return Unsup(op_at_, fmt::format("opcode {} is not read (code and objects other than plain data and numpy arrays are refused)", OpName(op)));
      }
    }
  }

 private:
  static std::string OpName(uint8_t op) {
    const char* name = nullptr;
    switch (op) {
      case 0x81: name = "NEWOBJ"; break;
      case 0x92: name = "NEWOBJ_EX"; break;
      case 'i': name = "INST"; break;
      case 'o': name = "OBJ"; break;
      case 'P': name = "PERSID"; break;
      case 'Q': name = "BINPERSID"; break;
      case 0x82: case 0x83: case 0x84: name = "EXT"; break;
      case 0x8f: name = "EMPTY_SET"; break;
      case 0x90: name = "ADDITEMS"; break;
      case 0x91: name = "FROZENSET"; break;
      case 'I': name = "INT"; break;
      case 'L': name = "LONG"; break;
      case 'F': name = "FLOAT"; break;
      case 'S': name = "STRING"; break;
      case 'V': name = "UNICODE"; break;
      case 'p': name = "PUT"; break;
      case 'g': name = "GET"; break;
      default: break;
    }
    if (name) return fmt::format("{} (0x{:02x})", name, op);
    return fmt::format("0x{:02x}", op);
  }

  Status Bad(size_t at, std::string why) const {
    return Status::Corrupt(fmt::format("pickle, offset {}: {}", at, why));
  }
  Status Unsup(size_t at, std::string why) const {
    return Status::Unsupported(fmt::format("pickle, offset {}: {}", at, why));
  }

  Result<const uint8_t*> Take(uint64_t len) {
    if (len > data_.size() - pos_)
      return Bad(op_at_, fmt::format("truncated: needs {} bytes, {} left", len, data_.size() - pos_));
    const uint8_t* b = data_.data() + pos_;
    pos_ += size_t(len);
    return b;
  }
  Result<uint64_t> Uint(int len) {
    SK_ASSIGN_OR_RETURN(const uint8_t* b, Take(uint64_t(len)));
    uint64_t v = 0;
    for (int k = 0; k < len; ++k) v |= uint64_t(b[k]) << (8 * k);
    return v;
  }
  Result<std::string> Line() {
    const uint8_t* p = data_.data();
    size_t start = pos_;
    while (pos_ < data_.size() && p[pos_] != '\n') {
      if (pos_ - start > 256) return Bad(op_at_, "GLOBAL name longer than 256 bytes");
      ++pos_;
    }
    if (pos_ >= data_.size()) return Bad(op_at_, "truncated: GLOBAL name without its newline");
    std::string s(reinterpret_cast<const char*>(p + start), pos_ - start);
    ++pos_;
    return s;
  }

  uint32_t New(Obj::T t) {
    arena_.emplace_back();
    arena_.back().t = t;
    return uint32_t(arena_.size() - 1);
  }
  Status Push(uint32_t o) {
    if (arena_.size() > lim_.max_objects) return Bad(op_at_, fmt::format("more than {} objects", lim_.max_objects));
    if (stack_.size() + marks_.size() >= lim_.max_stack) return Bad(op_at_, "stack limit exceeded");
    stack_.push_back(o);
    return Status::OK();
  }
  Status PushInt(int64_t v) {
    uint32_t o = New(Obj::T::kInt);
    arena_[o].i = v;
    return Push(o);
  }
  Status PushStr(int lenbytes) {
    SK_ASSIGN_OR_RETURN(uint64_t len, Uint(lenbytes));
    SK_ASSIGN_OR_RETURN(const uint8_t* b, Take(len));
    uint32_t o = New(Obj::T::kStr);
    arena_[o].s.assign(reinterpret_cast<const char*>(b), size_t(len));
    return Push(o);
  }
  Status PushBytes(int lenbytes) {
    SK_ASSIGN_OR_RETURN(uint64_t len, Uint(lenbytes));
    if (lenbytes == 4 && (data_.data()[op_at_] == 'T') && int32_t(uint32_t(len)) < 0) return Bad(op_at_, "BINSTRING with a negative length");
    SK_ASSIGN_OR_RETURN(const uint8_t* b, Take(len));
    uint32_t o = New(Obj::T::kBytes);
    arena_[o].bytes = data_.slice(size_t(b - data_.data()), size_t(len));
    return Push(o);
  }
  Status PushGlobal(const std::string& module, const std::string& name) {
    for (const auto& a : kAllowed)
      if (a.module == module && a.name == name) {
        uint32_t o = New(Obj::T::kGlobal);
        arena_[o].g = a.g;
        arena_[o].s = module + "." + name;
        return Push(o);
      }
    std::string shown = module + "." + name;
    for (char& c : shown)
      if (uint8_t(c) < 0x20 || uint8_t(c) >= 0x7f) c = '?';
    return Unsup(op_at_, fmt::format("global '{}' is refused (only numpy array reconstruction is read; nothing is executed)", shown));
  }

  size_t StackAboveMark() const { return stack_.size() - (marks_.empty() ? 0 : marks_.back()); }
  Result<size_t> PopMark() {
    if (marks_.empty()) return Bad(op_at_, "no MARK to pop");
    size_t m = marks_.back();
    marks_.pop_back();
    return m;
  }
  Result<uint32_t> Top() {
    if (StackAboveMark() < 1) return Bad(op_at_, "empty stack");
    return stack_.back();
  }
  Result<uint32_t> PopObj() {
    if (StackAboveMark() < 1) return Bad(op_at_, "empty stack");
    uint32_t o = stack_.back();
    stack_.pop_back();
    return o;
  }

  Status Put(int lenbytes) {
    uint64_t idx;
    if (lenbytes == 0) {
      idx = memo_.size();
    } else {
      SK_ASSIGN_OR_RETURN(idx, Uint(lenbytes));
    }
    SK_ASSIGN_OR_RETURN(uint32_t o, Top());
    if (!memo_.count(idx) && memo_.size() >= lim_.max_memo) return Bad(op_at_, fmt::format("more than {} memo entries", lim_.max_memo));
    memo_[idx] = o;
    return Status::OK();
  }
  Status Get(int lenbytes) {
    SK_ASSIGN_OR_RETURN(uint64_t idx, Uint(lenbytes));
    auto it = memo_.find(idx);
    if (it == memo_.end()) return Bad(op_at_, fmt::format("memo entry {} is not defined (memo holds {} entries)", idx, memo_.size()));
    return Push(it->second);
  }

  // Helpers for reading reduce arguments.
  Result<std::vector<uint64_t>> Shape(uint32_t o, std::string_view what) {
    const Obj& t = arena_[o];
    if (t.t != Obj::T::kTuple && t.t != Obj::T::kList) return Bad(op_at_, fmt::format("{}: shape is a {}, not a tuple", what, TypeName(t)));
    if (t.items.size() > 32) return Bad(op_at_, fmt::format("{}: {} dimensions (at most 32)", what, t.items.size()));
    std::vector<uint64_t> shape;
    for (uint32_t d : t.items) {
      const Obj& x = arena_[d];
      if (x.t != Obj::T::kInt || x.i < 0) return Bad(op_at_, fmt::format("{}: a dimension is not a non-negative int", what));
      shape.push_back(uint64_t(x.i));
    }
    return shape;
  }
  Status CheckSize(const NdArray& a, std::string_view what) {
    uint64_t n = a.dtype.itemsize;
    for (uint64_t d : a.shape)
      if (__builtin_mul_overflow(n, d, &n))
        return Bad(op_at_, fmt::format("{}: shape overflows", what));
    if (n != a.data.size())
      return Bad(op_at_, fmt::format("{}: shape and dtype {} need {} bytes, the data has {}", what, a.dtype.descr(), n,
                                     a.data.size()));
    return Status::OK();
  }
  Result<const DType*> DTypeOf(uint32_t o, std::string_view what) {
    const Obj& d = arena_[o];
    if (d.t != Obj::T::kDType) return Bad(op_at_, fmt::format("{}: dtype is a {}", what, TypeName(d)));
    return &d.dt;
  }

  Status Reduce() {
    if (StackAboveMark() < 2) return Bad(op_at_, "REDUCE without a callable and its arguments");
    uint32_t args_i = stack_.back();
    uint32_t fn_i = stack_[stack_.size() - 2];
    stack_.resize(stack_.size() - 2);
    const Obj& fn = arena_[fn_i];
    if (fn.t != Obj::T::kGlobal) return Unsup(op_at_, fmt::format("REDUCE of a {}, not an allowed callable", TypeName(fn)));
    const Obj& args = arena_[args_i];
    if (args.t != Obj::T::kTuple) return Bad(op_at_, fmt::format("REDUCE of {} with a {} for arguments", fn.s, TypeName(args)));
    std::vector<uint32_t> a = args.items;  // copy: New() may move the arena
    auto type = [&](size_t k) { return arena_[a[k]].t; };
    std::string fname = fn.s;
    switch (fn.g) {
      case Global::kReconstruct: {  // _reconstruct(ndarray, (0,), b'b'): an array waiting for BUILD
        if (a.size() != 3 || type(0) != Obj::T::kGlobal || arena_[a[0]].g != Global::kNdarray)
          return Unsup(op_at_, fmt::format("{} of something other than numpy.ndarray", fname));
        return Push(New(Obj::T::kShell));
      }
      case Global::kDtype: {  // dtype('u1', False, True)
        if (a.empty() || a.size() > 3) return Bad(op_at_, "numpy.dtype with a wrong number of arguments");
        const Obj& s = arena_[a[0]];
        std::string descr = s.t == Obj::T::kStr ? s.s : s.t == Obj::T::kBytes ? s.bytes.str() : std::string();
        DType dt;
        if (!ParseDescr(descr, &dt))
          return Unsup(op_at_, fmt::format("numpy dtype '{}' is not read (bool, integers, floats and complex are)", descr.substr(0, 32)));
        uint32_t o = New(Obj::T::kDType);
        arena_[o].dt = dt;
        return Push(o);
      }
      case Global::kFrombuffer: {  // _frombuffer(buf, dtype, shape, order)
        if (a.size() != 4 || type(0) != Obj::T::kBytes || type(3) != Obj::T::kStr)
          return Bad(op_at_, fmt::format("{} with unexpected arguments", fname));
        SK_ASSIGN_OR_RETURN(const DType* dt, DTypeOf(a[1], fname));
        NdArray arr;
        arr.dtype = *dt;
        SK_ASSIGN_OR_RETURN(arr.shape, Shape(a[2], fname));
        const std::string& order = arena_[a[3]].s;
        if (order != "C" && order != "F") return Bad(op_at_, fmt::format("{}: order '{}'", fname, order.substr(0, 8)));
        arr.fortran_order = order == "F";
        arr.data = arena_[a[0]].bytes;
        SK_RETURN_IF_ERROR(CheckSize(arr, fname));
        uint32_t o = New(Obj::T::kArray);
        arena_[o].arr = std::move(arr);
        return Push(o);
      }
      case Global::kScalar: {  // scalar(dtype, bytes): a numpy scalar (0-d array)
        if (a.size() != 2 || type(1) != Obj::T::kBytes) return Bad(op_at_, fmt::format("{} with unexpected arguments", fname));
        SK_ASSIGN_OR_RETURN(const DType* dt, DTypeOf(a[0], fname));
        NdArray arr;
        arr.dtype = *dt;
        arr.data = arena_[a[1]].bytes;
        SK_RETURN_IF_ERROR(CheckSize(arr, fname));
        uint32_t o = New(Obj::T::kArray);
        arena_[o].arr = std::move(arr);
        return Push(o);
      }
      case Global::kCodecsEncode: {  // encode(str, 'latin1'): protocol 2's spelling of bytes
        if (a.size() != 2 || type(0) != Obj::T::kStr || type(1) != Obj::T::kStr ||
            (arena_[a[1]].s != "latin1" && arena_[a[1]].s != "latin-1"))
          return Unsup(op_at_, "_codecs.encode other than (str, 'latin1')");
        std::string out;
        SK_RETURN_IF_ERROR(Latin1(arena_[a[0]].s, &out));
        uint32_t o = New(Obj::T::kBytes);
        arena_[o].bytes = Bytes::Take(std::move(out));
        return Push(o);
      }
      case Global::kBytes: {
        if (!a.empty()) return Unsup(op_at_, "bytes() with arguments");
        return Push(New(Obj::T::kBytes));
      }
      case Global::kNdarray: break;
    }
    return Unsup(op_at_, fmt::format("REDUCE of {}: not an allowed callable", fname));
  }

  // UTF-8 text of code points < 256 -> one byte each.
  Status Latin1(const std::string& s, std::string* out) {
    out->reserve(s.size());
    for (size_t k = 0; k < s.size();) {
      uint8_t c = uint8_t(s[k]);
      if (c < 0x80) {
        out->push_back(char(c));
        ++k;
      } else if ((c & 0xe0) == 0xc0 && k + 1 < s.size() && (uint8_t(s[k + 1]) & 0xc0) == 0x80) {
        uint32_t cp = (uint32_t(c & 0x1f) << 6) | (uint8_t(s[k + 1]) & 0x3f);
        if (cp > 0xff) return Bad(op_at_, "_codecs.encode: a character beyond latin-1");
        out->push_back(char(cp));
        k += 2;
      } else {
        return Bad(op_at_, "_codecs.encode: text that is not latin-1");
      }
    }
    return Status::OK();
  }

  Status Build() {
    if (StackAboveMark() < 2) return Bad(op_at_, "BUILD without an object and its state");
    uint32_t st_i = stack_.back();
    stack_.pop_back();
    Obj& obj = arena_[stack_.back()];
    const Obj& st = arena_[st_i];
    if (obj.t == Obj::T::kDType) {
      // (version, byteorder, subarray, names, fields, elsize, alignment, flags[, metadata])
      if (st.t != Obj::T::kTuple || (st.items.size() != 8 && st.items.size() != 9))
        return Bad(op_at_, "numpy.dtype state is not an 8- or 9-tuple");
      const Obj& order = arena_[st.items[1]];
      if (order.t != Obj::T::kStr || order.s.size() != 1) return Bad(op_at_, "numpy.dtype state: byte order is not a character");
      for (int k = 2; k <= 4; ++k)
        if (arena_[st.items[size_t(k)]].t != Obj::T::kNone)
          return Unsup(op_at_, "structured or subarray numpy dtypes are not read");
      char c = order.s[0];
      if (c == '>' && obj.dt.itemsize > 1) obj.dt.order = '>';
      else if (c == '<' || c == '=' || (c == '|' && obj.dt.itemsize == 1)) obj.dt.order = obj.dt.itemsize > 1 ? '<' : '|';
      else if (c != '|' && c != '>') return Bad(op_at_, fmt::format("numpy.dtype state: byte order '{}'", c == '\0' ? '?' : c));
      obj.dt_built = true;
      return Status::OK();
    }
    if (obj.t == Obj::T::kShell) {
      // (version, shape, dtype, is_fortran, rawdata) or (shape, dtype, is_fortran, rawdata)
      if (st.t != Obj::T::kTuple || (st.items.size() != 5 && st.items.size() != 4))
        return Bad(op_at_, "numpy.ndarray state is not a 4- or 5-tuple");
      size_t b = st.items.size() - 4;
      std::vector<uint32_t> it = st.items;
      NdArray arr;
      SK_ASSIGN_OR_RETURN(arr.shape, Shape(it[b], "numpy.ndarray state"));
      SK_ASSIGN_OR_RETURN(const DType* dt, DTypeOf(it[b + 1], "numpy.ndarray state"));
      arr.dtype = *dt;
      const Obj& f = arena_[it[b + 2]];
      if (f.t != Obj::T::kBool && f.t != Obj::T::kInt) return Bad(op_at_, "numpy.ndarray state: is_fortran is not a bool");
      arr.fortran_order = f.t == Obj::T::kBool ? f.b : f.i != 0;
      const Obj& raw = arena_[it[b + 3]];
      if (raw.t == Obj::T::kList) return Unsup(op_at_, "numpy object arrays are not read");
      if (raw.t != Obj::T::kBytes) return Bad(op_at_, fmt::format("numpy.ndarray state: data is a {}, not bytes", TypeName(raw)));
      arr.data = raw.bytes;
      SK_RETURN_IF_ERROR(CheckSize(arr, "numpy.ndarray"));
      Obj& target = arena_[stack_.back()];
      target.t = Obj::T::kArray;
      target.arr = std::move(arr);
      return Status::OK();
    }
    return Unsup(op_at_, fmt::format("BUILD on a {} (only numpy arrays and dtypes are built)", TypeName(obj)));
  }

  Status Export(uint32_t o, uint32_t depth, uint64_t* nodes, Value* out) const {
    if (depth > lim_.max_depth) return Bad(op_at_, fmt::format("nesting deeper than {} (or a cycle)", lim_.max_depth));
    if (++*nodes > lim_.max_result_nodes) return Bad(op_at_, fmt::format("result of more than {} values", lim_.max_result_nodes));
    const Obj& x = arena_[o];
    using K = Value::Kind;
    switch (x.t) {
      case Obj::T::kNone: out->kind = K::kNone; return Status::OK();
      case Obj::T::kBool: out->kind = K::kBool; out->b = x.b; out->i = x.b; return Status::OK();
      case Obj::T::kInt: out->kind = K::kInt; out->i = x.i; return Status::OK();
      case Obj::T::kFloat: out->kind = K::kFloat; out->f = x.f; return Status::OK();
      case Obj::T::kStr: out->kind = K::kStr; out->s = x.s; return Status::OK();
      case Obj::T::kBytes: out->kind = K::kBytes; out->bytes = x.bytes; return Status::OK();
      case Obj::T::kArray: out->kind = K::kArray; out->array = x.arr; return Status::OK();
      case Obj::T::kTuple:
      case Obj::T::kList:
        out->kind = x.t == Obj::T::kTuple ? K::kTuple : K::kList;
        out->items.resize(x.items.size());
        for (size_t k = 0; k < x.items.size(); ++k) SK_RETURN_IF_ERROR(Export(x.items[k], depth + 1, nodes, &out->items[k]));
        return Status::OK();
      case Obj::T::kDict:
        out->kind = K::kDict;
        out->dict.resize(x.dict.size());
        for (size_t k = 0; k < x.dict.size(); ++k) {
          SK_RETURN_IF_ERROR(Export(x.dict[k].first, depth + 1, nodes, &out->dict[k].first));
          SK_RETURN_IF_ERROR(Export(x.dict[k].second, depth + 1, nodes, &out->dict[k].second));
        }
        return Status::OK();
      case Obj::T::kGlobal:
      case Obj::T::kDType:
      case Obj::T::kShell: break;
    }
    return Unsup(op_at_, fmt::format("a {} object in the result (only data and numpy arrays are read)", TypeName(x)));
  }

  Bytes data_;
  Limits lim_;
  size_t pos_ = 0, op_at_ = 0;
  std::vector<Obj> arena_;
  std::vector<uint32_t> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<uint64_t, uint32_t> memo_;
};

}  // namespace

Result<Value> ParsePickle(const Bytes& data, const Limits& limits) {
  Machine m(data, limits);
  return m.Run();
}

// ---------------------------------------------------------------------------
// .npy

std::string NpyHeader(const NdArray& arr) {
  std::string shape = "(";
  for (size_t k = 0; k < arr.shape.size(); ++k) shape += fmt::format("{}{}", arr.shape[k], k + 1 < arr.shape.size() || arr.shape.size() == 1 ? ", " : "");
  if (arr.shape.size() == 1) shape.pop_back();  // "(5,)"
  shape += ")";
  std::string dict = fmt::format("{{'descr': '{}', 'fortran_order': {}, 'shape': {}, }}", arr.dtype.descr(),
                                 arr.fortran_order ? "True" : "False", shape);
  size_t total = 10 + dict.size() + 1;
  size_t padded = (total + 63) / 64 * 64;
  dict.append(padded - total, ' ');
  dict.push_back('\n');
  std::string h = "\x93NUMPY";
  h.push_back('\x01');
  h.push_back('\x00');
  h.push_back(char(dict.size() & 0xff));
  h.push_back(char(dict.size() >> 8));
  return h + dict;
}

Bytes ToNpy(const NdArray& arr) {
  std::string h = NpyHeader(arr);
  const size_t n = h.size() + arr.data.size();
  // Not zero-filled first: every byte is copied in (a vector's memset cost ~15% of a conversion).
  std::shared_ptr<uint8_t[]> out(new uint8_t[n]);
  std::memcpy(out.get(), h.data(), h.size());
  if (!arr.data.empty()) std::memcpy(out.get() + h.size(), arr.data.data(), arr.data.size());
  const uint8_t* p = out.get();
  return Bytes(std::shared_ptr<const void>(std::move(out), p), p, n);
}

Result<NdArray> ParseNpy(const Bytes& npy) {
  auto bad = [](std::string why) { return Status::Corrupt("not a .npy array: " + why); };
  const uint8_t* p = npy.data();
  if (npy.size() < 10 || std::memcmp(p, "\x93NUMPY", 6) != 0) return bad("no \\x93NUMPY magic");
  uint8_t major = p[6];
  size_t hl, start;
  if (major == 1) {
    hl = size_t(p[8]) | size_t(p[9]) << 8;
    start = 10;
  } else if (major == 2 || major == 3) {
    if (npy.size() < 12) return bad("truncated header");
    hl = size_t(p[8]) | size_t(p[9]) << 8 | size_t(p[10]) << 16 | size_t(p[11]) << 24;
    start = 12;
  } else {
    return bad(fmt::format("version {}", major));
  }
  if (hl > npy.size() - start) return bad("header runs past the end");
  std::string_view h(reinterpret_cast<const char*>(p + start), hl);
  auto value_of = [&](std::string_view key) -> std::string_view {
    std::string k1 = "'" + std::string(key) + "'";
    size_t at = h.find(k1);
    if (at == std::string_view::npos) return {};
    at = h.find(':', at + k1.size());
    if (at == std::string_view::npos) return {};
    ++at;
    while (at < h.size() && h[at] == ' ') ++at;
    return h.substr(at);
  };
  NdArray arr;
  std::string_view d = value_of("descr");
  if (d.size() < 2 || (d[0] != '\'' && d[0] != '"')) return bad("no descr");
  size_t e = d.find(d[0], 1);
  if (e == std::string_view::npos) return bad("descr");
  if (!ParseDescr(d.substr(1, e - 1), &arr.dtype)) return bad(fmt::format("dtype '{}' is not read", d.substr(1, std::min<size_t>(e - 1, 32))));
  std::string_view f = value_of("fortran_order");
  if (f.rfind("True", 0) == 0) arr.fortran_order = true;
  else if (f.rfind("False", 0) != 0) return bad("fortran_order");
  std::string_view s = value_of("shape");
  if (s.empty() || s[0] != '(') return bad("shape");
  size_t close = s.find(')');
  if (close == std::string_view::npos) return bad("shape");
  std::string_view dims = s.substr(1, close - 1);
  uint64_t cur = 0;
  bool in = false;
  for (char c : dims) {
    if (c >= '0' && c <= '9') {
      if (cur > (uint64_t(1) << 48)) return bad("dimension too large");
      cur = cur * 10 + uint64_t(c - '0');
      in = true;
    } else if (c == ',') {
      if (!in) return bad("shape");
      arr.shape.push_back(cur);
      cur = 0;
      in = false;
    } else if (c != ' ' && c != 'L') {
      return bad("shape");
    }
  }
  if (in) arr.shape.push_back(cur);
  if (arr.shape.size() > 32) return bad("more than 32 dimensions");
  uint64_t n = arr.dtype.itemsize;
  for (uint64_t dd : arr.shape)
    if (__builtin_mul_overflow(n, dd, &n)) return bad("shape overflows");
  size_t off = start + hl;
  if (n != npy.size() - off) return bad(fmt::format("shape and dtype need {} bytes, the file has {}", n, npy.size() - off));
  arr.data = npy.slice(off, size_t(n));
  return arr;
}

bool HasColorChannels(const NdArray& a) { return a.shape.size() == 3 && (a.shape[2] == 3 || a.shape[2] == 4); }

void SwapRedBlue(const NdArray& a, uint8_t* px) {
  if (!HasColorChannels(a) || a.fortran_order) return;
  const size_t s = a.dtype.itemsize, stride = s * size_t(a.shape[2]), n = a.data.size();
  if (s == 1 && stride == 3) {  // cv2.imread's uint8 BGR: a loop the compiler vectorises
    for (size_t off = 0; off + 3 <= n; off += 3) std::swap(px[off], px[off + 2]);
    return;
  }
  uint8_t tmp[16];
  for (size_t off = 0; off + stride <= n; off += stride) {
    std::memcpy(tmp, px + off, s);
    std::memcpy(px + off, px + off + 2 * s, s);
    std::memcpy(px + off + 2 * s, tmp, s);
  }
}

Result<Bytes> NpyBgrToRgb(const Bytes& npy) {
  SK_ASSIGN_OR_RETURN(NdArray a, ParseNpy(npy));
  if (!HasColorChannels(a)) return npy;
  if (a.fortran_order) return Status::Unsupported("BGR to RGB of a Fortran-order array");
  Bytes out = ToNpy(a);  // an owned copy
  SwapRedBlue(a, const_cast<uint8_t*>(out.data()) + (out.size() - a.data.size()));
  return out;
}

}  // namespace shardkit::pickle
