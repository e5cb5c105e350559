#!/usr/bin/env bash
# ddptrain's out_dir and its checkpoints across runs: a new run into an out_dir that holds newer
# checkpoints (another run's) is refused before it writes anything — they would have outlived
# its own, which the pruning deleted at once —, as is a resume from an older checkpoint among
# newer ones; latest and auto are never refused. An empty out_dir (data.dir, checkpoint) is a
# usage error, not a run written into /. --resume_from latest with nothing to resume says what
# to do and creates nothing. The HINT naming the checkpoint before a damaged latest one comes
# for damage only (not for a model mismatch, which the earlier one shares), for --task test and
# predict too. --overwrite from an older checkpoint of out_dir's own keeps metrics.jsonl and
# TensorBoard up to its step (purge_step), and a cut that fails leaves metrics.jsonl as it was.
# Tiny MLP runs (a second or two each).
. "$(dirname "$0")/lib.sh"
TRAIN=$BIN/ddptrain
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
cd "$T"
S=(--model.hidden 16 --batch_size 16 --log_every 0 --eval_every 0 --tensorboard false)
snap() { (cd "$1" && find . -printf '%p %s %T@\n' | sort); } # names, sizes, times
refused() { # refused 'MESSAGE' ARGS...: exit 2, MESSAGE alone on stderr
    local want=$1 rc=0
    shift
    "$TRAIN" "$@" >out 2>err || rc=$?
    [ $rc -eq 2 ] || { cat out err >&2; fail "ddptrain $* exited $rc, want 2"; }
    assert_contains err "$want"
    [ "$(wc -l <err)" -eq 1 ] || { cat err >&2; fail "ddptrain $*: want one line on stderr"; }
}

# An earlier run's checkpoints (4, 8, 12) in out_dir: a new run of 3 steps used to print
# checkpoint step1…3 and prune them at once (the highest steps stay), leaving step12 as
# 'latest'. Refused now, with nothing written or deleted.
"$TRAIN" "${S[@]}" --total_steps 12 --checkpoint.every 4 --out_dir r3 >a.out 2>&1 ||
    { cat a.out; fail "the first run"; }
snap r3 >r3.before
refused "out_dir 'r3' holds checkpoints up to step 12 ('r3/checkpoints/step12.safetensors'), newer than step 0 where this new run starts: pruning would delete this run's checkpoints in their favour; resume from the newest with --resume_from latest (or auto), choose another --out_dir, move 'r3/checkpoints' away, or --overwrite true" \
    "${S[@]}" --total_steps 3 --checkpoint.every 1 --out_dir r3
snap r3 | cmp -s - r3.before || fail "the refused run changed out_dir"
# Two ranks: rank 0 refuses, both stop at once.
rc=0; "$DDPRUN" --standalone --nproc_per_node 2 "$TRAIN" "${S[@]}" --total_steps 3 --out_dir r3 \
    >out 2>err || rc=$?
[ $rc -eq 1 ] || { cat out err >&2; fail "2 ranks into r3: ddprun exited $rc, want 1"; }
assert_contains err "[rank0]: ddptrain: out_dir 'r3' holds checkpoints up to step 12"
assert_contains err "ended with exit code 2"
snap r3 | cmp -s - r3.before || fail "the refused 2-rank run changed out_dir"
# A resume from an explicit older checkpoint starts at its step: newer ones refuse it too …
refused "newer than step 8 where this run starts (--resume_from 'r3/checkpoints/step8.safetensors')" \
    "${S[@]}" --total_steps 14 --checkpoint.every 1 --out_dir r3 \
    --resume_from r3/checkpoints/step8.safetensors
snap r3 | cmp -s - r3.before || fail "the refused resume changed out_dir"
# … and into an out_dir of its own it goes on from there.
"$TRAIN" "${S[@]}" --total_steps 10 --checkpoint.every 1 --out_dir r8 \
    --resume_from r3/checkpoints/step8.safetensors >b.out 2>&1 || { cat b.out; fail "resume into r8"; }
assert_contains b.out "resumed from r3/checkpoints/step8.safetensors at step 8"
[ "$(ls r8/checkpoints)" = "$(printf 'step10.safetensors\nstep9.safetensors')" ] ||
    fail "r8 holds $(ls r8/checkpoints | tr '\n' ' ')"
# latest (and auto) start from the newest: never refused; keep 2 leaves this run's two.
"$TRAIN" "${S[@]}" --total_steps 14 --checkpoint.every 1 --checkpoint.keep 2 --out_dir r3 \
    --resume_from latest >c.out 2>&1 || { cat c.out; fail "resume latest"; }
assert_contains c.out "resumed from r3/checkpoints/step12.safetensors at step 12"
[ "$(ls r3/checkpoints)" = "$(printf 'step13.safetensors\nstep14.safetensors')" ] ||
    fail "r3 holds $(ls r3/checkpoints | tr '\n' ' ')"
"$TRAIN" "${S[@]}" --total_steps 15 --out_dir r3 --resume_from auto >d.out 2>&1 ||
    { cat d.out; fail "resume auto"; }
assert_contains d.out "resumed from r3/checkpoints/step14.safetensors at step 14"
"$TRAIN" --task test --out_dir r3 >t.out 2>&1 || { cat t.out; fail "test"; }
assert_contains t.out "loaded r3/checkpoints/step15.safetensors at step 15"
ok "a new run (or a resume from step 8) among newer checkpoints: refused, nothing touched; latest/auto go on"

# An empty out_dir would write into / (/checkpoints, /tb, /train.log). Refused first of all
# (before batch_size 0, so that a ddptrain without the check stops on that instead of writing).
refused "key 'out_dir' is empty (the command line); give it a path, or leave it out for its default 'runs/default'" \
    --out_dir "" --batch_size 0
printf 'out_dir:\nbatch_size: 0\n' >empty.yaml
refused "key 'out_dir' is empty (empty.yaml line 1)" --config empty.yaml
refused "key 'out_dir' is empty" --out_dir ""
refused "key 'out_dir' is empty" --task test --out_dir ""
refused "key 'out_dir' is empty" --task report --out_dir ""
refused "key 'data.dir' is empty (the command line)" --data.dir "" --out_dir e1
refused "key 'checkpoint' is empty (the command line); give it a path, or leave it out for its default 'latest'" \
    --task test --checkpoint "" --out_dir r3
[ ! -e e1 ] || fail "a refused run created its out_dir"
ok "an empty out_dir, data.dir or checkpoint: a usage error naming the key, nothing written"

# --resume_from latest with nothing to resume: what to do, and nothing created.
refused "--resume_from latest: there is no checkpoint in 'none/checkpoints' to resume from; leave out --resume_from to start at step 0, or give --resume_from auto to resume when there is one" \
    "${S[@]}" --out_dir none --resume_from latest
[ ! -e none ] || fail "--resume_from latest without a checkpoint created out_dir"
refused "cannot open checkpoint 'no.safetensors'" "${S[@]}" --out_dir none --resume_from no.safetensors
[ ! -e none ] || fail "--resume_from a missing file created out_dir"
ok "--resume_from latest with no checkpoint: what to do instead, nothing created"

# A model mismatch (another hidden size) is not damage: the checkpoint before it has the same
# mismatch, so no HINT names it.
rc=0; "$TRAIN" "${S[@]}" --model.hidden 100 --total_steps 20 --out_dir r3 --resume_from latest \
    >out 2>err || rc=$?
[ $rc -ne 0 ] || fail "a checkpoint of another model was resumed"
# The command line names another model: a usage error (exit 2, as a bad key), not a failure (1).
[ $rc -eq 2 ] || fail "a resume of another model's checkpoint exited $rc, want 2"
assert_contains err "saved with another model"
assert_not_contains err "HINT"
ok "a model mismatch: the message, without a HINT about the checkpoint before it"

# A truncated latest checkpoint: test and predict name the one before it too; training's HINT
# says to move the damaged one aside, refused before anything is written.
cp -r r3 r5
truncate -s 3000 r5/checkpoints/step15.safetensors
for task in test predict; do
    rc=0; "$TRAIN" --task $task --out_dir r5 >out 2>err || rc=$?
    [ $rc -eq 2 ] || { cat err >&2; fail "--task $task of a truncated checkpoint exited $rc"; }
    assert_contains err "step15.safetensors' is malformed"
    assert_contains err "HINT: the checkpoint before it is 'r5/checkpoints/step14.safetensors': --checkpoint r5/checkpoints/step14.safetensors"
done
"$TRAIN" --task test --out_dir r5 --checkpoint r5/checkpoints/step14.safetensors >t.out 2>&1 ||
    { cat t.out; fail "test of the checkpoint the HINT names"; }
assert_contains t.out "loaded r5/checkpoints/step14.safetensors at step 14"
snap r5 >r5.before
rc=0; "$TRAIN" "${S[@]}" --total_steps 20 --out_dir r5 --resume_from auto >out 2>err || rc=$?
[ $rc -eq 2 ] || { cat err >&2; fail "resume from a truncated checkpoint exited $rc"; }
assert_contains err "HINT: the checkpoint before it is 'r5/checkpoints/step14.safetensors': move the damaged one out of the way (mv 'r5/checkpoints/step15.safetensors' 'r5/checkpoints/step15.safetensors.damaged'), then --resume_from auto resumes from it"
snap r5 | cmp -s - r5.before || fail "the refused resume changed out_dir"
mv r5/checkpoints/step15.safetensors r5/checkpoints/step15.safetensors.damaged
"$TRAIN" "${S[@]}" --total_steps 20 --out_dir r5 --resume_from auto >e.out 2>&1 ||
    { cat e.out; fail "resume after moving the damaged checkpoint aside"; }
assert_contains e.out "resumed from r5/checkpoints/step14.safetensors at step 14"
ok "a truncated latest checkpoint: test, predict and resume name the one before it; the HINT works"

# An out_dir that cannot be made names the folder that failed and why (a read-only file system
# here), not the ENOENT of train.log inside it. Needs a tmpfs mount (root, as in CI).
mkdir -p rofs
if mount -t tmpfs -o ro,size=64k tmpfs rofs 2>/dev/null; then
    rc=0; "$TRAIN" "${S[@]}" --total_steps 1 --out_dir rofs/a/run >out 2>err || rc=$?
    umount rofs
    [ $rc -eq 2 ] || { cat err >&2; fail "an out_dir on a read-only file system exited $rc"; }
    assert_contains err "out_dir 'rofs/a/run' is not writable: cannot create 'rofs/a': Read-only file system; choose another --out_dir"
    ok "an out_dir that cannot be made: the folder and the reason"
else
    echo "skip: cannot mount a tmpfs here (not root?): the read-only out_dir case"
fi

# --overwrite true with a run that cannot start (no GPU for device cuda; a batch whose
# activations cannot be allocated): it deletes nothing. Before 2026-11-26 the newer checkpoints
# went first and the run failed after, leaving none.
cp -r r3 r3ow
snap r3ow >r3ow.before
for bad in "--device cuda" "--batch_size 2000000000 --model.hidden 100000"; do
    rc=0
    # shellcheck disable=SC2086 # the words of $bad are separate arguments
    "$TRAIN" "${S[@]}" --total_steps 3 --out_dir r3ow --overwrite true $bad >out 2>err || rc=$?
    [ $rc -ne 0 ] || { cat out err; fail "--overwrite true $bad: started"; }
    ! grep -q 'overwrite: deleted' out err || { cat out err; fail "--overwrite true $bad: deleted"; }
    snap r3ow | cmp -s - r3ow.before || { cat out err; fail "--overwrite true $bad: out_dir changed"; }
done
ok "--overwrite true with a run that cannot start: nothing deleted, out_dir unchanged"

# --overwrite true (Hugging Face's overwrite_output_dir): the newer checkpoints are deleted, the
# run trains afresh and metrics.jsonl starts anew; how `make demo` runs again into runs/default.
"$TRAIN" "${S[@]}" --total_steps 3 --checkpoint.every 1 --out_dir r3ow --overwrite true \
    >ow.out 2>ow.err || { cat ow.out ow.err; fail "--overwrite true"; }
assert_contains ow.out "overwrite: deleted 3 checkpoints newer than step 0 from 'r3ow/checkpoints'"
[ "$(cd r3ow/checkpoints && ls)" = "$(printf 'step1.safetensors\nstep2.safetensors\nstep3.safetensors')" ] ||
    { ls r3ow/checkpoints; fail "--overwrite true: want step1-3 alone"; }
[ "$(grep -c '"start": true' r3ow/metrics.jsonl)" -eq 1 ] || fail "--overwrite true: metrics.jsonl not started anew"
ok "--overwrite true: another run's newer checkpoints deleted, this run's kept, metrics.jsonl anew"

# --overwrite true with --resume_from an older checkpoint of out_dir's own (going back to step 4
# of 8): what was logged up to it is kept and only what came after goes, as torch's purge_step
# does — metrics.jsonl holds steps 1–4 of the first run and 5–8 of this one, each once, and the
# TensorBoard files stay, the new one purging from step 5. Until 2026-11-27 metrics.jsonl
# started anew and the event files were deleted: steps 1–4 were lost.
K=("${S[@]}" --log_every 1 --tensorboard true --checkpoint.every 2 --checkpoint.keep 4 --out_dir rk)
steps() { grep '"epoch"' rk/metrics.jsonl | sed 's/^{"step": \([0-9]*\),.*/\1/' | tr '\n' ' '; }
"$TRAIN" "${K[@]}" --total_steps 8 >k1.out 2>&1 || { cat k1.out; fail "rk: the first run"; }
[ "$(steps)" = "1 2 3 4 5 6 7 8 " ] || fail "rk: the first run logged steps $(steps)"
ls rk/tb >tb.before
[ "$(wc -l <tb.before)" -eq 1 ] || fail "rk: the first run wrote $(cat tb.before)"
"$TRAIN" "${K[@]}" --total_steps 8 --resume_from rk/checkpoints/step4.safetensors \
    --overwrite true >k2.out 2>&1 || { cat k2.out; fail "rk: --overwrite from step 4"; }
assert_contains k2.out "resumed from rk/checkpoints/step4.safetensors at step 4"
assert_contains k2.out "overwrite: deleted 2 checkpoints newer than step 4 from 'rk/checkpoints'"
assert_contains k2.out "overwrite: kept 5 lines of 'rk/metrics.jsonl' up to step 4, dropped 5 (later steps, or cut short)"
! grep -q 'TensorBoard event file' k2.out || { cat k2.out; fail "rk: event files deleted"; }
[ "$(steps)" = "1 2 3 4 5 6 7 8 " ] || fail "rk: after --overwrite from step 4, steps $(steps)"
[ "$(grep '"start": true' rk/metrics.jsonl | sed 's/^{"step": \([0-9]*\),.*/\1/' | tr '\n' ' ')" = "0 4 " ] ||
    { cat rk/metrics.jsonl; fail "rk: want the start lines of step 0 and 4"; }
[ "$(cd rk/checkpoints && ls | sort -V | tr '\n' ' ')" = "step2.safetensors step4.safetensors step6.safetensors step8.safetensors " ] ||
    fail "rk: checkpoints $(ls rk/checkpoints | tr '\n' ' ')"
ls rk/tb | head -1 | cmp -s - tb.before || fail "rk: the first run's event file is gone: $(ls rk/tb)"
[ "$(ls rk/tb | wc -l)" -eq 2 ] || fail "rk: event files $(ls rk/tb | tr '\n' ' ')"
if command -v python3 >/dev/null; then
    python3 - rk/tb <<'PY' || fail "rk: the new TensorBoard file does not purge from step 5"
import os, struct, sys
d = sys.argv[1]
f = sorted(os.listdir(d))
b = open(os.path.join(d, f[1]), "rb").read()
n = struct.unpack("<Q", b[:8])[0]
second = b[12 + n + 4:]
m = struct.unpack("<Q", second[:8])[0]
ev = second[12:12 + m]
assert ev[0] == 0x09 and ev[9:] == b"\x10\x05\x3a\x02\x08\x01", ev  # step 5, SessionLog START
PY
fi
ok "--overwrite true from an older checkpoint of out_dir's: steps up to it kept, the later ones replaced, TensorBoard purged from the next step"

# The same with no newer checkpoint to delete (a run killed after its last one, in the middle
# of a line): the lines past it and the cut one go all the same. A cut that fails (a file-size
# limit: EFBIG) stops the run and leaves metrics.jsonl as it was, no temporary file beside it.
printf '{"step": 9, "epoch": 0, "loss": 0.1}\n{"step": 2, "epoch": 0, "lo' >>rk/metrics.jsonl
cp rk/metrics.jsonl k.before
rc=0
(ulimit -f 1 && exec "$TRAIN" "${K[@]}" --total_steps 10 --overwrite true \
    --resume_from rk/checkpoints/step8.safetensors) >out 2>err || rc=$?
[ $rc -eq 2 ] || { cat out err; fail "rk: a cut past the file-size limit exited $rc, want 2"; }
assert_contains err "ddptrain: overwrite: cutting 'rk/metrics.jsonl' after step 8 failed: writing 'rk/metrics.jsonl.tmp."
assert_contains err "File too large"
assert_contains err "it is as it was (free space in 'rk', or move the file away)"
cmp -s rk/metrics.jsonl k.before || fail "rk: the failed cut changed metrics.jsonl"
[ -z "$(find rk -name '*.tmp.*')" ] || fail "rk: left $(find rk -name '*.tmp.*')"
"$TRAIN" "${K[@]}" --total_steps 10 --overwrite true --resume_from rk/checkpoints/step8.safetensors \
    >k3.out 2>&1 || { cat k3.out; fail "rk: --overwrite from step 8"; }
assert_contains k3.out "overwrite: kept 11 lines of 'rk/metrics.jsonl' up to step 8, dropped 2 (later steps, or cut short)"
! grep -q 'overwrite: deleted' k3.out || { cat k3.out; fail "rk: deleted something"; }
[ "$(steps)" = "1 2 3 4 5 6 7 8 9 10 " ] || fail "rk: after --overwrite from step 8, steps $(steps)"
ok "--overwrite true from out_dir's newest checkpoint: a dead run's tail and cut line dropped; a failed cut changes nothing"

# A resume from a checkpoint of another model (or optimizer) is refused before out_dir is
# touched: a new out_dir is not made, and an existing one (train.log, metrics.jsonl,
# checkpoints) is left exactly as it was; with 2 ranks too (rank 1 stops with exit code 86).
"$TRAIN" "${S[@]}" --total_steps 4 --checkpoint.every 2 --out_dir mm >out 2>err ||
    { cat out err; fail "training mm"; }
snap mm >mm.before
sleep 0.01
for args in "--model.hidden 24" "--optimizer adamw"; do
    rc=0; "$TRAIN" "${S[@]}" $args --total_steps 6 --out_dir mm_new \
        --resume_from mm/checkpoints/step4.safetensors >out 2>err || rc=$?
    [ $rc -ne 0 ] || fail "$args: a resume from another model's checkpoint worked"
    # Another optimizer is a usage error too (exit 2, one line), not a damaged file (exit 1).
    [ $rc -eq 2 ] || { cat err >&2; fail "$args: exit code $rc, want 2"; }
    [ "$(wc -l <err)" -eq 1 ] || { cat err >&2; fail "$args: want one line on stderr"; }
    assert_contains err "step4.safetensors"
    [ ! -e mm_new ] || { ls -R mm_new; fail "$args: a refused resume made its out_dir"; }
    rc=0; "$TRAIN" "${S[@]}" $args --total_steps 6 --out_dir mm --resume_from latest >out 2>err ||
        rc=$?
    [ $rc -ne 0 ] || fail "$args: a resume from another model's latest checkpoint worked"
    snap mm | cmp -s - mm.before || fail "$args: the refused resume changed out_dir"
done
rc=0; "$BIN/ddprun" --standalone --nproc_per_node=2 "$TRAIN" "${S[@]}" --model.hidden 24 \
    --total_steps 6 --out_dir mm --resume_from latest >out 2>&1 || rc=$?
[ $rc -ne 0 ] || fail "2 ranks: a resume from another model's checkpoint worked"
assert_contains out "saved with another model"
snap mm | cmp -s - mm.before || fail "2 ranks: the refused resume changed out_dir"
ok "a resume from another model's or optimizer's checkpoint: refused, out_dir untouched (1 and 2 ranks)"

# Another optimizer, both ways: the message names the checkpoint's optimizer and the run's,
# and what to do. Before, it read as a damaged file ("lacks 'optim.fc1.weight.exp_avg'", exit 1).
refused "optimizer is adamw here (the command line) but sgd in the checkpoint 'mm/checkpoints/step4.safetensors': it holds the optimizer state momentum_buffer, adamw needs exp_avg, exp_avg_sq; resume it with --optimizer sgd, or train with adamw from step 0 into another --out_dir (without --resume_from)" \
    "${S[@]}" --optimizer adamw --total_steps 6 --out_dir mm --resume_from latest
"$TRAIN" "${S[@]}" --optimizer adamw --total_steps 2 --checkpoint.every 2 --out_dir ma >out 2>err ||
    { cat out err; fail "training ma (adamw)"; }
refused "optimizer is sgd here (default) but adamw in the checkpoint 'ma/checkpoints/step2.safetensors': it holds the optimizer state exp_avg, exp_avg_sq, sgd needs momentum_buffer; resume it with --optimizer adamw" \
    "${S[@]}" --total_steps 4 --out_dir ma --resume_from latest
# Two ranks: rank 0 refuses, exit code 2 through ddprun.
rc=0; "$DDPRUN" --standalone --nproc_per_node 2 "$TRAIN" "${S[@]}" --total_steps 4 --out_dir ma \
    --resume_from latest >out 2>err || rc=$?
[ $rc -ne 0 ] || fail "2 ranks: a resume with another optimizer worked"
assert_contains err "[rank0]: ddptrain: optimizer is sgd here (default) but adamw in the checkpoint"
assert_contains err "ended with exit code 2"
# A checkpoint without a stored configuration (saved by a program on the library) is told by
# its state's names.
"$TRAIN" "${S[@]}" --optimizer adamw --total_steps 2 --checkpoint.every 2 --out_dir nc >out 2>err ||
    { cat out err; fail "training nc (adamw)"; }
python3 - nc/checkpoints/step2.safetensors <<'PY' || fail "stripping the config metadata"
import json, struct, sys
p = sys.argv[1]
b = open(p, "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
h["__metadata__"].pop("config")
h["__metadata__"].pop("ddp.data_crc32", None)
j = json.dumps(h).encode()
open(p, "wb").write(struct.pack("<Q", len(j)) + j + b[8 + n:])
PY
refused "the checkpoint 'nc/checkpoints/step2.safetensors' was saved with another optimizer: it holds the optimizer state exp_avg, exp_avg_sq, sgd needs momentum_buffer; resume it with the optimizer that saved it" \
    "${S[@]}" --total_steps 4 --out_dir nc --resume_from latest
ok "a resume with another optimizer (sgd <-> adamw; stored configuration or not): exit 2 naming both"
