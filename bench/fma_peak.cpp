#include "fma_peak.h"

#include "qkv/machine.h"

namespace qkv::bench {

// The measurement lives in the library (src/kernels/machine_peak.cpp), shared with `qkv bench`.
double fma_peak_work(int threads, int64_t iterations) {
  const PeakIsa isa = peak_isa_available(PeakIsa::avx512) ? PeakIsa::avx512 : PeakIsa::avx2;
  return qkv::fma_peak_work(threads, iterations, isa);
}

}  // namespace qkv::bench
