# CUDA feed and nvJPEG decoding (issue 7), included at the end of lib/CMakeLists.txt.
#
# SHARDKIT_WITH_CUDA (default ON): build the CUDA code when a CUDA compiler and toolkit
# are found; nvJPEG is used when nvjpeg.h and libnvjpeg are found too. Without them the
# library still provides shardkit/gpu.h, whose functions then say "built without CUDA".
# CMAKE_CUDA_ARCHITECTURES defaults to 90 (H100/H200); set it for other GPUs.
option(SHARDKIT_WITH_CUDA "Build the CUDA feed and nvJPEG decoder when the CUDA toolkit is found" ON)
if(EXISTS ${PROJECT_SOURCE_DIR}/include/shardkit/loader.h)  # the GPU feed sits on the streaming loader
set(SHARDKIT_HAVE_CUDA OFF)
set(SHARDKIT_HAVE_NVJPEG OFF)
if(SHARDKIT_WITH_CUDA)
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES 90)
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    enable_language(CUDA)
    find_package(CUDAToolkit)
    if(CUDAToolkit_FOUND)
      set(SHARDKIT_HAVE_CUDA ON)
      find_path(SHARDKIT_NVJPEG_INCLUDE nvjpeg.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
      if(TARGET CUDA::nvjpeg AND SHARDKIT_NVJPEG_INCLUDE)
        # nvjpeg_decoder.cc was written against the documented API without this header
        # at hand: check that it compiles here, and build without nvJPEG (saying why)
        # rather than not at all when it does not.
        set(_sk_tc_type ${CMAKE_TRY_COMPILE_TARGET_TYPE})
        set(CMAKE_TRY_COMPILE_TARGET_TYPE STATIC_LIBRARY)
        try_compile(SHARDKIT_NVJPEG_COMPILES ${CMAKE_BINARY_DIR}/nvjpeg_check
          SOURCES ${CMAKE_CURRENT_LIST_DIR}/nvjpeg_decoder.cc
          CMAKE_FLAGS "-DINCLUDE_DIRECTORIES=${PROJECT_SOURCE_DIR}/include;${PROJECT_SOURCE_DIR}/lib;${SHARDKIT_NVJPEG_INCLUDE};${CUDAToolkit_INCLUDE_DIRS}"
          CXX_STANDARD 20
          OUTPUT_VARIABLE _sk_nvjpeg_out)
        set(CMAKE_TRY_COMPILE_TARGET_TYPE ${_sk_tc_type})
        if(SHARDKIT_NVJPEG_COMPILES)
          set(SHARDKIT_HAVE_NVJPEG ON)
        else()
          message(WARNING "shardkit: lib/gpu/nvjpeg_decoder.cc does not compile against ${SHARDKIT_NVJPEG_INCLUDE}/nvjpeg.h; "
            "building without nvJPEG. Compiler output:\n${_sk_nvjpeg_out}")
        endif()
      endif()
    endif()
  endif()
endif()
message(STATUS "shardkit: CUDA ${SHARDKIT_HAVE_CUDA}, nvJPEG ${SHARDKIT_HAVE_NVJPEG}")

if(SHARDKIT_HAVE_CUDA)
  # The kernels build as their own object library: the library's warning flags are for g++.
  add_library(shardkit_gpu_kernels OBJECT ${CMAKE_CURRENT_LIST_DIR}/kernels.cu)
  target_include_directories(shardkit_gpu_kernels PRIVATE ${PROJECT_SOURCE_DIR}/include ${PROJECT_SOURCE_DIR}/lib)
  # C++17 for nvcc: CMake releases before 3.27 do not know that nvcc 12+ speaks C++20.
  set_target_properties(shardkit_gpu_kernels PROPERTIES POSITION_INDEPENDENT_CODE ON CUDA_STANDARD 17
    CUDA_STANDARD_REQUIRED ON CUDA_VISIBILITY_PRESET hidden)
  # The libraries were created before CUDA was enabled: give them the CUDA properties explicitly.
  set_target_properties(shardkit_objects shardkit shardkit_internal PROPERTIES
    CUDA_ARCHITECTURES "${CMAKE_CUDA_ARCHITECTURES}" CUDA_STANDARD 17)
  target_sources(shardkit_objects PRIVATE
    ${CMAKE_CURRENT_LIST_DIR}/device_batch.cc
    ${CMAKE_CURRENT_LIST_DIR}/feed.cc
    ${CMAKE_CURRENT_LIST_DIR}/gpu_loader.cc
    ${CMAKE_CURRENT_LIST_DIR}/copy_path.cc
    ${CMAKE_CURRENT_LIST_DIR}/decode_path.cc
    ${CMAKE_CURRENT_LIST_DIR}/jpeg_header.cc)
  # An object library cannot hold other objects: both libraries take the kernels directly.
  target_link_libraries(shardkit PRIVATE shardkit_gpu_kernels)
  target_link_libraries(shardkit_internal PRIVATE shardkit_gpu_kernels)
  # The CUDA runtime and nvJPEG are linked statically (their symbols stay hidden behind
  # lib/shardkit.map), as NCCL and the nvidia wheels' own libraries do. Linked as shared
  # libraries, libshardkit loaded before pip's torch put the system toolkit's
  # libcudart.so.N / libnvjpeg.so.N into the process; torch then found those sonames
  # already loaded, used them instead of its wheel's newer copies, and crashed (issue 13).
  # A static runtime brings no soname at all. -DSHARDKIT_CUDA_STATIC_RUNTIME=OFF links
  # the shared ones (ctest no_shared_cuda_runtime then does not run).
  option(SHARDKIT_CUDA_STATIC_RUNTIME "Link the CUDA runtime and nvJPEG statically" ON)
  if(SHARDKIT_CUDA_STATIC_RUNTIME AND TARGET CUDA::cudart_static)
    set_target_properties(shardkit_objects shardkit shardkit_internal shardkit_gpu_kernels PROPERTIES
      CUDA_RUNTIME_LIBRARY Static)
    target_link_libraries(shardkit_objects PUBLIC CUDA::cudart_static)
    set(SHARDKIT_STATIC_CUDA_RUNTIME ON)
  else()
    target_link_libraries(shardkit_objects PUBLIC CUDA::cudart)
    set(SHARDKIT_STATIC_CUDA_RUNTIME OFF)
  endif()
  target_compile_definitions(shardkit_objects PRIVATE SHARDKIT_HAVE_CUDA=1)
  if(SHARDKIT_HAVE_NVJPEG)
    target_sources(shardkit_objects PRIVATE ${CMAKE_CURRENT_LIST_DIR}/nvjpeg_decoder.cc)
    if(SHARDKIT_STATIC_CUDA_RUNTIME AND TARGET CUDA::nvjpeg_static)
      target_link_libraries(shardkit_objects PUBLIC CUDA::nvjpeg_static)
    else()
      target_link_libraries(shardkit_objects PUBLIC CUDA::nvjpeg)
      set(SHARDKIT_STATIC_CUDA_RUNTIME OFF)  # libnvjpeg.so brings the shared runtime
    endif()
    target_compile_definitions(shardkit_objects PRIVATE SHARDKIT_HAVE_NVJPEG=1)
  endif()
  message(STATUS "shardkit: static CUDA runtime: ${SHARDKIT_STATIC_CUDA_RUNTIME}")
  set(SHARDKIT_STATIC_CUDA_RUNTIME ${SHARDKIT_STATIC_CUDA_RUNTIME} CACHE INTERNAL "libshardkit links no shared CUDA runtime")
else()
  set(SHARDKIT_STATIC_CUDA_RUNTIME OFF CACHE INTERNAL "libshardkit links no shared CUDA runtime")
  target_sources(shardkit_objects PRIVATE ${CMAKE_CURRENT_LIST_DIR}/no_cuda.cc ${CMAKE_CURRENT_LIST_DIR}/feed.cc
    ${CMAKE_CURRENT_LIST_DIR}/jpeg_header.cc)
endif()

# The GPU benchmark (bench/gpu_bench.cc): public API plus lib/gpu/testing.h (the internal
# library). With the other benchmarks (SHARDKIT_BUILD_BENCH; the sanitizer build has none).
if(SHARDKIT_BUILD_BENCH)
  add_executable(shardkit_gpu_bench ${PROJECT_SOURCE_DIR}/bench/gpu_bench.cc)
  target_link_libraries(shardkit_gpu_bench PRIVATE shardkit_internal fmt::fmt Threads::Threads)
endif()
else()
  message(STATUS "shardkit: GPU feed skipped (no shardkit/loader.h in this tree)")
endif()
