#include "fma_peak.h"

namespace qkv::bench {

PeakIsa best_peak_isa() { return peak_isa_available(PeakIsa::avx512) ? PeakIsa::avx512 : PeakIsa::avx2; }

// The measurement lives in the library (src/kernels/machine_peak.cpp), shared with `qkv bench`.
double fma_peak_work(int threads, int64_t iterations) {
  return qkv::fma_peak_work(threads, iterations, best_peak_isa());
}

}  // namespace qkv::bench
