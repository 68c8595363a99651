#!/usr/bin/env bash
# The GPU feed on the GPU machine (issue 7): configure with CUDA, build, run the GPU tests,
# compute-sanitizer on them, and the benchmark with its peers; a short table last.
#
# Run from the repo root on the GPU machine, with .deps/ carried along (made here by
# scripts/device-deps.sh):
#   bash scripts/device_gpu.sh [all|quick|build|test|sanitize|bench|profile|loader|final|read]   (default: all)
# loader = the CPU reader vs the DataLoader (issue 6); final = build + test + loader;
# read = `shardkit bench` random reads at 1..16 threads, warm and cold (issue 5).
# quick = build + test + bench (no sanitizer): the default when called from
# scripts/device_bench.sh, which passes BUILD (build dir), WORK ($WORK/imgs: its corpus)
# and OUT.
# `all` may take longer than one 10-minute device call: run build, test, sanitize and
# bench as four calls (build-gpu/ and .bench/ are git-ignored and stay on the machine).
# Each stage builds what it needs first (in $BUILD, default build-gpu/). Logs and JSON results are written
# to $OUT (as gpu_*) when it is set, else to $BUILD/out; the corpus is made once, in .bench/
# (or taken from $WORK/imgs).
set -uo pipefail
stage=${1:-${WORK:+quick}}
stage=${stage:-all}
cd "$(dirname "$0")/.."
B=${BUILD:-build-gpu}
if [ -n "${WORK:-}" ] && [ -d "$WORK/imgs" ]; then
  corpus=${CORPUS:-$WORK/imgs}                # device_bench.sh's corpus
else
  corpus=${CORPUS:-$PWD/.bench/gpu_corpus}    # .bench/ is git-ignored: kept between runs
fi
mkdir -p "$(dirname "$corpus")"
if [[ "${CMAKE_PREFIX_PATH:-}" == */opt/deps/* ]]; then
  :  # already unpacked by the caller (scripts/device_bench.sh)
elif [ -f .deps/unpack.sh ]; then
  # shellcheck disable=SC1091
  source .deps/unpack.sh
else
  echo "device_gpu: .deps/unpack.sh missing (run scripts/device-deps.sh here and carry .deps)" >&2
fi
export PATH=/usr/local/cuda/bin:$PATH
OUTDIR=${OUT:-$B/out}
mkdir -p "$OUTDIR"
J=$(nproc)
T0=$(date +%s)
say() { echo "== device_gpu [$(( $(date +%s) - T0 ))s] $*"; }

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tee "$OUTDIR/gpu_device.txt"
nvcc --version | tail -1 | tee -a "$OUTDIR/gpu_device.txt"

build() {
  say "configure"
  cmake -S . -B "$B" -DSHARDKIT_WITH_CUDA=ON -DSHARDKIT_WITH_REMOTE=OFF -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
    > "$OUTDIR/gpu_configure.log" 2>&1 || { tail -40 "$OUTDIR/gpu_configure.log"; return 1; }
  grep -A30 "shardkit:" "$OUTDIR/gpu_configure.log" | grep -v "^--" | head -60
  say "build"
  cmake --build "$B" -j"$J" --target shardkit test_gpu shardkit_gpu_bench > "$OUTDIR/gpu_build.log" 2>&1 \
    || { grep -E "error|Error" -A5 "$OUTDIR/gpu_build.log" | head -60; return 1; }
  say "built"
}

gtests() {
  say "GPU tests"
  corpus || echo "device_gpu: no corpus; the corpus test will skip"
  SHARDKIT_CORPUS=$corpus $B/tests/test_gpu --durations yes > "$OUTDIR/gpu_tests.log" 2>&1
  local rc=$?
  grep -E "warning:|SKIPPED|nvJPEG vs|failed|passed|^[0-9.]+ s:" -A2 "$OUTDIR/gpu_tests.log" | head -80
  grep -E "FAILED" -B3 -A10 "$OUTDIR/gpu_tests.log" | head -60
  return $rc
}

sanitize() {
  say "compute-sanitizer memcheck"
  local cs
  cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  local rc=0
  # Every GPU test but [nosan]: memory flatness (the sanitizer's own allocations move it)
  # and the 8000-image corpus (too slow under memcheck).
  timeout 330 "$cs" --tool memcheck --leak-check full --error-exitcode 97 \
    $B/tests/test_gpu "~[nosan]" > "$OUTDIR/gpu_memcheck.log" 2>&1 || rc=$?
  tail -8 "$OUTDIR/gpu_memcheck.log"
  # initcheck: no kernel reads device memory nothing wrote (staging, weights, pixels).
  # Only tests without nvJPEG: writes by the JPEG engines may be invisible to it.
  say "compute-sanitizer initcheck (copy path, host-decoded GPU path)"
  timeout 120 "$cs" --tool initcheck --error-exitcode 97 \
    $B/tests/test_gpu "copy path*" > "$OUTDIR/gpu_initcheck_copy.log" 2>&1 || rc=$?
  tail -4 "$OUTDIR/gpu_initcheck_copy.log"
  timeout 120 "$cs" --tool initcheck --error-exitcode 97 \
    $B/tests/test_gpu "GPU decode with every image on the host decoder*" > "$OUTDIR/gpu_initcheck_host.log" 2>&1 || rc=$?
  tail -4 "$OUTDIR/gpu_initcheck_host.log"
  return $rc
}

corpus() {
  if [ ! -d "$corpus" ]; then
    say "corpus (16 x 500 images)"
    local py=python3 mk=""
    [ -x /usr/bin/python3 ] && /usr/bin/python3 -c "import PIL, numpy" 2>/dev/null && py=/usr/bin/python3
    for c in "${CORPUS_SCRIPT:-}" ../shared/corpus/make_corpus.py shared/corpus/make_corpus.py .corpus/make_corpus.py; do
      [ -n "$c" ] && [ -f "$c" ] && { mk=$c; break; }
    done
    [ -n "$mk" ] || { echo "device_gpu: make_corpus.py not found (set CORPUS_SCRIPT, or carry ../shared/corpus as .corpus)"; return 1; }
    # make_corpus.py opens every file of its sources/ (SOURCES.md too): run a copy of it
    # beside the images only.
    local tmp
    tmp=$(mktemp -d)
    cp "$mk" "$tmp/" && mkdir -p "$tmp/sources"
    find "$(dirname "$mk")/sources" -maxdepth 1 -type f \( -iname '*.png' -o -iname '*.jpg' -o -iname '*.jpeg' \) \
      -exec cp {} "$tmp/sources/" \;
    rm -rf "$corpus.part"
    # 16 seeds x 500 images in parallel (one 8000-image run takes ~4 minutes there).
    local k fail=0
    for k in $(seq 0 15); do
      $py "$tmp/make_corpus.py" "$corpus.part" --count 500 --seed "$k" > "$tmp/corpus.$k.log" 2>&1 &
    done
    for k in $(seq 0 15); do wait -n || fail=1; done
    cat "$tmp"/corpus.*.log > "$OUTDIR/gpu_corpus.log"
    [ "$fail" = 0 ] || { echo "device_gpu: cannot make the corpus"; tail "$OUTDIR/gpu_corpus.log"; return 1; }
    echo "device_gpu: corpus $(find "$corpus.part" -type f | wc -l) images"
    mv "$corpus.part" "$corpus"
  fi
}

bench() {
  corpus || return 1
  say "shardkit_gpu_bench"
  $B/lib/shardkit_gpu_bench "$corpus" --batch 256 --epochs 2 > "$OUTDIR/gpu_bench_shardkit.jsonl" 2> "$OUTDIR/gpu_bench_shardkit.err"
  cat "$OUTDIR/gpu_bench_shardkit.err"
  say "peers (torchvision GPU decode, DataLoader)"
  python3 scripts/bench_gpu_peer.py "$corpus" --batch 256 --epochs 2 --workers $(( J > 1 ? J - 1 : 1 )) > "$OUTDIR/gpu_bench_peers.jsonl" \
    2> "$OUTDIR/gpu_bench_peers.err"
  tail -3 "$OUTDIR/gpu_bench_peers.err"
  python3 - "$OUTDIR/gpu_bench_shardkit.jsonl" "$OUTDIR/gpu_bench_peers.jsonl" "$OUTDIR/gpu_device.txt" <<'PY'
import json, sys
rows = []
for f in sys.argv[1:3]:
    for line in open(f):
        line = line.strip()
        if line.startswith("{"):
            rows.append(json.loads(line))
rate = {}
for r in rows:
    if "images_per_s" in r:
        key = r["mode"] + (f"(step {r['consumer_step_ms']:.0f}ms)" if "consumer_step_ms" in r else "")
        rate[key] = r
dl = next((r["images_per_s"] for r in rows if r["mode"] == "dataloader" and "images_per_s" in r), None)
tv = next((r["images_per_s"] for r in rows if r["mode"] == "torchvision_gpu_decode" and "images_per_s" in r), None)
print()
print("GPU:", open(sys.argv[3]).read().strip().replace("\n", " | "))
print(f"{'mode':34s} {'images/s':>10s} {'x DataLoader':>13s} {'x torchvision':>14s}  notes")
for k, r in rate.items():
    ips = r["images_per_s"]
    a = f"{ips / dl:.2f}" if dl else "-"
    b = f"{ips / tv:.2f}" if tv else "-"
    notes = []
    if "consumer_wait_pct" in r: notes.append(f"consumer wait {r['consumer_wait_pct']:.2f}%, x cpu_loader {r['vs_cpu_loader']:.3f}, x ideal {r['vs_ideal']:.3f}")
    if "hardware" in r: notes.append(f"hw {r['hardware']} cuda {r['cuda']} host {r['host']} roi {r['roi']}")
    if "skipped" in r: notes.append(f"skipped {r['skipped']} (CMYK/PNG)")
    print(f"{k:34s} {ips:10.1f} {a:>13s} {b:>14s}  {'; '.join(notes)}")
for r in rows:
    if "error" in r or ("skipped" in r and "images_per_s" not in r):
        print(f"{r['mode']:34s} {'-':>10s}  {r.get('error', r.get('skipped'))}")
# The goals of issue 7.
cp = [r for r in rows if r["mode"] == "copy_path" and "images_per_s" in r]
gd = next((r for r in rows if r["mode"] == "gpu_decode" and "images_per_s" in r), None)
goals = []
if len(cp) >= 3:
    goals.append(("copy path, consumer 0.5x: rate / CPU loader >= 0.98", cp[1]["vs_cpu_loader"], cp[1]["vs_cpu_loader"] >= 0.98))
    goals.append(("copy path, consumer 1.5x: consumer wait % < 2", cp[2]["consumer_wait_pct"], cp[2]["consumer_wait_pct"] < 2))
if gd and dl:
    goals.append(("gpu decode / DataLoader >= 10", gd["images_per_s"] / dl, gd["images_per_s"] / dl >= 10))
if gd and tv:
    goals.append(("gpu decode / torchvision GPU decode >= 2", gd["images_per_s"] / tv, gd["images_per_s"] / tv >= 2))
print()
for name, v, ok in goals:
    print(f"goal: {name:55s} {v:8.3f}  {'met' if ok else 'NOT met'}")
PY
}

# Where the GPU decode path's time goes (shardkit_gpu_bench --profile: GpuLoader::profile()),
# GPU decode modes only; PROFILE_ARGS adds shardkit_gpu_bench arguments (e.g. "--threads 8");
# HW_LOADS lists the --hw-load values (GpuOptions::hardware_load) to run (default "1").
profile() {
  corpus || return 1
  local l
  for l in ${HW_LOADS:-1}; do
    say "shardkit_gpu_bench --modes gpu --profile --hw-load $l"
    $B/lib/shardkit_gpu_bench "$corpus" --batch 256 --epochs 2 --modes gpu --profile --hw-load "$l" \
      ${PROFILE_ARGS:-} 2>&1 | tee -a "$OUTDIR/gpu_profile.txt"
  done
}

# The CPU streaming reader against the DataLoader (issue 6), on tar shards of the corpus:
# single-thread ratio and scaling (sk_loader_bench), `shardkit bench --loader`, the peer.
loaderbench() {
  corpus || return 1
  say "build shardkit_cli sk_loader_bench"
  cmake --build "$B" -j"$J" --target shardkit_cli sk_loader_bench > "$OUTDIR/loader_build.log" 2>&1 \
    || { grep -E "error" -A5 "$OUTDIR/loader_build.log" | head -40; return 1; }
  local S=$B/tools/shardkit W
  W=$(dirname "$corpus")/wds
  [ -f "$W/train.manifest.json" ] || $S convert "$corpus" "wds:$W/train-%06d.tar" --shard-size 64MB > /dev/null || return 1
  say "sk_loader_bench"
  "$B/bench/sk_loader_bench" "$W/train.manifest.json" --threads "$J" --repeat 1 2>&1 | tee "$OUTDIR/loader.txt" \
    | grep -E "images/s|ratio|efficiency" | head -12
  say "shardkit bench --loader; DataLoader peer"
  $S bench "$W/train.manifest.json" --loader --threads "$J" --batch-size 256 --batches 120 | tee "$OUTDIR/loader-bench.txt" | tail -3
  python3 scripts/bench_loader_peer.py "$corpus" --workers $(( J > 1 ? J - 1 : 1 )) --batch 256 --epochs 3 \
    > "$OUTDIR/peer.txt" 2>&1
  grep -E "images/s" "$OUTDIR/peer.txt" | tail -1
}

# Random-read latency and throughput (issue 5) on the corpus in its four formats: warm at
# 1..16 threads (views and copies, with the memcpy and in-memory floors), then cold.
readbench() {
  corpus || return 1
  say "build shardkit_cli"
  cmake --build "$B" -j"$J" --target shardkit_cli > "$OUTDIR/read_build.log" 2>&1 \
    || { grep -E "error" -A5 "$OUTDIR/read_build.log" | head -40; return 1; }
  local S=$B/tools/shardkit R n
  R=$(dirname "$corpus")/read
  mkdir -p "$R"
  [ -f "$R/w/t.manifest.json" ] || $S convert "$corpus" "wds:$R/w/t-%06d.tar" --shard-size 64MB > /dev/null || return 1
  [ -d "$R/t.lmdb" ] || $S convert "$corpus" "lmdb:$R/t.lmdb" > /dev/null || return 1
  [ -f "$R/t.h5" ] || $S convert "$corpus" "$R/t.h5" > /dev/null || return 1
  n=$(find "$corpus" -type f | wc -l)
  local DS=("$corpus" "$R/w/t.manifest.json" "$R/t.lmdb" "$R/t.h5")
  # 20x the corpus per pass: a view takes ~0.5 us, and a pass of one corpus at 16 threads
  # (8 slices of 62 reads per worker) would be as short as the workers' start/end skew.
  say "shardkit bench, warm, 1..16 threads ($(( n * 20 )) samples per pass)"
  $S bench "${DS[@]}" --threads 1,2,4,8,16 --samples "$(( n * 20 ))" --json > "$OUTDIR/read_warm.json" 2> "$OUTDIR/read_warm.err" || return 1
  say "shardkit bench, cold, 1 and 16 threads"
  $S bench "${DS[@]}" --cold --threads 1,16 --samples 4000 --no-floor > "$OUTDIR/read_cold.txt" 2>&1 || return 1
  python3 - "$OUTDIR/read_warm.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
rate, p50 = {}, {}
for row in r["rows"]:
    d = row["dataset"]
    k = (("memory:" if d.startswith("memory:") else "") + d.split("/")[-1], row["mode"])
    rate[k + (row["threads"],)] = row["samples_per_s"]
    if row["threads"] == 1: p50[k] = row["latency_us"]["p50"]
ths = sorted({t for (_, _, t) in rate})
print(f"{'dataset':24s} {'mode':12s} {'p50@1 us':>9s} " + " ".join(f"{'eff@'+str(t):>8s}" for t in ths if t > 1) + f" {'samples/s@'+str(ths[-1]):>14s}")
for k in sorted(p50):
    one = rate.get(k + (1,))
    effs = " ".join(f"{rate[k + (t,)] / (t * one):8.2f}" if one and k + (t,) in rate else f"{'-':>8s}" for t in ths if t > 1)
    print(f"{k[0]:24s} {k[1]:12s} {p50[k]:9.2f} {effs} {rate.get(k + (ths[-1],), 0):14.0f}")
PY
  grep -E "random-(view|copy) +(1|16) " "$OUTDIR/read_cold.txt" | head -20
}

rc=0
case "$stage" in
  read) build && readbench || rc=1 ;;
  loader) build && loaderbench || rc=1 ;;
  final)
    build || exit 1
    gtests || rc=1
    loaderbench || rc=1
    ;;
  profile) build && profile || rc=1 ;;
  build) build || rc=1 ;;
  test) build && gtests || rc=1 ;;
  sanitize) build && sanitize || rc=1 ;;
  bench) build && bench || rc=1 ;;
  quick)
    build || exit 1
    gtests || rc=1
    bench || rc=1
    echo "device_gpu: compute-sanitizer not run in quick mode: scripts/device_gpu.sh sanitize"
    ;;
  all)
    build || exit 1
    gtests || rc=1
    sanitize || rc=1
    bench || rc=1
    ;;
  *) echo "usage: $0 [all|quick|build|test|sanitize|bench|profile|loader|final|read]"; exit 2 ;;
esac
say "done rc=$rc"
exit $rc
