// Which sanitizer runtime a test binary runs under, for the tests that measure the process itself
// (its address space, its allocator) or cap it: GCC says so with __SANITIZE_*__, clang through
// __has_feature. Defines QKV_TEST_UNDER_ASAN or QKV_TEST_UNDER_TSAN.
#pragma once

#if defined(__SANITIZE_ADDRESS__)
#define QKV_TEST_UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define QKV_TEST_UNDER_ASAN 1
#endif
#endif

#if defined(__SANITIZE_THREAD__)
#define QKV_TEST_UNDER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define QKV_TEST_UNDER_TSAN 1
#endif
#endif
