# The lmdb format's sources, included by lib/CMakeLists.txt.
target_sources(shardkit_objects PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/env.cc
  ${CMAKE_CURRENT_LIST_DIR}/format.cc
  ${CMAKE_CURRENT_LIST_DIR}/reader.cc
  ${CMAKE_CURRENT_LIST_DIR}/records.cc
  ${CMAKE_CURRENT_LIST_DIR}/writer.cc
  ${CMAKE_CURRENT_LIST_DIR}/wild.cc
)
# Caffe's Datum message for the lmdb format's "caffe" layout.
add_custom_command(
  OUTPUT ${CMAKE_CURRENT_BINARY_DIR}/formats/caffe.pb.h ${CMAKE_CURRENT_BINARY_DIR}/formats/caffe.pb.cc
  COMMAND ${CMAKE_COMMAND} -E make_directory ${CMAKE_CURRENT_BINARY_DIR}/formats
  COMMAND protobuf::protoc --cpp_out=${CMAKE_CURRENT_BINARY_DIR}/formats
          -I ${CMAKE_CURRENT_LIST_DIR} ${CMAKE_CURRENT_LIST_DIR}/caffe.proto
  DEPENDS ${CMAKE_CURRENT_LIST_DIR}/caffe.proto protobuf::protoc
  COMMENT "protoc formats/lmdb/caffe.proto")
target_sources(shardkit_objects PRIVATE ${CMAKE_CURRENT_BINARY_DIR}/formats/caffe.pb.cc)
set_source_files_properties(${CMAKE_CURRENT_BINARY_DIR}/formats/caffe.pb.cc PROPERTIES COMPILE_OPTIONS "-w")
