# Sourced by the build scripts (test.sh, test-sanitize.sh, fuzz.sh, demo.sh): compile
# through ccache when it is installed (scripts/install-deps.sh installs it). CMake reads
# CMAKE_<LANG>_COMPILER_LAUNCHER from the environment when a build directory is first
# configured. The cache (~/.cache/ccache, or CCACHE_DIR) outlives a clone: a second clone
# of the same commit on the same machine compiles nothing again.
# CCACHE_BASEDIR makes the paths in a compile line relative to the checkout and
# CCACHE_NOHASHDIR leaves the working directory out of the hash, so two clones in
# different folders share their entries.
if command -v ccache >/dev/null 2>&1 && [ -z "${SHARDKIT_NO_CCACHE:-}" ]; then
  export CMAKE_C_COMPILER_LAUNCHER=ccache CMAKE_CXX_COMPILER_LAUNCHER=ccache
  export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$(pwd -P)}" CCACHE_NOHASHDIR=1
  export CCACHE_MAXSIZE="${CCACHE_MAXSIZE:-12G}"
fi
