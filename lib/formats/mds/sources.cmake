# The mds format's sources, included by lib/CMakeLists.txt.
target_sources(shardkit_objects PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/format.cc
  ${CMAKE_CURRENT_LIST_DIR}/index.cc
  ${CMAKE_CURRENT_LIST_DIR}/shard.cc
  ${CMAKE_CURRENT_LIST_DIR}/reader.cc
  ${CMAKE_CURRENT_LIST_DIR}/writer.cc
  ${CMAKE_CURRENT_LIST_DIR}/hash.cc
)
# zstd-compressed shards.
target_link_libraries(shardkit_objects PUBLIC PkgConfig::ZSTD)
