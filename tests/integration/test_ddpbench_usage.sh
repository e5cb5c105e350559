#!/usr/bin/env bash
# ddpbench's flags as a user meets them: a bad value (an unknown --op or --buffers, a size that
# is not a number of bytes, a negative one, --min 0 or above --max, too many --sizes, a bad
# --iters) stops it before any work with exit 2 and a line naming the flag; odd sizes are rounded
# down to whole elements and the bytes column says what was moved; --iters is honoured as given.
. "$(dirname "$0")/lib.sh"
BENCH=$BIN/ddpbench
export DDP_CACHE_DIR=off

refused() { # refused 'WHAT IT SAYS' ARGS…: exit 2, nothing measured, the message on stderr
    local want=$1 rc=0
    shift
    "$BENCH" "$@" >"$T/out" 2>"$T/err" || rc=$?
    [ "$rc" = 2 ] || { cat "$T/out" "$T/err" >&2; fail "ddpbench $* exited $rc, not 2"; }
    assert_contains "$T/err" "$want"
    [ ! -s "$T/out" ] || { cat "$T/out" >&2; fail "ddpbench $* measured something"; }
    ok "ddpbench $* refused: $(head -1 "$T/err")"
}

refused "--op 'bogus': use allreduce, broadcast" --op bogus --sizes 4K
refused "--buffers 'foo': use arena or private" --buffers foo --sizes 4K
refused "--sizes '-1': give a whole number of bytes" --sizes -1
refused "--sizes 'abc': give a whole number of bytes" --sizes abc,4K
refused "--sizes '1x': give a whole number of bytes" --sizes 4K,1x
refused "--sizes '1e30': give a whole number of bytes" --sizes 1e30
refused "--min '0': give a whole number of bytes" --min 0 --max 16
refused "--min 8388608 is above --max 4096" --min 8M --max 4K
refused "--iters 'abc': give a number of calls" --iters abc --sizes 4K
refused "--dtype 'half': use float32, bfloat16 or float16" --dtype half --sizes 4K
refused "--reduce 'prod': use sum, avg, min or max" --reduce prod --sizes 4K
refused "--sizes '$(seq -s, 1 65)': at most 64 sizes" --sizes "$(seq -s, 1 65)"
# An unknown flag is named as unknown, also as the last argument (until 2026-11-25 it was told
# that it "needs a value"); the error message's own bound, 1T, is a size it takes.
refused "unknown option '--bogus'" --bogus
refused "unknown option '--bogus'" --bogus 3
refused "unknown option '--csv=1'" --csv=1
refused "'--iters' needs a value" --sizes 4K --iters
refused "--min 1099511627776 is above --max 4" --min 1T --max 4
refused "--sizes '2T': give a whole number of bytes from 1 to 1T" --sizes 2T
# A backend for the other --device's memory, named in ddpbench's own flags (until 2026-11-25 the
# group's message, "this group's are in host memory", exit 1, after the set-up).
refused "--backend 'nccl' moves GPU buffers: add --device cuda" --backend nccl --sizes 4K
refused "--backend 'cuda-staged' moves GPU buffers: add --device cuda" --backend cuda-staged --sizes 4K
refused "--backend 'shm' moves host buffers, not --device cuda's" --device cuda --backend shm --sizes 4K

# '--flag=value', as ddprun and ddptrain take flags (until 2026-11-25 an unknown option here).
"$BENCH" --op=broadcast --sizes=4K,8K --iters=3 --csv >"$T/out" 2>"$T/err" ||
    { cat "$T/out" "$T/err" >&2; fail "ddpbench --op=broadcast --sizes=4K,8K --iters=3 failed"; }
got=$(awk -F, '$1 != "op" && !/^#/ {print $1 ":" $2 ":" $7}' "$T/out" | tr '\n' ' ')
[ "$got" = "broadcast:4096:0 broadcast:8192:0 " ] || { cat "$T/out" >&2; fail "--flag=value gave '$got'"; }
ok "--op=broadcast --sizes=4K,8K --iters=3 taken as '--flag value'"
# Its header for a world of one (until 2026-11-25: "1 ranks", "all 1 ranks copying at once").
assert_contains "$T/out" "# ddpbench: 1 rank, backend"
assert_contains "$T/out" "(one rank copying)"

# Odd sizes at 2 ranks: rounded down to whole float32 elements (per rank for allgather and
# reduce_scatter), every result checked (wrong = 0), the bytes column what was moved; a size with
# no element is skipped with a note.
"$DDPRUN" --standalone --nproc_per_node=2 --no_prefix "$BENCH" --op all --sizes 6,13 \
    --iters 3 --csv >"$T/csv" 2>"$T/err" || { cat "$T/csv" "$T/err" >&2; fail "odd sizes"; }
got=$(awk -F, '$1 != "op" && !/^#/ {print $1 ":" $2 ":" $3 ":" $7}' "$T/csv" | tr '\n' ' ')
want="allreduce:4:1:0 allreduce:12:3:0 broadcast:4:1:0 broadcast:12:3:0 allgather:8:1:0 "
want+="reduce_scatter:8:1:0 "
[ "$got" = "$want" ] || { cat "$T/csv" "$T/err" >&2; fail "odd sizes gave '$got', not '$want'"; }
assert_contains "$T/err" "allgather of 6 bytes skipped: less than one float32 per rank"
ok "odd sizes rounded down to whole elements and reported as moved; 6 B allgather skipped"

# --dtype and --reduce (2026-11-26): every collective in bfloat16 and float16 at 3 ranks, every
# reduction checked (an average within the type's rounding), over shm and tcp; the header says
# which. 3 ranks: an average of 3 does not divide exactly, 4 KiB + 2 bytes leaves a tail.
for be in shm tcp; do
    for dt in bfloat16 float16; do
        for red in avg max; do
            "$DDPRUN" --standalone --nproc_per_node=3 --no_prefix "$BENCH" --backend $be --op all \
                --sizes 4098,64K --dtype $dt --reduce $red --iters 2 --csv >"$T/csv" 2>"$T/err" ||
                { cat "$T/csv" "$T/err" >&2; fail "--dtype $dt --reduce $red over $be"; }
            got=$(awk -F, '$1 != "op" && !/^#/ {print $1 ":" $2 ":" $7}' "$T/csv" | tr '\n' ' ')
            want="allreduce:4098:0 allreduce:65536:0 broadcast:4098:0 broadcast:65536:0 "
            want+="allgather:4098:0 allgather:65532:0 reduce_scatter:4098:0 reduce_scatter:65532:0 "
            [ "$got" = "$want" ] || { cat "$T/csv" >&2; fail "$dt $red over $be gave '$got'"; }
            assert_contains "$T/csv" "buffers, $dt $red, in place"
        done
    done
done
ok "--dtype bfloat16/float16 --reduce avg/max at 3 ranks over shm and tcp: every result right"

# Buffers that do not fit in memory: one line saying how big and what to lower (it said
# "ddpbench: out of memory: " until 2026-11-26). Under a 4 GiB address-space limit, so that the
# allocation fails on any host (with vm.overcommit_memory=1 it would succeed, and the buffers'
# memset call the OOM killer). Not under the sanitizers, whose allocators stop the program at a
# 1 TiB request instead of returning NULL.
if [ -z "$SANITIZE" ]; then
    rc=0; (ulimit -v 4000000 && exec "$BENCH" --sizes 1T --buffers private) >"$T/out" 2>"$T/err" || rc=$?
    [ $rc -eq 1 ] || { cat "$T/err"; fail "--sizes 1T exited $rc, not 1"; }
    assert_contains "$T/err" "ddpbench: out of memory for two buffers of 1099511627840 bytes (the largest size × 1 rank); lower --max or --sizes"
    ok "--sizes 1T: out of memory, said with the size"
fi

# --backend tcp (docs/group.md) has no shared-memory arena: one note saying so, not that "the
# arena could not hold" the sizes (what every rank said until 2026-11-25), and it measures.
"$DDPRUN" --standalone --nproc_per_node=2 --no_prefix "$BENCH" --backend tcp --sizes 4K \
    --iters 3 --csv >"$T/csv" 2>"$T/err" || { cat "$T/csv" "$T/err" >&2; fail "--backend tcp"; }
assert_contains "$T/csv" "allreduce,4096,1024,"
assert_contains "$T/err" "backend 'tcp' has no shared-memory arena: private buffers instead"
assert_not_contains "$T/err" "could not hold"
[ "$(grep -c 'no shared-memory arena' "$T/err")" = 1 ] || { cat "$T/err" >&2; fail "the note not once"; }
ok "--backend tcp: private buffers, said once"

# DDP_TIMEOUT bounds the set-up against a store that accepts and never answers (a stranger on
# the port): ddpbench's own 10 min took precedence over it until 2026-11-26.
if command -v python3 >/dev/null; then
    port=$(free_port)
    python3 -c 'import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen(8); keep = []
end = time.time() + 60
while time.time() < end:
    s.settimeout(1)
    try: keep.append(s.accept()[0])
    except OSError: pass' "$port" &
    mute=$!
    BG_PIDS+=($mute)
    sleep 0.5
    rc=0
    start=$(date +%s)
    MASTER_ADDR=127.0.0.1 MASTER_PORT=$port RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 LOCAL_WORLD_SIZE=2 \
        DDP_TIMEOUT=2 timeout 60 "$BENCH" --sizes 1024 --iters 1 >"$T/mute.out" 2>"$T/mute.err" || rc=$?
    took=$(($(date +%s) - start))
    [ $rc -eq 1 ] && [ $took -lt 20 ] || { cat "$T/mute.err"; fail "a mute store: exit $rc after $took s, want 1 within DDP_TIMEOUT"; }
    assert_contains "$T/mute.err" "cannot reach the store at '127.0.0.1:$port' after 2" # 2 s, or 2.01 s under load
    kill $mute 2>/dev/null
    wait $mute 2>/dev/null || true
    ok "a store that never answers: ddpbench gives up after DDP_TIMEOUT (2 s)"
fi
