#!/usr/bin/env bash
# ddprun's GPU flags without a GPU: CUDA_VISIBLE_DEVICES is the fake device list (ddprun reads only
# the variable, never the driver). --nproc_per_node gpu starts one worker per visible GPU and, as
# torchrun, leaves CUDA_VISIBLE_DEVICES alone (libddp binds GPU LOCAL_RANK); --isolate_gpus gives
# each worker only its own GPU, wrapping when workers outnumber GPUs; no visible GPU is a clear
# error.
. "$(dirname "$0")/lib.sh"

get() { sed -n "s/^$2=//p" "$1"; }

# One worker per visible GPU; every worker sees the whole list and its LOCAL_RANK.
d=$T/gpu; mkdir -p "$d"
CUDA_VISIBLE_DEVICES=3,5,7 "$DDPRUN" --standalone --nproc_per_node gpu "$WORKER" env "$d" \
    >"$d/out" 2>"$d/err" || { cat "$d/err"; fail "ddprun --nproc_per_node gpu exited $?"; }
[ "$(ls "$d"/env.* | wc -l)" -eq 3 ] || fail "3 visible GPUs: expected 3 workers"
for r in 0 1 2; do
    [ "$(get "$d/env.$r" LOCAL_RANK)" = $r ] || fail "LOCAL_RANK in env.$r"
    [ "$(get "$d/env.$r" CUDA_VISIBLE_DEVICES)" = 3,5,7 ] || fail "CUDA_VISIBLE_DEVICES rewritten in env.$r"
done
ok "--nproc_per_node gpu: 3 workers for 3 visible GPUs, CUDA_VISIBLE_DEVICES untouched"

# --isolate_gpus: worker r sees only the r-th visible GPU (indices or UUIDs), wrapping.
d=$T/iso; mkdir -p "$d"
CUDA_VISIBLE_DEVICES=3,5,7 "$DDPRUN" --standalone --nproc_per_node gpu --isolate_gpus "$WORKER" \
    env "$d" >"$d/out" 2>"$d/err" || { cat "$d/err"; fail "ddprun --isolate_gpus exited $?"; }
for r in 0 1 2; do
    want=$(echo 3,5,7 | cut -d, -f$((r + 1)))
    [ "$(get "$d/env.$r" CUDA_VISIBLE_DEVICES)" = "$want" ] || fail "env.$r: want GPU $want"
done
d=$T/wrap; mkdir -p "$d"
CUDA_VISIBLE_DEVICES=GPU-aaaa,GPU-bbbb "$DDPRUN" --standalone --nproc_per_node 4 --isolate-gpus \
    "$WORKER" env "$d" >"$d/out" 2>"$d/err" || { cat "$d/err"; fail "--isolate-gpus × 4 exited $?"; }
for r in 0 1 2 3; do
    want=GPU-aaaa; [ $((r % 2)) -eq 1 ] && want=GPU-bbbb
    [ "$(get "$d/env.$r" CUDA_VISIBLE_DEVICES)" = $want ] || fail "env.$r: want $want"
done
ok "--isolate_gpus: each worker sees its own GPU; 4 workers on 2 GPUs share them in turn"

# auto: the GPU count when GPUs are visible.
d=$T/auto; mkdir -p "$d"
CUDA_VISIBLE_DEVICES=0,1 "$DDPRUN" --standalone --nproc_per_node auto "$WORKER" env "$d" \
    >"$d/out" 2>"$d/err" || fail "ddprun --nproc_per_node auto exited $?"
[ "$(ls "$d"/env.* | wc -l)" -eq 2 ] || fail "auto with 2 visible GPUs: expected 2 workers"
ok "--nproc_per_node auto: one worker per visible GPU"

# No GPU visible: a clear error before anything starts, exit 2.
set +e
CUDA_VISIBLE_DEVICES=-1 "$DDPRUN" --standalone --nproc_per_node gpu "$WORKER" env "$T" \
    >"$T/none.out" 2>"$T/none.err"
rc=$?
CUDA_VISIBLE_DEVICES= "$DDPRUN" --standalone --nproc_per_node 2 --isolate_gpus "$WORKER" env "$T" \
    >"$T/none2.out" 2>"$T/none2.err"
rc2=$?
set -e
[ $rc -eq 2 ] || fail "no GPU with --nproc_per_node gpu: exit $rc, want 2"
assert_contains "$T/none.err" "--nproc_per_node=gpu: no GPU is visible"
[ $rc2 -eq 2 ] || fail "no GPU with --isolate_gpus: exit $rc2, want 2"
assert_contains "$T/none2.err" "--isolate_gpus: no GPU is visible"
[ ! -e "$T/env.0" ] || fail "a worker started without a GPU"
ok "no visible GPU: a clear error, no worker started"
