#!/usr/bin/env bash
# ddptrain's language models end to end, on tiny GPTs and a synthetic text (no dependency on the
# fortunes package): the default config parses; ddpprep makes data.text's files; bad input (an odd-sized token file, an id beyond
# the vocabulary, a block_size the file cannot hold, n_embd not divisible by n_head) is a
# one-line error before any work; 2 ranks × B end where 1 rank × 2B does (random windows and
# epochs of fixed windows); a run killed after a checkpoint and resumed ends bit for bit where an
# uninterrupted one does (dropout on), and the resume removes a dead save's temporary file;
# test and predict need no --config and give the same validation loss for 1 and 2 ranks;
# generation is deterministic for a seed, with the key/value cache or without; other vocabularies
# take --prompt_tokens.
. "$(dirname "$0")/lib.sh"
TRAIN=$BIN/ddptrain
DUMP=$BIN/ckpt_tool
SRC=$(cd "$(dirname "$0")/../.." && pwd)
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 DDP_DATA_CACHE=$T/cache
cd "$T"

story_text >text.txt
TINY=(--model.type gpt --data.text "$T/text.txt" --data.doc_sep % --model.n_layer 2
      --model.n_head 2 --model.n_embd 32 --model.block_size 32 --optimizer adamw --lr 3e-3
      --betas 0.9,0.95 --weight_decay 0.1 --grad_clip 1 --eval_windows 40 --max_new_tokens 0)

# The default config loads (zero steps: its keys, the data preparation, the model).
"$TRAIN" --config "$SRC/configs/gpt-fortunes.yaml" --data.text "$T/text.txt" --total_steps 0 \
    --epochs 0 --max_new_tokens 0 --out_dir dry >dry.out 2>&1 || { cat dry.out; fail "dry run"; }
assert_contains dry.out "trained 0 steps"

# ddpprep makes the files data.text makes (the dry run above: doc_sep %, every 10th document to
# validation), and its layout is exact: every byte one little-endian uint16, document k to
# val.bin when k % val_every == val_every − 1, the separator lines kept.
"$BIN/ddpprep" --out_dir prep --doc_sep % text.txt >prep.out 2>&1 || { cat prep.out; fail "ddpprep"; }
cmp -s prep/train.bin cache/text-*-train.bin && cmp -s prep/val.bin cache/text-*-val.bin ||
    fail "ddpprep's files differ from data.text's: $(ls cache)"
printf 'ab\n%%\ncd\n%%\nef\n%%\n' >three.txt
"$BIN/ddpprep" --out_dir prep3 --doc_sep % --val_every 3 three.txt >prep3.out 2>&1 ||
    { cat prep3.out; fail "ddpprep of three documents"; }
u16() { od -An -v -tu2 --endian=little "$1" | tr -s ' \n' ' '; }
u8() { printf "$1" | od -An -v -tu1 | tr -s ' \n' ' '; }
[ "$(u16 prep3/train.bin)" = "$(u8 'ab\n%%\ncd\n%%\n')" ] ||
    fail "ddpprep train.bin: $(u16 prep3/train.bin), want $(u8 'ab\n%%\ncd\n%%\n')"
[ "$(u16 prep3/val.bin)" = "$(u8 'ef\n%%\n')" ] ||
    fail "ddpprep val.bin: $(u16 prep3/val.bin), want $(u8 'ef\n%%\n')"
ok "ddpprep: the same files as data.text; bytes as uint16, documents dealt by position"
"$TRAIN" --help >help
for k in model.n_layer model.n_head model.n_embd model.block_size model.vocab_size model.bias \
    data.train data.val data.text data.doc_sep data.sampling eps eval_windows prompt \
    prompt_tokens max_new_tokens temperature top_k; do assert_contains help "$k"; done
ok "configs/gpt-fortunes.yaml loads; --help lists the GPT keys"

# Bad input: exit 2 and one line naming the problem, before any work.
bad() { # bad NAME EXPECTED-TEXT ARGS…: exit 2, the text on stderr, nothing started
    local name=$1 want=$2
    shift 2
    rc=0
    "$TRAIN" "${TINY[@]}" --out_dir "bad_$name" "$@" >"$name.out" 2>"$name.err" || rc=$?
    [ $rc -eq 2 ] || { cat "$name.err"; fail "$name: exit code $rc, expected 2"; }
    assert_contains "$name.err" "$want"
    [ "$(wc -l <"$name.err")" -eq 1 ] || { cat "$name.err"; fail "$name: not one line"; }
    [ ! -d "bad_$name" ] || fail "$name: work started"
}
printf 'abc' >odd.bin
bad odd "has an odd number of bytes (3)" --data.train odd.bin --data.val odd.bin
python3 -c "
import struct, sys
open('big.bin', 'wb').write(struct.pack('<600H', *[i % 301 for i in range(600)]))
open('short.bin', 'wb').write(struct.pack('<10H', *range(10)))"
bad vocab "data.train 'big.bin' holds token id 300, not below model.vocab_size 256" \
    --data.train big.bin --data.val big.bin
bad block "model.block_size 32 is larger than data.val 'short.bin' allows: it has 10 tokens" \
    --data.train big.bin --data.val short.bin --model.vocab_size 301
bad heads "model.n_embd 32 is not divisible by model.n_head 3" --model.n_head 3
ok "odd-sized file, id ≥ vocab_size, block_size > file, n_embd % n_head: one-line errors"

# data.text too short for a window names data.text and what to do, not the cache's file as a
# data.val the user never gave; a FIFO or a device is refused (a FIFO blocked the open until
# the job's timeout, /dev/zero was read until memory ran out), by ddptrain and ddpprep.
for i in $(seq 20); do printf 'ab\n%%\n'; done >short.txt
bad shorttext "model.block_size 32 is larger than the validation tokens data.text gives allow: 10 (in '$T/cache/text-" \
    --data.text "$T/short.txt"
assert_contains shorttext.err "lower model.block_size or give more text (or a smaller data.val_every)"
mkfifo fifo
rc=0
timeout 20 "$TRAIN" "${TINY[@]}" --data.text "$T/fifo" --out_dir bad_fifo >fifo.out 2>&1 || rc=$?
[ $rc -eq 2 ] || { cat fifo.out; fail "data.text a FIFO: exit $rc, want 2 (124: waiting for a writer)"; }
assert_contains fifo.out "data.text: text input '$T/fifo' is a FIFO (named pipe), not a file or a folder"
[ ! -d bad_fifo ] || fail "data.text a FIFO: work started"
rc=0
timeout 20 "$TRAIN" "${TINY[@]}" --data.text /dev/zero --out_dir bad_fifo >zero.out 2>&1 || rc=$?
[ $rc -eq 2 ] || { cat zero.out; fail "data.text /dev/zero: exit $rc, want 2"; }
assert_contains zero.out "text input '/dev/zero' is a character device, not a file or a folder"
rc=0
timeout 20 "$BIN/ddpprep" --out_dir bad_fifo fifo >fifo2.out 2>&1 || rc=$?
[ $rc -eq 1 ] || { cat fifo2.out; fail "ddpprep of a FIFO: exit $rc, want 1"; }
assert_contains fifo2.out "text input 'fifo' is a FIFO (named pipe)"
# An unreadable input is named as the input, without the data cache's hint ("DDP_DATA_CACHE
# names another folder", which the cache's writer added to the failed read). As root: as nobody.
if [ "$(id -u)" != 0 ] || command -v setpriv >/dev/null; then
    as_user=()
    [ "$(id -u)" != 0 ] || as_user=(setpriv --reuid=65534 --regid=65534 --clear-groups)
    cp short.txt unreadable.txt && chmod 000 unreadable.txt && chmod 755 "$T" && mkdir -m 777 ucache
    rc=0
    DDP_DATA_CACHE=$T/ucache "${as_user[@]}" "$TRAIN" "${TINY[@]}" --data.text "$T/unreadable.txt" \
        --out_dir "$T/ucache/run" >unr.out 2>&1 || rc=$?
    [ $rc -eq 2 ] || { cat unr.out; fail "an unreadable data.text: exit $rc, want 2"; }
    assert_contains unr.out "data.text: cannot read text input '$T/unreadable.txt': Permission denied"
    assert_not_contains unr.out "DDP_DATA_CACHE"
fi
ok "data.text: too short for a window names data.text; a FIFO, a device, an unreadable file"

# N ranks × B ≡ 1 rank × N·B: the same windows, the same losses, the same weights within float
# rounding (not bit for bit: the gradient sums run over 4 and 4 windows instead of 8).
weights_close() { # weights_close A B TOL: every parameter of A within TOL (abs) of B's
    python3 - "$1" "$2" "$3" <<'EOF'
import sys
def load(p):
    t = {}
    for line in open(p):
        f = line.split()
        if f[0] == "T" and not bytes.fromhex(f[1]).decode().startswith("optim."):
            nd = int(f[3]); t[f[1]] = [float.fromhex(v) for v in f[4 + nd:]]
    return t
a, b, tol = load(sys.argv[1]), load(sys.argv[2]), float(sys.argv[3])
assert a.keys() == b.keys() and len(a) > 0, "different tensors"
worst = max(abs(x - y) for k in a for x, y in zip(a[k], b[k]))
print(f"max |difference| {worst:.3g} over {sum(map(len, a.values()))} weights")
sys.exit(0 if worst <= tol else 1)
EOF
}
losses() { sed -n 's/.*\(step [0-9]*\/[0-9]*\) | epoch [0-9]* | \(loss [0-9.]*\).*/\1 \2/p' "$1"; }
for mode in random epoch; do
    args=("${TINY[@]}" --data.sampling $mode --total_steps 8 --log_every 1 --eval_every 4)
    "$DDPRUN" --standalone --nproc_per_node=2 "$TRAIN" "${args[@]}" --batch_size 4 \
        --out_dir two_$mode >two_$mode.out 2>&1 || { cat two_$mode.out; fail "2 ranks $mode"; }
    "$TRAIN" "${args[@]}" --batch_size 8 --out_dir one_$mode >one_$mode.out 2>&1 ||
        { cat one_$mode.out; fail "1 rank $mode"; }
    [ "$(losses two_$mode.out | wc -l)" -eq 8 ] || fail "$mode: want 8 progress lines"
    [ "$(losses two_$mode.out)" = "$(losses one_$mode.out)" ] ||
        fail "$mode losses differ: $(losses two_$mode.out) vs $(losses one_$mode.out)"
    "$DUMP" dump two_$mode/checkpoints/step8.safetensors >two_$mode.txt
    "$DUMP" dump one_$mode/checkpoints/step8.safetensors >one_$mode.txt
    d=$(weights_close two_$mode.txt one_$mode.txt 2e-5) || fail "$mode weights differ: $d"
    ok "$mode windows: 2 ranks × 4 = 1 rank × 8 (losses to 4 decimals; $d)"
done
# Accumulation: 2 micro-steps of 4 windows (no_sync between) = one step of 8.
"$TRAIN" "${TINY[@]}" --total_steps 8 --log_every 1 --eval_every 4 --batch_size 4 --grad_accum 2 \
    --out_dir accum >accum.out 2>&1 || { cat accum.out; fail "grad_accum 2"; }
[ "$(losses accum.out)" = "$(losses one_random.out)" ] || fail "grad_accum 2 losses differ"
"$DUMP" dump accum/checkpoints/step8.safetensors >accum.txt
d=$(weights_close accum.txt one_random.txt 2e-5) || fail "grad_accum 2 weights differ: $d"
ok "random windows: 1 rank × 4 × grad_accum 2 = 1 rank × 8 ($d)"
grep -q '"tokens_per_s"' two_random/metrics.jsonl || fail "metrics.jsonl lacks tokens_per_s"
grep -q '"val_loss"' two_random/metrics.jsonl || fail "metrics.jsonl lacks val_loss"
assert_contains two_random.out "eval at step 0: val loss 5.5"
assert_contains two_random.out "tokens/s"

# Killed after a checkpoint and resumed = never stopped, bit for bit, with dropout; the resume
# removes the temporary file a save killed on this host left behind. Sanitizer builds, 3–15×
# slower, run 30 steps instead of 300 (200 in bf16); every rank is killed right after step 10's
# checkpoint (DDP_TEST_KILL_AFTER_CHECKPOINT).
N=300 NB=200
[ -n "$SANITIZE" ] && N=30 NB=30
args=("${TINY[@]}" --model.n_embd 64 --model.dropout 0.1 --batch_size 8 --total_steps $N
      --checkpoint.every 10 --checkpoint.keep 40 --log_every 5 --eval_every 100)
"$DDPRUN" --standalone --nproc_per_node=2 "$TRAIN" "${args[@]}" --out_dir whole >whole.out 2>&1 ||
    { cat whole.out; fail "uninterrupted run failed"; }
# Killed right after step 10's checkpoint (a kill from here raced a fast run to its end).
rc=0
DDP_TEST_KILL_AFTER_CHECKPOINT=10 "$DDPRUN" --standalone --nproc_per_node=2 "$TRAIN" "${args[@]}" \
    --out_dir cut >cut.out 2>&1 || rc=$?
[ $rc -ne 0 ] || { cat cut.out; fail "the run was not killed after its checkpoint at step 10"; }
[ -f cut/checkpoints/step10.safetensors ] || fail "no checkpoint at step 10"
[ ! -f cut/checkpoints/step$N.safetensors ] || fail "the run finished before it could be killed"
dead=$(python3 -c "import os
p = 4000000
while os.path.exists(f'/proc/{p}'): p -= 1
print(p)")
touch "cut/checkpoints/step10.safetensors.tmp.$(hostname).$dead"
"$DDPRUN" --standalone --nproc_per_node=2 "$TRAIN" "${args[@]}" --out_dir cut --resume_from latest \
    >resume.out 2>&1 || { cat resume.out; fail "resume failed"; }
assert_contains resume.out "resumed from cut/checkpoints/step"
assert_contains cut/train.log "removed 1 temporary file that interrupted saves left in"
[ ! -e "cut/checkpoints/step10.safetensors.tmp.$(hostname).$dead" ] || fail "stale file kept"
"$DUMP" dump whole/checkpoints/step$N.safetensors | grep -v '^M ' >a.txt
"$DUMP" dump cut/checkpoints/step$N.safetensors | grep -v '^M ' >b.txt
[ -s a.txt ] && cmp -s a.txt b.txt || fail "resumed weights differ from the uninterrupted run's"
tail_losses() { losses "$1" | tail -n 4; }
[ "$(tail_losses resume.out)" = "$(tail_losses whole.out)" ] ||
    fail "resumed losses differ: $(tail_losses resume.out) vs $(tail_losses whole.out)"
ok "killed after a checkpoint and resumed: the same losses and weights, bit for bit; stale file removed"

# test and predict without --config: the model comes from the checkpoint's stored configuration.
vl=$(sed -n 's/^\[rank0\]: val loss \([0-9.]*\), perplexity.*/\1/p' whole.out)
[ -n "$vl" ] || fail "no final val loss"
"$TRAIN" --task test --out_dir whole >t1.out 2>&1 || { cat t1.out; fail "test, 1 rank"; }
"$DDPRUN" --standalone --nproc_per_node=2 "$TRAIN" --task test --out_dir whole >t2.out 2>&1 ||
    { cat t2.out; fail "test, 2 ranks"; }
assert_contains t1.out "val loss $vl, perplexity"
assert_contains t2.out "val loss $vl, perplexity"
assert_contains t1.out "configuration: the one stored in whole/checkpoints/step$N.safetensors"
ok "test without --config: val loss $vl with 1 rank and with 2"

gen() { "$TRAIN" --task predict --out_dir whole --max_new_tokens 60 --temperature 1 "$@"; }
gen --seed 5 --prompt "the cat" >g1 2>g1.err || { cat g1.err; fail "predict failed"; }
gen --seed 5 --prompt "the cat" >g2 2>/dev/null || fail "predict failed"
gen --seed 6 --prompt "the cat" >g3 2>/dev/null || fail "predict failed"
[ "$(head -c 7 g1)" = "the cat" ] || fail "the output does not start with the prompt"
[ "$(wc -c <g1)" -ge 67 ] || fail "fewer than 60 new bytes: $(cat g1)"
cmp -s g1 g2 || fail "the same seed gave different text"
! cmp -s g1 g3 || fail "seeds 5 and 6 gave the same text"
assert_contains g1.err "loaded whole/checkpoints/step$N.safetensors at step $N"
"$DDPRUN" --standalone --nproc_per_node=2 --no_prefix "$TRAIN" --task predict \
    --out_dir whole --max_new_tokens 60 --temperature 1 --seed 5 --prompt "the cat" >g4 2>/dev/null ||
    fail "predict with 2 ranks failed"
cmp -s g1 g4 || fail "2 ranks generated other text than 1: $(cat g4)"
# the key/value cache (default) against every token recomputing its whole context: the same
# text, through the cached first block_size tokens and the sliding window after them
gen --seed 5 --prompt "the cat" --kv_cache false >g5 2>/dev/null || fail "predict, kv_cache false"
cmp -s g1 g5 || fail "kv_cache false generated other text: $(cat g5) / $(cat g1)"
ok "generation: streams after the prompt, the same for a seed (1 or 2 ranks, kv_cache or not), differs across seeds"
# Text that standard output cannot take (a full disk): generation stops there, exit 1, one line
# (until 2026-11-26 every token was lost with exit 0 and "generated 60 tokens").
rc=0; gen --seed 5 --prompt "the cat" >/dev/full 2>gfull.err || rc=$?
[ $rc -eq 1 ] || { cat gfull.err; fail "predict >/dev/full exited $rc, not 1"; }
assert_contains gfull.err "ddptrain: writing the generated text failed: No space left on device"
assert_not_contains gfull.err "generated 60 tokens"
ok "generation into a full standard output: stopped, exit 1, said"

# Another vocabulary: ids in and out.
"$TRAIN" "${TINY[@]}" --data.train big.bin --data.val big.bin --model.vocab_size 320 \
    --model.block_size 16 --total_steps 3 --out_dir v320 >v320.out 2>&1 ||
    { cat v320.out; fail "vocab 320 training"; }
rc=0; "$TRAIN" --task predict --out_dir v320 --prompt "abc" --max_new_tokens 5 >p.out 2>p.err ||
    rc=$?
[ $rc -eq 2 ] || fail "a text prompt for a 320-token vocabulary: exit $rc, want 2"
assert_contains p.err "--prompt_tokens 1,2,3"
# An id past the vocabulary: a usage error before predict_out is opened (until 2026-11-26 exit 1,
# after an earlier predict_out had been emptied)
echo keep >kept.txt
rc=0; "$TRAIN" --task predict --out_dir v320 --prompt_tokens 1,2,320 --predict_out kept.txt \
    >p.out 2>p.err || rc=$?
[ $rc -eq 2 ] || { cat p.err; fail "prompt_tokens past the vocabulary: exit $rc, want 2"; }
assert_contains p.err "prompt_tokens (the command line) has 320 (entry 3), not a token id of this model (0 … 319)"
[ "$(cat kept.txt)" = keep ] || fail "a refused prompt changed the earlier predict_out"
"$TRAIN" --task predict --out_dir v320 --prompt_tokens 300,7 --max_new_tokens 5 >p.out 2>p.err ||
    { cat p.err; fail "predict with prompt_tokens"; }
grep -Eq '^300 7( [0-9]+){5}$' p.out || { cat p.out; fail "want the ids '300 7' and 5 more"; }
ok "vocabulary 320: --prompt refused with a hint, ids past it refused (exit 2), --prompt_tokens in, ids out"

# precision bf16 on the CPU (where it has bf16 units and oneDNN): killed after a checkpoint and
# resumed = never stopped, bit for bit (which kernel computes a product never depends on what ran
# before); the stored configuration keeps bf16 for test and predict; generation is the same for
# a seed with 1 rank and 2.
if have_cpu_bf16; then
    args=("${TINY[@]}" --precision bf16 --model.dropout 0.1 --batch_size 8 --total_steps $NB
          --checkpoint.every 10 --checkpoint.keep 40 --log_every 5 --eval_every 100)
    "$DDPRUN" --standalone --nproc_per_node=2 "$TRAIN" "${args[@]}" --out_dir bwhole \
        >bwhole.out 2>&1 || { cat bwhole.out; fail "bf16: uninterrupted run failed"; }
    assert_contains bwhole.out "device cpu (precision bf16)"
    rc=0
    DDP_TEST_KILL_AFTER_CHECKPOINT=10 "$DDPRUN" --standalone --nproc_per_node=2 "$TRAIN" \
        "${args[@]}" --out_dir bcut >bcut.out 2>&1 || rc=$?
    [ $rc -ne 0 ] || { cat bcut.out; fail "bf16: not killed after its checkpoint at step 10"; }
    [ -f bcut/checkpoints/step10.safetensors ] || fail "bf16: no checkpoint at step 10"
    [ ! -f bcut/checkpoints/step$NB.safetensors ] || fail "bf16: finished before it was killed"
    "$DDPRUN" --standalone --nproc_per_node=2 "$TRAIN" "${args[@]}" --out_dir bcut \
        --resume_from latest >bresume.out 2>&1 || { cat bresume.out; fail "bf16: resume failed"; }
    assert_contains bresume.out "resumed from bcut/checkpoints/step"
    "$DUMP" dump bwhole/checkpoints/step$NB.safetensors | grep -v '^M ' >ba.txt
    "$DUMP" dump bcut/checkpoints/step$NB.safetensors | grep -v '^M ' >bb.txt
    [ -s ba.txt ] && cmp -s ba.txt bb.txt || fail "bf16: resumed weights differ"
    [ "$(losses bresume.out | tail -n 4)" = "$(losses bwhole.out | tail -n 4)" ] ||
        fail "bf16: resumed losses differ"
    "$TRAIN" --task test --out_dir bwhole >bt.out 2>&1 || { cat bt.out; fail "bf16: test"; }
    assert_contains bt.out "device cpu (precision bf16)"
    bgen() { "$TRAIN" --task predict --out_dir bwhole --max_new_tokens 40 --seed 3 --prompt "the"; }
    bgen >bg1 2>/dev/null || fail "bf16: predict failed"
    "$DDPRUN" --standalone --nproc_per_node=2 --no_prefix "$TRAIN" --task predict \
        --out_dir bwhole --max_new_tokens 40 --seed 3 --prompt "the" >bg2 2>/dev/null ||
        fail "bf16: predict with 2 ranks failed"
    [ "$(wc -c <bg1)" -ge 43 ] && cmp -s bg1 bg2 || fail "bf16: generation differs: $(cat bg1) / $(cat bg2)"
    bgen --kv_cache false >bg3 2>/dev/null || fail "bf16: predict, kv_cache false"
    cmp -s bg1 bg3 || fail "bf16: kv_cache false generated other text: $(cat bg3) / $(cat bg1)"
    ok "bf16: resumed = uninterrupted bit for bit; test and predict keep bf16; generation fixed by the seed"
else
    ok "bf16 on the CPU skipped: no bf16 units or no oneDNN here"
fi
