#!/usr/bin/env bash
# Fuzzes every input a user or a stranger can hand ddpc: the YAML config parser, IDX and token
# data files, text corpora, safetensors checkpoint headers and trainer checkpoints, Slurm host
# lists, the store's wire protocol from both ends, and strangers on the tcp backend's port
# (tests/fuzz/).
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]     (default 60 s, every target)
#
# Builds the libFuzzer harnesses with clang and ASan+UBSan in build-fuzz/ (cmake -DDDP_FUZZ=ON),
# then for each target: replays its seed corpus (tests/fuzz/corpus/<target>/, crash regressions
# included), and fuzzes for the given time starting from it. New inputs go to
# build-fuzz/corpus/<target>/, never into the repository; a crash leaves its input in
# build-fuzz/artifacts/<target>/ and makes the script exit 1. At the end one line per target:
# corpus size (libFuzzer's: inputs/bytes), edges covered, executions, executions per second,
# crashes.
# Keep an input that crashed as a regression: copy it to tests/fuzz/corpus/<target>/crash-<what>.
# Environment: FUZZ_BUILD (build-fuzz), FUZZ_JOBS (cores to build with: nproc), FUZZ_PARALLEL
# (targets fuzzed at once, each libFuzzer being one thread: nproc), FUZZ_ARGS (more libFuzzer
# flags, e.g. "-max_len=65536").
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-60}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(config idx tokens ckpt store store_client tcp trainstate text hostlist)
build=${FUZZ_BUILD:-build-fuzz}
jobs=${FUZZ_JOBS:-$(nproc)}
par=${FUZZ_PARALLEL:-$(nproc)}

if ! command -v clang >/dev/null; then
    echo "fuzz: clang is not installed (scripts/install-deps.sh installs clang and libclang-rt-14-dev)" >&2
    exit 1
fi
if [ ! -f "$build/CMakeCache.txt" ]; then
    CC=clang cmake -S . -B "$build" -DDDP_FUZZ=ON -DDDP_BUILD_TESTS=OFF -DDDP_CUDA=OFF \
        -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
fi
cmake --build "$build" -j "$jobs" --target fuzzers >/dev/null

# Leaks are checked at exit only (a harness returns everything it takes), and a store harness
# run must not leave the fuzzer's threads stuck: ASan aborts, libFuzzer reports.
export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

# One target: its seeds, then fuzzing. Its summary line goes to $build/fuzz-$t.sum; a failing
# seed, a crash or an early stop also leaves $build/fuzz-$t.failed.
fuzz_one() {
    local t=$1
    local bin=$build/bin/fuzz_$t seeds=tests/fuzz/corpus/$t work=$build/corpus/$t
    local art=$build/artifacts/$t log=$build/fuzz-$t.log sum=$build/fuzz-$t.sum
    local opts=() before after done_line corp cov execs rate crashes
    mkdir -p "$work" "$art"
    [ -f "tests/fuzz/$t.dict" ] && opts+=("-dict=tests/fuzz/$t.dict")
    case $t in # room for what each format needs to get interesting (libFuzzer's default: 4 KiB)
    config) opts+=(-max_len=16384) ;; # a few thousand nested maps once overflowed the stack
    ckpt | store | store_client | tcp | trainstate) opts+=(-max_len=8192) ;;
    esac

    # The seeds first, crash regressions among them: each must run cleanly.
    if ! "$bin" -runs=0 "$seeds" >"$log" 2>&1; then
        {
            echo "fuzz: $t: a seed input fails (see $log)"
            tail -30 "$log"
        } >&2
        printf '%-8s seed corpus FAILS\n' "$t" >"$sum"
        : >"$build/fuzz-$t.failed"
        return 0
    fi
    before=$(find "$art" -type f | wc -l)
    # -rss_limit_mb and -timeout turn a memory blow-up or a hang into a reported crash;
    # FUZZ_ARGS is split into words on purpose.
    # shellcheck disable=SC2086
    "$bin" -max_total_time="$secs" -print_final_stats=1 -rss_limit_mb=2048 -timeout=25 \
        -artifact_prefix="$art/" "${opts[@]}" ${FUZZ_ARGS:-} "$work" "$seeds" >>"$log" 2>&1 || true
    after=$(find "$art" -type f | wc -l)
    # libFuzzer's last status line: "#N DONE cov: E ft: F corp: FILES/SIZE …" (the corpus it
    # keeps: inputs that each add coverage; SIZE in b, Kb or Mb).
    done_line=$(grep -E '^#[0-9]+[[:space:]]+DONE' "$log" | tail -1)
    corp=$(sed -n 's/.* corp: \([0-9]*\/[0-9]*[KM]*b\).*/\1/p' <<<"$done_line")
    cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$done_line")
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
    crashes=$((after - before))
    printf '%-8s corpus %12s  cov %5s  %10s execs  %7s/s  crashes %s\n' \
        "$t" "${corp:-?}" "${cov:-?}" "${execs:-?}" "${rate:-?}" "$crashes" >"$sum"
    if [ "$crashes" -ne 0 ] || [ -z "$execs" ]; then
        {
            echo "fuzz: $t: crashed or stopped early; inputs in $art/, log $log:"
            grep -E "ERROR|SUMMARY|==[0-9]+==|runtime error|stalled" "$log" | head -20 || true
        } >&2
        : >"$build/fuzz-$t.failed"
    fi
}

for t in "${targets[@]}"; do
    [ -x "$build/bin/fuzz_$t" ] || { echo "fuzz: no target '$t' ($build/bin/fuzz_$t)" >&2; exit 1; }
    rm -f "$build/fuzz-$t.sum" "$build/fuzz-$t.failed"
done
# FUZZ_PARALLEL targets at a time (each libFuzzer process is one thread), so that a CI pass
# takes ceil(targets / cores) × SECONDS rather than targets × SECONDS.
for t in "${targets[@]}"; do
    while [ "$(jobs -rp | wc -l)" -ge "$par" ]; do
        wait -n || true
    done
    fuzz_one "$t" &
done
wait
status=0
summary=()
for t in "${targets[@]}"; do
    if [ -f "$build/fuzz-$t.sum" ]; then
        summary+=("$(cat "$build/fuzz-$t.sum")")
    else
        summary+=("$(printf '%-8s no result (the script failed; see %s)' "$t" "$build/fuzz-$t.log")")
        status=1
    fi
    [ ! -f "$build/fuzz-$t.failed" ] || status=1
done
echo "fuzz: ${secs} s per target ($build; $(date -u +%Y-%m-%dT%H:%MZ))"
printf '  %s\n' "${summary[@]}"
exit $status
