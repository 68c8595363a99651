# The wds format's benchmarks of its own internals, included by bench/CMakeLists.txt
# (their programs land in build/bench/ with the others). They live here, not in bench/,
# because they include the format's internal headers, which bench/'s programs may not.
# Issue 15: plans at 10^9 samples and merging 100,000 parts (synthetic; docs/benchmarks.md).
add_executable(sk_parts_bench ${CMAKE_CURRENT_LIST_DIR}/parts_bench.cc)
target_include_directories(sk_parts_bench PRIVATE ${PROJECT_SOURCE_DIR}/bench)
target_link_libraries(sk_parts_bench PRIVATE shardkit_internal fmt::fmt)
# Issue 15: the random-access index within a budget at 10^9 samples (procedural; docs/benchmarks.md).
add_executable(sk_index_bench ${CMAKE_CURRENT_LIST_DIR}/index_bench.cc)
target_include_directories(sk_index_bench PRIVATE ${PROJECT_SOURCE_DIR}/bench)
target_link_libraries(sk_index_bench PRIVATE shardkit_internal fmt::fmt)
