# The folder format's sources, included by lib/CMakeLists.txt.
target_sources(shardkit_objects PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/folder.cc
)
