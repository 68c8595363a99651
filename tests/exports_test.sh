#!/usr/bin/env bash
# Checks the dynamic symbol table of the built shared library (issue 13, "a real library
# boundary"): every defined, exported symbol is part of the public API of include/shardkit/.
#   tests/exports_test.sh LIBSHARDKIT_SO PUBLIC_INCLUDE_DIR
# Fails, listing the offenders, on
#  - a GNU-unique ('u') symbol: it binds process-wide even under RTLD_LOCAL (the
#    `import shardkit; import torch` crash);
#  - a symbol outside namespace shardkit (fmt, nlohmann, boost, protobuf, TBB, std::, C);
#  - a symbol of an internal namespace (shardkit::io::, tar::, formats::, ...) or test hook;
#  - a name (namespace, class or function) that the public headers do not declare.
set -euo pipefail
LIB="$1"
INC="$2"
[ -f "$LIB" ] || { echo "exports_test: no library at $LIB" >&2; exit 2; }
syms="$(nm -D --defined-only -C "$LIB")"
[ -n "$syms" ] || { echo "exports_test: nm printed nothing for $LIB" >&2; exit 2; }
# Identifiers the public headers declare, comments left out.
words="$(sed -e 's://.*$::' "$INC"/shardkit/*.h | grep -oE '[A-Za-z_][A-Za-z0-9_]*' | sort -u)"
bad=0
fail() { echo "exports_test: $1: $2"; bad=$((bad + 1)); }
while IFS= read -r line; do
  type="$(cut -d' ' -f2 <<<"$line")"
  name="$(cut -d' ' -f3- <<<"$line")"
  if [ "$type" = "u" ]; then fail "GNU-unique symbol" "$name"; continue; fi
  # The entity's qualified name: no typeinfo/vtable prefix, no template arguments, no ABI
  # tags, no parameters.
  q="$(sed -E -e 's/^(typeinfo name for|typeinfo for|vtable for|VTT for|guard variable for) //' <<<"$name" |
       sed -E -e ':a' -e 's/<[^<>]*>//g' -e 'ta' -e 's/\[abi:[^]]*\]//g' -e 's/\(.*$//')"
  # A function template's demangled name starts with its return type: keep the name.
  case "$q" in *::operator*) ;; *" "*) q="${q##* }" ;; esac
  case "$q" in
    shardkit::*) ;;
    *) fail "not in namespace shardkit" "$name"; continue ;;
  esac
  if grep -qE '^shardkit::(io|tar|formats|pipeline|paths|core|decode|gpu|detail|internal|lmdb|hdf5|wds|folder|testing)::' <<<"$q" ||
     grep -qE 'SetFaultHook|ForTest' <<<"$q"; then
    fail "internal namespace or test hook" "$name"; continue
  fi
  # Every component after shardkit:: must be a name the public headers declare
  # (operators and destructors by their class).
  IFS=':' read -r -a parts <<<"${q#shardkit::}"
  for p in "${parts[@]}"; do
    p="${p#\~}"
    [ -z "$p" ] && continue
    case "$p" in operator*) continue ;; esac
    if ! grep -qxF -- "$p" <<<"$words"; then
      fail "not declared in include/shardkit/" "$name ($p)"; break
    fi
  done
done <<<"$syms"
n="$(wc -l <<<"$syms")"
if [ "$bad" -ne 0 ]; then
  echo "exports_test: $bad of $n exported symbols of $LIB are not the public API"
  exit 1
fi
echo "exports_test: all $n exported symbols of $LIB are the public API"
