/*
 * presence.c — whether the other nodes are still there, while the workers run: each node's
 * heartbeat (hb/<node>, every --monitor_interval), the presence connection of a node other than
 * 0 (its close makes the store set gone/<node> at once: that ddprun was killed or its machine went
 * down with the network up), node 0's decision that a node is lost (by that mark, else by the
 * heartbeat's silence for --agent_timeout), the failed key every node reads, and the final
 * handshake that keeps node 0's store up until the others are done with it. The elastic
 * rendezvous (elastic.c) takes the same decision for a node that dies while the nodes gather.
 * What a lost node means for the job (stop, restart, the summary) is agent.c's.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "agent_int.h"

#define GONE_CONFIRM_MS 1000 /* the shortest wait for a presence mark's node to beat again */

/* A node other than 0: a second connection to the store, idle, whose close makes the store set
 * ddprun/gone/<node> = host (ddp_store_on_close). A ddprun killed (-9, its machine rebooting
 * with the network up) closes it at once, so node 0 names the node lost within a second or so,
 * not after --agent_timeout. Without it the heartbeat path still finds the node. */
void agent_open_presence(agent *a)
{
    ddprun_opts *o = a->o;
    if (o->nnodes == 1 || o->node_rank <= 0)
        return;
    char k[128];
    snprintf(k, sizeof k, "ddprun/gone/%d", o->node_rank);
    ddp_store_set_timeout(a->store, 2000);
    ddp_store_opts co = DDP_STORE_OPTS_INIT;
    co.host = o->master_addr;
    co.port = a->wd.master_port;
    co.token = a->wd.token;
    /* Idle: its keepalive (a quarter of this, 4 to 60 s) must not end it before the heartbeat
     * would call a silent node dead; the store's own sets the mark only for a close the node
     * made (FIN, RST), never for a network that went quiet. */
    co.timeout_ms = o->agent_timeout < 900 ? (int)(o->agent_timeout * 4000) : 3600000;
    co.connect_timeout_ms = 2000;
    ddp_error err = {0};
    /* A mark left by this node's earlier life (a ddprun started anew) stays until node 0 has
     * seen it: node 0 clears the members' marks as each attempt starts. */
    if (ddp_store_connect(&co, &a->presence, &err) != DDP_OK ||
        ddp_store_on_close(a->presence, k, a->host, strlen(a->host)) != DDP_OK) {
        ddprun_say("note: no presence connection to the store (%s); should this ddprun die, "
                   "node 0 finds it only after --agent_timeout",
                   a->presence  ? ddp_store_last_error(a->presence)
                   : err.msg[0] ? err.msg
                                : ddp_store_last_error(a->store));
        ddp_store_close(a->presence);
        a->presence = NULL;
    }
}

void agent_close_presence(agent *a)
{
    if (a->presence) { /* an orderly end: this node is not lost */
        ddp_store_set_timeout(a->presence, 1000);
        (void)ddp_store_on_close(a->presence, "", NULL, 0);
    }
    ddp_store_close(a->presence);
    a->presence = NULL;
}

int agent_presence_lost(agent *a, int id, int64_t hb, bool expired, int64_t now, presence_watch *w,
                        bool say_alive, char *host, size_t cap)
{
    const ddprun_opts *o = a->o;
    char k[64];
    snprintf(k, sizeof k, "ddprun/gone/%d", id);
    int st = agent_peek_str(a->store, k, host, cap);
    if (st != 0)
        return st < 0 ? -1 : 0;
    if (!w->seen_ms) {
        w->seen_ms = now;
        w->hb = hb;
        return 0;
    }
    if (hb != w->hb) {
        /* It beats on: alive, its presence connection broke (the heartbeat path stays). */
        if (say_alive)
            ddprun_say("node %d's presence connection to the store closed, but its ddprun still "
                       "beats: taken for alive",
                       id);
        (void)ddp_store_delete(a->store, k, NULL);
        w->seen_ms = 0;
        return 0;
    }
    int64_t confirm = (int64_t)(o->monitor_interval * 5000);
    if (confirm < GONE_CONFIRM_MS)
        confirm = GONE_CONFIRM_MS;
    if (confirm > (int64_t)(o->agent_timeout * 1000))
        confirm = (int64_t)(o->agent_timeout * 1000);
    return now - w->seen_ms >= confirm || expired ? 1 : 0;
}

/* Node 0: the other members' heartbeats and presence. lost gets a line for a node found dead
 * (else ""): its presence connection closed and its heartbeat has not moved since
 * (agent_presence_lost); or no heartbeat for --agent_timeout (a machine that vanished, no FIN).
 * false when the store failed. */
static bool watch_members(agent *a, char *lost, size_t cap)
{
    ddprun_opts *o = a->o;
    ddp_store *s = a->store;
    char k[128];
    int64_t now = now_ms();
    lost[0] = '\0';
    for (int i = 1; i < a->wd.nnodes; i++) {
        int64_t v;
        snprintf(k, sizeof k, "ddprun/hb/%d", a->member_id[i]);
        if (ddp_store_add(s, k, 0, &v) != DDP_OK)
            return false;
        bool moved = v != a->hb_value[i];
        if (moved) {
            a->hb_value[i] = v;
            a->hb_changed_ms[i] = now;
        }
        bool expired = !moved && now - a->hb_changed_ms[i] > (int64_t)(o->agent_timeout * 1000);
        char host[65];
        int gst = agent_presence_lost(a, a->member_id[i], v, expired, now, &a->gone[i], true, host,
                                      sizeof host);
        if (gst < 0)
            return false;
        if (gst > 0) {
            char when[64];
            time_t at = time(NULL) - (time_t)((now - a->gone[i].seen_ms) / 1000);
            struct tm tm;
            localtime_r(&at, &tm);
            strftime(when, sizeof when, "%H:%M:%S", &tm);
            snprintf(lost, cap,
                     "node %d ('%s') " LINE_NODE_GONE " at %s and it has not beaten since (its "
                     "machine or ddprun died)",
                     a->member_id[i], host, when);
            a->node_dead[i] = true;
            return true;
        }
        if (expired) {
            snprintf(lost, cap,
                     "the ddprun of node %d " LINE_HEARTBEAT_LOST " (no heartbeat for %.0f s); its "
                     "machine or launcher died",
                     a->member_id[i], o->agent_timeout);
            a->node_dead[i] = true;
            return true;
        }
    }
    return true;
}

/* Writes a first-hand failure line to the failed key: it is the first, or replaces a secondary
 * one (as record_local_failure does). */
static void publish_first_hand(agent *a, const char *line)
{
    char k[128];
    key(k, sizeof k, a, "failed");
    void *cur = NULL;
    size_t cur_len = 0;
    if (ddp_store_compare_set(a->store, k, "", 0, line, strlen(line), &cur, &cur_len) == DDP_OK &&
        cur && strncmp(cur, SECONDARY_MARK, strlen(SECONDARY_MARK)) == 0)
        (void)ddp_store_compare_set(a->store, k, cur, cur_len, line, strlen(line), NULL, NULL);
    free(cur);
}

bool agent_check_nodes(agent *a, bool may_reshape, bool *remote_failed, char *line, size_t cap)
{
    ddprun_opts *o = a->o;
    ddp_store *s = a->store;
    char k[128];
    /* Short calls: while one blocks, output, exits and signals wait. The caller tolerates
     * failures for up to --agent_timeout before it calls the store lost. */
    ddp_store_set_timeout(s, 2000);
    /* The heartbeat first: a node still stopping its workers after a failure or a re-form beats
     * too, so that an elastic node 0 gathering the next round keeps its place (close_round). */
    snprintf(k, sizeof k, "ddprun/hb/%d", o->node_rank);
    if (ddp_store_add(s, k, 1, NULL) != DDP_OK)
        return false;
    key(k, sizeof k, a, "failed");
    int fst = agent_peek_str(s, k, line, cap);
    if (fst < 0)
        return false;
    bool failed = fst == 0;
    if (failed) {
        *remote_failed = true;
        /* Node 0 still watches the others after a secondary failure: a node that died is its
         * cause (its workers' peers stop first, then it is found gone). */
        if (o->node_rank != 0 || strncmp(line, SECONDARY_MARK, strlen(SECONDARY_MARK)) != 0)
            return true;
    }
    if (o->node_rank != 0)
        return true;
    char lost[700];
    if (!watch_members(a, lost, sizeof lost))
        return false;
    if (lost[0]) {
        publish_first_hand(a, lost);
        snprintf(line, cap, "%s", lost);
        *remote_failed = true;
        return true;
    }
    if (failed)
        return true;
    /* Elastic, below MAX, every worker of this node still running: a node that has come since
     * the round closed re-forms the group (torch's agent: num_nodes_waiting > 0 → restart). */
    bool found = false;
    if (o->elastic && may_reshape && a->wd.nnodes < o->nnodes) {
        if (!agent_waiting_nodes(a, line, cap, &found))
            return false;
        key(k, sizeof k, a, "failed");
        if (found && ddp_store_compare_set(s, k, "", 0, line, strlen(line), NULL, NULL) == DDP_OK)
            *remote_failed = true; /* the line read back next tick if another node's came first */
    }
    return true;
}

bool agent_all_done(agent *a, bool *ok)
{
    char k[128];
    *ok = true;
    for (int i = 0; i < a->wd.nnodes; i++) {
        snprintf(k, sizeof k, "ddprun/a%d/done/%d", a->wd.attempt, i);
        int st = agent_peek_str(a->store, k, NULL, 0);
        if (st != 0) {
            *ok = st > 0;
            return false;
        }
    }
    return true;
}

void agent_final_handshake(agent *a)
{
    ddprun_opts *o = a->o;
    if (o->nnodes == 1)
        return;
    ddp_store_set_timeout(a->store, 2000);
    if (o->node_rank != 0) {
        (void)ddp_store_add(a->store, "ddprun/final_acks", 1, NULL);
        return;
    }
    /* A node declared dead will never ack: waiting for it only delays the exit by the whole
     * bound below. */
    int64_t expected = a->wd.nnodes - 1;
    for (int i = 1; i < a->wd.nnodes; i++)
        if (a->node_dead[i])
            expected--;
    int64_t deadline = now_ms() + (int64_t)(o->grace_period * 1000) + 5000;
    while (now_ms() < deadline) {
        int64_t acks = 0;
        if (ddp_store_add(a->store, "ddprun/final_acks", 0, &acks) != DDP_OK || acks >= expected)
            return;
        nap_ms(20);
    }
}
