#!/usr/bin/env bash
# The floors of lib/ include only downwards (docs/architecture.md, "Layers"):
#   core <- io <- formats <- pipeline <- gpu, and decode (on core) below pipeline;
# the command (tools/) and the Python module use no format's internals.
#   tests/layering_test.sh SOURCE_DIR
set -euo pipefail
cd "$1"
fail=0
check() {  # DIR ALLOWED-FLOORS...
  local dir="$1"
  shift
  local allowed=" $* "
  while IFS= read -r hit; do
    file="${hit%%:*}"
    floor="$(sed -n 's/.*#include "\([a-z_]*\)\/.*/\1/p' <<<"$hit")"
    case "$floor" in core | io | decode | formats | pipeline | gpu) ;; *) continue ;; esac
    if [[ "$allowed" != *" $floor "* ]]; then
      echo "layering: $file includes from lib/$floor/, which $dir/ may not (allowed: $*)"
      fail=1
    fi
  done < <(grep -rn '^#include "[a-z_]*/' "$dir" --include='*.h' --include='*.cc' --include='*.cu' --include='*.cuh' || true)
}
check lib/core core
check lib/io core io
check lib/decode core decode
check lib/formats core io formats
check lib/pipeline core io decode formats pipeline
check lib/gpu core io decode formats pipeline gpu
check tools core io pipeline
check python/src core io pipeline
[ $fail -eq 0 ] && echo "layering: lib/ includes only downwards; tools/ and python/src/ use no format internals"
exit $fail
