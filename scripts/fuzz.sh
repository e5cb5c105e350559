#!/usr/bin/env bash
# Fuzzes every input a user or a stranger can hand ddpc: the YAML config parser, IDX and token
# data files, safetensors checkpoint headers, and the store's wire protocol (tests/fuzz/).
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
# Environment: FUZZ_BUILD (build-fuzz), FUZZ_JOBS (cores to build with: nproc),
# FUZZ_ARGS (more libFuzzer flags, e.g. "-max_len=65536").
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-60}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(config idx tokens ckpt store)
build=${FUZZ_BUILD:-build-fuzz}
jobs=${FUZZ_JOBS:-$(nproc)}

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

status=0
summary=()
for t in "${targets[@]}"; do
    bin=$build/bin/fuzz_$t
    seeds=tests/fuzz/corpus/$t
    work=$build/corpus/$t
    art=$build/artifacts/$t
    log=$build/fuzz-$t.log
    [ -x "$bin" ] || { echo "fuzz: no target '$t' ($bin)" >&2; exit 1; }
    mkdir -p "$work" "$art"
    opts=()
    [ -f tests/fuzz/$t.dict ] && opts+=(-dict=tests/fuzz/$t.dict)
    case $t in # room for what each format needs to get interesting (libFuzzer's default: 4 KiB)
    config) opts+=(-max_len=16384) ;; # a few thousand nested maps once overflowed the stack
    ckpt | store) opts+=(-max_len=8192) ;;
    esac

    # The seeds first, crash regressions among them: each must run cleanly.
    if ! "$bin" -runs=0 "$seeds" >"$log" 2>&1; then
        echo "fuzz: $t: a seed input fails (see $log)" >&2
        tail -30 "$log" >&2
        status=1
        summary+=("$(printf '%-8s seed corpus FAILS' "$t")")
        continue
    fi
    before=$(find "$art" -type f | wc -l)
    # -rss_limit_mb and -timeout turn a memory blow-up or a hang into a reported crash.
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
    summary+=("$(printf '%-8s corpus %12s  cov %5s  %10s execs  %7s/s  crashes %s' \
        "$t" "${corp:-?}" "${cov:-?}" "${execs:-?}" "${rate:-?}" "$crashes")")
    if [ "$crashes" -ne 0 ] || [ -z "$execs" ]; then
        status=1
        echo "fuzz: $t: crashed or stopped early; inputs in $art/, log $log:" >&2
        grep -E "ERROR|SUMMARY|==[0-9]+==|runtime error|stalled" "$log" | head -20 >&2 || true
    fi
done
echo "fuzz: ${secs} s per target ($build; $(date -u +%Y-%m-%dT%H:%MZ))"
printf '  %s\n' "${summary[@]}"
exit $status
