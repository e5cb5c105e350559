#!/usr/bin/env bash
# The default language-model job against its torch twin (issue 11): runs
#   ddprun --standalone --nproc_per_node=2 ddptrain --config configs/gpt-fortunes.yaml
# timing it, then trains tests/python/gpt_twin.py the same way on the same windows
# (bench/gpt_twin_train.py) and compares the final validation losses (within 2%).
# usage: bench/gpt_vs_torch_loss.sh [--same-init] [BUILD_DIR] [RUN_DIR] [extra ddptrain flags…]
#   e.g. bench/gpt_vs_torch_loss.sh build runs/gpt-vs-torch --total_steps 200
# --same-init: the twin starts from ddptrain's initial weights (saved by a one-step run at
# lr 1e-30, which changes no weight), so that only float rounding separates the two runs;
# without it the twin draws its own (torch's generator), as a second user of the config would.
# Needs Debian's python3-torch (/usr/bin/python3) and the fortunes package. Takes minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
SAME_INIT=0
[ "${1:-}" = --same-init ] && { SAME_INIT=1; shift; }
BUILD=${1:-build}
RUN=${2:-runs/gpt-vs-torch}
shift $(($# < 2 ? $# : 2))
rm -rf "$RUN"
start=$(date +%s.%N)
"$BUILD/bin/ddprun" --standalone --nproc_per_node=2 "$BUILD/bin/ddptrain" \
    --config configs/gpt-fortunes.yaml --out_dir "$RUN" "$@"
end=$(date +%s.%N)
echo "ddptrain: the default LM job took $(echo "$end - $start" | bc) s (wall, 2 ranks)"
grep -E '^(eval at step|trained)' "$RUN/train.log"
INIT=()
if [ $SAME_INIT = 1 ]; then
    "$BUILD/bin/ddptrain" --config configs/gpt-fortunes.yaml "$@" --out_dir "$RUN/init" \
        --total_steps 1 --lr 1e-30 --max_new_tokens 0 --eval_windows 1 >/dev/null
    INIT=(--init "$RUN/init/checkpoints/step1.safetensors")
fi
/usr/bin/python3 bench/gpt_twin_train.py "$RUN" --threads 2 "${INIT[@]}"
