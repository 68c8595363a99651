#!/usr/bin/env bash
# The floors of lib/ include only downwards (docs/architecture.md, "Layers"):
#   core <- io <- formats <- pipeline <- gpu, and decode (on core) below pipeline;
# the command (tools/), the Python module and the benchmarks in bench/ use no format's
# internals (a format's benchmarks of its internals live in lib/formats/<name>/bench/).
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
  done < <(grep -rn '^#include "[a-z_]*/' "$dir" --include='*.h' --include='*.cc' --include='*.cu' --include='*.cuh' |
    grep -v "^lib/formats/[a-z_0-9]*/bench/" || true)
}
check lib/core core
check lib/io core io
check lib/decode core decode
check lib/formats core io formats
check lib/pipeline core io decode formats pipeline
check lib/gpu core io decode formats pipeline gpu
check tools core io pipeline
check python/src core io pipeline
check bench core io decode pipeline gpu
# A format's benchmarks of its own internals (programs, not library code) may also use the
# plan, as tests do.
for d in lib/formats/*/bench; do
  [ -d "$d" ] && check "$d" core io formats pipeline
done
# lib/io is the only floor that touches files: the formats go through the storage seam
# (io/any_file.h, io/file.h, shardkit/filesystem.h). The exceptions are the LMDB and HDF5
# folders, whose libraries open a local path (which they get from the seam).
posix='::(open|openat|access|flock|unlink|unlinkat|mkdir|rmdir|rename|stat|lstat|fstat|fstatat|opendir|readdir|pread|pwrite|ftruncate|fsync|fdatasync|truncate)\(|std::filesystem::|<dirent\.h>|<sys/stat\.h>'
while IFS= read -r hit; do
  echo "layering: a file call outside lib/io (use the storage seam): $hit"
  fail=1
done < <(grep -rnE "$posix" lib/formats lib/pipeline --include='*.h' --include='*.cc' | grep -vE '^lib/formats/(lmdb|hdf5)/|^lib/formats/[a-z_0-9]*/bench/' || true)
[ $fail -eq 0 ] && echo "layering: lib/ includes only downwards; tools/, python/src/ and bench/ use no format internals; only lib/io (and the LMDB/HDF5 adapters) call the file system"
exit $fail
