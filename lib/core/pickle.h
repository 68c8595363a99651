// Internal: a strict reader of a subset of Python's pickle format. Not installed.
//
// Pickle is a program for a stack machine whose instructions may import and call
// any Python function. This reader runs none of it: it understands the opcodes of
// protocols 2-5 that plain data needs (None, bool, int, float, str, bytes, tuple,
// list, dict, the memo, FRAME) and recognises numpy arrays and scalars by the few
// globals numpy's own __reduce__ uses, building them from their bytes:
//   numpy.core.multiarray._reconstruct + numpy.ndarray + numpy.dtype (protocols 2-4,
//     and non-contiguous arrays in 5), numpy.core.numeric._frombuffer (protocol 5,
//     in-band buffers only), numpy.core.multiarray.scalar (numpy scalars),
//   the numpy._core.* spellings of numpy 2, and _codecs.encode(str, 'latin1') and
//   builtins.bytes() with which protocol 2 spells bytes.
// Every other global is refused with an error naming it, before anything uses it.
// The input is bounded (depth, objects, memo, size); malformed or hostile input
// gives a Status, never a crash or a hang.
//
// Thread safety: ParsePickle is a pure function; the Values it returns are plain
// values (their Bytes may be views of the input, which they keep alive).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "shardkit/bytes.h"
#include "shardkit/status.h"

namespace shardkit::pickle {

// A numpy dtype this reader accepts: bool, signed/unsigned integers and floats
// (and complex), of any byte order; not strings, objects, structures or subarrays.
struct DType {
  char kind = 'u';        // 'b' bool, 'i' signed int, 'u' unsigned int, 'f' float, 'c' complex
  uint32_t itemsize = 1;  // bytes per element
  char order = '|';       // '<' little, '>' big, '|' not applicable (itemsize 1)
  // numpy's descr string, e.g. "|u1", "<f4", ">i8".
  std::string descr() const;
};

struct NdArray {
  DType dtype;
  std::vector<uint64_t> shape;  // empty for a numpy scalar (0-d)
  bool fortran_order = false;
  Bytes data;  // exactly product(shape) * itemsize bytes, in the order above
  uint64_t elements() const;
};

struct DictEntry;  // {first, second}: a key and its value (defined below, once Value is complete)

struct Value {
  enum class Kind { kNone, kBool, kInt, kFloat, kStr, kBytes, kTuple, kList, kDict, kArray };
  Kind kind = Kind::kNone;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;                              // kStr (UTF-8)
  Bytes bytes;                                // kBytes
  std::vector<Value> items;                   // kTuple, kList
  std::vector<DictEntry> dict;                // kDict, in pickle order
  NdArray array;                              // kArray

  // Python-ish name of the kind, for error messages ("tuple", "numpy.ndarray", ...).
  std::string_view type_name() const;
  bool is_int() const { return kind == Kind::kInt || kind == Kind::kBool; }
};

// Not std::pair<Value, Value>: a pair of an incomplete type inside Value itself is
// refused by libstdc++'s checks under clang (the fuzz build).
struct DictEntry {
  Value first, second;
};

struct Limits {
  uint32_t max_depth = 64;            // nesting of containers in the result
  uint64_t max_objects = 1u << 20;    // objects created while reading
  uint64_t max_result_nodes = 1u << 20;  // values in the returned tree (shared memo entries count each time)
  uint64_t max_memo = 1u << 20;       // memo entries
  uint64_t max_stack = 1u << 16;      // stack entries plus marks
};

// Reads one pickle occupying all of `data` (a STOP then nothing but trailing
// bytes is an error too). Bytes and array data in the result are views of `data`
// where the pickle holds them raw (protocol 3+), so they live as long as `data`'s owner.
Result<Value> ParsePickle(const Bytes& data, const Limits& limits = {});

// True when `data` starts like a pickle of protocol 2..5 (PROTO opcode).
bool LooksLikePickle(std::string_view data);

// numpy's .npy format, version 1.0: magic, header dict padded to a multiple of
// 64 bytes, then the array's bytes. Returns the header (prepend it to arr.data).
std::string NpyHeader(const NdArray& arr);
// The whole .npy file (header and data) as one owned buffer.
Bytes ToNpy(const NdArray& arr);
// Parses a .npy file (versions 1.0, 2.0, 3.0) of a dtype DType accepts; the data is a view of `npy`.
Result<NdArray> ParseNpy(const Bytes& npy);

// Whether `a` has a channel order: C- or Fortran-order H x W x 3 or H x W x 4.
bool HasColorChannels(const NdArray& a);
// Swaps channels 0 and 2 (BGR <-> RGB) of every pixel, in place: `px` holds a C-order
// H x W x 3|4 array's bytes laid out as a.data is. Other shapes are left alone.
void SwapRedBlue(const NdArray& a, uint8_t* px);
// An .npy file with channels 0 and 2 of its H x W x 3|4 array swapped (a new buffer);
// `npy` itself for any other shape. Errors: not an .npy file (kCorrupt), a Fortran-order
// colour array (kUnsupported).
Result<Bytes> NpyBgrToRgb(const Bytes& npy);

}  // namespace shardkit::pickle
