#!/usr/bin/env bash
# What a nanoGPT user meets first, on a 1-layer GPT that trains in well under a second: a run
# whose loss becomes NaN writes metrics.jsonl that JSON readers and --task report still read
# (null, not "-nan"); ddpprep explains a text that gives no validation or training tokens
# before it replaces any file, and --val_every 0 leaves no old val.bin behind.
. "$(dirname "$0")/lib.sh"
TRAIN=$BIN/ddptrain
PREP=$BIN/ddpprep
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 DDP_DATA_CACHE=$T/cache
cd "$T"

# 20000 byte tokens of a repeated sentence, as nanoGPT's uint16 files.
s="hello world, the quick brown fox jumps over the lazy dog. "
for i in $(seq 400); do printf '%s' "$s"; done >text.txt
head -c 20000 text.txt | od -An -v -tu1 | tr -s ' \n' '\n' | grep -v '^$' |
    awk '{ printf "%c%c", $1, 0 }' >tr.bin
tail -c 3200 text.txt | od -An -v -tu1 | tr -s ' \n' '\n' | grep -v '^$' |
    awk '{ printf "%c%c", $1, 0 }' >va.bin
[ "$(stat -c %s tr.bin)" = 40000 ] || fail "tr.bin: $(stat -c %s tr.bin) bytes"
TINY=(--model.type gpt --model.n_layer 1 --model.n_head 2 --model.n_embd 16
      --model.block_size 16 --batch_size 4 --log_every 5 --eval_every 10 --eval_windows 20
      --max_new_tokens 0 --data.train tr.bin --data.val va.bin --total_steps 20)

# A diverged run (sgd at lr 1e6): every loss is NaN. metrics.jsonl stays JSON (null), the
# report says the run diverged instead of "no training progress line".
"$TRAIN" "${TINY[@]}" --lr 1e6 --out_dir nan >nan.out 2>&1 || { cat nan.out; fail "nan run"; }
assert_contains nan.out "loss -nan"
assert_not_contains nan/metrics.jsonl "nan"
assert_contains nan/metrics.jsonl '"loss": null'
assert_contains nan/metrics.jsonl '"val_loss": null'
if command -v python3 >/dev/null; then
    python3 -c 'import json, sys; [json.loads(l) for l in open(sys.argv[1])]' nan/metrics.jsonl ||
        fail "metrics.jsonl of a NaN run is not JSON"
fi
rc=0
"$TRAIN" --task report --out_dir nan >rep.out 2>&1 || rc=$?
[ $rc -eq 1 ] || { cat rep.out; fail "report of an all-NaN run: exit $rc"; }
assert_contains rep.out "diverged at step 5"
ok "a NaN loss is null in metrics.jsonl; the report says the run diverged"

# Diverged half way: the report is made, and its header says from which step.
head -4 nan/metrics.jsonl | sed 's/"loss": null/"loss": 4.5/; s/"val_loss": null/"val_loss": 4.6/' \
    >half.jsonl
tail -n +5 nan/metrics.jsonl >>half.jsonl
mkdir half && cp half.jsonl half/metrics.jsonl
"$TRAIN" --task report --out_dir half >half.out 2>&1 || { cat half.out; fail "half report"; }
assert_contains half/report.html "loss NaN/inf from step 15 (diverged)"
sed 's/<[^>]*>//g' half/report.html >half.txt
assert_contains half.txt "20 steps · final train loss NaN"
assert_contains half.txt "validation loss NaN"
ok "a run that diverged half way has a report that says from which step"

# ddpprep: one file without doc_sep is one document, so no validation tokens: the message says
# how to cut it into documents, and the files of an earlier preparation stay as they were.
printf 'a\n%%\nb\n%%\nc\n%%\nd\n' >f.txt
"$PREP" --out_dir p --doc_sep % --val_every 2 f.txt >p1.out 2>&1 || { cat p1.out; fail "ddpprep"; }
cp p/train.bin train.before && cp p/val.bin val.before
rc=0
"$PREP" --out_dir p text.txt >p2.out 2>&1 || rc=$?
[ $rc -eq 1 ] || { cat p2.out; fail "ddpprep of one document: exit $rc"; }
assert_contains p2.out "1 document (each file is one document)"
assert_contains p2.out "doc_sep"
rc=0
"$PREP" --out_dir p --doc_sep % --val_every 1 f.txt >p3.out 2>&1 || rc=$?
[ $rc -eq 1 ] || { cat p3.out; fail "ddpprep --val_every 1: exit $rc"; }
assert_contains p3.out "with val_every 1 every one goes to validation"
cmp -s p/train.bin train.before && cmp -s p/val.bin val.before ||
    fail "a failed ddpprep replaced a file of the earlier preparation"
: >empty.txt
rc=0
"$PREP" --out_dir p empty.txt >p4.out 2>&1 || rc=$?
[ $rc -eq 1 ] && grep -q "the text inputs are empty" p4.out || { cat p4.out; fail "empty input"; }
"$PREP" --out_dir p --doc_sep % --val_every 0 f.txt >p5.out 2>&1 || { cat p5.out; fail "val 0"; }
[ ! -e p/val.bin ] || fail "ddpprep --val_every 0 left the earlier val.bin beside the new train.bin"
assert_contains p5.out "removed 'p/val.bin'"
ok "ddpprep: clear messages for empty splits, nothing replaced on failure, no stale val.bin"

# Resuming (or testing) with another model: n_head changes no array's shape, so the load alone
# took it; every model key is checked against the checkpoint's stored configuration.
S=(--optimizer adamw --lr 1e-2 --tensorboard false)
"$TRAIN" "${TINY[@]}" "${S[@]}" --out_dir shape >shape.out 2>&1 || { cat shape.out; fail "shape"; }
rc=0
"$TRAIN" "${TINY[@]}" "${S[@]}" --out_dir shape --total_steps 30 --resume_from latest \
    --model.n_head 4 >sh1.out 2>&1 || rc=$?
[ $rc -ne 0 ] || { cat sh1.out; fail "a resume with another n_head was accepted"; }
assert_contains sh1.out "model.n_head is 4 here (the command line) but 2 in the checkpoint"
assert_contains sh1.out "give --model.n_head 2 to resume it"
[ ! -e shape/checkpoints/step30.safetensors ] || fail "the resume with another n_head trained"
rc=0
"$TRAIN" --task test --out_dir shape --model.n_head 4 >sh2.out 2>&1 || rc=$?
[ $rc -ne 0 ] || { cat sh2.out; fail "a test with another n_head was accepted"; }
assert_contains sh2.out "leave out --model.n_head"
rc=0
"$TRAIN" "${TINY[@]}" "${S[@]}" --out_dir shape --total_steps 30 --resume_from latest \
    --model.n_embd 32 >sh3.out 2>&1 || rc=$?
[ $rc -ne 0 ] && grep -q "model.n_embd is 32 here" sh3.out || { cat sh3.out; fail "n_embd"; }
"$TRAIN" "${TINY[@]}" "${S[@]}" --out_dir shape --total_steps 30 --resume_from latest \
    --model.dropout 0.1 >sh4.out 2>&1 || { cat sh4.out; fail "a resume with dropout on"; }
# Every differing model key in one line (one at a time, a resume with none of the model's
# flags took a try per key), for a resume and for a test.
rc=0
"$TRAIN" --out_dir shape --total_steps 30 --resume_from latest >sh5.out 2>&1 || rc=$?
[ $rc -ne 0 ] || { cat sh5.out; fail "a resume with the default model was accepted"; }
assert_contains sh5.out "model.type is mlp here (default) but gpt in the checkpoint"
assert_contains sh5.out "give --model.type gpt --model.n_layer 1 --model.n_head 2 --model.n_embd 16 --model.block_size 16 to resume it"
[ "$(wc -l <sh5.out)" -eq 1 ] || { cat sh5.out; fail "the model's keys: not one line"; }
rc=0
"$TRAIN" --task test --out_dir shape --model.n_head 4 --model.n_layer 3 >sh6.out 2>&1 || rc=$?
[ $rc -ne 0 ] || { cat sh6.out; fail "a test with another n_head and n_layer was accepted"; }
assert_contains sh6.out "leave out --model.n_layer, --model.n_head (the checkpoint's stored"
ok "a resume or test with another model (n_head, n_embd) names the key; dropout may change"

# test and predict of a checkpoint that holds another model.type: said first, before the data of
# the model asked for is looked for (a classifier's checkpoint with --model.type gpt was told
# "needs token files", a gpt's with --model.type cnn a missing data.dir, until 2026-11-26); on 2
# ranks rank 0 says it and the other stops with it.
small_idx cls 40 20
"$TRAIN" --data.dir cls --model.hidden 8 --batch_size 8 --total_steps 2 --tensorboard false \
    --out_dir clsrun >cls.out 2>&1 || { cat cls.out; fail "a classifier's training"; }
for task in test predict; do
    rc=0
    "$TRAIN" --task $task --checkpoint clsrun/checkpoints/step2.safetensors --model.type gpt \
        >mm.out 2>mm.err || rc=$?
    [ $rc -eq 2 ] || { cat mm.err; fail "$task, an mlp checkpoint as a gpt: exit $rc, want 2"; }
    assert_contains mm.err "model.type is gpt here (the command line) but mlp in the checkpoint 'clsrun/checkpoints/step2.safetensors': it was saved with another model; leave out --model.type"
    assert_contains mm.err "or give --checkpoint one saved with model.type gpt"
    [ "$(wc -l <mm.err)" -eq 1 ] || { cat mm.err; fail "$task, an mlp checkpoint as a gpt: not one line"; }
    rc=0
    "$TRAIN" --task $task --out_dir shape --model.type cnn --data.dir "$T/nodata" >mm.out 2>mm.err ||
        rc=$?
    [ $rc -eq 2 ] || { cat mm.err; fail "$task, a gpt checkpoint as a cnn: exit $rc, want 2"; }
    assert_contains mm.err "model.type is cnn here (the command line) but gpt in the checkpoint"
    [ "$(wc -l <mm.err)" -eq 1 ] || { cat mm.err; fail "$task, a gpt checkpoint as a cnn: not one line"; }
done
rc=0
DDP_TIMEOUT=60 timeout 30 "$BIN/ddprun" --standalone --nproc_per_node 2 "$TRAIN" --task test \
    --checkpoint clsrun/checkpoints/step2.safetensors --model.type gpt >mm2.out 2>&1 || rc=$?
[ $rc -eq 1 ] || { cat mm2.out; fail "2 ranks, an mlp checkpoint as a gpt: ddprun exited $rc"; }
assert_contains mm2.out "worker failed: rank 0 (local rank 0, role 'default') ended with exit code 2"
assert_contains mm2.out "model.type is gpt here (the command line) but mlp in the checkpoint"
assert_not_contains mm2.out "token files"
ok "test and predict of another model.type's checkpoint: the mismatch first, on 1 rank and 2"

# data.text whose bytes reach past model.vocab_size: the message names data.text and the cache
# file as the cache's (it named the cache file as data.train, a key the user never set).
for i in $(seq 40); do printf 'the quick brown fox %d\n%%\n' "$i"; done >docs.txt
rc=0
"$TRAIN" --model.type gpt --model.n_layer 1 --model.n_head 2 --model.n_embd 16 \
    --model.block_size 8 --data.text "$T/docs.txt" --data.doc_sep % --model.vocab_size 100 \
    --out_dir v100 >v100.out 2>v100.err || rc=$?
[ $rc -eq 2 ] || { cat v100.err; fail "data.text past vocab_size 100: exit $rc, want 2"; }
assert_contains v100.err "data.text '$T/docs.txt' holds byte 120 in its training text (tokens cached in '$T/cache/"
assert_contains v100.err "not below model.vocab_size 100; text is read as bytes: set model.vocab_size to 256"
assert_not_contains v100.err "data.train"
[ "$(wc -l <v100.err)" -eq 1 ] || { cat v100.err; fail "data.text past vocab_size: not one line"; }
ok "data.text past model.vocab_size: names data.text, and the token file as the cache's"

# A temperature so small strtod calls it an underflow (1e-320, subnormal) is a number: argmax,
# as temperature 0 (it was "not a number"); 1e999 is out of range.
"$TRAIN" --task predict --out_dir shape --prompt hey --max_new_tokens 20 --temperature 0 \
    >t0.out 2>/dev/null || fail "predict at temperature 0"
"$TRAIN" --task predict --out_dir shape --prompt hey --max_new_tokens 20 --temperature 1e-320 \
    >ts.out 2>ts.err || { cat ts.err; fail "predict at temperature 1e-320"; }
cmp -s t0.out ts.out || fail "temperature 1e-320 gave '$(cat ts.out)', temperature 0 '$(cat t0.out)'"
rc=0
"$TRAIN" --task predict --out_dir shape --temperature 1e999 >tb.out 2>tb.err || rc=$?
[ $rc -eq 2 ] || { cat tb.err; fail "temperature 1e999: exit $rc, want 2"; }
assert_contains tb.err "key 'temperature': '1e999' is out of range (the command line)"
ok "temperature 1e-320 is argmax (an underflow is a number); 1e999 is out of range"

# Generation: max_new_tokens far beyond block_size slides the context (it was one buffer of
# prompt + max_new_tokens tokens, whose size overflowed: a heap overrun and an abort); the
# prompt is text or ids, not both (the stored one of the other kind gives way).
rc=0
timeout 2 "$TRAIN" --task predict --out_dir shape --max_new_tokens 4611686018427387904 \
    >huge.out 2>huge.err || rc=$?
[ $rc -eq 124 ] || { tail -c 300 huge.err; fail "max_new_tokens 2^62: exit $rc, want 124 (still generating)"; }
[ "$(stat -c %s huge.out)" -gt 100 ] || fail "max_new_tokens 2^62: nothing generated"
"$TRAIN" --task predict --out_dir shape --max_new_tokens 100 --prompt "the quick brown fox jumps" \
    >g1.out 2>/dev/null || fail "predict"
[ "$(stat -c %s g1.out)" -ge 125 ] || fail "predict of 100 tokens: $(stat -c %s g1.out) bytes"
rc=0
"$TRAIN" --task predict --out_dir shape --prompt hi --prompt_tokens 104 >pp.out 2>&1 || rc=$?
[ $rc -eq 2 ] || { cat pp.out; fail "--prompt and --prompt_tokens together: exit $rc"; }
assert_contains pp.out "prompt (the command line) and prompt_tokens (the command line) are both given"
"$TRAIN" "${TINY[@]}" "${S[@]}" --out_dir withprompt --prompt "the " --max_new_tokens 2 \
    >wp.out 2>&1 || { cat wp.out; fail "training with a prompt"; }
"$TRAIN" --task predict --out_dir withprompt --prompt_tokens 104,105 --max_new_tokens 2 \
    >wp2.out 2>/dev/null || fail "--prompt_tokens over a stored --prompt"
[ "$(head -c 2 wp2.out)" = hi ] || fail "--prompt_tokens 104,105 printed '$(head -c 2 wp2.out)'"
ok "generation past block_size without a growing buffer; --prompt or --prompt_tokens, not both"

# TensorBoard beside an earlier run's events: --overwrite deletes them (as it deletes the
# checkpoints and starts metrics.jsonl anew; they were left, and TensorBoard drew both runs);
# a start at step 0 beside them (no checkpoint to resume) purges them from step 0 on.
"$TRAIN" "${TINY[@]}" "${S[@]}" --tensorboard true --out_dir tbrun >tb1.out 2>&1 || fail "tb run"
"$TRAIN" "${TINY[@]}" "${S[@]}" --tensorboard true --out_dir tbrun --total_steps 10 \
    --overwrite true >tb2.out 2>&1 || { cat tb2.out; fail "overwrite run"; }
assert_contains tb2.out "overwrite: deleted 1 TensorBoard event file from 'tbrun/tb'"
[ "$(ls tbrun/tb | wc -l)" -eq 1 ] || fail "after --overwrite: $(ls tbrun/tb)"
rm tbrun/checkpoints/*
"$TRAIN" "${TINY[@]}" "${S[@]}" --tensorboard true --out_dir tbrun --total_steps 10 \
    >tb3.out 2>&1 || { cat tb3.out; fail "restart at step 0"; }
if command -v python3 >/dev/null; then
    python3 - tbrun/tb <<'PY' || fail "the restarted run's TensorBoard file does not purge from step 0"
import os, struct, sys
d = sys.argv[1]
f = sorted(os.listdir(d))
assert len(f) == 2, f
b = open(os.path.join(d, f[1]), "rb").read()
n = struct.unpack("<Q", b[:8])[0]
second = b[12 + n + 4:]
m = struct.unpack("<Q", second[:8])[0]
ev = second[12:12 + m]
assert ev[0] == 0x09 and ev[9:] == b"\x3a\x02\x08\x01", ev  # wall time, SessionLog START, no step: 0
PY
fi
ok "TensorBoard: --overwrite deletes the other run's events; a restart at step 0 purges them"

# A gpt's --task predict writes its text to predict_out when given (it was ignored silently).
"$TRAIN" --task predict --out_dir shape --prompt hey --max_new_tokens 5 --predict_out gen.txt \
    >gen.out 2>&1 || { cat gen.out; fail "predict to predict_out"; }
assert_contains gen.out "wrote the generated text to gen.txt"
[ "$(head -c 3 gen.txt)" = hey ] && [ "$(stat -c %s gen.txt)" -ge 8 ] ||
    fail "predict_out holds '$(cat gen.txt)'"
assert_not_contains gen.out "hey"
ok "a gpt's generated text goes to predict_out when given"

# max_new_tokens 0 in predict (the training's "no sample after training", stored in the
# checkpoint, or given): refused, naming where the 0 is from; it wrote the prompt alone.
for given in "" "--max_new_tokens 0"; do
    rc=0
    "$TRAIN" --task predict --out_dir shape --prompt hey --predict_out zero.txt $given \
        >zero.out 2>zero.err || rc=$?
    [ $rc -eq 2 ] || { cat zero.err; fail "predict, max_new_tokens 0 ($given): exit $rc, want 2"; }
    [ ! -e zero.txt ] || fail "predict, max_new_tokens 0 ($given): wrote '$(cat zero.txt)'"
done
assert_contains zero.err "key 'max_new_tokens' is 0 (the command line): --task predict would write the prompt alone; give --max_new_tokens N"
"$TRAIN" --task predict --out_dir shape --prompt hey --predict_out zero.txt >zero.out 2>zero.err ||
    true
assert_contains zero.err "is 0 (the configuration stored in the checkpoint, where 0 skipped the sample after training)"
ok "predict with max_new_tokens 0: refused, saying where the 0 comes from"

# ddpprep's --out_dir: parents made (as ddptrain's out_dir), a file in the way named.
"$PREP" --out_dir deep/er/dir --doc_sep % --val_every 2 f.txt >d1.out 2>&1 || { cat d1.out; fail "deep"; }
[ -s deep/er/dir/train.bin ] || fail "ddpprep --out_dir deep/er/dir: no train.bin"
: >plainfile
rc=0
"$PREP" --out_dir plainfile/sub --doc_sep % --val_every 2 f.txt >d2.out 2>&1 || rc=$?
[ $rc -eq 1 ] || fail "ddpprep into a file: exit $rc"
assert_contains d2.out "'plainfile' is a file, not a folder"
# A failed preparation removes the folders it made (an existing one stays, with its files).
mkdir -p keep && : >keep/mine
rc=0
"$PREP" --out_dir keep/new/sub --doc_sep % --val_every 2 missing.txt >d3.out 2>&1 || rc=$?
[ $rc -eq 1 ] || { cat d3.out; fail "ddpprep of a missing input: exit $rc"; }
[ ! -e keep/new ] || fail "a failed ddpprep left the folders it made: $(find keep)"
[ -e keep/mine ] || fail "a failed ddpprep removed a file it did not make"
ok "ddpprep --out_dir: parents made, a file in the way named, nothing left on failure"

# ddpprep without --out_dir, or without an input: one line naming what is missing (it printed
# the whole usage, which said neither).
rc=0
"$PREP" --doc_sep % f.txt >m1.out 2>&1 || rc=$?
[ $rc -eq 2 ] || { cat m1.out; fail "ddpprep without --out_dir: exit $rc"; }
assert_contains m1.out "ddpprep: --out_dir is missing: the folder that gets train.bin and val.bin"
[ "$(wc -l <m1.out)" -eq 1 ] || { cat m1.out; fail "ddpprep without --out_dir: not one line"; }
rc=0
"$PREP" --out_dir m2 --doc_sep % >m2.out 2>&1 || rc=$?
[ $rc -eq 2 ] || { cat m2.out; fail "ddpprep without an input: exit $rc"; }
assert_contains m2.out "ddpprep: no text to prepare: give files or folders after the flags"
[ ! -e m2 ] || fail "ddpprep without an input made its --out_dir"
ok "ddpprep without --out_dir or an input: one line naming what is missing"

# metrics.jsonl that cannot be opened (a folder of that name): an error before any work, as
# for train.log (the run went on silently without it, and the report had nothing to read).
mkdir -p nometrics/metrics.jsonl
rc=0
"$TRAIN" "${TINY[@]}" "${S[@]}" --out_dir nometrics >nm.out 2>&1 || rc=$?
[ $rc -eq 2 ] || { cat nm.out; fail "metrics.jsonl a folder: exit $rc, want 2"; }
assert_contains nm.out "cannot open 'nometrics/metrics.jsonl': Is a directory"
[ ! -e nometrics/checkpoints/step20.safetensors ] || fail "trained without metrics.jsonl"
ok "a metrics.jsonl that cannot be opened stops the run before any work"

# 2 ranks: rank 1 waits for rank 0's generation in a broadcast rank 0 renews every few seconds,
# not in one barrier, so a generation longer than a collective's deadline (DDP_TIMEOUT, 1 s
# here) completes; a prompt rank 0 refuses stops rank 1 at once (exit 86), not at the deadline.
# Rank 0 renews every quarter of DDP_TIMEOUT: 0.25 s of 1 s left a sanitized rank 0 that lost
# the CPU for 0.75 s under load behind (TSan: "broadcast #63 timed out", reproduced with three
# busy loops beside it), so the sanitized builds, whose 60000 tokens take far longer than 3 s
# (23 s under TSan here), use 3 s. TSan's 20000 tokens (8 s) are still well past its 3 s.
gen_timeout=1 gen_tokens=60000
[ -z "$SANITIZE" ] || gen_timeout=3
[ "$SANITIZE" != thread ] || gen_tokens=20000
DDP_TIMEOUT=$gen_timeout "$BIN/ddprun" --standalone --nproc_per_node 2 "$TRAIN" --task predict \
    --out_dir shape --max_new_tokens $gen_tokens --predict_out long.txt >long.out 2>&1 ||
    { tail -5 long.out; fail "a 2-rank generation longer than DDP_TIMEOUT"; }
[ "$(stat -c %s long.txt)" -ge $((gen_tokens + 1)) ] || fail "long.txt: $(stat -c %s long.txt) bytes"
rc=0
DDP_TIMEOUT=60 timeout 30 "$BIN/ddprun" --standalone --nproc_per_node 2 "$TRAIN" --task predict \
    --out_dir shape --max_new_tokens 5 --predict_out "$T/no/such/dir/x.txt" >badp.out 2>&1 || rc=$?
[ $rc -eq 1 ] || { cat badp.out; fail "rank 0 cannot write predict_out on 2 ranks: exit $rc"; }
assert_contains badp.out "rank 0: predict: cannot write '$T/no/such/dir/x.txt'"
# rank 1 learns it from the group's abort, unless ddprun stopped it first (rank 0 exits at once)
if grep -q '^\[rank1\]: ddptrain: rank 1' badp.out; then
    assert_contains badp.out "rank 1: generate: broadcast"
    assert_contains badp.out "rank 0 aborted the group: predict: cannot write '$T/no/such/dir/x.txt'"
fi
! grep -q "rank 0: generate: predict" badp.out || { cat badp.out; fail "rank 0 said it twice"; }
# A prompt past the vocabulary: refused by every rank before any work, a usage error
rc=0
DDP_TIMEOUT=60 timeout 30 "$BIN/ddprun" --standalone --nproc_per_node 2 "$TRAIN" --task predict \
    --out_dir shape --prompt_tokens 999 --max_new_tokens 5 >badp.out 2>&1 || rc=$?
[ $rc -eq 1 ] || { cat badp.out; fail "a refused prompt on 2 ranks: ddprun exited $rc"; }
assert_contains badp.out "ended with exit code 2"
assert_contains badp.out "prompt_tokens (the command line) has 999 (entry 1), not a token id of this model (0 … 255)"
ok "2 ranks: a generation past DDP_TIMEOUT completes; rank 0's failure stops rank 1 at once; a bad prompt is a usage error"

# nanoGPT's names: the ddptrain key, not a "did you mean" by spelling (eval_iters was told
# eval_every, which is nanoGPT's eval_interval).
for pair in eval_iters:eval_windows eval_interval:eval_every log_interval:log_every \
    init_from:resume_from start:prompt; do
    rc=0
    "$TRAIN" --model.type gpt "--${pair%%:*}" 1 >nn.out 2>&1 || rc=$?
    [ $rc -eq 2 ] || { cat nn.out; fail "--${pair%%:*}: exit $rc"; }
    assert_contains nn.out "ddptrain's key for '${pair%%:*}' is '${pair##*:}'"
    assert_not_contains nn.out "did you mean"
done
ok "nanoGPT's key names get ddptrain's key"
