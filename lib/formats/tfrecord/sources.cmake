# The tfrecord format's sources, included by lib/CMakeLists.txt.
target_sources(shardkit_objects PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/format.cc
  ${CMAKE_CURRENT_LIST_DIR}/crc32c.cc
  ${CMAKE_CURRENT_LIST_DIR}/frames.cc
  ${CMAKE_CURRENT_LIST_DIR}/example.cc
  ${CMAKE_CURRENT_LIST_DIR}/dataset.cc
  ${CMAKE_CURRENT_LIST_DIR}/writer.cc
)
# tf.train.Example (TensorFlow's field numbers) for the tfrecord format.
add_custom_command(
  OUTPUT ${CMAKE_CURRENT_BINARY_DIR}/formats/tfrecord/example.pb.h ${CMAKE_CURRENT_BINARY_DIR}/formats/tfrecord/example.pb.cc
  COMMAND ${CMAKE_COMMAND} -E make_directory ${CMAKE_CURRENT_BINARY_DIR}/formats/tfrecord
  COMMAND protobuf::protoc --cpp_out=${CMAKE_CURRENT_BINARY_DIR}/formats/tfrecord
          -I ${CMAKE_CURRENT_LIST_DIR} ${CMAKE_CURRENT_LIST_DIR}/example.proto
  DEPENDS ${CMAKE_CURRENT_LIST_DIR}/example.proto protobuf::protoc
  COMMENT "protoc formats/tfrecord/example.proto")
target_sources(shardkit_objects PRIVATE ${CMAKE_CURRENT_BINARY_DIR}/formats/tfrecord/example.pb.cc)
set_source_files_properties(${CMAKE_CURRENT_BINARY_DIR}/formats/tfrecord/example.pb.cc PROPERTIES COMPILE_OPTIONS "-w")
# gzip/zlib-compressed TFRecord files.
target_link_libraries(shardkit_objects PUBLIC ZLIB::ZLIB)
