# QKV_KERNEL_CHECK: the layers core, kernels, attention and cache and one test binary,
# qkv_kernel_check, for a cross build (scripts/arm64.sh: aarch64, run under qemu-user). Included from the top-level
# CMakeLists.txt after OpenMP is found (gcc-aarch64 ships its own libgomp); nothing here needs a
# library of the target architecture that Debian's cross compiler lacks:
# - fmt is used header-only (FMT_HEADER_ONLY) from the host's libfmt-dev headers, which are the
#   same for every architecture;
# - OpenBLAS is loaded with dlopen on first use (core/blas.cpp), so only its declarations are
#   compiled; the check never multiplies through BLAS;
# - GoogleTest is compiled from the sources libgtest-dev ships in /usr/src/googletest.
find_package(Threads REQUIRED)
# FindOpenMP names libgomp.so, which a static link refuses; -fopenmp lets the driver pick libgomp.a.
set_property(TARGET OpenMP::OpenMP_CXX PROPERTY INTERFACE_LINK_LIBRARIES -fopenmp)

find_path(QKV_FMT_INCLUDE fmt/format.h PATHS /usr/include NO_CMAKE_FIND_ROOT_PATH NO_DEFAULT_PATH REQUIRED)
# A view holding fmt/ alone: the host's /usr/include must not shadow the target's C library headers.
set(_qkv_host_headers ${PROJECT_BINARY_DIR}/host_headers)
file(MAKE_DIRECTORY ${_qkv_host_headers})
file(CREATE_LINK ${QKV_FMT_INCLUDE}/fmt ${_qkv_host_headers}/fmt SYMBOLIC)
add_library(fmt::fmt INTERFACE IMPORTED)
target_include_directories(fmt::fmt SYSTEM INTERFACE ${_qkv_host_headers})
target_compile_definitions(fmt::fmt INTERFACE FMT_HEADER_ONLY)

# cblas.h and openblas_config.h declare the same LP64 functions on every 64-bit Linux.
find_path(QKV_CBLAS_INCLUDE cblas.h PATHS /usr/include/${CMAKE_LIBRARY_ARCHITECTURE} /usr/include/x86_64-linux-gnu
  PATH_SUFFIXES openblas-pthread openblas NO_CMAKE_FIND_ROOT_PATH NO_DEFAULT_PATH REQUIRED)
set(BLAS_LIBRARIES /usr/lib/${CMAKE_LIBRARY_ARCHITECTURE}/libopenblas.so.0)

add_library(qkv_flags INTERFACE)
target_compile_features(qkv_flags INTERFACE cxx_std_20)
include(cmake/qkv_layer.cmake)
add_subdirectory(src/core)
add_subdirectory(src/kernels)
add_subdirectory(src/attention)
add_subdirectory(src/cache)

set(_qkv_gtest /usr/src/googletest/googletest)
if(NOT EXISTS ${_qkv_gtest}/src/gtest-all.cc)
  message(FATAL_ERROR "QKV_KERNEL_CHECK needs GoogleTest's sources in ${_qkv_gtest} (libgtest-dev)")
endif()
add_library(qkv_check_gtest STATIC ${_qkv_gtest}/src/gtest-all.cc)
target_include_directories(qkv_check_gtest SYSTEM PUBLIC ${_qkv_gtest}/include PRIVATE ${_qkv_gtest})
target_link_libraries(qkv_check_gtest PUBLIC Threads::Threads)

# The fused forward's and backward's property cases, the decode kernel's tests (masks that hide
# whole chunks among them) and their thread-count tests, dropout, packed sequences, the KV codec's
# widening loads, the micro-kernel's column max, the sums over tens of thousands of keys, and the
# backward's unread padding and renormalized rows, and the lse's vector log, as in qkv_tests.
add_executable(qkv_kernel_check tests/kernel_check/main.cpp tests/property_test.cpp tests/fused_test.cpp
  tests/fused_threads_test.cpp tests/backward_test.cpp tests/decode_test.cpp tests/decode_mask_test.cpp
  tests/dropout_test.cpp tests/varlen_test.cpp tests/kv_codec_test.cpp tests/microkernel_test.cpp
  tests/long_sum_test.cpp tests/backward_unread_test.cpp tests/backward_renorm_test.cpp tests/row_log_test.cpp)
target_include_directories(qkv_kernel_check PRIVATE tests)
target_link_libraries(qkv_kernel_check PRIVATE qkv_cache qkv_attention qkv_kernels qkv_core qkv_check_gtest fmt::fmt
  OpenMP::OpenMP_CXX Threads::Threads ${CMAKE_DL_LIBS})
