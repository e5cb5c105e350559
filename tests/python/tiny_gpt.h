/*
 * tiny_gpt.h — nanoGPT's GPT composed from the ddp/nn.h transformer layers, forward and backward,
 * for transformer_dump: a whole-model parity check against torch and the step benchmark. A test
 * fixture, not the library's model (which belongs in src/nn behind the model interface): no
 * checkpoints, no sharding, dropout only through the attention kernel's own.
 *
 * Parameters live in one flat array in this order (nanoGPT's state_dict order, the tied lm_head
 * left out): wte (V, C), wpe (P, C), then per layer ln_1.weight, ln_1.bias, attn.c_attn.weight
 * (3C, C), attn.c_attn.bias, attn.c_proj.weight (C, C), attn.c_proj.bias, ln_2.weight, ln_2.bias,
 * mlp.c_fc.weight (4C, C), mlp.c_fc.bias, mlp.c_proj.weight (C, 4C), mlp.c_proj.bias, then
 * ln_f.weight, ln_f.bias; every bias left out when bias is false (nanoGPT's bias=False).
 */
#ifndef TINY_GPT_H
#define TINY_GPT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ddp/nn.h"

typedef struct tiny_gpt_cfg {
    int L, C, nh, P, V; /* layers, n_embd, heads, block_size, vocab_size */
    bool bias;
    float attn_dropout; /* dropout on the attention probabilities only */
} tiny_gpt_cfg;

typedef struct tiny_gpt tiny_gpt;

/* Allocates a model for batches of up to B × cfg->P tokens: parameters (zeroed), gradients and
 * activations. NULL on a bad configuration (message on stderr) or out of memory. */
tiny_gpt *tiny_gpt_new(const tiny_gpt_cfg *cfg, int B);
void tiny_gpt_free(tiny_gpt *m);
size_t tiny_gpt_n_params(const tiny_gpt *m);
float *tiny_gpt_params(tiny_gpt *m); /* (n_params,) */
float *tiny_gpt_grads(tiny_gpt *m);  /* (n_params,) accumulated by backward */

/* Forward over idx (B, T) with T ≤ P; with targets (B, T) also the mean cross-entropy (ignore
 * index -1) into *loss and its gradient, kept for tiny_gpt_backward. 0, or -1 with a message on
 * stderr for a bad token id or target. step keys the attention dropout. */
int tiny_gpt_forward(tiny_gpt *m, const int32_t *idx, const int32_t *targets, int B, int T,
                     uint64_t step, double *loss);
/* Backward of the last forward (which had targets): grads += dloss/dparams. */
void tiny_gpt_backward(tiny_gpt *m, uint64_t step);

#endif
