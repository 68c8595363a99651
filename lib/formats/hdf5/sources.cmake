# The hdf5 format's sources, included by lib/CMakeLists.txt.
target_sources(shardkit_objects PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/format.cc
  ${CMAKE_CURRENT_LIST_DIR}/h5.cc
  ${CMAKE_CURRENT_LIST_DIR}/reader.cc
  ${CMAKE_CURRENT_LIST_DIR}/vlen_guard.cc
  ${CMAKE_CURRENT_LIST_DIR}/writer.cc
  ${CMAKE_CURRENT_LIST_DIR}/arrays.cc
)
