#!/usr/bin/env bash
# Remote storage benchmark (issue 14; not a test): the loader over a local HTTP server
# and over s3rver against the same tar shards on local disk, and convert to S3 against
# convert to local disk. Servers are the tests' own (tests/remote_http_server.py,
# s3rver from .npm-deps: scripts/install-s3rver.sh), on loopback.
#   scripts/bench_remote.sh [--count N] [--threads T] [--batches B] [--shards S] [--folder DIR]
# --shards: output shards of every conversion (8); --folder: an existing image folder
# instead of making --count images (e.g. 16 parallel make_corpus.py runs).
# Prints one table: images/s (loader: decode + RandomResizedCrop + normalize, random
# order) and the ratio to local disk; the first epoch from S3 with an empty cache
# (cold) and the next with the cache filled (warm); convert seconds local vs s3://.
# SK: the shardkit binary (default build/tools/shardkit); MAKE_CORPUS as bench_convert.sh;
# PY: a python3 with PIL and numpy (default /usr/bin/python3). Without node (or with
# NO_S3=1) the s3rver rows are left out (the GPU machine has node when .deps is made by
# scripts/device-deps.sh and .npm-deps is carried). UPLOAD_ONLY=1: the
# conversions only (no loader rows); ROUNDS: runs of each shard row, best kept (2);
# LOADER_ROUNDS: further runs of the local, HTTP and warm-cache loader rows (2). Under
# the table: the client's CPU seconds of every timed run, and where strace is installed
# when the first and the last shard were renamed into place.
# HTTP_SERVER=nginx: Debian's nginx serves and takes the PUTs instead of the Python server,
# and a second nginx server shaped like S3 (multipart answered, parts kept as files, never
# assembled, nothing checked) times the S3 upload against a store that is not the limit.
# The servers keep their files (nginx its request bodies too) in /dev/shm when it is
# writable (SERVER_DIR to choose): a remote store does not write to the client's disk,
# and a loopback one on the same disk slows the client's own writes (the upload rows
# would measure the shared disk).
# The upload to S3 is also timed against the tests' Python S3 emulation
# (tests/remote_http_server.py: multipart, Content-MD5 checked), which has no SigV4 check.
set -euo pipefail
cd "$(dirname "$0")/.."
COUNT=2000
THREADS=$(nproc)
BATCHES=0
SHARDS=8
FOLDER=
while [ $# -gt 0 ]; do
  case "$1" in
    --count) COUNT="$2"; shift 2 ;;
    --threads) THREADS="$2"; shift 2 ;;
    --batches) BATCHES="$2"; shift 2 ;;
    --shards) SHARDS="$2"; shift 2 ;;
    --folder) FOLDER="$2"; shift 2 ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
SK=${SK:-build/tools/shardkit}
PY=${PY:-/usr/bin/python3}
S3=1
{ [ -n "${NO_S3:-}" ] || ! command -v node >/dev/null || [ ! -d .npm-deps/node_modules ]; } && S3=0
[ -x "$SK" ] || { echo "build shardkit first (cmake --build build --target shardkit_cli)" >&2; exit 1; }
W=$(mktemp -d "${TMPDIR:-/tmp}/skremote.XXXXXX")
PIDS=()
SD=
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  rm -rf "$W"; case "$SD" in /dev/shm/skremote.*) rm -rf "$SD";; esac
}
trap 'rc=$?; cleanup; exit $rc' EXIT

if [ -n "$FOLDER" ]; then
  ln -s "$(cd "$FOLDER" && pwd)" "$W/imgs"
else
MK="${MAKE_CORPUS:-../shared/corpus/make_corpus.py}"
[ -f "$MK" ] || MK=.corpus/make_corpus.py   # scripts/stage-corpus.sh's copy
[ -f "$MK" ] || { echo "bench_remote: no make_corpus.py (set MAKE_CORPUS, or run scripts/stage-corpus.sh)" >&2; exit 1; }
GEN="$W/gen"; mkdir -p "$GEN/sources"
cp "$MK" "$GEN/make_corpus.py"
find "$(dirname "$MK")/sources" -maxdepth 1 -type f \( -iname '*.png' -o -iname '*.jpg' -o -iname '*.jpeg' \) \
  -exec cp {} "$GEN/sources/" \;
"$PY" "$GEN/make_corpus.py" "$W/imgs" --count "$COUNT" >/dev/null 2>&1
fi
N=$(find -L "$W/imgs" -type f | wc -l)

# Servers on free loopback ports. HTTP_SERVER=nginx: nginx (Debian's nginx-core, with
# its DAV module for PUT) instead of the tests' Python server, to see whether the client
# or the Python server is the limit.
SD=${SERVER_DIR:-}
if [ -z "$SD" ] && [ -w /dev/shm ]; then SD=$(mktemp -d /dev/shm/skremote.XXXXXX); fi
SD=${SD:-$W/srv}
mkdir -p "$SD"
ln -s "$SD/http" "$W/http"
mkdir -p "$SD/http" "$W/s3data" "$SD/s3emu/test"
if [ "${HTTP_SERVER:-python}" = nginx ]; then
  NGX=$(command -v nginx || { [ -x /opt/deps/usr/sbin/nginx ] && echo /opt/deps/usr/sbin/nginx; } || echo /usr/sbin/nginx)
  # Two free ports (both bound at once, so they differ).
  read -r PORT PORT2 < <("$PY" -c 'import socket
s = [socket.socket() for _ in range(2)]
for x in s: x.bind(("127.0.0.1", 0))
print(*(x.getsockname()[1] for x in s))')
  mkdir -p "$SD/s3ngx/test"
  mkdir -p "$W/ngx"
  cat >"$W/ngx/nginx.conf" <<NGX
daemon off; worker_processes auto; user root; pid $W/ngx/nginx.pid; error_log $W/ngx/error.log;
events { worker_connections 4096; }
http {
  access_log off; client_body_temp_path $SD/ngx-body; proxy_temp_path $W/ngx/proxy;
  fastcgi_temp_path $W/ngx/fcgi; uwsgi_temp_path $W/ngx/uwsgi; scgi_temp_path $W/ngx/scgi;
  client_max_body_size 0; sendfile on; keepalive_requests 100000;
  server { listen 127.0.0.1:$PORT; root $SD/http; dav_methods PUT DELETE; create_full_put_path on; }
  # S3-shaped, for the upload rows only: a store that is not the limit. It answers
  # multipart's initiate, complete and abort itself, keeps each part as a file and never
  # assembles them (S3 does that on its own machines); no signature or Content-MD5 check.
  server {
    listen 127.0.0.1:$PORT2; root $SD/s3ngx;
    location / {
      set \$op "\$request_method \$args";
      if (\$op ~ "^POST uploads") { return 200 '<InitiateMultipartUploadResult><UploadId>u</UploadId></InitiateMultipartUploadResult>'; }
      if (\$op ~ "^POST uploadId=") { return 200 '<CompleteMultipartUploadResult></CompleteMultipartUploadResult>'; }
      if (\$op ~ "^DELETE uploadId=") { return 204; }
      if (\$op ~ "^PUT partNumber=") { rewrite ^ /.parts\$uri.\$arg_partNumber break; }
      dav_methods PUT DELETE; create_full_put_path on;
      add_header ETag '"e"' always;
    }
  }
}
NGX
  [ "$(id -u)" = 0 ] || sed -i "s/ user root;//" "$W/ngx/nginx.conf"  # workers run as us
  "$NGX" -c "$W/ngx/nginx.conf" -p "$W/ngx" -e "$W/ngx/error.log" >/dev/null 2>&1 &
  PIDS+=($!)
  echo "$PORT" >"$W/http.port"
  HTTP_NAME="http (nginx)"
else
  "$PY" tests/remote_http_server.py --root "$W/http" --port-file "$W/http.port" >/dev/null 2>&1 &
  PIDS+=($!)
  HTTP_NAME="http (python server)"
fi
if [ $S3 = 1 ]; then
  NODE_PATH=.npm-deps/node_modules node --openssl-legacy-provider tests/s3rver_launch.js "$W/s3data" "$W/s3.port" \
    >/dev/null 2>&1 &
  PIDS+=($!)
else
  echo 0 >"$W/s3.port"
fi
"$PY" tests/remote_http_server.py --root "$SD/s3emu" --port-file "$W/s3emu.port" >/dev/null 2>&1 &
PIDS+=($!)
for f in http.port s3.port s3emu.port; do for _ in $(seq 200); do [ -s "$W/$f" ] && break; sleep 0.1; done; done
HTTP="http://127.0.0.1:$(cat "$W/http.port")"
export AWS_ENDPOINT_URL="http://127.0.0.1:$(cat "$W/s3.port")" AWS_ACCESS_KEY_ID=S3RVER \
  AWS_SECRET_ACCESS_KEY=S3RVER AWS_REGION=us-east-1 SHARDKIT_STAGING_DIR="$W/staging"

# Wall seconds of a command; its CPU seconds (user, system: the client's, not a server's)
# go to $W/cpu.log, printed under the table.
secs() {
  local t0 t1 tm
  t0=$(date +%s.%N)
  tm=$( { TIMEFORMAT="%U %S"; time "$@" >"$W/log" 2>&1; } 2>&1 ) || { echo "FAILED: $* ($(tail -1 "$W/log"))" >&2; exit 1; }
  t1=$(date +%s.%N)
  awk -v w="$(awk "BEGIN{print $t1 - $t0}")" -v c="$tm" -v what="${*//$W\//}" \
    'BEGIN{split(c, a, " "); n = length(what); if (n > 64) what = substr(what, n - 63)
           printf "%-64s wall %6.2f user %6.2f sys %6.2f\n", what, w, a[1], a[2]}' >>"$W/cpu.log"
  awk "BEGIN{printf \"%.2f\", $t1 - $t0}"
}
min() { awk "BEGIN{print ($1 < $2) ? $1 : $2}"; }
# ROUNDS (default 2) rounds in alternating order, the best of each (the first run also
# warms the page cache; the disk's time varies from run to run).
# With nginx: also shard to s3:// against its S3-shaped server (above), in the same rounds.
ngs3() { AWS_ENDPOINT_URL="http://127.0.0.1:$PORT2" "$@"; }
T_NGS3=-
T_LOCAL=$(secs "$SK" shard "$W/imgs" "$W/local/ds-%06d.tar" --num-shards "$SHARDS")
T_HTTP=$(secs "$SK" shard "$W/imgs" "$HTTP/up/ds-%06d.tar" --num-shards "$SHARDS")
[ "${HTTP_SERVER:-python}" = nginx ] && T_NGS3=$(ngs3 secs "$SK" shard "$W/imgs" "s3://test/n/ds-%06d.tar" --num-shards "$SHARDS")
for _ in $(seq 2 "${ROUNDS:-2}"); do
  [ "${HTTP_SERVER:-python}" = nginx ] &&
    T_NGS3=$(min "$T_NGS3" "$(ngs3 secs "$SK" shard "$W/imgs" "s3://test/n/ds-%06d.tar" --num-shards "$SHARDS" --overwrite)")
  T_HTTP=$(min "$T_HTTP" "$(secs "$SK" shard "$W/imgs" "$HTTP/up/ds-%06d.tar" --num-shards "$SHARDS" --overwrite)")
  T_LOCAL=$(min "$T_LOCAL" "$(secs "$SK" shard "$W/imgs" "$W/local/ds-%06d.tar" --num-shards "$SHARDS" --overwrite)")
done
# S3 (multipart parts in parallel, Content-MD5 each) against the Python S3 emulation.
emu() { AWS_ENDPOINT_URL="http://127.0.0.1:$(cat "$W/s3emu.port")" "$@"; }
T_EMU=$(emu secs "$SK" shard "$W/imgs" "s3://test/e/ds-%06d.tar" --num-shards "$SHARDS")
T_EMU=$(min "$T_EMU" "$(emu secs "$SK" shard "$W/imgs" "s3://test/e/ds-%06d.tar" --num-shards "$SHARDS" --overwrite)")
# The HTTP server's ceiling: the same finished shards PUT by curl, 8 at once, nothing else to do.
T_CURLPUT=- T_EMUPUT=-
curl_put() { secs bash -c "ls '$W/local'/*.tar | xargs -P 8 -I{} curl -sf -T {} '$1'"; }
if command -v curl >/dev/null; then
  T_CURLPUT=$(curl_put "$HTTP/curl/")
  # The emulation's own floor: the same shards as single PUTs (no multipart), 8 at once.
  T_EMUPUT=$(curl_put "http://127.0.0.1:$(cat "$W/s3emu.port")/test/curl/")
fi
T_S3=- T_PUT=-
if [ $S3 = 1 ]; then
T_S3=$(secs "$SK" shard "$W/imgs" "s3://test/ds/ds-%06d.tar" --num-shards "$SHARDS")
# The store's own ceiling: the same files PUT by boto3 (4 threads, as shardkit's uploader),
# with nothing else to do; shard to s3:// cannot beat max(shard to local, this).
# (Where Debian's python3-boto3 is installed; the GPU machine has none.)
/usr/bin/python3 -c "import boto3" 2>/dev/null && T_PUT=$(secs /usr/bin/python3 -c '
import boto3, os, sys
from concurrent.futures import ThreadPoolExecutor
d = sys.argv[1]
s3 = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"], region_name="us-east-1")
def put(n):
    with open(os.path.join(d, n), "rb") as f:
        s3.put_object(Bucket="test", Key="raw/" + n, Body=f.read())
with ThreadPoolExecutor(4) as ex:
    list(ex.map(put, sorted(os.listdir(d))))
' "$W/local")
fi
# Where a conversion's wall time goes (strace, where installed): seconds from the start to
# the first and the last shard's rename into place, and to the exit.
TIMELINES=()
if command -v strace >/dev/null; then
  timeline() {
    local out=$1; shift
    strace -f -tt -e trace=execve,rename,renameat,renameat2,exit_group -o "$W/strace" "$@" >/dev/null 2>&1
    awk -v what="$out" '/execve/ && !t0 {t0 = $2} /\.tar\.tmp-/ && /rename/ {if (!first) first = $2; last = $2}
      /exit_group/ {end = $2}
      function s(t, a) {split(t, a, ":"); return a[1] * 3600 + a[2] * 60 + a[3]}
      END {printf "%-12s first shard %.2f s, last shard %.2f s, exit %.2f s (under strace)\n", what,
           s(first) - s(t0), s(last) - s(t0), s(end) - s(t0)}' "$W/strace"
  }
  TIMELINES+=("$(timeline local "$SK" shard "$W/imgs" "$W/local/ds-%06d.tar" --num-shards "$SHARDS" --overwrite)")
  TIMELINES+=("$(timeline http "$SK" shard "$W/imgs" "$HTTP/up/ds-%06d.tar" --num-shards "$SHARDS" --overwrite)")
fi
cp "$W"/local/* "$W/http/"
if [ -n "${UPLOAD_ONLY:-}" ]; then  # the conversions only: no loader rows
  L=- H=- S3RANGE=- S3COLD=- S3WARM=-
else

BB=()
[ "$BATCHES" -gt 0 ] && BB=(--batches "$BATCHES")
# CPU ticks used so far by the HTTP server's processes (nginx only: the Python server
# shares its name with other processes).
TICK=$(getconf CLK_TCK 2>/dev/null || echo 100)
srv_ticks() {
  local t=0 f c a
  [ "${HTTP_SERVER:-python}" = nginx ] || { echo 0; return; }
  for f in /proc/[0-9]*; do
    c=$(cat "$f/comm" 2>/dev/null) || continue
    [ "$c" = nginx ] || continue
    read -r -a a <"$f/stat" 2>/dev/null || continue
    t=$((t + a[13] + a[14]))
  done
  echo "$t"
}
ips() {  # images/s of one `bench --loader` run; TAG's images and CPU go to $W/cpu-TAG
  local tag=$1 s0 s1 tm
  shift
  s0=$(srv_ticks)
  tm=$( { TIMEFORMAT="%U %S"; time "$SK" bench --loader "$@" --threads "$THREADS" --batch-size 64 "${BB[@]}" --json \
          >"$W/ips.json" 2>"$W/err"; } 2>&1 ) || { echo "FAILED: bench --loader $* ($(tail -1 "$W/err"))" >&2; exit 1; }
  s1=$(srv_ticks)
  "$PY" -c 'import json,sys
r = json.load(open(sys.argv[1]))["rows"][0]
u, s = map(float, sys.argv[2].split())
open(sys.argv[4], "a").write("%d %.3f %.3f\n" % (r["images"], u + s, int(sys.argv[3]) / float(sys.argv[5])))
print(round(r["images_per_s"]))' "$W/ips.json" "$tm" "$((s1 - s0))" "$W/cpu-$tag" "$TICK"
}
"$SK" bench --loader "$W/local/ds.manifest.json" --threads "$THREADS" --batch-size 64 --batches 2 >/dev/null 2>&1 || true
max() { awk "BEGIN{print ($1 > $2) ? $1 : $2}"; }
# LOADER_ROUNDS (2) rounds in alternating order, the best of each: a loaded machine drifts,
# and a run of 200 batches lasts about a second on 16 cores (--batches N for longer runs).
L=$(ips local "$W/local/ds.manifest.json")
H=$(ips http "$HTTP/ds.manifest.json")
S3RANGE=- S3COLD=- S3WARM=-
if [ $S3 = 1 ]; then
S3RANGE=$(ips s3range "s3://test/ds/ds.manifest.json")
S3COLD=$(ips s3cold "s3://test/ds/ds.manifest.json" --cache-dir "$W/cache")
S3WARM=0
fi
for _ in $(seq "${LOADER_ROUNDS:-2}"); do
  [ $S3 = 1 ] && S3WARM=$(max "$S3WARM" "$(ips s3warm "s3://test/ds/ds.manifest.json" --cache-dir "$W/cache")")
  H=$(max "$H" "$(ips http "$HTTP/ds.manifest.json")")
  L=$(max "$L" "$(ips local "$W/local/ds.manifest.json")")
done
[ $S3 = 1 ] && S3RANGE=$(max "$S3RANGE" "$(ips s3range "s3://test/ds/ds.manifest.json")")
fi
r() { [ "$1" = - ] || [ "$2" = - ] && { echo -; return; }; awk "BEGIN{printf \"%.2f\", $1 / $2}"; }
echo "remote storage, $N images in $SHARDS shards ($(du -sm "$W/local" | cut -f1) MB), $THREADS threads, loopback servers"
printf "%-44s %12s %8s\n" "loader (random order, decode+crop; best run)" "images/s" "ratio"
printf "%-44s %12s %8s\n" "local disk" "$L" "1.00"
printf "%-44s %12s %8s\n" "$HTTP_NAME, range requests" "$H" "$(r "$H" "$L")"
printf "%-44s %12s %8s\n" "s3rver, range requests, no cache" "$S3RANGE" "$(r "$S3RANGE" "$L")"
printf "%-44s %12s %8s\n" "s3rver, --cache-dir, cold (first epoch)" "$S3COLD" "$(r "$S3COLD" "$L")"
printf "%-44s %12s %8s\n" "s3rver, --cache-dir, warm" "$S3WARM" "$(r "$S3WARM" "$L")"
printf "%-44s %12s %8s\n" "shard to local disk (s)" "$T_LOCAL" "1.00"
printf "%-44s %12s %8s\n" "shard to $HTTP_NAME PUT (s)" "$T_HTTP" "$(r "$T_LOCAL" "$T_HTTP")"
printf "%-44s %12s %8s\n" "server ceiling: curl PUT of the shards (s)" "$T_CURLPUT" "$(r "$T_LOCAL" "$T_CURLPUT")"
printf "%-44s %12s %8s\n" "shard to s3:// (S3-shaped nginx) (s)" "$T_NGS3" "$(r "$T_LOCAL" "$T_NGS3")"
printf "%-44s %12s %8s\n" "shard to s3:// (Python S3 emulation) (s)" "$T_EMU" "$(r "$T_LOCAL" "$T_EMU")"
printf "%-44s %12s %8s\n" "emulation ceiling: curl PUT of the shards (s)" "$T_EMUPUT" "$(r "$T_LOCAL" "$T_EMUPUT")"
printf "%-44s %12s %8s\n" "shard to s3:// (s; ratio = speed vs local)" "$T_S3" "$(r "$T_LOCAL" "$T_S3")"
printf "%-44s %12s %8s\n" "store ceiling: boto3 PUT of the same files (s)" "$T_PUT" "$(r "$T_LOCAL" "$T_PUT")"
# The loader's CPU per image, all runs of a row: the client's, and the HTTP server's (nginx).
# With every core decoding, the HTTP row cannot beat local x (client local) / (client
# HTTP + server): the server and the loopback copies take their CPU from the decoders.
if [ -s "$W/cpu-local" ]; then
  echo "loader CPU per image, microseconds (client; + server where it is nginx):"
  for t in local http s3range s3cold s3warm; do
    [ -s "$W/cpu-$t" ] && awk -v t="$t" '{n += $1; c += $2; s += $3} END {printf "  %-8s client %6.0f  server %5.0f\n", t, c / n * 1e6, s / n * 1e6}' "$W/cpu-$t"
  done
  if [ -s "$W/cpu-http" ] && [ "${HTTP_SERVER:-python}" = nginx ]; then
    cat "$W/cpu-local" "$W/cpu-http" | awk -v nl="$(wc -l <"$W/cpu-local")" \
      'NR <= nl {n1 += $1; c1 += $2; next} {n2 += $1; c2 += $2 + $3}
       END {printf "  CPU-bound limit of the HTTP ratio (local / (client + server)): %.2f\n", (c1 / n1) / (c2 / n2)}'
  fi
fi
echo "client CPU seconds of each timed run (bash's time; servers not included):"
cat "$W/cpu.log"
for t in "${TIMELINES[@]}"; do echo "$t"; done
