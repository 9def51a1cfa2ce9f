// Living within a capped address space (ulimit -v, RLIMIT_AS). OpenBLAS gives every thread that
// calls it (and every worker of its own) a 128 MiB buffer, retried forever when the allocation
// fails, so too many such threads in a small address space hang the process; libgomp, failing to
// create a thread, prints "Thread creation failed" and exits the process. These functions size a
// call's threads to what the limit leaves room for.
#pragma once

namespace qkv {

// Address space one thread calling OpenBLAS takes: its 128 MiB buffer (malloc(134221824), seen in
// gdb) plus its thread stack (8 MiB by default).
inline constexpr unsigned long long kBlasWorkerBytes = (128ull + 8ull) << 20;
// What qkv keeps free for itself beside the workers before it starts any.
inline constexpr unsigned long long kAddressSpaceReserve = 1ull << 30;

// `wanted` capped so that the threads' buffers (wanted - 1 of them beside the calling thread's)
// fit in RLIMIT_AS with kAddressSpaceReserve to spare; at least 1. `wanted` unchanged when
// the address space is unlimited. Thread-safe (reads the limit only).
int blas_threads_within_address_space(int wanted);

// Address space one more OpenMP thread takes: its stack (OMP_STACKSIZE or GOMP_STACKSIZE as libgomp
// reads them, else glibc's default thread stack) and guard page, plus the 64 MiB malloc arena glibc
// reserves for a thread's first allocation. Read once; thread-safe.
unsigned long long openmp_thread_bytes();

// `wanted` capped so that its wanted - 1 threads beside the calling one fit, at
// openmp_thread_bytes() each, in what RLIMIT_AS leaves above the process's present size; at least 1
// (the calling thread alone). `wanted` unchanged when the address space is unlimited or wanted <= 1.
// Thread-safe.
int threads_within_address_space(int wanted);

// This machine's physical memory in bytes (sysconf: _SC_PHYS_PAGES x _SC_PAGESIZE), 0 if the
// system does not say. Beyond it an allocation may be granted (overcommit) and the process then
// SIGKILLed by the OOM killer on first touch instead of failing: readers and result allocations
// compare a size against it first. Thread-safe.
unsigned long long physical_memory_bytes();

}  // namespace qkv
