// shardkit/export.h: SHARDKIT_API marks what libshardkit exports.
//
// libshardkit is built with -fvisibility=hidden and a linker version script
// (lib/shardkit.map), so only declarations marked SHARDKIT_API in the headers of
// include/shardkit/ are in its dynamic symbol table; everything else (lib/ internals,
// fmt, nlohmann-json, protobuf, TBB, std:: instantiations) stays inside the library.
// Mark a class when it has out-of-line members or virtual functions (its vtable and
// type_info must be shared across the library boundary), a free function otherwise.
#pragma once

// SHARDKIT_HIDDEN keeps a nested class of an exported class (a pimpl's Impl) inside.
// The attribute-specifier form, so that it can follow [[nodiscard]] on a class.
#if defined(__GNUC__) || defined(__clang__)
#define SHARDKIT_API [[gnu::visibility("default")]]
#define SHARDKIT_HIDDEN [[gnu::visibility("hidden")]]
#else
#define SHARDKIT_API
#define SHARDKIT_HIDDEN
#endif
