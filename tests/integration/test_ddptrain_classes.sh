#!/usr/bin/env bash
# How many classes ddptrain's classifier has. It used to be what the TEST set's labels reached:
# a test split without the last class made training fail at its first batch ("label 9 of row 0
# is outside [0, 5)"), and --task predict (or test) on a few images of one's own, labelled 0,
# built a 1-class model that the checkpoint refused as "saved with another model". Now: training
# takes what the labels of either split reach; test and predict take the checkpoint's (its last
# fcN.bias), and test refuses labels beyond them in one line. Tiny IDX files, 1 and 2 ranks.
. "$(dirname "$0")/lib.sh"
TRAIN=$BIN/ddptrain
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
cd "$T"

idx() { # idx DIR SPLIT LABEL…: 28 × 28 images of noise, one per label
    local dir=$1 split=$2
    shift 2
    mkdir -p "$dir"
    idx_files "$dir/$split" "$@"
}
S=(--model.hidden 8 --batch_size 2 --total_steps 4 --log_every 0 --tensorboard false)

# The test split lacks classes 5-9.
idx ten train 0 1 2 3 4 5 6 7 8 9 9 8 7 6 5 4 3 2 1 0
idx ten t10k 0 1 2 3 4
"$DDPRUN" --standalone --nproc_per_node 2 "$TRAIN" "${S[@]}" --data.dir ten --out_dir r10 >a.out 2>&1 ||
    { cat a.out; fail "training with a test split that lacks the last classes"; }
assert_contains a.out "test accuracy"
ok "a test split without the last classes: the model has the training labels' 10 classes"

# A few images of one's own, every label 0: predict and test use the checkpoint's 10 classes.
idx mine t10k 0 0 0
"$DDPRUN" --standalone --nproc_per_node 2 "$TRAIN" --task predict --out_dir r10 --data.dir mine \
    --predict_out mine.csv >p.out 2>&1 || { cat p.out; fail "predict on 3 images labelled 0"; }
[ "$(wc -l <mine.csv)" -eq 4 ] || { cat mine.csv; fail "mine.csv: want a header and 3 rows"; }
"$TRAIN" --task test --out_dir r10 --data.dir mine >t.out 2>&1 || { cat t.out; fail "test on 3 images"; }
assert_contains t.out "(3 images)"
ok "predict and test on 3 images labelled 0: the checkpoint's 10 classes"

# A 5-class model tested on labels up to 9: refused in one line, before any work; predict goes on.
idx five train 0 1 2 3 4 4 3 2 1 0
idx five t10k 0 1 2 3 4
idx nine t10k 0 9 5
"$TRAIN" "${S[@]}" --data.dir five --out_dir r5 >b.out 2>&1 || { cat b.out; fail "5-class training"; }
rc=0
"$TRAIN" --task test --out_dir r5 --data.dir nine >out 2>err || rc=$?
[ $rc -eq 2 ] || { cat out err; fail "test of a 5-class model on labels to 9: exit $rc, want 2"; }
assert_contains err "ddptrain: the labels in data.dir 'nine' go up to 9, but the checkpoint's model has 5 classes (0 … 4)"
[ "$(wc -l <err)" -eq 1 ] || { cat err; fail "want one line"; }
"$TRAIN" --task predict --out_dir r5 --data.dir nine --predict_out five.csv >p5.out 2>&1 ||
    { cat p5.out; fail "predict of a 5-class model on labels to 9"; }
ok "a 5-class model: test on labels to 9 refused in one line, predict goes on"
