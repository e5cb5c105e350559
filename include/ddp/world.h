/*
 * ddp/world.h — who am I in the job: the launcher's environment contract.
 *
 * ddprun (and torchrun) give each worker RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
 * GROUP_RANK, MASTER_ADDR and MASTER_PORT; ddprun adds DDP_RUN_ID, DDP_STORE_TOKEN,
 * DDP_RESTART_COUNT, DDP_MAX_RESTARTS and DDP_AGENT_STORE. ddp_world_from_env() reads them and
 * checks that they agree with each other. With no RANK set, a program is a world of one and
 * behaves exactly like a plain single-process run.
 */
#ifndef DDP_WORLD_H
#define DDP_WORLD_H

#include <stdbool.h>

#include "ddp/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DDP_DEFAULT_MASTER_ADDR "127.0.0.1"
#define DDP_DEFAULT_MASTER_PORT 29500

/* Plain data: a snapshot of the environment, filled by ddp_world_from_env(). */
typedef struct ddp_world {
    int rank;             /* RANK, 0 ≤ rank < world_size */
    int world_size;       /* WORLD_SIZE */
    int local_rank;       /* LOCAL_RANK: index among the ranks on this node */
    int local_world_size; /* LOCAL_WORLD_SIZE */
    int node_rank;        /* GROUP_RANK: index of this node */
    int restart_count; /* DDP_RESTART_COUNT (or TORCHELASTIC_RESTART_COUNT), 0 on the first attempt
                        */
    int max_restarts;  /* DDP_MAX_RESTARTS (or TORCHELASTIC_MAX_RESTARTS) */
    char master_addr[256]; /* MASTER_ADDR: host of the rendezvous store */
    int master_port;       /* MASTER_PORT */
    char run_id[128];      /* DDP_RUN_ID (or TORCHELASTIC_RUN_ID); "none" when unset */
    char store_token[128]; /* DDP_STORE_TOKEN; empty when unset */
    bool launched;         /* true when RANK was set: some launcher started us */
    bool agent_store;      /* true when a launcher (ddprun) hosts the store; else rank 0 hosts it */
} ddp_world;

/* Reads the environment into *out. A world of one when RANK is unset. Fails with DDP_ERR_INVALID
 * when a variable is malformed or the set is inconsistent (RANK without WORLD_SIZE, RANK ≥
 * WORLD_SIZE, …), naming the variable. *out written only on DDP_OK; err may be NULL. */
ddp_status ddp_world_from_env(ddp_world *out, ddp_error *err);

#ifdef __cplusplus
}
#endif
#endif /* DDP_WORLD_H */
