/*
 * elastic.c — an elastic job's rendezvous (--nnodes MIN:MAX), in rounds, and its newcomers.
 *
 * torchrun's c10d rendezvous, on ddprun's store. Node 0 (the store's host) runs each round:
 *   ddprun/attempt                  the round node 0 is at; a node that comes joins there
 *   a<k>/count, a<k>/slot/<j>       a node adds 1 to count and writes its record in slot j:
 *                                   "id nproc max_restarts min max run_id_set run_id host"
 *   a<k>/members                    node 0's close: "ok RESTARTS N SLOT…" (the members, by id:
 *                                   group ranks 0…N-1), or "fail MESSAGE" (below MIN)
 * Node 0 closes the round at once when MAX nodes are in, or when at least MIN are and none came
 * for last_call_timeout (each arrival starts that wait again, as in torch); below MIN at
 * --rdzv_timeout (join_timeout) it fails the round naming who came and who is missing. A node
 * whose slot is not among the members (it came after the close, or beyond MAX) waits for the
 * next round; node 0 sees its slot while the job runs and, below MAX, re-forms the group.
 *
 * Here: the rounds (node 0's close, every node's join), the newcomers node 0 sees while the job
 * runs, and the nodes told at the end that no place opened. A fixed job's rendezvous is in
 * rendezvous.c; the monitor that calls agent_waiting_nodes is presence.c's.
 */
#define _GNU_SOURCE
#include <limits.h>
#include <netdb.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent_int.h"

typedef struct erec {
    int id, nproc, mr, lo, hi, id_set;
    char run_id[128];
    char host[64];
} erec;

static int parse_erec(const char *v, erec *r)
{
    return sscanf(v, "%d %d %d %d %d %d %127s %63s", &r->id, &r->nproc, &r->mr, &r->lo, &r->hi,
                  &r->id_set, r->run_id, r->host) == 8 &&
                   r->nproc >= 1
               ? 0
               : -1;
}

/* Another node's record against this node's flags: 0, or *msg says which flag differs. */
static int check_erec(const agent *a, const char *v, erec *r, char *msg, size_t cap)
{
    const ddprun_opts *o = a->o;
    if (parse_erec(v, r) != 0) {
        snprintf(msg, cap,
                 "a node sent a malformed rendezvous record; run the same ddprun on "
                 "every node");
        return -1;
    }
    if (r->nproc > DDPRUN_MAX_NPROC) {
        snprintf(msg, cap,
                 "node %d ('%s') asks for %d workers, more than ddprun's %d per node; run the "
                 "same ddprun on every node",
                 r->id, r->host, r->nproc, DDPRUN_MAX_NPROC);
        return -1;
    }
    if (r->mr != o->max_restarts || r->lo != o->min_nodes || r->hi != o->nnodes) {
        snprintf(msg, cap,
                 "node %d ('%s') runs with --max_restarts %d --nnodes %d:%d but node %d with %d "
                 "and %d:%d; give every node the same flags",
                 r->id, r->host, r->mr, r->lo, r->hi, o->node_rank, o->max_restarts, o->min_nodes,
                 o->nnodes);
        return -1;
    }
    if (strcmp(r->run_id, o->run_id) != 0) {
        snprintf(msg, cap,
                 "node %d ('%s') runs with run id '%s' but node %d with '%s'; give every node "
                 "the same --run_id (--rdzv_id), or leave it out on every node but node 0",
                 r->id, r->host, r->run_id, o->node_rank, o->run_id);
        return -1;
    }
    return 0;
}

/* Bytes of a members line: "ok R N" and up to MAX slot numbers. */
static size_t members_cap(const ddprun_opts *o)
{
    return 64 + 24 * (size_t)o->nnodes;
}

/* Node 0 ends round k's rendezvous with line (said here, and by every node that reads it). */
static void fail_round(agent *a, const char *line)
{
    char k[128], v[800];
    ddprun_say("%s", line);
    key(k, sizeof k, a, "members");
    snprintf(v, sizeof v, "fail %s", line);
    ddp_store_set_timeout(a->store, 2000);
    (void)ddp_store_set(a->store, k, v, strlen(v));
    nap_ms(1000); /* keep the store up while the other nodes read it */
}

/* Elastic, node 0: the wait_hb entry of slot j of the current round, or NULL (out of memory). */
static int64_t *wait_hb_slot(agent *a, int64_t j)
{
    if (a->wait_hb_round != a->wd.attempt) {
        for (int64_t i = 0; i < a->wait_hb_cap; i++)
            a->wait_hb[i] = INT64_MIN;
        a->wait_hb_round = a->wd.attempt;
    }
    if (j >= a->wait_hb_cap) {
        int64_t ncap = j + 16;
        int64_t *n = realloc(a->wait_hb, sizeof *n * (size_t)ncap);
        if (!n)
            return NULL;
        for (int64_t i = a->wait_hb_cap; i < ncap; i++)
            n[i] = INT64_MIN;
        a->wait_hb = n;
        a->wait_hb_cap = ncap;
    }
    return &a->wait_hb[j];
}

/* Elastic, a node waiting in the rendezvous (for the close, or for a place): its heartbeat
 * every 100 ms, by which node 0 tells a waiting node from one that died or was stopped (torch's
 * keep-alive). A failed call shows in the caller's next store call. */
static void beat(agent *a, int64_t *last)
{
    int64_t now = now_ms();
    if (now - *last < 100)
        return;
    *last = now;
    char k[64];
    snprintf(k, sizeof k, "ddprun/hb/%d", a->o->node_rank);
    (void)ddp_store_add(a->store, k, 1, NULL);
}

/* Node 0: gathers round k's nodes and closes it (see above). own: node 0's slot. 0, or -1
 * said (and told to the others). */
static int close_round(agent *a, int64_t own)
{
    ddprun_opts *o = a->o;
    ddp_store *s = a->store;
    char k[128], v[800], msg[1024];
    int64_t start = now_ms(), give_up = start + (int64_t)(o->rdzv_timeout * 1000);
    int64_t last_call = (int64_t)(o->last_call_timeout * 1000), last_arrival = start;
    int cap = 0, n_ok = 0, rc = -1;
    erec *recs = NULL;
    /* per slot: 0 not read yet, 1 a member-to-be, -1 refused, -2 left out: its heartbeat
     * stopped for --agent_timeout (stopped, its machine gone), or its presence connection closed
     * and it has not beaten since (killed: agent_presence_lost, as while the workers run), as
     * torch's keep-alive drops a silent participant; it is back in if the heartbeat moves before
     * the close; -3 left: its ddprun, new to the job, received a signal (under left/<slot>) */
    signed char *have = NULL;
    int64_t *hb_val = NULL, *hb_at = NULL, last_scan = 0;
    presence_watch *gone = NULL; /* per slot: its presence mark (gone/<id>) */
    /* The last round's members (node 0 aside) still beating but not back yet (stopping slow
     * workers): a full round waits for them, and they come before newcomers, as torch reopens a
     * round only once its every participant has left it; before 2026-11-25 two newcomers could
     * fill a 2:3 job's re-formed round while a running node stopped its workers, leaving it out.
     * One silent for --agent_timeout no longer counts. */
    int pending = 0;
    for (int i = 1; i < a->wd.nnodes; i++)
        a->hb_changed_ms[i] = start;
    for (;;) {
        int64_t count = 0;
        key(k, sizeof k, a, "count");
        if (ddp_store_add(s, k, 0, &count) != DDP_OK)
            goto out_store;
        if (count > cap) {
            int ncap = (int)count + 16;
            erec *nr = realloc(recs, sizeof *nr * (size_t)ncap);
            if (nr)
                recs = nr;
            signed char *nh = realloc(have, sizeof *nh * (size_t)ncap);
            if (nh)
                have = nh;
            int64_t *nv = realloc(hb_val, sizeof *nv * (size_t)ncap);
            if (nv)
                hb_val = nv;
            int64_t *nt = realloc(hb_at, sizeof *nt * (size_t)ncap);
            if (nt)
                hb_at = nt;
            presence_watch *ng = realloc(gone, sizeof *ng * (size_t)ncap);
            if (ng)
                gone = ng;
            if (!nr || !nh || !nv || !nt || !ng) {
                ddprun_say("out of memory in the rendezvous");
                goto out;
            }
            memset(have + cap, 0, sizeof *have * (size_t)(ncap - cap));
            memset(gone + cap, 0, sizeof *gone * (size_t)(ncap - cap));
            cap = ncap;
        }
        for (int64_t j = 0; j < count; j++) {
            if (have[j])
                continue;
            snprintf(k, sizeof k, "ddprun/a%d/slot/%lld", a->wd.attempt, (long long)j);
            int st = agent_peek_str(s, k, v, sizeof v);
            if (st < 0)
                goto out_store;
            if (st > 0)
                continue; /* counted, not written yet */
            if (check_erec(a, v, &recs[j], msg, sizeof msg) != 0) {
                /* That node alone is turned away (told under refused/<slot>): a node started
                 * with other flags must not end a job that runs without it. */
                ddprun_say("refused a node: %s", msg);
                snprintf(k, sizeof k, "ddprun/a%d/refused/%lld", a->wd.attempt, (long long)j);
                if (ddp_store_set(s, k, msg, strlen(msg)) != DDP_OK)
                    goto out_store;
                have[j] = -1;
                continue;
            }
            have[j] = 1;
            n_ok++;
            last_arrival = hb_at[j] = now_ms();
            hb_val[j] = INT64_MIN;
        }
        /* The gathering nodes' heartbeats, and whether they left (a signal), every 200 ms. */
        for (int64_t j = 0; j < count && now_ms() - last_scan >= 200; j++) {
            if ((have[j] != 1 && have[j] != -2) || j == own)
                continue;
            snprintf(k, sizeof k, "ddprun/a%d/left/%lld", a->wd.attempt, (long long)j);
            int lst = agent_peek_str(s, k, v, sizeof v);
            if (lst < 0)
                goto out_store;
            if (lst == 0) {
                ddprun_say("node %d ('%s') left the rendezvous: %.400s; the round goes on "
                           "without it",
                           recs[j].id, recs[j].host, v);
                n_ok -= have[j] == 1;
                have[j] = -3;
                continue;
            }
            int64_t hb = 0, t = now_ms();
            snprintf(k, sizeof k, "ddprun/hb/%d", recs[j].id);
            if (ddp_store_add(s, k, 0, &hb) != DDP_OK)
                goto out_store;
            bool expired = false;
            if (hb != hb_val[j]) {
                if (have[j] == -2) {
                    ddprun_say("node %d ('%s') is back in the rendezvous", recs[j].id,
                               recs[j].host);
                    have[j] = 1;
                    n_ok++;
                }
                hb_val[j] = hb;
                hb_at[j] = t;
            } else {
                expired = t - hb_at[j] > (int64_t)(o->agent_timeout * 1000);
            }
            if (have[j] != 1)
                continue;
            /* Killed while it waits: its presence mark says so within a second or so, not after
             * --agent_timeout (before 2026-11-25 only the heartbeat did, and a round that closed
             * meanwhile had a dead node in it). A mark left by an earlier life of that node goes
             * quietly once the node beats. */
            char host[65];
            int gst = agent_presence_lost(a, recs[j].id, hb, expired, t, &gone[j], false, host,
                                          sizeof host);
            if (gst < 0)
                goto out_store;
            if (gst > 0 || expired) {
                int64_t *w = wait_hb_slot(a, j);
                if (w)
                    *w = hb; /* a re-form for it once it beats again */
                if (gst > 0)
                    ddprun_say("node %d ('%s') left the rendezvous: its ddprun's connection to the "
                               "store closed and it has not beaten since (killed, or its machine "
                               "went down); the round goes on without it",
                               recs[j].id, recs[j].host);
                else
                    ddprun_say("node %d ('%s') left the rendezvous: no heartbeat for %g s "
                               "(--agent_timeout); the round goes on without it",
                               recs[j].id, recs[j].host, o->agent_timeout);
                have[j] = -2;
                n_ok--;
            }
        }
        for (int i = 1, scan = now_ms() - last_scan >= 200; scan && i < a->wd.nnodes; i++) {
            if (i == 1)
                pending = 0;
            bool back = false;
            for (int64_t j = 0; j < count && !back; j++)
                back = have[j] == 1 && recs[j].id == a->member_id[i];
            if (back || a->node_dead[i])
                continue;
            int64_t hb = 0, t = now_ms();
            snprintf(k, sizeof k, "ddprun/hb/%d", a->member_id[i]);
            if (ddp_store_add(s, k, 0, &hb) != DDP_OK)
                goto out_store;
            if (hb != a->hb_value[i]) {
                a->hb_value[i] = hb;
                a->hb_changed_ms[i] = t;
            } else if (t - a->hb_changed_ms[i] > (int64_t)(o->agent_timeout * 1000)) {
                a->node_dead[i] = true;
                continue;
            }
            pending++;
        }
        if (now_ms() - last_scan >= 200)
            last_scan = now_ms();
        /* A node of the round that received a signal while it waited for the close (its ddprun
         * gone): the job stops, as for a signal while the workers run. */
        key(k, sizeof k, a, "failed");
        int fst = agent_peek_str(s, k, v, sizeof v);
        if (fst < 0)
            goto out_store;
        if (fst == 0 && strncmp(v, STOP_MARK, strlen(STOP_MARK)) == 0) {
            snprintf(msg, sizeof msg, "%.400s: the job stops", v + strlen(STOP_MARK));
            fail_round(a, msg);
            goto out;
        }
        int64_t now = now_ms();
        /* Full, it waits for the last round's nodes still beating (which would otherwise be left
         * out); below MAX they would come in after the close as newcomers, so the last call does
         * not wait for them (nor for a dead one's silence: a node that died, its survivors'
         * workers failing first, is not yet known dead). */
        if (n_ok >= o->nnodes ? !pending : n_ok >= o->min_nodes && now - last_arrival >= last_call)
            break;
        if (n_ok >= o->min_nodes && now >= give_up) {
            /* MIN came but the last call (or a last-round node) outlasts --rdzv_timeout: the
             * round closes with them (before 2026-11-25 it timed out, '1 node joined …, at least
             * 1 needed') */
            if (pending && n_ok >= o->nnodes)
                ddprun_say("closing the round at --rdzv_timeout %g s with %d node%s (--nnodes "
                           "%d:%d): %d node%s of the last round, still running, did not come "
                           "back; raise --rdzv_timeout above --grace_period",
                           o->rdzv_timeout, n_ok, n_ok == 1 ? "" : "s", o->min_nodes, o->nnodes,
                           pending, pending == 1 ? "" : "s");
            else
                ddprun_say("closing the round at --rdzv_timeout %g s with %d node%s (--nnodes "
                           "%d:%d): last_call_timeout %g s is longer; lower it, or raise "
                           "--rdzv_timeout",
                           o->rdzv_timeout, n_ok, n_ok == 1 ? "" : "s", o->min_nodes, o->nnodes,
                           o->last_call_timeout);
            break;
        }
        if (agent_interrupted(a)) {
            snprintf(msg, sizeof msg,
                     "ddprun on node 0 ('%s') received SIG%s while the nodes "
                     "gathered: the job stops",
                     a->host, sigabbrev_np(a->stop_signal));
            key(k, sizeof k, a, "members");
            snprintf(v, sizeof v, "fail %.790s", msg);
            (void)ddp_store_set(s, k, v, strlen(v));
            goto out;
        }
        if (now >= give_up) {
            char joined[300] = "", missing[300] = "";
            for (int64_t j = 0; j < count; j++) {
                size_t l = strlen(joined);
                if (have[j] == 1 && l < sizeof joined - 80)
                    snprintf(joined + l, sizeof joined - l, "%snode %d ('%s')", l ? ", " : "",
                             recs[j].id, recs[j].host);
            }
            for (int i = 0; i < a->wd.nnodes; i++) { /* the last round's nodes not back */
                bool back = false;
                for (int64_t j = 0; j < count && !back; j++)
                    back = have[j] == 1 && recs[j].id == a->member_id[i];
                size_t l = strlen(missing);
                if (!back && l < sizeof missing - 80)
                    snprintf(missing + l, sizeof missing - l, "%snode %d ('%s')", l ? ", " : "",
                             a->member_id[i], a->member_host[i]);
            }
            snprintf(
                msg, sizeof msg,
                "elastic rendezvous at '" HOSTF "' timed out after %g s: %d node%s joined "
                "(%.150s), at least %d needed (--nnodes %d:%d)%s%.150s%s; start ddprun on more "
                "nodes with the same --nnodes and --rdzv_endpoint, or raise --rdzv_timeout "
                "(join_timeout)",
                HOSTA(o->master_addr, a->wd.master_port), o->rdzv_timeout, n_ok,
                n_ok == 1 ? "" : "s", joined, o->min_nodes, o->min_nodes, o->nnodes,
                missing[0] ? "; missing from the last round: " : "", missing, missing[0] ? "" : "");
            fail_round(a, msg);
            goto out;
        }
        nap_ms(20);
    }
    /* Node 0 first, then the others in the order they came, MAX in all; group ranks by id. */
    size_t mcap = members_cap(o);
    int64_t *pick = malloc(sizeof *pick * (size_t)o->nnodes);
    char *mv = malloc(mcap);
    if (!pick || !mv) {
        free(pick);
        free(mv);
        ddprun_say("out of memory in the rendezvous");
        goto out;
    }
    int n = 0;
    pick[n++] = own;
    for (int pass = 0; pass < 2; pass++) /* the last round's members first, then newcomers */
        for (int64_t j = 0; j < cap && n < o->nnodes; j++) {
            if (have[j] != 1 || j == own)
                continue;
            bool was = false;
            for (int i = 1; i < a->wd.nnodes && !was; i++)
                was = recs[j].id == a->member_id[i];
            if (was == (pass == 0))
                pick[n++] = j;
        }
    for (int i = 1; i < n; i++) /* insertion sort by id; node 0 stays first (id 0) */
        for (int j = i; j > 1 && recs[pick[j]].id < recs[pick[j - 1]].id; j--) {
            int64_t t = pick[j];
            pick[j] = pick[j - 1];
            pick[j - 1] = t;
        }
    size_t l = (size_t)snprintf(mv, mcap, "ok %d %d", a->wd.restarts, n);
    for (int i = 0; i < n && l < mcap - 24; i++)
        l += (size_t)snprintf(mv + l, mcap - l, " %lld", (long long)pick[i]);
    key(k, sizeof k, a, "members");
    rc = ddp_store_set(s, k, mv, strlen(mv)) == DDP_OK ? 0 : -1;
    free(pick);
    free(mv);
    if (rc == 0)
        goto out;
out_store:
    ddprun_say("%s", ddp_store_last_error(s));
out:
    free(recs);
    free(have);
    free(hb_val);
    free(hb_at);
    free(gone);
    return rc;
}

/* Node 0: the workers' store of this round, on the store's host (else every interface, as
 * start_server), on a free port; the last round's goes (its workers are gone). 0, or -1 said. */
static int start_round_store(agent *a)
{
    ddprun_opts *o = a->o;
    ddp_error err = {0};
    char first[NI_MAXHOST];
    ddp_store_server_stop(a->round_server);
    a->round_server = NULL;
    ddp_store_server_opts so = DDP_STORE_SERVER_OPTS_INIT;
    so.host = agent_first_address(o->master_addr, first, sizeof first) ? first : o->master_addr;
    so.port = 0;
    so.token = a->wd.token;
    ddp_status st = ddp_store_server_start(&so, &a->round_server, &err);
    if (st == DDP_ERR_SYSTEM) {
        so.host = NULL;
        st = ddp_store_server_start(&so, &a->round_server, &err);
    }
    if (st != DDP_OK) {
        ddprun_say("%s", err.msg);
        return -1;
    }
    a->wd.store_port = ddp_store_server_port(a->round_server);
    return 0;
}

/* One node's side of an elastic round: join, wait for node 0's close, take the place it gives
 * (or wait for the next round). Sets the world; 0, or -1 said. */
int agent_rendezvous_elastic(agent *a)
{
    ddprun_opts *o = a->o;
    ddp_store *s = a->store;
    char k[128], v[800];
    size_t mcap = members_cap(o);
    char *mv = malloc(mcap);
    int64_t *slots = malloc(sizeof *slots * (size_t)o->nnodes);
    int rc = -1;
    if (!mv || !slots) {
        ddprun_say("out of memory in the rendezvous");
        goto out;
    }
    ddp_store_set_timeout(s, 2000);
    if (o->node_rank == 0) {
        snprintf(v, sizeof v, "%d", a->wd.attempt);
        if (ddp_store_set(s, "ddprun/attempt", v, strlen(v)) != DDP_OK)
            goto out_store;
    } else if (agent_follow_attempt(a, INT_MAX) < 0) {
        goto out_store;
    }
    /* A node waits for node 0's close as long as node 0 may gather (it may start its round a
     * --grace_period later, stopping its workers), plus a margin. */
    int64_t wait_ms = (int64_t)((o->rdzv_timeout + o->grace_period) * 1000) + 5000;
    bool said = false;
    for (;;) {
        int64_t slot = 0;
        key(k, sizeof k, a, "count");
        if (ddp_store_add(s, k, 1, &slot) != DDP_OK)
            goto out_store;
        slot--;
        snprintf(k, sizeof k, "ddprun/a%d/slot/%lld", a->wd.attempt, (long long)slot);
        snprintf(v, sizeof v, "%d %d %d %d %d %d %s %s", o->node_rank, o->nproc, o->max_restarts,
                 o->min_nodes, o->nnodes, o->run_id_set ? 1 : 0, o->run_id, a->host);
        if (ddp_store_set(s, k, v, strlen(v)) != DDP_OK)
            goto out_store;
        if (o->node_rank == 0 && close_round(a, slot) != 0)
            goto out;
        int64_t give_up = now_ms() + wait_ms, beat_at = 0;
        key(k, sizeof k, a, "members");
        int st;
        char rk[128];
        snprintf(rk, sizeof rk, "ddprun/a%d/refused/%lld", a->wd.attempt, (long long)slot);
        while ((st = agent_peek_str(s, k, mv, mcap)) == 1) {
            beat(a, &beat_at);
            if (agent_peek_str(s, rk, v, sizeof v) == 0) {
                ddprun_say("node 0 refused this node: %s", v);
                goto out;
            }
            if (agent_interrupted(a)) {
                /* Tell node 0, which would otherwise close the round with this node in it and
                 * later take it for dead (a restart counted, the wrong cause named). A node of
                 * the job (it ran in an earlier round) stops the job, as a signal while the
                 * workers run does; one that never ran in it leaves the round alone (torch's
                 * agent stopped by a signal leaves the rendezvous open). */
                char line[400];
                snprintf(line, sizeof line,
                         "%sddprun on node %d ('%s') received SIG%s while the nodes gathered",
                         a->joined ? STOP_MARK : "", o->node_rank, a->host,
                         sigabbrev_np(a->stop_signal));
                if (a->joined) {
                    key(k, sizeof k, a, "failed");
                    (void)ddp_store_compare_set(s, k, "", 0, line, strlen(line), NULL, NULL);
                    (void)ddp_store_add(s, "ddprun/final_acks", 1, NULL); /* no wait for it */
                } else {
                    snprintf(k, sizeof k, "ddprun/a%d/left/%lld", a->wd.attempt, (long long)slot);
                    (void)ddp_store_set(s, k, line, strlen(line));
                }
                goto out;
            }
            if (now_ms() >= give_up) {
                ddprun_say("node 0 did not close round %d of the elastic rendezvous at '" HOSTF
                           "' within %.0f s; look at node 0's ddprun",
                           a->wd.attempt, HOSTA(o->master_addr, a->wd.master_port),
                           (double)wait_ms / 1000);
                goto out;
            }
            nap_ms(20);
        }
        if (st < 0)
            goto out_store;
        if (strncmp(mv, "fail ", 5) == 0) {
            if (o->node_rank != 0)
                ddprun_say("%s", mv + 5);
            goto out;
        }
        int restarts = 0, n = 0, used = 0, mine = -1;
        const char *p = mv;
        bool bad = sscanf(p, "ok %d %d%n", &restarts, &n, &used) != 2 || n < 1 || n > o->nnodes;
        p += bad ? 0 : used;
        for (int i = 0; !bad && i < n; i++) {
            long long j = 0;
            bad = sscanf(p, " %lld%n", &j, &used) != 1;
            p += bad ? 0 : used;
            slots[i] = j;
            if (j == slot)
                mine = i;
        }
        if (bad) {
            ddprun_say("node 0 sent a malformed rendezvous close; run the same ddprun on every "
                       "node");
            goto out;
        }
        if (mine >= 0) { /* a member: the world from the members' records */
            a->wd.world_size = 0;
            for (int i = 0; i < n; i++) {
                erec r;
                char msg[700];
                snprintf(k, sizeof k, "ddprun/a%d/slot/%lld", a->wd.attempt, (long long)slots[i]);
                if (agent_peek_str(s, k, v, sizeof v) != 0)
                    goto out_store;
                if (check_erec(a, v, &r, msg, sizeof msg) != 0) {
                    ddprun_say("%s", msg);
                    goto out;
                }
                if (i == mine)
                    a->wd.rank_offset = a->wd.world_size;
                a->wd.world_size += r.nproc;
                a->member_id[i] = r.id;
                a->member_slot[i] = (int)slots[i];
                snprintf(a->member_host[i], sizeof a->member_host[i], "%s", r.host);
            }
            a->wd.nnodes = n;
            a->wd.group_rank = mine;
            a->wd.restarts = restarts;
            break;
        }
        /* Came after the close, or beyond MAX: node 0 sees this slot and re-forms the group
         * while it runs below MAX; at MAX this node waits for a place (a failure's restart). */
        if (!said)
            ddprun_say("node %d waits for the next round: the job runs with %d of at most %d "
                       "nodes (round %d closed before this node came, or it is full)",
                       o->node_rank, n, o->nnodes, a->wd.attempt);
        said = true;
        int64_t until = now_ms() + (int64_t)(o->rdzv_timeout * 1000);
        for (;;) {
            beat(a, &beat_at);
            int pst = agent_follow_attempt(a, INT_MAX);
            if (pst < 0)
                goto out_store;
            if (pst > 0)
                break;
            if (agent_peek_str(s, rk, v, sizeof v) == 0) {
                ddprun_say("node 0 refused this node: %s", v);
                goto out;
            }
            if (agent_peek_str(s, "ddprun/ended", v, sizeof v) == 0) {
                ddprun_say("the job ended (node 0's ddprun exits with status %s) before a place "
                           "opened for node %d; nothing ran on this node",
                           v, o->node_rank);
                goto out;
            }
            if (agent_interrupted(a))
                goto out;
            if (now_ms() >= until) {
                ddprun_say("no place opened for node %d within --rdzv_timeout %g s: the job runs "
                           "with its %d node%s (--nnodes %d:%d); raise --rdzv_timeout "
                           "(join_timeout) to wait longer",
                           o->node_rank, o->rdzv_timeout, n, n == 1 ? "" : "s", o->min_nodes,
                           o->nnodes);
                goto out;
            }
            nap_ms(100);
        }
    }
    /* node 0 picks the workers' MASTER_PORT now and the others read it, as in a fixed job */
    snprintf(k, sizeof k, "ddprun/a%d/master_port", a->wd.attempt);
    ddp_store_set_timeout(s, (int)(o->rdzv_timeout * 1000));
    if (o->node_rank == 0) {
        if ((a->wd.free_port = agent_pick_free_port(a, o->master_addr)) < 0 ||
            start_round_store(a) != 0)
            goto out;
        snprintf(v, sizeof v, "%d %d", a->wd.free_port, a->wd.store_port);
        if (ddp_store_set(s, k, v, strlen(v)) != DDP_OK)
            goto out_store;
    } else {
        void *p = NULL;
        size_t n = 0;
        if (ddp_store_get(s, k, &p, &n) != DDP_OK)
            goto out_store;
        snprintf(v, sizeof v, "%.*s", (int)(n < sizeof v ? n : sizeof v - 1), (char *)p);
        free(p);
        int fp = 0, sp = 0;
        if (sscanf(v, "%d %d", &fp, &sp) != 2 || fp < 1 || fp > 65535 || sp < 1 || sp > 65535) {
            ddprun_say("node 0 sent a malformed MASTER_PORT; run the same ddprun on every node");
            goto out;
        }
        a->wd.free_port = fp;
        a->wd.store_port = sp;
    }
    a->joined = true;
    for (int i = 0; i < a->wd.nnodes; i++)
        a->node_dead[i] = false, a->gone[i].seen_ms = 0;
    rc = 0;
    goto out;
out_store:
    ddprun_say("%s%s", ddp_store_last_error(s),
               o->node_rank ? " (the job may have ended: node 0's store is gone)" : "");
out:
    free(mv);
    free(slots);
    return rc;
}

/* Node 0 of an elastic job: whether a node has joined this round's rendezvous since it closed
 * (its slot is not among the members; torch's num_nodes_waiting). *found, and line says which.
 * false when the store failed. */
bool agent_waiting_nodes(agent *a, char *line, size_t cap, bool *found)
{
    ddp_store *s = a->store;
    char k[128];
    int64_t count = 0;
    *found = false;
    key(k, sizeof k, a, "count");
    if (ddp_store_add(s, k, 0, &count) != DDP_OK)
        return false;
    if (count <= a->wd.nnodes)
        return true; /* every slot a member's (the common case: nothing more to read) */
    /* A node whose workers all finished (done): the job is ending, and a re-form would run the
     * finished workers again (torch's agent leaves once its workers succeeded); the newcomer
     * waits, and leaves when the job ends. */
    for (int i = 1; i < a->wd.nnodes; i++) {
        bool done = false;
        snprintf(k, sizeof k, "ddprun/a%d/done/%d", a->wd.attempt, i);
        const char *keys[1] = {k};
        if (ddp_store_check(s, keys, 1, &done) != DDP_OK)
            return false;
        if (done)
            return true;
    }
    for (int64_t j = 0; j < count && !*found; j++) {
        bool member = false;
        for (int i = 0; i < a->wd.nnodes && !member; i++)
            member = a->member_slot[i] == j;
        if (member)
            continue;
        char v[700];
        snprintf(k, sizeof k, "ddprun/a%d/slot/%lld", a->wd.attempt, (long long)j);
        int st = agent_peek_str(s, k, v, sizeof v);
        if (st < 0)
            return false;
        erec r;
        char why[700];
        if (st > 0)
            continue; /* not written yet: next tick */
        if (check_erec(a, v, &r, why, sizeof why) != 0) {
            /* other flags: no reason to re-form; that node is told at once */
            snprintf(k, sizeof k, "ddprun/a%d/refused/%lld", a->wd.attempt, (long long)j);
            st = agent_peek_str(s, k, v, sizeof v);
            if (st < 0 || (st > 0 && ddp_store_set(s, k, why, strlen(why)) != DDP_OK))
                return false;
            if (st > 0)
                ddprun_say("refused a node: %s", why);
            continue;
        }
        /* Only for a node whose heartbeat moves: one that came and died (or was left out of the
         * round for its silence and is still gone) is no reason to restart the workers. */
        int64_t hb = 0, *seen = wait_hb_slot(a, j);
        snprintf(k, sizeof k, "ddprun/hb/%d", r.id);
        if (ddp_store_add(s, k, 0, &hb) != DDP_OK)
            return false;
        if (!seen || *seen == INT64_MIN || *seen == hb) {
            if (seen && *seen == INT64_MIN)
                *seen = hb;
            continue;
        }
        snprintf(line, cap,
                 RESHAPE_MARK "node %d ('%s') joined the running job (%d of at most %d nodes "
                              "running)",
                 r.id, r.host, a->wd.nnodes, a->o->nnodes);
        *found = true;
    }
    return true;
}

/* Elastic, node 0 at the end: nodes still waiting for a place (beyond MAX, or come as the job
 * ended) are told, rather than left to find the store gone (ddprun/ended: the exit status). */
void agent_tell_waiters(agent *a, int code)
{
    char k[128], v[16];
    int64_t count = 0;
    if (!a->o->elastic || a->o->node_rank != 0 || !a->store)
        return;
    ddp_store_set_timeout(a->store, 2000);
    key(k, sizeof k, a, "count");
    if (ddp_store_add(a->store, k, 0, &count) != DDP_OK || count <= a->wd.nnodes)
        return;
    snprintf(v, sizeof v, "%d", code);
    if (ddp_store_set(a->store, "ddprun/ended", v, strlen(v)) == DDP_OK)
        nap_ms(300); /* they look every 100 ms */
}
