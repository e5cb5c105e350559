#!/usr/bin/env bash
# ddptrain with dropout: N ranks × B (and N ranks × B/2 × 2 accumulation steps) end with the
# weights of 1 rank × N·B (relative difference ≤ 1e-5: float32 sums in another order). Each
# sample's mask is keyed by its place in the global micro-batch; the DistributedSampler gives
# rank r every N-th place, so the ranks pass a stride (ddp_model_batch.sample_stride). Before,
# the keys were contiguous per rank and paired masks with other samples: 0.6 apart. An MLP only:
# a CNN's batchnorm normalises over each rank's micro-batch (torch's BatchNorm2d under DDP
# without SyncBatchNorm), so no CNN run of other per-rank batches matches 1 rank × N·B.
. "$(dirname "$0")/lib.sh"
TRAIN=$BIN/ddptrain
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
cd "$T"


for model in mlp; do
    A=(--model.type $model --model.hidden 32,16 --model.dropout 0.3
       --log_every 0 --tensorboard false --total_steps 6 --eval_every 0)
    "$TRAIN" "${A[@]}" --batch_size 24 --out_dir one$model >one.out 2>&1 ||
        { cat one.out; fail "$model: 1 rank × 24"; }
    "$DDPRUN" --standalone --nproc_per_node 3 "$TRAIN" "${A[@]}" --batch_size 8 \
        --out_dir three$model >three.out 2>&1 || { cat three.out; fail "$model: 3 ranks × 8"; }
    "$DDPRUN" --standalone --nproc_per_node 2 "$TRAIN" "${A[@]}" --batch_size 6 --grad_accum 2 \
        --out_dir two$model >two.out 2>&1 || { cat two.out; fail "$model: 2 ranks × 6 × 2"; }
    weights_close one$model/checkpoints/step6.safetensors three$model/checkpoints/step6.safetensors ||
        fail "$model with dropout: 3 ranks × 8 ended elsewhere than 1 rank × 24"
    weights_close one$model/checkpoints/step6.safetensors two$model/checkpoints/step6.safetensors ||
        fail "$model with dropout: 2 ranks × 6 × 2 accumulation ended elsewhere than 1 rank × 24"
done
ok "dropout (an mlp of two dropout layers): 3 ranks × 8 and 2 ranks × 6 × 2 end with 1 rank × 24's weights"
