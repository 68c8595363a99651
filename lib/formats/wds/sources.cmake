# The wds format's sources, included by lib/CMakeLists.txt.
target_sources(shardkit_objects PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/format.cc
  ${CMAKE_CURRENT_LIST_DIR}/names.cc
  ${CMAKE_CURRENT_LIST_DIR}/ranged.cc
  ${CMAKE_CURRENT_LIST_DIR}/shard_index.cc
  ${CMAKE_CURRENT_LIST_DIR}/index_cache.cc
  ${CMAKE_CURRENT_LIST_DIR}/dali_index.cc
  ${CMAKE_CURRENT_LIST_DIR}/sums.cc
  ${CMAKE_CURRENT_LIST_DIR}/child.cc
  ${CMAKE_CURRENT_LIST_DIR}/pipe.cc
  ${CMAKE_CURRENT_LIST_DIR}/reader.cc
  ${CMAKE_CURRENT_LIST_DIR}/manifest.cc
  ${CMAKE_CURRENT_LIST_DIR}/writer.cc
  ${CMAKE_CURRENT_LIST_DIR}/journal.cc
  ${CMAKE_CURRENT_LIST_DIR}/parts.cc
  ${CMAKE_CURRENT_LIST_DIR}/shards.cc
  ${CMAKE_CURRENT_LIST_DIR}/index_command.cc
)
