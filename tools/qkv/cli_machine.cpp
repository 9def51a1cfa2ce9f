#include "cli_machine.h"

#include <algorithm>
#include <fstream>

#include <fmt/format.h>

namespace qkv::cli {
namespace {

constexpr double kPeakSeconds = 0.2;

std::string mib(int64_t bytes) { return fmt::format("{} MiB", bytes >> 20); }

std::string rate(const PeakMeasurement& p) {
  if (p.best <= 0) return fmt::format("{:>18}", "-");
  return fmt::format("{:>7.1f} ({:>7.1f})", p.best / 1e9, p.median / 1e9);
}

nlohmann::json peak_json(const PeakMeasurement& p) {
  return {{"best", p.best}, {"median", p.median}, {"runs", p.rates}};
}

}  // namespace

std::vector<MachineFigures> measure_machine(const std::vector<int>& thread_counts, int repeats) {
  std::vector<MachineFigures> out;
  for (int threads : thread_counts) {
    MachineFigures f;
    f.threads = threads;
    f.avx512 = measure_peak(threads, PeakIsa::avx512, repeats, kPeakSeconds);
    f.avx2 = measure_peak(threads, PeakIsa::avx2, repeats, kPeakSeconds);
    f.bf16 = measure_peak(threads, PeakIsa::avx512_bf16, repeats, kPeakSeconds);
    f.amx = measure_peak(threads, PeakIsa::amx_bf16, repeats, kPeakSeconds);
    f.bandwidth = probe_read_bandwidth(threads, memory_probe_bytes(), 2 * repeats + 1);
    out.push_back(std::move(f));
  }
  return out;
}

void print_machine(const std::vector<MachineFigures>& figures, const std::string& simd) {
  const MachineInfo& m = machine_info();
  fmt::print("machine: {} ({}{} family {} model {}): {}; the kernels' {} path\n", m.brand.empty() ? "CPU" : m.brand,
             m.vendor, m.vendor.empty() ? "" : ",", m.family, m.model, m.class_name, simd);
  const int64_t evict = memory_probe_bytes();
  if (m.l3_bytes > 0)
    fmt::print(
        "  L3 {} per core's domain ({}); cold-cache eviction and bandwidth buffer {} ({:.0f}x the L3, at least 256 "
        "MiB)\n",
        mib(m.l3_bytes), m.l3_source, mib(evict), static_cast<double>(evict) / static_cast<double>(m.l3_bytes));
  else
    fmt::print("  L3 not reported; cold-cache eviction and bandwidth buffer {} (the floor)\n", mib(evict));
  fmt::print("  peaks, GFLOP/s best (median) of {} runs:\n",
             figures.empty() ? 0
                             : std::max({figures[0].avx512.rates.size(), figures[0].avx2.rates.size(),
                                         figures[0].bf16.rates.size(), figures[0].amx.rates.size()}));
  fmt::print("  {:>7} {:>18} {:>18} {:>18} {:>18}\n", "threads", "fp32 AVX-512", "fp32 AVX2", "bf16 dot (vdpbf16ps)",
             "bf16 AMX (tdpbf16ps)");
  for (const MachineFigures& f : figures)
    fmt::print("  {:>7} {} {} {} {}\n", f.threads, rate(f.avx512), rate(f.avx2), rate(f.bf16), rate(f.amx));
  if (figures.empty()) return;
  const BandwidthProbe& first = figures[0].bandwidth;
  fmt::print("  read bandwidth, GB/s median (min-max) of {} passes over {}, by streams per thread:\n",
             first.by_streams.empty() ? 0 : first.by_streams[0].rates.size(), mib(first.bytes));
  std::string header = fmt::format("  {:>7}", "threads");
  for (const StreamRates& s : first.by_streams)
    header += fmt::format(" {:>18}", fmt::format("{} stream{}", s.streams, s.streams > 1 ? "s" : ""));
  fmt::print("{} {:>8}\n", header, "best");
  for (const MachineFigures& f : figures) {
    std::string row = fmt::format("  {:>7}", f.threads);
    for (const StreamRates& s : f.bandwidth.by_streams)
      row += fmt::format(" {:>18}", fmt::format("{:.1f} ({:.1f}-{:.1f})", s.median / 1e9, s.min / 1e9, s.max / 1e9));
    fmt::print("{} {:>8.1f}\n", row, f.bandwidth.best / 1e9);
  }
}

nlohmann::json machine_json(const std::vector<MachineFigures>& figures, const std::string& simd) {
  const MachineInfo& m = machine_info();
  nlohmann::json j = {{"brand", m.brand},
                      {"vendor", m.vendor},
                      {"family", m.family},
                      {"model", m.model},
                      {"class", m.class_name},
                      {"simd", simd},
                      {"l3_bytes", m.l3_bytes},
                      {"l3_source", m.l3_source},
                      {"eviction_bytes", memory_probe_bytes()},
                      {"threads", nlohmann::json::array()}};
  for (const MachineFigures& f : figures) {
    nlohmann::json streams = nlohmann::json::array();
    for (const StreamRates& s : f.bandwidth.by_streams)
      streams.push_back(
          {{"streams", s.streams}, {"median", s.median}, {"min", s.min}, {"max", s.max}, {"runs", s.rates}});
    j["threads"].push_back({{"threads", f.threads},
                            {"fp32_avx512", peak_json(f.avx512)},
                            {"fp32_avx2", peak_json(f.avx2)},
                            {"bf16_dot", peak_json(f.bf16)},
                            {"bf16_amx", peak_json(f.amx)},
                            {"bandwidth",
                             {{"bytes", f.bandwidth.bytes},
                              {"best", f.bandwidth.best},
                              {"best_streams", f.bandwidth.best_streams},
                              {"by_streams", streams}}}});
  }
  return j;
}

}  // namespace qkv::cli
