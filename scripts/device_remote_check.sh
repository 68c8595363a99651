#!/usr/bin/env bash
# For the GPU machine: does `shardkit bench --loader` still crash with the remote client
# linked in (SHARDKIT_WITH_REMOTE=ON, docs/remote.md "Building it")? Builds both ways,
# runs the same small loader benchmark with each, and on a crash prints the backtrace
# (gdb, when there) and the libraries the binary resolves, flagging any soname that
# two different directories provide (e.g. a carried Debian libssl/libz/libzstd beside
# the machine's own, which the machine's libcurl.so.4 was built against).
#
# There:   source .deps/unpack.sh && scripts/device_remote_check.sh      (carry .deps and .corpus)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/skout}
mkdir -p "$OUT"
NPROC=$(nproc)
W=${WORK:-/tmp/skremote}
rm -rf "$W" && mkdir -p "$W"
python3 .corpus/make_corpus.py "$W/imgs" --count 400 >/dev/null 2>&1 || { echo "no corpus script (.corpus)"; exit 1; }
for remote in ${ONLY:-OFF ON}; do
  B=build-remote-$remote
  cmake -S . -B "$B" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSHARDKIT_WITH_CUDA=OFF -DSHARDKIT_WITH_REMOTE=$remote \
    >"$OUT/cmake-$remote.log" 2>&1 || { tail -20 "$OUT/cmake-$remote.log"; continue; }
  cmake --build "$B" -j "$NPROC" --target shardkit_cli >"$OUT/build-$remote.log" 2>&1 || {
    grep -E "error" -A4 "$OUT/build-$remote.log" | head -30; continue; }
  S="$B/tools/shardkit"
  [ -f "$W/ds.manifest.json" ] || "$S" shard "$W/imgs" "$W/ds-%06d.tar" --num-shards 4 >/dev/null
  "$S" bench --loader "$W/ds.manifest.json" --batches 10 >"$OUT/loader-$remote.txt" 2>&1
  rc=$?
  echo "SHARDKIT_WITH_REMOTE=$remote: bench --loader exit $rc"
  if [ $rc -ge 128 ] || [ $rc -eq 139 ]; then
    if command -v gdb >/dev/null; then
      gdb -q -batch -ex run -ex bt -ex "info sharedlibrary" \
        --args "$S" bench --loader "$W/ds.manifest.json" --batches 10 2>&1 | tail -80
    else
      gcc -O1 -shared -fPIC -o "$W/segv.so" scripts/segv_backtrace.c 2>/dev/null
      LD_PRELOAD=$W/segv.so "$S" bench --loader "$W/ds.manifest.json" --batches 10 2>&1 | grep NATIVE >"$W/bt-all.txt"
      grep "thread created" "$W/bt-all.txt" | sort | uniq -c
      grep -v "thread created" "$W/bt-all.txt" | head -60 >"$W/bt.txt"
      cat "$W/bt.txt"
      # The faulting pc inside libc: the nearest exported symbol below it.
      pc=$(grep -oE 'NATIVE pc [^ ]+ [^ ]*libc\.so\.6\+0x[0-9a-f]+' "$W/bt.txt" | sed 's/.*+//')
      [ -n "$pc" ] && nm -D --defined-only /lib/x86_64-linux-gnu/libc.so.6 | python3 -c "
import sys; o = int('$pc', 16); best = max(((int(a, 16), n) for a, _, n in (l.split()[:3] for l in sys.stdin if len(l.split()) >= 3) if int(a, 16) <= o), default=(0, '?'))
print('  libc pc: %s+0x%x' % (best[1], o - best[0]))"
      # Frames in our own binaries, to function and line (addr2line from binutils).
      if command -v addr2line >/dev/null; then
        grep -oE '([^ ]*(shardkit|libshardkit[^ ]*))\+0x[0-9a-f]+' "$W/bt.txt" | head -30 | while IFS=+ read -r f off; do
          echo "  $f+$off: $(addr2line -f -C -i -e "$f" "$off" 2>/dev/null | paste -sd' ' | cut -c1-300)"
        done
      fi
    fi
    nm -D --defined-only "$S" | wc -l | sed 's/^/  dynamic symbols exported by the tool: /'
    readelf -d "$S" | grep -c 'NEEDED.*libstdc++' | sed 's/^/  libstdc++ NEEDED (0 = static): /'
  fi
  ldd "$S" | awk '{print $1, $3}' | sort >"$OUT/ldd-$remote.txt"
  echo "  libraries resolved from more than one directory (soname clash candidates):"
  ldd "$S" | awk '$3 ~ /^\// {n=$1; sub(/\.so.*/, "", n); print n, $3}' | sort | awk '
    {d=$2; sub(/\/[^\/]*$/, "", d); dirs[$1]=dirs[$1] " " d; c[$1]++}
    END {for (k in c) if (c[k] > 1) print "   ", k, dirs[k]}'
  ldd "$S" | grep -E "ssl|crypto|curl|libz\.|zstd|nghttp|gssapi|ldap" | sed 's/^/    /'
done
