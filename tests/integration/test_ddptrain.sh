#!/usr/bin/env bash
# ddptrain end to end on Fashion-MNIST (Debian's dataset-fashion-mnist): configuration errors
# before any work; train → test → predict; a run killed by SIGKILL after a checkpoint and
# resumed ends with the same weights, bit for bit, as one that never stopped; a checkpoint saved
# by 4 ranks resumes with 1 and 2; the sharded optimizer step equals the unsharded one bit for
# bit; a corrupt checkpoint is a clear error. The resumed run uses
# dropout and augmentation, whose draws must survive the restart.
. "$(dirname "$0")/lib.sh"
TRAIN=$BIN/ddptrain
DUMP=$BIN/ckpt_tool
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
cd "$T"

# Configuration errors: exit 2 and a message, before anything runs.
rc=0; "$TRAIN" --epoch 3 >out 2>err || rc=$?
[ $rc -eq 2 ] || fail "exit code $rc, expected: $rc -eq 2"
assert_contains err "unknown key 'epoch'"
assert_contains err "did you mean 'epochs'?"
rc=0; "$TRAIN" --lr fast >out 2>err || rc=$?
[ $rc -eq 2 ] || fail "exit code $rc, expected: $rc -eq 2"
assert_contains err "key 'lr': 'fast' is not a number"
printf 'model:\n  type: transformer\n' >bad.yaml
rc=0; "$TRAIN" --config bad.yaml >out 2>err || rc=$?
[ $rc -eq 2 ] || fail "exit code $rc, expected: $rc -eq 2"
assert_contains err "'transformer' is not one of mlp|cnn|gpt"
assert_contains err "bad.yaml line 2"
rc=0; "$TRAIN" --data.dir /no/such/dir >out 2>err || rc=$?
[ $rc -eq 2 ] || fail "exit code $rc, expected: $rc -eq 2"
assert_contains err "cannot open data file '/no/such/dir/train-images-idx3-ubyte': No such file or directory; data.dir '/no/such/dir' must hold train- and t10k-images-idx3-ubyte and -labels-idx1-ubyte (or .gz): Fashion-MNIST is Debian's dataset-fashion-mnist"
[ "$(wc -l <err)" -eq 1 ] || { cat err; fail "a missing data file: want one line"; }
rc=0; "$TRAIN" --augment.shift 28 >out 2>err || rc=$?
[ $rc -ne 0 ] || fail "augment.shift 28 on 28 × 28 images was accepted"
assert_contains err "augment.shift 28 must be from 0 to 27"
[ ! -d runs ] || fail "a bad augment.shift started work"
"$TRAIN" --help >help
for k in model.type model.hidden model.activation augment.hflip augment.shift batch_size grad_accum lr_scaling warmup_steps checkpoint.every \
    resume_from predict_out; do assert_contains help "$k"; done
ok "configuration errors are caught before any work, --help lists every key"

# Rank 0 cannot save a checkpoint (a full disk: a 3 MB tmpfs). Rank 1 learns it through the
# broadcast and usually exits first, with DDP_EXIT_PEER_FAILED (86); ddprun's summary names
# rank 0 and its "No space left on device" line, not rank 1. Needs mount (root); skipped without.
mkdir -p full
if mount -t tmpfs -o size=3000k tmpfs full 2>/dev/null; then
    UNMOUNT+=("$T/full")
    rc=0; "$DDPRUN" --standalone --nproc_per_node=2 "$TRAIN" --total_steps 5 --checkpoint.every 1 \
        --out_dir full/run >full.out 2>full.err || rc=$?
    [ $rc -eq 1 ] || { cat full.err; fail "disk full: ddprun exited $rc, want 1"; }
    assert_contains full.err "worker failed: rank 0 (local rank 0, role 'default') ended with exit code 1"
    # its last lines, in the summary
    grep -q "^ddprun:     | ddptrain: rank 0: checkpoint: writing .*No space left on device" full.err ||
        { cat full.err; fail "disk full: the summary lacks rank 0's ENOSPC line"; }
    # rank 1's line when it got to print it (rank 0 may end first, and rank 1 of ddprun's SIGTERM)
    if grep -q "before  : rank 1" full.err; then
        assert_contains full.err "rank 0 could not save the checkpoint (this rank stops with it: exit code 86)"
    fi
    umount "$T/full"
    UNMOUNT=()
    ok "rank 0 cannot save (disk full): the summary names rank 0 and its ENOSPC line, not rank 1"
    # The same mid-file with ZeRO-1's memory split: the header and the weights fit, AdamW's
    # state does not (the disk fills while the shards stream in). Rank 0 must keep taking part
    # in every gather (one per state array) and then say ENOSPC; it used to stop after the
    # first, so rank 1's next gather met rank 0's verdict ("collectives differ across ranks").
    mount -t tmpfs -o size=250k tmpfs full && UNMOUNT+=("$T/full") || fail "cannot remount"
    rc=0; "$DDPRUN" --standalone --nproc_per_node=2 "$TRAIN" --total_steps 2 --checkpoint.every 1 \
        --optimizer adamw --model.hidden 48,24 --shard_optimizer true --out_dir full/zero \
        >zfull.out 2>zfull.err || rc=$?
    [ $rc -eq 1 ] || { cat zfull.err; fail "disk full, sharded save: ddprun exited $rc, want 1"; }
    ! grep -q "collectives differ" zfull.err || { cat zfull.err; fail "disk full, sharded save: collectives differ"; }
    grep -q "^ddprun:     | ddptrain: rank 0: checkpoint: writing .*No space left on device" zfull.err ||
        { cat zfull.err; fail "disk full, sharded save: the summary lacks rank 0's ENOSPC line"; }
    ! ls full/zero/checkpoints/*.tmp.* 2>/dev/null || fail "disk full, sharded save: temporary file left"
    umount "$T/full"
    UNMOUNT=()
    ok "rank 0 cannot finish a sharded save (disk full mid-file): every rank stops, rank 0 says ENOSPC"
else
    echo "skip: cannot mount a tmpfs here (not root?): the disk-full checkpoint case is not run"
fi

# A file-size limit (ulimit -f 300: 300 KiB; tcp, as shm's segments obey it too) that the
# checkpoint passes, sharded and not: rank 0 says EFBIG with the file and removes it, rank 1
# stops with it. SIGXFSZ used to end rank 0 with no word and leave the temporary file behind.
for so in true false; do
    rc=0; (ulimit -f 300; "$DDPRUN" --standalone --nproc_per_node=2 "$TRAIN" --backend tcp \
        --total_steps 2 --checkpoint.every 1 --optimizer adamw --model.hidden 48,24 \
        --shard_optimizer $so --out_dir fsize$so >fsize.out 2>fsize.err) || rc=$?
    [ $rc -eq 1 ] || { cat fsize.err; fail "ulimit -f, shard_optimizer $so: ddprun exited $rc, want 1"; }
    assert_not_contains fsize.err "SIGXFSZ"
    grep -q "^ddprun:     | ddptrain: rank 0: checkpoint: writing .*File too large" fsize.err ||
        { cat fsize.err; fail "ulimit -f, shard_optimizer $so: the summary lacks rank 0's EFBIG line"; }
    [ -z "$(ls fsize$so/checkpoints)" ] || { ls fsize$so/checkpoints; fail "ulimit -f, shard_optimizer $so: a file was left"; }
done
ok "a file-size limit under the checkpoint: rank 0 says File too large and leaves no file"
# The same limit over shm: it binds /dev/shm's segment too, and the message said /dev/shm may
# be too small (grow it) where the file-size limit is the cause.
rc=0; (ulimit -f 300; "$DDPRUN" --standalone --nproc_per_node=2 "$TRAIN" --total_steps 2 \
    --out_dir fsizeshm >fsize.out 2>fsize.err) || rc=$?
[ $rc -eq 1 ] || { cat fsize.err; fail "ulimit -f over shm: ddprun exited $rc, want 1"; }
assert_contains fsize.err "File too large; the file-size limit (ulimit -f) is below it: raise it, or use the tcp backend"
assert_not_contains fsize.err "/dev/shm may be too small"
ok "a file-size limit under shm's segment is named as the cause"

# compress_bf16 (torch's bf16_compress_hook) changes the weights: the DDP line says it is on.
"$DDPRUN" --standalone --nproc_per_node=2 "$TRAIN" --total_steps 1 --compress_bf16 true \
    --out_dir runbf >out 2>err || { cat err; fail "compress_bf16 training failed"; }
assert_contains out "; gradients sent in bf16 (compress_bf16)"
ok "the DDP line says compress_bf16"

# Train with 2 ranks, then test and predict from the checkpoint.
"$DDPRUN" --standalone --nproc_per_node=2 "$TRAIN" --total_steps 60 --eval_every 30 \
    --out_dir run2 >out 2>err || { cat err; fail "training failed"; }
assert_contains out "DDP: 2 processes (shm: every rank on one host), device cpu, per-rank batch 64, grad accumulation 1, effective batch 128"
acc=$(sed -n 's/^\[rank0\]: test accuracy \([0-9.]*\)$/\1/p' out)
[ -n "$acc" ] || fail "no final test accuracy"
[ -f run2/checkpoints/step60.safetensors ] || fail "no checkpoint at the end"
grep -q '"test_accuracy"' run2/metrics.jsonl || fail "metrics.jsonl lacks evaluations"
assert_contains run2/train.log "test accuracy $acc"
# each rank's peak RSS in every progress line (MiB, the process's high-water mark: above the
# Fashion-MNIST images it holds, 47 MB), the largest in the last line; no GPU figure on the cpu
/usr/bin/python3 - run2/metrics.jsonl <<'EOP' || fail "metrics.jsonl: rank_peak_rss_mib missing or wrong"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
assert rows and all(len(r["rank_peak_rss_mib"]) == 2 for r in rows), rows[-1]
assert all(45 < v < 4096 for r in rows for v in r["rank_peak_rss_mib"]), rows[-1]
assert not any("rank_gpu_mem_mib" in r for r in rows)
EOP
grep -Eq '^\[rank0\]: trained 60 steps in [0-9.]+ s \(largest: peak RSS [0-9]+ MiB on rank [01]\)$' out ||
    { cat out; fail "the end line lacks the largest rank's peak RSS"; }
"$DDPRUN" --standalone --nproc_per_node=2 "$TRAIN" --task test --out_dir run2 >tout 2>&1 ||
    fail "test task failed"
assert_contains tout "test accuracy $acc (10000 images)"
"$TRAIN" --task test --out_dir run2 >tout1 2>&1 || fail "test task with 1 rank failed"
assert_contains tout1 "test accuracy $acc (10000 images)"
# a pred.csv there already, made private (chmod 640), keeps its mode when rewritten (0644 until
# 2026-11-27); the temporary file of a predict killed before (a pid now gone) is removed
echo old >pred.csv && chmod 640 pred.csv
dead=$(sh -c 'echo $$')
touch "pred.csv.tmp.$dead"
"$TRAIN" --task predict --out_dir run2 --predict_out pred.csv >pout 2>&1 || fail "predict failed"
[ "$(wc -l <pred.csv)" -eq 10001 ] || fail "predictions: want a header and 10000 rows"
[ "$(stat -c %a pred.csv)" = 640 ] || fail "pred.csv rewritten with mode $(stat -c %a pred.csv), want 640"
[ ! -e "pred.csv.tmp.$dead" ] || fail "a killed predict's temporary file pred.csv.tmp.$dead is left"
right=$(awk -F, 'NR > 1 && $2 == $3' pred.csv | wc -l)
[ "$right" -eq "$(awk -v a="$acc" 'BEGIN {printf "%d", a * 10000 + 0.5}')" ] ||
    fail "predictions give $right right, evaluation said $acc"
ok "train (2 ranks) → test (2 ranks and 1: same exact accuracy $acc) → predict (CSV agrees)"

# Killed after a checkpoint and resumed = never stopped (bit for bit), with dropout and
# augmentation on: a small CNN, its ranks killed right after the checkpoint at step 10 (of 20).
# Progress lines every 4 steps: the line at step 12 averages steps 9-12, two of them before the
# checkpoint (until 2026-11-26 the resumed run's line averaged 11-12 alone).
args=(--model.type cnn --model.channels 8 --model.hidden 32 --total_steps 20 --checkpoint.every 10
      --checkpoint.keep 5 --model.dropout 0.1 --augment.hflip true --augment.shift 2 --log_every 4)
"$DDPRUN" --standalone --nproc_per_node=2 "$TRAIN" "${args[@]}" --out_dir whole >whole.out 2>&1 ||
    fail "uninterrupted run failed"
rc=0 # killed right after step 10's checkpoint (a kill from here raced the run to its end)
DDP_TEST_KILL_AFTER_CHECKPOINT=10 "$DDPRUN" --standalone --nproc_per_node=2 "$TRAIN" "${args[@]}" \
    --out_dir cut >cut.out 2>&1 || rc=$?
[ $rc -ne 0 ] || { cat cut.out; fail "the run was not killed after its checkpoint at step 10"; }
[ -f cut/checkpoints/step10.safetensors ] || fail "no checkpoint at step 10"
[ ! -f cut/checkpoints/step20.safetensors ] || fail "the run finished before it could be killed"
"$DDPRUN" --standalone --nproc_per_node=2 "$TRAIN" "${args[@]}" --out_dir cut --resume_from latest \
    >resume.out 2>&1 || { cat resume.out; fail "resume failed"; }
assert_contains resume.out "resumed from cut/checkpoints/step10.safetensors at step 10"
"$DUMP" dump whole/checkpoints/step20.safetensors | grep -v '^M ' >a.txt
"$DUMP" dump cut/checkpoints/step20.safetensors | grep -v '^M ' >b.txt
[ -s a.txt ] && cmp -s a.txt b.txt || fail "resumed weights differ from the uninterrupted run's"
losses() { sed -n 's/.*\(step 1[1-9]\/20\|step 20\/20\) | epoch [0-9]* | \(loss [0-9.]*\).*/\1 \2/p' "$1"; }
[ -n "$(losses resume.out)" ] && [ "$(losses resume.out)" = "$(losses whole.out)" ] ||
    fail "resumed losses differ: $(losses resume.out) vs $(losses whole.out)"
[ "$(losses resume.out | head -1 | cut -d' ' -f2)" = 12/20 ] || fail "no line at step 12: $(losses resume.out)"
ok "killed after a checkpoint and resumed: the same losses (step 12's line across the resume) and the same weights, bit for bit"

# The same with epochs and a grad_accum that does not divide an epoch's batches (469 a rank, 93
# steps of 5 and 4 left over, so steps cross epoch ends), resumed in the second epoch: until
# 2026-11-26 the resumed run counted 187 steps, not 186 (its learning rates and weights then
# differed), and resuming the finished run trained one step more. A 784-16-10 MLP: the steps'
# count and the weights bit for bit do not depend on its size (the default 256,128 took 5× the
# CPU under TSan, 24 s a run of the four).
args=(--epochs 2 --grad_accum 5 --log_every 31 --eval_every 0 --model.hidden 16)
"$DDPRUN" --standalone --nproc_per_node=2 "$TRAIN" "${args[@]}" --out_dir acc_whole >acc_whole.out 2>&1 ||
    fail "uninterrupted run with grad_accum 5 failed"
rc=0
DDP_TEST_KILL_AFTER_CHECKPOINT=100 "$DDPRUN" --standalone --nproc_per_node=2 "$TRAIN" "${args[@]}" \
    --checkpoint.every 100 --out_dir acc_cut >acc_cut.out 2>&1 || rc=$?
[ $rc -ne 0 ] && [ -f acc_cut/checkpoints/step100.safetensors ] || fail "not killed after step 100's checkpoint"
"$DDPRUN" --standalone --nproc_per_node=2 "$TRAIN" "${args[@]}" --checkpoint.every 100 \
    --out_dir acc_cut --resume_from latest >acc_resume.out 2>&1 || { cat acc_resume.out; fail "resume failed"; }
assert_contains acc_whole.out "step 186/186"
assert_contains acc_resume.out "step 186/186"
assert_not_contains acc_resume.out "/187 "
"$DUMP" dump acc_whole/checkpoints/step186.safetensors | grep -v '^M ' >a.txt
"$DUMP" dump acc_cut/checkpoints/step186.safetensors | grep -v '^M ' >b.txt
[ -s a.txt ] && cmp -s a.txt b.txt || fail "grad_accum 5: resumed weights differ from the uninterrupted run's"
"$DDPRUN" --standalone --nproc_per_node=2 "$TRAIN" "${args[@]}" --out_dir acc_whole \
    --resume_from latest >acc_again.out 2>&1 || { cat acc_again.out; fail "resuming the finished run failed"; }
assert_contains acc_again.out "the last of the run's 186 steps (epochs): nothing to train"
ok "epochs 2 with grad_accum 5 (steps across epoch ends): resumed at step 100 = never stopped (186 steps, the same weights); the finished run resumed trains nothing"

# SIGUSR1 (Slurm's --signal=USR1@T before a time limit; ddprun passes it on): the rank that gets
# it tells the others at the next progress line, every rank saves a checkpoint at that step, and
# training goes on; SIGTERM then stops the job, and the run resumes from that checkpoint. Sent
# to rank 1's process alone, so that rank 0 (which writes) learns it only through the others;
# with log_every 0, through a per-step allreduce.
rank_pid() { # rank_pid DDPRUN_PID RANK: that worker's pid
    local p
    for p in $(pgrep -P "$1"); do
        tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "RANK=$2" && { echo "$p"; return; }
    done
}
for le in 5 0; do
    out=usr1_$le
    "$DDPRUN" --standalone --nproc_per_node=2 "$TRAIN" --total_steps 1000000 --log_every $le \
        --checkpoint.every 0 --eval_every 0 --out_dir $out >$out.out 2>&1 &
    BG_PIDS+=($!); job=$!
    # the MFU line comes after a collective that every rank makes once set up (handlers in place)
    for _ in $(seq 1500); do grep -q "MFU:" $out.out 2>/dev/null && break; sleep 0.02; done
    grep -q "MFU:" $out.out || { cat $out.out; fail "log_every $le: no MFU line"; }
    kill -USR1 "$(rank_pid $job 1)"
    for _ in $(seq 1000); do ls $out/checkpoints/step*.safetensors >/dev/null 2>&1 && break; sleep 0.02; done
    sleep 0.3
    kill -TERM $job
    rc=0; wait $job || rc=$?
    [ $rc -eq 143 ] || { cat $out.out; fail "log_every $le: ddprun exited $rc after SIGTERM, want 143"; }
    [ "$(ls $out/checkpoints/step*.safetensors 2>/dev/null | wc -l)" -eq 1 ] ||
        { ls $out/checkpoints; fail "log_every $le: want exactly one checkpoint after SIGUSR1"; }
    who=$([ $le -gt 0 ] && echo "rank 1" || echo "a rank")
    assert_contains $out.out "SIGUSR1 on $who: a checkpoint at this step, as asked; training goes on"
    ck=$(ls $out/checkpoints/step*.safetensors)
    n=$(basename "$ck" .safetensors); n=${n#step}
    [ $le -eq 0 ] || [ $((n % le)) -eq 0 ] || fail "the checkpoint after SIGUSR1 is at step $n, not at a progress line"
done
"$DDPRUN" --standalone --nproc_per_node=2 "$TRAIN" --total_steps $((n + 5)) --log_every 5 \
    --eval_every 0 --out_dir usr1_0 --resume_from latest >usr1r.out 2>&1 || { cat usr1r.out; fail "resume failed"; }
assert_contains usr1r.out "resumed from usr1_0/checkpoints/step$n.safetensors at step $n"
ok "SIGUSR1 to rank 1 alone: every rank saves one checkpoint (at the next progress line; with log_every 0 the next step) and trains on; it resumes"

# SIGUSR1 while the ranks still set up (data, group): remembered, the checkpoint comes at the
# first progress line, and the job goes on (until 2026-11-26 the handler came after the set-up:
# the signal ended the rank, while ddprun said "the job goes on"). Sent once both ranks catch it
# (SigCgt), while the data are still being prepared into an empty cache (~0.3 s here): the last
# file the preparation makes must not be there yet, or the test did not test the set-up.
mkdir -p usr1_cache
DDP_DATA_CACHE=$PWD/usr1_cache "$DDPRUN" --standalone --nproc_per_node=2 "$TRAIN" --total_steps 20 \
    --log_every 10 --checkpoint.every 0 --eval_every 0 --out_dir usr1_early >usr1_early.out 2>&1 &
BG_PIDS+=($!); job=$!
caught() { # caught PID: SIGUSR1 (bit 10) in the process's caught signals
    local m; m=$(sed -n 's/^SigCgt:\s*//p' "/proc/$1/status" 2>/dev/null)
    [ -n "$m" ] && [ $((0x$m & 0x200)) -ne 0 ]
}
for _ in $(seq 1000); do
    p0=$(rank_pid $job 0 || true); p1=$(rank_pid $job 1 || true) # none yet: not an error
    [ -n "$p0" ] && [ -n "$p1" ] && caught "$p0" && caught "$p1" && break
    sleep 0.005
done
prepared=$(ls usr1_cache | grep -c '^t10k-labels-idx1-ubyte\.[0-9]*\.[0-9]*$' || true)
kill -USR1 $job
[ "$prepared" = 0 ] || fail "the data were prepared before SIGUSR1 was sent: the set-up was not tested"
rc=0; wait $job || rc=$?
[ $rc -eq 0 ] || { cat usr1_early.out; fail "SIGUSR1 during the set-up: ddprun exited $rc"; }
[ -f usr1_early/checkpoints/step10.safetensors ] ||
    { ls usr1_early/checkpoints; cat usr1_early.out; fail "no checkpoint at step 10 after an early SIGUSR1"; }
ok "SIGUSR1 during the ranks' set-up: remembered, a checkpoint at the first progress line, the job goes on"

# test and predict rebuild the model from the configuration stored in the checkpoint: no
# --model.type, --model.channels, … needed; a key given on the command line still wins.
"$TRAIN" --task test --out_dir whole >cnn.out 2>&1 ||
    { cat cnn.out; fail "test of the CNN without its flags"; }
assert_contains cnn.out "configuration: the one stored in whole/checkpoints/step20.safetensors"
acc=$(sed -n 's/^\[rank0\]: test accuracy \([0-9.]*\)$/\1/p' whole.out)
assert_contains cnn.out "test accuracy $acc (10000 images)"
"$TRAIN" --task predict --out_dir whole --predict_out cnn.csv >/dev/null 2>&1 ||
    fail "predict of the CNN without its flags"
[ "$(wc -l <cnn.csv)" -eq 10001 ] || fail "CNN predictions: want a header and 10000 rows"
rc=0; "$TRAIN" --task test --out_dir whole --model.channels 4 >out 2>err || rc=$?
[ $rc -ne 0 ] && grep -q "saved with another model" err ||
    fail "a command-line key did not win over the stored one"
ok "test and predict of the CNN from its checkpoint alone (the stored config), command line on top"
# The same for an MLP of a shape other than the default's (whose flags would not rebuild it).
"$TRAIN" --model.hidden 48 --model.activation gelu --total_steps 10 --eval_every 0 \
    --out_dir mlp48 >mlp48.out 2>&1 || { cat mlp48.out; fail "training an MLP 784-48-10"; }
"$TRAIN" --task test --out_dir mlp48 >mlpt.out 2>&1 ||
    { cat mlpt.out; fail "test of the MLP without its flags"; }
assert_contains mlpt.out "configuration: the one stored in mlp48/checkpoints/step10.safetensors"
acc=$(sed -n 's/^test accuracy \([0-9.]*\)$/\1/p' mlp48.out)
[ -n "$acc" ] || { cat mlp48.out; fail "the MLP's training printed no test accuracy"; }
assert_contains mlpt.out "test accuracy $acc (10000 images)"
"$TRAIN" --task predict --out_dir mlp48 --predict_out mlp.csv >/dev/null 2>&1 ||
    fail "predict of the MLP without its flags"
[ "$(wc -l <mlp.csv)" -eq 10001 ] || fail "MLP predictions: want a header and 10000 rows"
ok "test and predict of an MLP 784-48-10 (gelu) from its checkpoint alone"

# A checkpoint saved by 4 ranks resumes with 2 and with 1, from its step.
"$DDPRUN" --standalone --nproc_per_node=4 "$TRAIN" --total_steps 20 --checkpoint.every 20 \
    --optimizer adamw --lr 0.001 --out_dir four >/dev/null 2>&1 || fail "4 ranks failed"
for w in 2 1; do
    cp -r four four$w
    "$DDPRUN" --standalone --nproc_per_node=$w "$TRAIN" --total_steps 30 --optimizer adamw \
        --lr 0.001 --out_dir four$w --resume_from latest >r$w.out 2>&1 || { cat r$w.out; fail "resume with $w"; }
    assert_contains r$w.out "resumed from four$w/checkpoints/step20.safetensors at step 20 (saved by 4 ranks)"
    assert_contains r$w.out "step 30/30"
    [ -f four$w/checkpoints/step30.safetensors ] || fail "no step 30 after resuming with $w"
done
"$TRAIN" --task test --out_dir four >four.out 2>&1 ||
    { cat four.out; fail "test of an AdamW run without --optimizer"; }
assert_contains four.out "loaded four/checkpoints/step20.safetensors at step 20 (saved by 4 ranks)"
ok "a checkpoint saved by 4 ranks resumes with 2 and with 1 and continues from step 20"

# The sharded optimizer step (ZeRO-1, the default) changes no bit: 3 ranks (shards of unequal
# parameter pieces), AdamW with clipping, weights and optimizer state against the unsharded run.
args=(--total_steps 12 --checkpoint.every 12 --optimizer adamw --lr 0.001 --grad_clip 0.5
      --model.hidden 48,24)
for sh in true false; do
    "$DDPRUN" --standalone --nproc_per_node=3 "$TRAIN" "${args[@]}" --shard_optimizer $sh \
        --out_dir shard_$sh >shard_$sh.out 2>&1 || { cat shard_$sh.out; fail "shard_optimizer $sh"; }
    "$DUMP" dump shard_$sh/checkpoints/step12.safetensors | grep -v '^M ' >shard_$sh.txt
done
[ "$(grep -c '^T ' shard_true.txt)" -eq 18 ] || fail "want 6 weights and 12 AdamW state tensors"
cmp -s shard_true.txt shard_false.txt || fail "sharded and unsharded steps give different weights or state"
ok "sharded optimizer step = unsharded, bit for bit (weights and AdamW state, 3 ranks, clipping)"

# ZeRO-1's memory split: each rank keeps a third of the AdamW state, rank 0 gathers it for the
# checkpoint (the file above), and a run resumed from a sharded checkpoint taken at step 6
# (every rank loads the whole state, then keeps its third) ends where the unsharded run did.
assert_contains shard_true.out "optimizer step sharded (ZeRO-1), each rank keeping 1/3 of its state"
for leg in 1 2; do
    "$DDPRUN" --standalone --nproc_per_node=3 "$TRAIN" "${args[@]}" --checkpoint.every 6 \
        --checkpoint.keep 3 --shard_optimizer true --out_dir halves --resume_from auto \
        >halves$leg.out 2>&1 || { cat halves$leg.out; fail "sharded halves, leg $leg"; }
    [ $leg = 2 ] || rm halves/checkpoints/step12.safetensors
done
assert_contains halves2.out "resumed from halves/checkpoints/step6.safetensors at step 6"
"$DUMP" dump halves/checkpoints/step12.safetensors | grep -v '^M ' >halves.txt
cmp -s halves.txt shard_false.txt || fail "a sharded run resumed at step 6 differs from the unsharded run"
ok "ZeRO-1's memory split: 1/3 of the state per rank, gathered to save, resumed bit for bit"

# Buckets rebuilt along backward's order (on the progress thread, unsharded, small buckets)
# change no bit either: the same weights and AdamW state as with rebuild_buckets false.
for rb in true false; do
    "$DDPRUN" --standalone --nproc_per_node=3 "$TRAIN" "${args[@]}" --shard_optimizer false \
        --overlap async --bucket_kb 4 --rebuild_buckets $rb --out_dir rebuild_$rb \
        >rebuild_$rb.out 2>&1 || { cat rebuild_$rb.out; fail "rebuild_buckets $rb"; }
    "$DUMP" dump rebuild_$rb/checkpoints/step12.safetensors | grep -v '^M ' >rebuild_$rb.txt
done
[ "$(grep -c '^T ' rebuild_true.txt)" -eq 18 ] || fail "want 6 weights and 12 AdamW state tensors"
cmp -s rebuild_true.txt rebuild_false.txt || fail "rebuilt buckets give different weights or state"
ok "rebuilt buckets = the first layout, bit for bit (weights and AdamW state, 3 ranks, async)"

# A corrupt or mismatched checkpoint is a clear error; the saved one is untouched.
cp four/checkpoints/step20.safetensors good.bin
head -c 5000 good.bin >four/checkpoints/step20.safetensors
rc=0; "$TRAIN" --total_steps 30 --optimizer adamw --out_dir four --resume_from latest >out 2>err || rc=$?
[ $rc -ne 0 ] || fail "exit code $rc, expected: $rc -ne 0"
assert_contains err "step20.safetensors"
rc=0; "$TRAIN" --total_steps 30 --model.hidden 64 --out_dir run2 --resume_from latest >out 2>err || rc=$?
[ $rc -ne 0 ] || fail "exit code $rc, expected: $rc -ne 0"
assert_contains err "saved with another model"
ok "a truncated or mismatched checkpoint is refused with a message naming it"

# A rank killed mid-training, ranks started by hand (no ddprun, which would stop the other at
# once): the survivor, waiting for it in a collective, stops as its consequence, with exit code
# 86 (DDP_EXIT_PEER_FAILED: ddp_group_peer_failed), over shm and over tcp.
for be in shm tcp; do
    port=$(free_port)
    for r in 0 1; do
        DDP_BACKEND=$be RANK=$r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "$TRAIN" \
            --total_steps 1000000 --log_every 5 --checkpoint.every 0 --eval_every 0 \
            --out_dir killed_$be >killed_$be.$r 2>&1 &
        BG_PIDS+=($!)
        pids[$r]=$!
    done
    for _ in $(seq 600); do grep -q "step 10/" killed_$be.0 && break; sleep 0.05; done
    assert_contains killed_$be.0 "step 10/"
    kill -KILL "${pids[1]}"
    rc=0; wait "${pids[0]}" || rc=$?
    wait "${pids[1]}" 2>/dev/null || true
    [ $rc -eq 86 ] || { cat killed_$be.0; fail "$be: the survivor exited $rc, want 86"; }
    assert_contains killed_$be.0 "rank 1"
    assert_contains killed_$be.0 "(this rank stops with it: exit code 86)"
done
ok "a rank killed mid-training: the survivor exits 86 (another rank's failure), naming rank 1, over shm and tcp"

# A rank failing on its own mid-training (its forward at step 3, as out of memory would:
# DDP_TEST_FAIL_FORWARD_AT_STEP), ranks by hand: it aborts its group with the reason, so the other
# exits 86 naming rank 1 and what failed there — not only that rank 1 left or closed its
# connection.
for be in shm tcp; do
    port=$(free_port)
    for r in 0 1; do
        extra=()
        [ $r = 1 ] && extra=(DDP_TEST_FAIL_FORWARD_AT_STEP=3)
        env "${extra[@]}" DDP_BACKEND=$be RANK=$r LOCAL_RANK=$r LOCAL_WORLD_SIZE=2 WORLD_SIZE=2 \
            MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "$TRAIN" --total_steps 20 --log_every 5 \
            --checkpoint.every 0 --eval_every 0 --out_dir failed_$be >failed_$be.$r 2>&1 &
        BG_PIDS+=($!)
        pids[$r]=$!
    done
    rc0=0; wait "${pids[0]}" || rc0=$?
    rc1=0; wait "${pids[1]}" || rc1=$?
    [ $rc1 -eq 1 ] || { cat failed_$be.1; fail "$be: the failing rank exited $rc1, want 1"; }
    [ $rc0 -eq 86 ] || { cat failed_$be.0; fail "$be: the other rank exited $rc0, want 86"; }
    assert_contains failed_$be.0 "rank 1 aborted the group: forward: the test's failure"
done
ok "a rank failing on its own: the other exits 86, told what failed on rank 1, over shm and tcp"

# shm+tcp on two "hosts" (DDP_HOST_ID A A B B), ranks by hand: rank 3 killed. Its host's leader,
# rank 2, sees it die in shm and aborts the group before it exits (as group.h advises), so the
# other host learns the cause over tcp: rank 0 names rank 3. Before 2026-11-25 ddptrain exited
# without the abort and rank 0 said only "rank 2 closed its connection …: it probably died",
# blaming a healthy rank (found by bench/chaos.py).
port=$(free_port)
hosts=(A A B B)
for r in 0 1 2 3; do
    DDP_BACKEND=shm+tcp DDP_HOST_ID=${hosts[$r]} RANK=$r LOCAL_RANK=$((r % 2)) LOCAL_WORLD_SIZE=2 \
        WORLD_SIZE=4 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "$TRAIN" --total_steps 1000000 \
        --log_every 5 --checkpoint.every 0 --eval_every 0 --out_dir killed_hier >killed_hier.$r 2>&1 &
    BG_PIDS+=($!)
    pids[$r]=$!
done
for _ in $(seq 600); do grep -q "step 10/" killed_hier.0 && break; sleep 0.05; done
assert_contains killed_hier.0 "step 10/"
kill -KILL "${pids[3]}"
for r in 0 1 2; do
    rc=0; wait "${pids[$r]}" || rc=$?
    [ $rc -eq 86 ] || { cat killed_hier.$r; fail "shm+tcp: rank $r exited $rc, want 86"; }
    assert_contains killed_hier.$r "rank 3"
done
wait "${pids[3]}" 2>/dev/null || true
assert_contains killed_hier.0 "rank 2 aborted the group"
ok "shm+tcp: a rank killed on one host: the other host's ranks name it, not its host's leader"

# Standard output that cannot take the results (a full disk: /dev/full) is an error, exit 1 with
# a line saying so (exit 0 until 2026-11-26, the test results lost); a closed standard output
# is /dev/null, not a descriptor the store's socket then takes (the DDP line went into the
# store's stream, and the rank died of SIGPIPE with no word). On the MLP's checkpoint (mlp48,
# above): the model does not matter here, and the CNN's two evaluations of 10000 images were
# a sixth of this test's time under TSan.
rc=0
"$TRAIN" --task test --out_dir mlp48 >/dev/full 2>full.err || rc=$?
[ $rc -eq 1 ] || { cat full.err; fail "--task test >/dev/full exited $rc, not 1"; }
assert_contains full.err "ddptrain: writing to standard output failed"
"$TRAIN" --task test --out_dir mlp48 >&- 2>closed.err || { cat closed.err; fail "--task test >&- failed"; }
ok "--task test with a full standard output: exit 1, said; with a closed one: fine"

# A metrics.jsonl whose last line was cut short (a full disk, a kill in a write) is ended before
# the next run appends, so its first line is a line of its own (until 2026-11-26 it was glued to
# the cut one, and --task report read the dead run's lines as this one's).
"$TRAIN" --total_steps 3 --out_dir cutline >/dev/null 2>&1 || fail "cutline: a 3-step run failed"
printf '{"step": 3, "loss": 0.5' >>cutline/metrics.jsonl
"$TRAIN" --total_steps 3 --out_dir cutline --resume_from latest >/dev/null 2>&1 ||
    fail "cutline: the resume failed"
tail -1 cutline/metrics.jsonl | grep -q '^{"step": 3, "start": true' ||
    { tail -3 cutline/metrics.jsonl; fail "the resume's first line was not a line of its own"; }
ok "a metrics.jsonl line cut short: the next run's first line starts a line of its own"
