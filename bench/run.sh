#!/bin/sh
# `make bench`: bench/run.sh <build dir>. Prints the machine (class, L3, peaks, bandwidth), runs the
# qkv benchmarks, S6's peak memory and the PyTorch comparison, and ends with the targets table:
# every target as a % of the ceilings measured here (see docs/benchmarks.md). Raw results stay in
# <build dir>/bench-results/.
set -eu
BUILD=${1:-build}
HERE=$(cd "$(dirname "$0")" && pwd)
OUT="$BUILD/bench-results"
mkdir -p "$OUT"
# Idle OpenMP threads sleep instead of spinning: on a machine shared with other jobs a spinning
# thread steals the core its partner needs (S2 on 2 threads took twice the 1-thread wall time
# with the default policy under a load of 10). Applies to qkv and PyTorch alike.
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-passive}"
LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg)
# The machine first: five invocations of the probes (their spread is one of the targets), each
# followed by a plain read whose loop shares no code with them (bench/plain_read.cpp) and which
# calls the probe between its own passes, so targets.py compares the two round by round.
echo "the machine: 5 x (qkv bench --machine, a plain read) (about a minute)..." >&2
# Two threads where the process may run on two CPUs (qkv bench refuses more threads than CPUs).
MACHINE_THREADS=$(nproc)
if [ "$MACHINE_THREADS" -gt 2 ]; then MACHINE_THREADS=2; fi
PLAIN=
if [ -x "$BUILD/bench/qkv_plain_read" ]; then PLAIN=--plain; fi
for i in 1 2 3 4 5; do
  "$BUILD/qkv" bench --machine --threads "$MACHINE_THREADS" --json "$OUT/machine-$i.json" > "$OUT/machine-$i.txt"
  if [ -n "$PLAIN" ]; then
    "$BUILD/bench/qkv_plain_read" > "$OUT/plain-$i.json"
    PLAIN="$PLAIN $OUT/plain-$i.json"
  fi
done
cat "$OUT/machine-1.txt"
# How far a core overlaps a stream with the FMAs that consume it at decode's FMAs per byte, for
# 32-, 16- and 8-bit rows at 1 and 2 threads (bench/decode_floor_probe.cpp, three runs, under a
# minute): a factor of the decode rows' floors (targets.py). The probe of the family the kernels
# run here (the machine's "simd", QKV_SIMD honoured); other families have none, and their decode
# ceilings take no factor.
OVERLAP=
SIMD=$(/usr/bin/python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["simd"])' "$OUT/machine-1.json")
case $SIMD in
  avx512) PROBE=decode_floor_probe ;;
  avx2) PROBE=decode_floor_probe_avx2 ;;
  *) PROBE= ;;
esac
if [ -n "$PROBE" ] && [ -x "$BUILD/bench/qkv_$PROBE" ]; then
  OVERLAP=--overlap
  for i in 1 2 3; do
    "$BUILD/bench/qkv_$PROBE" --overlap > "$OUT/overlap-$i.json"
    OVERLAP="$OVERLAP $OUT/overlap-$i.json"
  done
else
  echo "no overlap probe for the $SIMD kernels: the decode ceilings take none" >&2
fi
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
echo "qkv benchmarks (about 2 minutes, more where the host lends them less and they run again)..." >&2
# Run again (up to three runs) while the host lends the binary less than the machine probe measured
# (its own FMA peak under 90% of the probe's best; one 2-thread run read half): bench/lent_rerun.py.
/usr/bin/python3 "$HERE/lent_rerun.py" --machine "$OUT"/machine-[1-5].json --out "$OUT/qkv.json" -- \
  "$BUILD/bench/qkv_bench" > "$OUT/qkv.log"
"$BUILD/bench/qkv_bench" --peak-memory > "$OUT/memory.json"
# One thread pinned to each CPU in turn, the first four this process may run on (under 2 minutes
# each): on a shared host one vCPU ran the same prefill 10-21% slower than the other in the same
# minutes while its FMA peak moved 3% (Zen 5 guest), so an unpinned one-thread row depends on where
# the scheduler put it. Each pinned run measures its own peaks on that CPU, and the kernel rows'
# blocks alone (targets.py).
PINNED=
if command -v taskset > /dev/null 2>&1; then
  for cpu in $(/usr/bin/python3 -c 'import os; print(*sorted(os.sched_getaffinity(0))[:4])'); do
    echo "one thread pinned to CPU $cpu (under 2 minutes)..." >&2
    taskset -c "$cpu" "$BUILD/bench/qkv_bench" \
      --benchmark_filter='^((fma_peak|bf16_peak|attention/[^/]+/(fp32|bf16))/threads:1/|microkernel/(fused|backward)_D)' \
      --benchmark_out="$OUT/pinned-$cpu.json" --benchmark_out_format=json > "$OUT/pinned-$cpu.log"
    taskset -c "$cpu" "$BUILD/bench/qkv_backward_bench" --benchmark_filter='^(fma_peak|backward/[^/]+/fp32)/threads:1/' \
      --benchmark_out="$OUT/pinned-backward-$cpu.json" --benchmark_out_format=json > "$OUT/pinned-backward-$cpu.log"
    PINNED="$PINNED --pinned $cpu $OUT/pinned-$cpu.json $OUT/pinned-backward-$cpu.json"
  done
fi
echo "PyTorch (about 2 minutes)..." >&2
/usr/bin/python3 "$HERE/torch_compare.py" > "$OUT/torch.json"
LOAD_AFTER=$(cut -d' ' -f1-3 /proc/loadavg)
/usr/bin/python3 "$HERE/report.py" --qkv "$OUT/qkv.json" --torch "$OUT/torch.json" --memory "$OUT/memory.json" \
  --load-before "$LOAD_BEFORE" --load-after "$LOAD_AFTER" --machine "$OUT/machine-1.json" | tee "$OUT/table.md"
/usr/bin/python3 "$HERE/compare_backward.py" --build "$BUILD" --out "$OUT" --machine "$OUT"/machine-[1-5].json | tee "$OUT/backward_table.md"
# The AVX2 path against the AVX2 FMA peak (what a CPU without AVX-512 reaches; about 1 minute),
# where the CPU has AVX2.
if "$BUILD/bench/qkv_bench" --avx2 --benchmark_list_tests > /dev/null 2>&1; then
  echo "AVX2 path (about 1 minute)..." >&2
  LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
  /usr/bin/python3 "$HERE/lent_rerun.py" --machine "$OUT"/machine-[1-5].json --out "$OUT/avx2.json" -- \
    "$BUILD/bench/qkv_bench" --avx2 > "$OUT/avx2.log"
  /usr/bin/python3 "$HERE/lent_rerun.py" --machine "$OUT"/machine-[1-5].json --out "$OUT/avx2_backward.json" -- \
    "$BUILD/bench/qkv_backward_bench" --avx2 > "$OUT/avx2_backward.log"
  LOAD_AFTER=$(cut -d' ' -f1-3 /proc/loadavg)
  /usr/bin/python3 "$HERE/avx2_report.py" --forward "$OUT/avx2.json" --backward "$OUT/avx2_backward.json" \
    --load-before "$LOAD_BEFORE" --load-after "$LOAD_AFTER" | tee "$OUT/avx2_table.md"
fi
# Ring attention over MPI (only when qkv_ring_bench was built, i.e. MPI was found).
if [ -x "$BUILD/bench/qkv_ring_bench" ]; then
  echo "ring attention, 2 ranks x 1 thread vs 1 rank x 2 threads (several minutes)..." >&2
  /usr/bin/python3 "$HERE/ring_bench.py" "$BUILD/bench/qkv_ring_bench" | tee "$OUT/ring_table.md"
  # The compute-vs-transfer model of a ring step at scale (docs/ring-attention.md), calibrated
  # with the 1-thread kernel speeds just measured, for 32-core ranks.
  speed() { grep "^kernel .* $1 " "$OUT/ring_table.md" | grep -o 'gflops=[0-9.]*' | head -n 1 | cut -d= -f2; }
  fwd=$(speed forward) bwd=$(speed backward)
  if [ -n "$fwd" ] && [ -n "$bwd" ]; then
    /usr/bin/python3 "$HERE/ring_model.py" --fwd "$fwd" --bwd "$bwd" --cores 32 | tee "$OUT/ring_model.md"
  fi
fi
# Decode against a KV cache (bench/decode_bench.cpp, about 6 minutes): each step as a percentage
# of the roofline bound measured by the same binary (docs/benchmarks.md, "Decode").
echo "qkv decode benchmarks (about 6 minutes)..." >&2
"$BUILD/bench/qkv_decode_bench" --benchmark_out="$OUT/decode.json" --benchmark_out_format=json | tee "$OUT/decode.log"
# The cold steps the targets take, in two more processes (about 5 minutes): a process draws how its
# caches are placed and its steps keep that (on a Zen 5 guest one process's int8 steps took 5.0 ms,
# the next one's 6.6, each within 2-5% round to round), so targets.py takes each one's median over
# the three processes.
DECODE="$OUT/decode.json"
echo "the decode rows of the targets, in two more processes (about 5 minutes)..." >&2
for i in 2 3; do
  "$BUILD/bench/qkv_decode_bench" --benchmark_out="$OUT/decode-$i.json" --benchmark_out_format=json \
    --benchmark_filter="$(/usr/bin/python3 "$HERE/targets.py" --decode-filter)" > "$OUT/decode-$i.log"
  DECODE="$DECODE $OUT/decode-$i.json"
done
# What the second sum of large scores costs as q grows (fp32 forward and backward, 1 thread,
# with and without softcap; docs/accuracy.md), and the int8 KV cache's error per scale
# granularity (why one scale per token and head; docs/decode.md). Under a minute together.
echo "large scores, int8 scales (under a minute)..." >&2
PYTHONPATH="$BUILD/python" /usr/bin/python3 "$HERE/large_score_cost.py" | tee "$OUT/large_scores.txt"
PYTHONPATH="$BUILD/python" /usr/bin/python3 "$HERE/large_score_cost.py" 50 | tee "$OUT/large_scores_softcap.txt"
/usr/bin/python3 "$HERE/int8_scale_accuracy.py" | tee "$OUT/int8_scales.txt"
# Packed variable-length batches against padding (32 sequences of 16-2048 tokens, causal,
# forward + backward; docs/benchmarks.md, "Packed sequences"). About a minute.
echo "varlen vs padded (about a minute)..." >&2
PYTHONPATH="$BUILD/python" /usr/bin/python3 "$HERE/varlen_bench.py" | tee "$OUT/varlen.md"
# Every target against the ceilings measured in this run, naming the machine's class.
AVX2=
if [ -f "$OUT/avx2.json" ]; then AVX2="--avx2 $OUT/avx2.json $OUT/avx2_backward.json"; fi
echo
echo "load average at the start: $LOAD_START; at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
# shellcheck disable=SC2086 # PLAIN, DECODE, AVX2, PINNED and OVERLAP are option lists
/usr/bin/python3 "$HERE/targets.py" --machine "$OUT"/machine-[1-5].json $PLAIN --qkv "$OUT/qkv.json" \
  --backward "$OUT/backward.json" --decode $DECODE $AVX2 $PINNED $OVERLAP | tee "$OUT/targets.md"
