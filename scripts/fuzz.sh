#!/usr/bin/env bash
# Builds the libFuzzer targets (clang-14, ASan + UBSan) in build-asan, the tree of the ASan test run
# (scripts/asan_tree.sh), and runs them.
#   scripts/fuzz.sh smoke [SECONDS=20]  replays each committed corpus (fuzz/corpus/<target>, which
#                                       holds the regression inputs), then fuzzes a scratch copy
#                                       of it for SECONDS; run by `make test`.
#   scripts/fuzz.sh run [SECONDS=600]   replays, then fuzzes for SECONDS, growing the working
#                                       corpus build-asan/corpus/<target>; run by `make fuzz`.
# Environment: FUZZ_BUILD (build-asan), JOBS (2), FUZZERS (space-separated names; default all),
# FUZZ_PARALLEL (fuzzers at a time; default 1). Exits non-zero on any crash, leak, timeout, OOM
# or broken invariant, naming the input libFuzzer saved in build-asan/artifacts/. A summary of
# executions, exec/s and corpus size goes to build-asan/fuzz-<mode>.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-smoke}
case "$mode" in
  smoke) seconds=${2:-20} ;;
  run) seconds=${2:-600} ;;
  *) echo "usage: $0 smoke|run [seconds]" >&2; exit 2 ;;
esac
dir=${FUZZ_BUILD:-build-asan}
jobs=${JOBS:-2}
parallel=${FUZZ_PARALLEL:-1}

. scripts/asan_tree.sh
configure_asan_tree "$dir"
[ -n "${FUZZ_SKIP_BUILD:-}" ] || cmake --build "$dir" -j"$jobs" --target fuzzers

fuzzers=${FUZZERS:-$(cd "$dir/fuzz" && ls fuzz_* | sed 's/^fuzz_//')}
mkdir -p "$dir/artifacts" "$dir/logs" "$dir/corpus"
summary="$dir/fuzz-$mode.txt"
echo "# $(date -u +%FT%TZ) fuzz $mode, $seconds s each" >>"$summary"
# Small inputs keep exec/s high; every format's interesting structure fits in 4 KB.
common=(-timeout=10 -rss_limit_mb=2048 -max_len=4096 -print_final_stats=1)

dict_for() {
  case "$1" in
    npy) echo "-dict=fuzz/npy.dict" ;;
    safetensors) echo "-dict=fuzz/safetensors.dict" ;;
    glove | word2vec_text | word2vec_binary) echo "-dict=fuzz/embeddings.dict" ;;
  esac
}

# Runs one fuzzer; returns its exit status and appends a line to the summary.
fuzz_one() {
  local name=$1 bin="$dir/fuzz/fuzz_$name" seeds="fuzz/corpus/$1" log="$dir/logs/$1-$mode.log" work
  local dict
  dict=$(dict_for "$name")
  # Replay first: every committed seed and regression input must pass on its own.
  # Files, not the directory: libFuzzer would write new units into a directory it is given.
  if ! OMP_NUM_THREADS=1 "$bin" "${common[@]}" -artifact_prefix="$dir/artifacts/$name-" "$seeds"/* >"$log.replay" 2>&1; then
    echo "fuzz_$name: a committed corpus input fails; see $log.replay" >&2
    tail -30 "$log.replay" >&2
    return 1
  fi
  if [ "$mode" = smoke ]; then
    work=$(mktemp -d)
    cp "$seeds"/* "$work"/
  else
    work="$dir/corpus/$name"
    mkdir -p "$work"
  fi
  local start status=0
  start=$(date +%s)
  OMP_NUM_THREADS=1 nice -n 10 "$bin" -max_total_time="$seconds" "${common[@]}" $dict \
    -artifact_prefix="$dir/artifacts/$name-" "$work" "$seeds" >"$log" 2>&1 || status=$?
  local elapsed=$(($(date +%s) - start))
  local execs rate files bytes
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  files=$(find "$work" -type f | wc -l)
  bytes=$(find "$work" -type f -printf '%s\n' | awk '{s += $1} END {print s + 0}')
  [ "$mode" = smoke ] && rm -rf "$work"
  local result=ok
  if [ "$status" -ne 0 ]; then
    result="FAILED (exit $status)"
    echo "fuzz_$name failed; log $log:" >&2
    grep -E "ERROR|WARNING|invariant|Test unit written|SUMMARY" "$log" | head -20 >&2 || true
  fi
  printf '%-16s %5ss %12s execs %8s exec/s  corpus %5s files %8s bytes  %s\n' "$name" "$elapsed" "${execs:-?}" \
    "${rate:-?}" "$files" "$bytes" "$result" | tee -a "$summary"
  return "$status"
}

failed=0
running=0
pids=()
for name in $fuzzers; do
  fuzz_one "$name" &
  pids+=($!)
  running=$((running + 1))
  if [ "$running" -ge "$parallel" ]; then
    wait "${pids[0]}" || failed=1
    pids=("${pids[@]:1}")
    running=$((running - 1))
  fi
done
for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
if [ "$failed" -ne 0 ]; then
  echo "fuzz $mode: FAILED (inputs in $dir/artifacts/)" >&2
  exit 1
fi
echo "fuzz $mode: all fuzzers clean ($summary)"
