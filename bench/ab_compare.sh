#!/bin/sh
# A/B of kernel variants on a shared, noisy machine: bench/ab_compare.sh FILTER ROUNDS BIN...
# runs each qkv_bench binary BIN (e.g. copies built from two commits) in turn, ROUNDS times,
# on the Google Benchmark FILTER, and prints per binary and benchmark the median of each run as
# GFLOP/s per CPU second (flops / process CPU time per iteration); qkv_backward_bench binaries
# work too, and qkv_decode_bench ones print CPU µs per thread per step instead (lower is
# better). Alternating the binaries makes a slow phase of the machine hit every variant alike;
# compare the lists, not single numbers.
# Example: bench/ab_compare.sh 'attention/S[46]/fp32/threads:1' 3 /tmp/before/qkv_bench build/bench/qkv_bench
set -eu
FILTER=$1
ROUNDS=$2
shift 2
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
# The AVX2 group (avx2/...) is registered only with --avx2.
case $FILTER in avx2/*) GROUP=--avx2 ;; *) GROUP= ;; esac
for round in $(seq "$ROUNDS"); do
  for bin in "$@"; do
    # qkv_bench reports cpu_s_per_iter and flops_per_iter; qkv_backward_bench the rate itself,
    # CPU_FLOPS (both per CPU second), qkv_decode_bench cpu_us (divided by 1e-9 to cancel the
    # final 1e9); the micro-kernel benchmarks (one thread, nothing else in the process) only their
    # wall rate, FLOPS. Each becomes name|value|unit|divisor-value|divisor-unit.
    "$bin" $GROUP --benchmark_filter="$FILTER" --benchmark_report_aggregates_only=true 2>/dev/null | grep median |
      sed -E -e 's/^([^ ]*)_median .*cpu_s_per_iter=([0-9.e+-]+)([munkMG]?) flops_per_iter=([0-9.e+-]+)([munkMG]?).*/\1|\4|\5|\2|\3/' \
        -e 's/^([^ ]*)_median .*CPU_FLOPS=([0-9.e+-]+)([munkMG]?).*/\1|\2|\3|1|/' \
        -e 's/^([^ ]*)_median .*cpu_us=([0-9.e+-]+)([munkMG]?).*/\1|\2|\3|1e-9|/' \
        -e 's/^([^ ]*)_median .* FLOPS=([0-9.e+-]+)([munkMG]?).*/\1|\2|\3|1|/' |
      awk -F'|' -v bin="$bin" '
        function unit(s) { return s == "n" ? 1e-9 : s == "u" ? 1e-6 : s == "m" ? 1e-3 : s == "k" ? 1e3 : s == "M" ? 1e6 : s == "G" ? 1e9 : 1 }
        NF == 5 { printf "%s %s %.1f\n", bin, $1, $2 * unit($3) / ($4 * unit($5)) / 1e9 }'
  done
done | sort -s -k1,2 | awk '{ key = $1 " " $2; v[key] = v[key] " " $3 } END { for (k in v) print k ":" v[k] }' | sort
