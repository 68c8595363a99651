#!/usr/bin/env bash
# Builds the self-contained wheel (pip wheel --no-build-isolation: the in-tree backend,
# python/build_backend/) and tests it in a fresh virtual environment with the build tree
# moved away (tests/wheel_test.py: DT_NEEDED allow-list, /proc/self/maps, convert + read
# back, the venv's shardkit command); then builds the sdist and checks that it holds
# exactly the tracked files and the version.
#   scripts/test-wheel.sh [BUILD_DIR]      (default: build-pip)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD="${1:-build-pip}"
scripts/install-deps.sh
. scripts/ccache-env.sh
# Debian's interpreter (its pip, venv, build, PIL and pybind11), also where another
# python3 is first on PATH; PYTHON=... picks another.
PY="${PYTHON:-/usr/bin/python3}"
DIST="$(mktemp -d)"
trap 'rm -rf "$DIST"; [ -d "$BUILD.moved" ] && mv "$BUILD.moved" "$BUILD"' EXIT
t0=$(date +%s)
SHARDKIT_BUILD_DIR="$PWD/$BUILD" "$PY" -m pip wheel --no-build-isolation --no-deps \
  --disable-pip-version-check -q -w "$DIST" .
echo "test-wheel: built $(cd "$DIST" && ls) in $(( $(date +%s) - t0 )) s"
mv "$BUILD" "$BUILD.moved"   # nothing of the build tree can be found while the wheel is tested
"$PY" tests/wheel_test.py "$DIST"/shardkit-*.whl
mv "$BUILD.moved" "$BUILD"
"$PY" -m build --sdist --no-isolation -o "$DIST" . >/dev/null
"$PY" - "$DIST" <<'PY'
import glob, re, subprocess, sys, tarfile
sdist = glob.glob(sys.argv[1] + "/shardkit-*.tar.gz")[0]
version = re.search(r"project\(shardkit VERSION ([0-9.]+)", open("CMakeLists.txt").read()).group(1)
base = "shardkit-%s/" % version
names = tarfile.open(sdist).getnames()
tracked = subprocess.run(["git", "ls-files"], check=True, stdout=subprocess.PIPE, text=True).stdout.split()
want = sorted([base + f for f in tracked] + [base + "PKG-INFO"])
if sorted(names) != want:
    extra, missing = sorted(set(names) - set(want)), sorted(set(want) - set(names))
    sys.exit("test-wheel: the sdist %s differs from the tracked files: extra %s, missing %s" % (sdist, extra[:5], missing[:5]))
pkg = tarfile.open(sdist).extractfile(base + "PKG-INFO").read().decode()
if "Version: %s\n" % version not in pkg:
    sys.exit("test-wheel: the sdist's PKG-INFO does not say Version: " + version)
print("test-wheel: sdist %s: %d files, the tracked ones and PKG-INFO" % (sdist.rsplit("/", 1)[-1], len(names)))
PY
