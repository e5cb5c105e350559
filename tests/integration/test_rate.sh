#!/usr/bin/env bash
# The rate and MFU of ddptrain's progress lines count training time alone: an interval that holds
# an evaluation or a checkpoint shows the same samples/s as one that does not. Before 2026-11-24
# the evaluation's time was in the interval, and with log_every 5 and eval_every 10 every other
# progress line showed about 1/7 of the rate (and of the MFU) of its neighbours.
. "$(dirname "$0")/lib.sh"
TRAIN=$BIN/ddptrain
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
cd "$T"

"$DDPRUN" --standalone --nproc_per_node=2 "$TRAIN" --total_steps 100 --log_every 5 \
    --eval_every 10 --checkpoint.every 10 --tensorboard false --out_dir run >train.out 2>&1 ||
    { cat train.out; fail "training failed"; }
# Progress lines at 15, 25, …, 95 follow an evaluation and a checkpoint (at 10, 20, …); those at
# 10, 20, …, 100 do not. The medians must be within a factor 3 (they were 7 apart; a factor 2
# was the bound until 2026-11-25, within reach of a busy host's noise on 5-step intervals).
python3 - run/metrics.jsonl <<'PY' || fail "the rate after an evaluation differs from the others"
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
after = [r for r in rows if "samples_per_s" in r and r["step"] % 10 == 5 and r["step"] > 5]
plain = [r for r in rows if "samples_per_s" in r and r["step"] % 10 == 0]
ratio = statistics.median(r["samples_per_s"] for r in after) / statistics.median(
    r["samples_per_s"] for r in plain)
mfu = statistics.median(r["mfu"] for r in after) / statistics.median(r["mfu"] for r in plain)
print(f"samples/s after an evaluation / otherwise: {ratio:.2f} (MFU {mfu:.2f}); "
      f"{len(after)} and {len(plain)} lines")
sys.exit(0 if 1 / 3 < ratio < 3 and 1 / 3 < mfu < 3 else 1)
PY
ok "samples/s and MFU after an evaluation and a checkpoint: the training rate, as elsewhere"
