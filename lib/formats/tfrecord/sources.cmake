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
shardkit_format_proto(example.proto formats/tfrecord)
# gzip/zlib-compressed TFRecord files.
target_link_libraries(shardkit_objects PUBLIC ZLIB::ZLIB)
