# Every dependency is a Debian package (scripts/install-deps.sh installs them).
find_package(PkgConfig REQUIRED)
pkg_check_modules(LMDB REQUIRED IMPORTED_TARGET lmdb)
pkg_check_modules(XXHASH REQUIRED IMPORTED_TARGET libxxhash)
pkg_check_modules(ZSTD REQUIRED IMPORTED_TARGET libzstd)
pkg_check_modules(TURBOJPEG REQUIRED IMPORTED_TARGET libturbojpeg)
pkg_check_modules(JPEG REQUIRED IMPORTED_TARGET libjpeg)
find_package(LibArchive REQUIRED)
find_package(HDF5 REQUIRED COMPONENTS C)
find_package(TBB REQUIRED)
find_package(fmt REQUIRED)
find_package(nlohmann_json REQUIRED)
# msgpack-c's C++ package is named "msgpack" (target msgpackc-cxx) in Debian 12, msgpack-cxx later.
find_package(msgpack-cxx CONFIG QUIET)
if(msgpack-cxx_FOUND)
  set(SHARDKIT_MSGPACK_TARGET msgpack-cxx)
else()
  find_package(msgpack CONFIG REQUIRED)
  set(SHARDKIT_MSGPACK_TARGET msgpackc-cxx)
endif()
find_package(Protobuf REQUIRED)
find_package(ZLIB REQUIRED)  # tfrecord: GZIP/ZLIB-compressed files
find_package(PNG REQUIRED)
find_package(OpenSSL REQUIRED COMPONENTS Crypto)  # MD5 (core/md5.h): Content-MD5, wids md5sum, MDS hashes
find_package(Threads REQUIRED)
if(SHARDKIT_BUILD_TOOLS)
  find_package(CLI11 CONFIG REQUIRED)
endif()
# Remote objects (lib/io/remote): libcurl (HTTP, TLS, SigV4 signing) and expat (S3's XML answers).
# Optional (SHARDKIT_WITH_REMOTE, default ON): it is not wired into the formats yet, and
# on the GPU machine (Debian packages carried onto Ubuntu) linking it made the loader
# crash, so the device scripts build without it (docs/remote.md).
option(SHARDKIT_WITH_REMOTE "Build the HTTP(S)/S3 object client (lib/io/remote, libcurl + expat)" ON)
if(SHARDKIT_WITH_REMOTE)
  find_package(CURL REQUIRED)
  pkg_check_modules(EXPAT REQUIRED IMPORTED_TARGET expat)
endif()
