# The tar format's sources, included by lib/CMakeLists.txt.
target_sources(shardkit_objects PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/tar.cc
  ${CMAKE_CURRENT_LIST_DIR}/source.cc
)
