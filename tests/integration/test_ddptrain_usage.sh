#!/usr/bin/env bash
# ddptrain as a new user meets it: a value out of range names its key and the value given (not a
# list of every bound), and an out_dir that cannot be written stops every rank before any
# training, instead of failing at the first checkpoint after the whole run.
. "$(dirname "$0")/lib.sh"
TRAIN=$BIN/ddptrain
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 DDP_DATA_CACHE=$T/cache
cd "$T"

check() { # check 'MESSAGE' ARGS...: exit 2 with MESSAGE, nothing written
    local want=$1 rc=0
    shift
    "$TRAIN" --out_dir "$T/run" "$@" >out 2>err || rc=$?
    [ $rc -eq 2 ] || { cat err >&2; fail "ddptrain $* exited $rc, want 2"; }
    assert_contains err "$want"
    [ ! -e "$T/run" ] || fail "ddptrain $* created its out_dir before refusing"
}
check "key 'epochs' is -1; it must be ≥ 0" --epochs -1
check "key 'batch_size' is 0; it must be ≥ 1" --batch_size 0
check "key 'grad_accum' is 0; it must be ≥ 1" --grad_accum 0
check "key 'lr' is 0; it must be > 0" --lr 0
check "key 'warmup_steps' is -5; it must be ≥ 0" --warmup_steps -5
check "key 'checkpoint.keep' is 0; it must be ≥ 1" --checkpoint.keep 0
check "key 'grad_clip' is -1; it must be ≥ 0" --grad_clip -1
check "key 'model.dropout' is 1; it must be below 1" --model.dropout 1
printf 'batch_size: -3\n' >neg.yaml
check "key 'batch_size' is -3; it must be ≥ 1" --config neg.yaml
# Layer sizes and AdamW's betas and eps: named by their key, exit 2 (they failed later, exit 1,
# as "rank 0: model: model hidden[0] is 0" or an optimizer line listing every bound).
check "key 'model.hidden' has 0 (entry 1, the command line); every size must be from 1 to 16777216" \
    --model.hidden 0
printf 'model:\n  type: cnn\n  channels: [8, 0]\n' >ch.yaml
check "key 'model.channels' has 0 (entry 2, ch.yaml line 3)" --config ch.yaml
check "key 'betas' is 0.9,1.5 (the command line); each of the two must be from 0 to below 1" \
    --optimizer adamw --betas 0.9,1.5
check "key 'eps' is -1; it must be ≥ 0" --optimizer adamw --eps -1
check "schedule step needs lr_step_epochs ≥ 1" --schedule step
check "key 'lr_gamma' is 0; it must be > 0" --schedule step --lr_step_epochs 1 --lr_gamma 0
# Past 32 bits: refused (until 2026-11-26 cut: batch_size 4294967360 trained with 64, and
# 2147483648 failed later as a negative max_batch, exit 1).
check "key 'batch_size' is 4294967360; it must be ≥ 1 and ≤ 2147483647" --batch_size 4294967360
check "key 'batch_size' is 2147483648; it must be ≥ 1 and ≤ 2147483647" --batch_size 2147483648
check "key 'grad_accum' is 4294967298; it must be ≥ 1 and ≤ 2147483647" --grad_accum 4294967298
# A GPT's size keys, each by name (one message listed them all, with the lower bounds alone)
check "key 'model.block_size' is 100000000; it must be from 1 to 1048576" \
    --model.type gpt --model.block_size 100000000
check "key 'model.n_head' is 0; it must be from 1 to 1048576" --model.type gpt --model.n_head 0
check "key 'model.vocab_size' is 70000; it must be from 1 to 65536 (token files hold uint16 ids)" \
    --model.type gpt --model.vocab_size 70000
ok "a value out of range names its key and value, before any work"

# A small IDX data set (600 training images, 100 test; labels 0-9 in turn) for the checks that
# run whole epochs: Fashion-MNIST's 60000 took most of this test's time, under TSan a minute.
small_idx small 600 100

# schedule step: torch's StepLR stepped per epoch (lr × lr_gamma every lr_step_epochs epochs;
# torch's names step_size and gamma point to the keys). 9 batches of 64 an epoch.
"$TRAIN" --out_dir "$T/steplr" --data.dir small --epochs 3 --batch_size 64 --log_every 9 --lr 0.2 \
    --schedule step --lr_step_epochs 1 --lr_gamma 0.5 >out 2>err || { cat err; fail "schedule step"; }
lrs=$(sed -n 's/.*"epoch": \([0-9]\),.*"lr": \([0-9.e-]*\).*/\1 \2/p' "$T/steplr/metrics.jsonl" |
    awk '{ printf "%s:%.6g ", $1, $2 }')
[ "$lrs" = "0:0.2 1:0.1 2:0.05 " ] || fail "StepLR per epoch: got '$lrs'"
rc=0; "$TRAIN" --out_dir "$T/run" --step_size 3 >out 2>err || rc=$?
assert_contains err "ddptrain's key for 'step_size' is 'lr_step_epochs'"
ok "schedule step: lr × lr_gamma each lr_step_epochs (0.2, 0.1, 0.05 over 3 epochs), as StepLR"

# An effective batch beyond an epoch (9 batches of 64 an epoch, grad_accum 40): a note, one step.
"$TRAIN" --out_dir "$T/bigacc" --data.dir small --epochs 1 --batch_size 64 --grad_accum 40 \
    >out 2>err || { cat err; fail "grad_accum beyond an epoch"; }
assert_contains out "note: an epoch gives each rank 9 batches of 64, fewer than grad_accum 40"
assert_contains out "trained 1 step in"
ok "an effective batch larger than an epoch: a note saying steps span epochs; 'trained 1 step'"

# A key twice in one YAML file is refused (parsers differ on which wins); a YAML list is read
# as comma-separated text for a text key (betas: [0.9, 0.95], as PyTorch writes them).
printf 'lr: 0.1\nbatch_size: 8\nlr: 0.2\n' >dup.yaml
check "key 'lr' is set twice in 'dup.yaml' (line 1 and line 3); keep one of them" --config dup.yaml
printf 'optimizer: adamw\nbetas: [0.9, 0.95, 0.99]\n' >b3.yaml
check "betas '0.9,0.95,0.99' is not two numbers like 0.9,0.95" --config b3.yaml
# On the command line too, as the YAML list's text or in its brackets (before 2026-11-25
# --betas "[0.9, 0.95]" was refused): the same values, so the same losses.
check "betas '[0.9, 0.95' is not two numbers like 0.9,0.95 or [0.9, 0.95] (the command line)" \
    --optimizer adamw --betas "[0.9, 0.95"
check "betas '0.9 0.95' is not two numbers" --optimizer adamw --betas "0.9 0.95"
check "schedule step needs lr_step_epochs" --optimizer adamw --betas " [ 0.9 ,0.95 ] " --schedule step
i=0
for b in 0.8,0.95 "[0.8, 0.95]" 0.5,0.95; do
    "$TRAIN" --optimizer adamw --lr 0.01 --betas "$b" --out_dir "$T/runc$i" --total_steps 3 \
        --log_every 1 --tensorboard false >out 2>err || { cat err >&2; fail "--betas '$b' refused"; }
    grep -o 'step 3/3 | epoch 0 | loss [0-9.]*' out >loss$i
    [ -s loss$i ] || { cat out; fail "--betas '$b': no step 3 line"; }
    rm -rf "$T/runc$i"
    i=$((i + 1))
done
cmp -s loss0 loss1 || fail "--betas '[0.8, 0.95]' trained otherwise than 0.8,0.95"
! cmp -s loss0 loss2 || fail "--betas 0.5,0.95 trained as 0.8,0.95 (betas ignored?)"
# shard_optimizer true with one process: nothing to split, and the DDP line says so (it was
# silently unsharded); auto says nothing.
"$TRAIN" --out_dir "$T/runs1" --total_steps 1 --shard_optimizer true --tensorboard false \
    >out 2>err || { cat err >&2; fail "shard_optimizer true, 1 rank"; }
assert_contains out "effective batch 64; optimizer step not sharded (shard_optimizer true needs 2 or more processes)"
"$TRAIN" --out_dir "$T/runs2" --total_steps 1 --tensorboard false >out 2>err ||
    { cat err >&2; fail "shard_optimizer auto, 1 rank"; }
assert_not_contains out "sharded"
rm -rf "$T/runs1" "$T/runs2"
printf 'optimizer: adamw\nlr: 0.001\nbetas: [0.8, 0.95]\n' >b2.yaml
"$TRAIN" --config b2.yaml --out_dir "$T/runb" --total_steps 2 --warmup_steps 3 \
    --tensorboard false >out 2>err || { cat err >&2; fail "betas as a YAML list refused"; }
assert_contains out "note: warmup_steps 3 > the run's 2 steps: the learning rate stays in its warmup"
# A warmup as long as the run reaches lr at its last step (lr·(s+1)/warmup_steps): no note.
"$TRAIN" --out_dir "$T/runw" --total_steps 2 --warmup_steps 2 --log_every 1 --tensorboard false \
    >outw 2>errw || { cat errw >&2; fail "a warmup as long as the run failed"; }
assert_not_contains outw "note: warmup_steps"
assert_contains outw "step 2/2 | epoch 0 | loss"
assert_contains outw "| lr 0.1 |"
grep -q 'betas: ."0.8,0.95' "$T/runb/checkpoints/step2.safetensors" ||
    fail "betas [0.8, 0.95] not stored as 0.8,0.95"
# Generation's keys on a model that does not generate are refused, not ignored.
check "key 'prompt' (the command line) is for a gpt model's generation, but model.type is mlp" \
    --prompt hi
rc=0
"$TRAIN" --task predict --out_dir "$T/runb" --prompt hi >out 2>err || rc=$?
[ $rc -eq 2 ] || fail "predict --prompt on an mlp checkpoint exited $rc, want 2"
assert_contains err "key 'prompt' (the command line) is for a gpt model's generation"
# predict_out's default is out_dir/predictions.csv, not the working directory
"$TRAIN" --task predict --out_dir "$T/runb" >out 2>err || { cat err >&2; fail "predict failed"; }
assert_contains out "wrote 10000 predictions to $T/runb/predictions.csv"
[ -s "$T/runb/predictions.csv" ] && [ ! -e predictions.csv ] || fail "predictions not in out_dir"
# predict_out a folder: said before the predictions (it was blamed on the free space after them)
rc=0
"$TRAIN" --task predict --out_dir "$T/runb" --predict_out "$T/runb" >out 2>err || rc=$?
[ $rc -eq 2 ] || { cat err >&2; fail "predict_out a folder: exit $rc, want 2"; }
assert_contains err "predict_out '$T/runb' (the command line) is a folder; give the file to write, e.g. '$T/runb/predictions.csv'"
ok "a key twice in a file, a YAML list for betas, --prompt on an mlp: clear errors; predictions in out_dir, predict_out not a folder"

# PyTorch / Hugging Face names for ddptrain's keys: a HINT with ddptrain's own name.
check "HINT: ddptrain's key for 'learning_rate' is 'lr' (--lr)" --learning_rate 3e-4
check "HINT: ddptrain's key for 'max_steps' is 'total_steps'" --max_steps 100
check "HINT: ddptrain's key for 'gradient_accumulation_steps' is 'grad_accum'" \
    --gradient_accumulation_steps 2
printf 'num_epochs: 3\n' >foreign.yaml
check "HINT: ddptrain's key for 'num_epochs' is 'epochs'" --config foreign.yaml
check "unknown key 'foo' (on the command line); --help lists every key" --foo 1
ok "learning_rate, max_steps, gradient_accumulation_steps, num_epochs: ddptrain's names given"
# A launcher flag after the program's name ('ddprun ddptrain --nproc_per_node=2') reaches
# ddptrain: say it is ddprun's and where it goes, not only that the key is unknown.
check "HINT: --nproc_per_node is a flag of the launcher (ddprun's, as torchrun's): put it before the program's name, 'ddprun --nproc_per_node … ddptrain …'" \
    --nproc-per-node=2
check "HINT: --standalone is a flag of the launcher" --standalone
assert_not_contains err "did you mean"
check "HINT: --tee is a flag of the launcher" --tee 3
assert_not_contains err "did you mean"
ok "a launcher flag given after the program: said to be ddprun's, to go before the program"

# One training run per out_dir at a time: while another holds out_dir's lock (a run, here
# the test's shell), a second run is refused before reading or deleting anything there, --overwrite
# included (two runs started together both trained into it, overwriting each other's stepN).
mkdir -p busy/checkpoints && echo keep >busy/checkpoints/step99.safetensors
exec 9<busy
flock -n 9 || fail "cannot lock busy"
for extra in "" "--overwrite true" "--resume_from auto"; do
    rc=0
    # shellcheck disable=SC2086
    "$TRAIN" --out_dir busy --total_steps 2 $extra >out 2>err || rc=$?
    [ $rc -eq 2 ] || { cat err >&2; fail "a second run into a busy out_dir ($extra) exited $rc"; }
    assert_contains err "ddptrain: out_dir 'busy' is in use by another training run (it holds the folder's lock)"
done
[ "$(cat busy/checkpoints/step99.safetensors)" = keep ] || fail "the refused run touched a checkpoint"
[ "$(ls busy)" = checkpoints ] || fail "the refused run wrote into out_dir: $(ls busy)"
exec 9<&-
ok "a second training run into an out_dir in use is refused, nothing read or deleted"

# out_dir below a regular file: not writable. Two ranks: both stop at once, no training.
touch afile
rc=0
t0=$(now_ms)
"$DDPRUN" --standalone --nproc_per_node 2 "$TRAIN" --out_dir "$T/afile/run" --total_steps 20000 \
    >out 2>err || rc=$?
[ $rc -eq 1 ] || { cat err >&2; fail "ddprun exited $rc for an unwritable out_dir, want 1"; }
assert_contains err "out_dir '$T/afile/run' is not writable"
assert_contains err "choose another --out_dir"
assert_contains err "worker failed: rank 0 (local rank 0, role 'default') ended with exit code 2"
assert_not_contains out "step 50/"
[ $(($(now_ms) - t0)) -lt 20000 ] || fail "an unwritable out_dir took more than 20 s to stop"
ok "an unwritable out_dir stops both ranks before the first step; the summary names rank 0, not rank 1 (exit 86)"

# out_dir writable but its checkpoints folder is not (a file of that name): same, before work.
mkdir -p run2 && touch run2/checkpoints
rc=0
"$TRAIN" --out_dir "$T/run2" --total_steps 20000 >out 2>err || rc=$?
[ $rc -eq 2 ] || { cat err >&2; fail "exit $rc for a checkpoints file, want 2"; }
assert_contains err "out_dir '$T/run2': '$T/run2/checkpoints' is a file, not a directory"
assert_contains err "move the file away or choose another --out_dir"
assert_not_contains err "Permission denied" # before 2026-11-25: access()'s word for a file
assert_not_contains out "step 50/"
# A resume looks there first: the same words from the checkpoint library, still exit 2.
rc=0
"$TRAIN" --out_dir "$T/run2" --total_steps 20 --resume_from latest >out 2>err || rc=$?
[ $rc -eq 2 ] || { cat err >&2; fail "resume: exit $rc for a checkpoints file, want 2"; }
assert_contains err "checkpoint directory '$T/run2/checkpoints' is a file, not a directory; move"
ok "out_dir/checkpoints that is a file: said so (not 'Permission denied'), before the first step"

# A truncated latest checkpoint: a clear error naming the one before it, and nothing deleted;
# moving the damaged one aside, as the HINT says, resumes from the one named.
"$TRAIN" --out_dir "$T/run3" --total_steps 20 --checkpoint.every 10 --log_every 10 \
    --tensorboard false >out 2>err || { cat err >&2; fail "the 20-step run failed"; }
c=$T/run3/checkpoints
[ -e "$c/step10.safetensors" ] && [ -e "$c/step20.safetensors" ] || fail "no step10/step20"
size10=$(stat -c %s "$c/step10.safetensors")
truncate -s 5000 "$c/step20.safetensors"
rc=0
"$TRAIN" --out_dir "$T/run3" --total_steps 30 --resume_from latest >out 2>err || rc=$?
[ $rc -ne 0 ] || fail "a truncated latest checkpoint was resumed from"
assert_contains err "step20.safetensors' is malformed"
assert_contains err "HINT: the checkpoint before it is '$c/step10.safetensors': move the damaged one out of the way (mv '$c/step20.safetensors' '$c/step20.safetensors.damaged'), then --resume_from latest resumes from it"
[ "$(stat -c %s "$c/step10.safetensors")" = "$size10" ] || fail "step10 changed"
[ "$(stat -c %s "$c/step20.safetensors")" = 5000 ] || fail "the damaged step20 was touched"
mv "$c/step20.safetensors" "$c/step20.safetensors.damaged"
"$TRAIN" --out_dir "$T/run3" --total_steps 30 --resume_from latest \
    --log_every 10 >out 2>err || { cat err >&2; fail "resuming from the hint's checkpoint failed"; }
assert_contains out "resumed from $c/step10.safetensors at step 10"
ok "a truncated latest checkpoint: clear error naming the previous one, nothing lost"

# One byte changed in the latest checkpoint's data (a flipped bit on disk): it loaded as other
# weights before 2026-11-25; now the data's checksum refuses it, with the same hint.
[ -e "$c/step30.safetensors" ] || fail "no step30"
size=$(stat -c %s "$c/step30.safetensors")
printf '\x5a' | dd of="$c/step30.safetensors" bs=1 seek=$((size - 3)) conv=notrunc status=none
rc=0
"$TRAIN" --out_dir "$T/run3" --total_steps 40 --resume_from latest >out 2>err || rc=$?
[ $rc -eq 2 ] || { cat err >&2; fail "a checkpoint with a changed byte: exit $rc, want 2"; }
assert_contains err "step30.safetensors' is malformed: its data does not match the checksum saved with it"
assert_contains err "HINT: the checkpoint before it is '$c/step"
# --task test and predict likewise (until 2026-11-26: exit 1 and no HINT, where a truncated file
# gave both)
for task in test predict; do
    rc=0
    "$TRAIN" --task $task --out_dir "$T/run3" >out 2>err || rc=$?
    [ $rc -eq 2 ] || { cat err >&2; fail "--task $task, a changed byte: exit $rc, want 2"; }
    assert_contains err "does not match the checksum saved with it"
    assert_contains err "HINT: the checkpoint before it is '$c/step10.safetensors': --checkpoint $c/step10.safetensors"
done
ok "a byte changed in the latest checkpoint: refused by its checksum (exit 2), the one before it named"

# --task test with an out_dir that holds no run: say what to give instead.
rc=0
"$TRAIN" --task test --out_dir "$T/norun" >out 2>err || rc=$?
[ $rc -eq 2 ] || { cat err >&2; fail "--task test without a run exited $rc, want 2"; }
assert_contains err "HINT: --task test reads the checkpoint of a training run: give that run's --out_dir (now '$T/norun') or --checkpoint PATH"
[ ! -e "$T/norun" ] || fail "--task test created the out_dir it could not read"
ok "--task test on an out_dir with no run: a HINT naming --out_dir and --checkpoint"

# --resume_from auto under ddprun --max_restarts: one command line for the first attempt (no
# checkpoint yet: step 0) and the restart (the latest checkpoint), as torchrun's elastic scripts
# do. Rank 1 of attempt 0 is killed once the first checkpoint exists. Under the sanitizers a
# 784-16-10 MLP (the default's steps took 23 s of CPU under TSan, 4 s so); the plain build keeps
# the default, whose steps leave the wrapper's kill more room before the run could end.
tiny=()
[ -z "$SANITIZE" ] || tiny=(--model.hidden 16)
cat >wrap.sh <<WRAP
#!/bin/sh
if [ "\$DDP_RESTART_COUNT" = 0 ] && [ "\$RANK" = 1 ]; then
    "$TRAIN" "\$@" & p=\$!
    echo \$p >"$T/pid.wrapped"
    while [ ! -e "$T/run4/checkpoints/step100.safetensors" ] && kill -0 \$p 2>/dev/null; do
        sleep 0.02
    done
    kill -9 \$p 2>/dev/null
    exit 7
fi
exec "$TRAIN" "\$@"
WRAP
chmod +x wrap.sh
"$DDPRUN" --standalone --nproc_per_node 2 --max_restarts 1 ./wrap.sh --out_dir "$T/run4" --data.dir small \
    --total_steps 400 --checkpoint.every 100 --log_every 100 --tensorboard false --resume_from auto \
    ${tiny[@]+"${tiny[@]}"} >out 2>err || { cat out err >&2; fail "the restarted job failed"; }
assert_contains out "resume_from auto: no checkpoint in $T/run4/checkpoints yet: starting at step 0"
assert_contains out "resumed from $T/run4/checkpoints/step"
assert_contains err "ended with exit code 7"
[ -e "$T/run4/checkpoints/step400.safetensors" ] || fail "the restart did not finish the run"
ok "--resume_from auto: a fresh start, then the restart resumes from the latest checkpoint"

# A batch larger than a rank's share of the data: the numbers, not a question.
rc=0
"$DDPRUN" --standalone --nproc_per_node 2 "$TRAIN" --out_dir "$T/run5" --batch_size 40000 \
    --total_steps 2 >out 2>err || rc=$?
[ $rc -eq 1 ] || { cat out err >&2; fail "batch_size 40000 × 2 ranks exited $rc, want 1"; }
assert_contains err "batch_size 40000 is more than the 30000 samples each of the 2 ranks gets per epoch (60000 in the training set); lower batch_size"
ok "batch_size above a rank's share of the data: the numbers and what to do"

# log_every 0: what --help says (until 2026-11-25 it said nothing of 0), one progress line at
# the last step.
"$TRAIN" --help >help.out || fail "ddptrain --help exited $?"
assert_contains help.out "progress line every N steps (0: at the last step only)"
"$TRAIN" --out_dir "$T/run6" --total_steps 3 --log_every 0 --tensorboard false >out 2>err ||
    { cat out err >&2; fail "log_every 0 failed"; }
[ "$(grep -c '^step ' out)" = 1 ] && assert_contains out "step 3/3 |" ||
    { cat out >&2; fail "log_every 0 did not give one progress line, at step 3"; }
ok "log_every 0: one progress line, at the last step, as --help says"

# --config or --local_rank with nothing after it: its value is missing (until 2026-11-25:
# "unknown key 'config'", a key --help does not list since it is not one).
for flag in --config --local_rank --local-rank; do
    rc=0
    "$TRAIN" "$flag" >out 2>err || rc=$?
    [ $rc -eq 2 ] || { cat out err >&2; fail "ddptrain $flag exited $rc, want 2"; }
    assert_contains err "option '$flag' needs a value"
    assert_not_contains err "unknown key"
done
# The command line's forms --help now names: --key=value, dashes, a bare bool.
assert_contains help.out "--key value or --key=value, dashes or"
"$TRAIN" --out-dir "$T/run7" --total-steps=1 --tensorboard=false --overwrite >out 2>err ||
    { cat out err >&2; fail "--out-dir --total-steps=1 --overwrite failed"; }
assert_contains out "trained 1 step in"
ok "--config/--local_rank without a value said so; --key=value, dashes and a bare bool taken"

# --version, as ddprun's: every tool names itself and ddpc's version, exit 0, nothing written.
for tool in ddprun ddptrain ddpbench ddpprep; do
    "$BIN/$tool" --version >ver.out 2>&1 || { cat ver.out; fail "$tool --version failed"; }
    [ "$(cat ver.out)" = "$tool (ddpc) 0.1.0" ] || fail "$tool --version: $(cat ver.out)"
done
ok "ddprun, ddptrain, ddpbench and ddpprep answer --version"

# Another process holding the data cache's preparation lock (stopped, stuck): after 5 s the rank
# says it waits and for what (it was silent for up to 10 min until 2026-11-26), and trains once
# the lock is free.
lockcache=$T/lockcache
mkdir -p "$lockcache"
ref=$(ls "$T/cache"/train-images-idx3-ubyte.*[0-9] 2>/dev/null | head -1)
[ -n "$ref" ] || fail "no prepared training images in $T/cache to name the lock after"
lock="$lockcache/$(basename "$ref").lock"
flock "$lock" sleep 7 &
BG_PIDS+=($!)
holder=$!
sleep 0.3
DDP_DATA_CACHE=$lockcache "$TRAIN" --total_steps 2 --eval_every 0 --out_dir lockwait \
    >lockwait.out 2>&1 || { cat lockwait.out; fail "training behind a held lock failed"; }
wait $holder
assert_contains lockwait.out "ddp: waiting for another process to"
assert_contains lockwait.out "$lock"
ok "a held data-preparation lock: said after 5 s, then trained"

# Under an address-space limit (ulimit -v) too small for OpenBLAS's 128 MiB buffers, a thread
# retried the failed mmap forever and ddptrain hung in its first product, or at exit even after
# a usage error (until 2026-11-26): now a run is refused with a line, and every exit is prompt.
# With OpenBLAS's own threads (its count unset). Not under the sanitizers (their shadow memory
# needs terabytes of address space).
if [ -z "$SANITIZE" ]; then
    rc=0
    (unset OPENBLAS_NUM_THREADS OMP_NUM_THREADS && ulimit -v 200000 &&
        timeout 30 "$TRAIN" --total_steps 2 --eval_every 0 --out_dir vlim) >vlim.out 2>&1 || rc=$?
    [ $rc -eq 1 ] || { cat vlim.out; fail "ddptrain under ulimit -v 200000: exit $rc, want 1"; }
    assert_contains vlim.out "the address-space limit (ulimit -v: 195 MiB) leaves less than"
    assert_contains vlim.out "MiB free beside what is mapped already, the least a run needs (the BLAS maps 128 MiB"
    rc=0
    (unset OPENBLAS_NUM_THREADS OMP_NUM_THREADS && ulimit -v 150000 &&
        timeout 30 "$TRAIN" --max_steps 2) >vlim2.out 2>&1 || rc=$?
    [ $rc -eq 2 ] || { cat vlim2.out; fail "a usage error under ulimit -v 150000: exit $rc, want 2"; }
    assert_contains vlim2.out "is 'total_steps'"
    (ulimit -v 2097152 && timeout 60 "$TRAIN" --total_steps 2 --eval_every 0 --out_dir vlim3) \
        >vlim3.out 2>&1 || { cat vlim3.out; fail "a run under ulimit -v 2 GiB (1 BLAS thread) refused"; }
    ok "an address-space limit too small for the BLAS: a run refused in a line, a usage error prompt; 2 GiB trains"
fi
