/*
 * rendezvous.c — how one node's ddprun meets the others: node 0 hosts the store (or, under c10d
 * numbering, whichever node can listen on the endpoint), every node connects and learns the job's
 * run id; then each attempt's rendezvous: a fixed job's claims and records, checked against this
 * node's flags, and the workers' MASTER_PORT that node 0 picks. An elastic job's rounds are in
 * elastic.c; what happens once the nodes have met is agent.c's and presence.c's.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "agent_int.h"

/* ---- store set-up ------------------------------------------------------------------------- */

/* Starts node 0's store on --master_addr:--master_port; on several nodes a master_addr this host
 * cannot listen on (a name other nodes resolve differently: NAT, /etc/hosts) falls back to every
 * interface when any_fallback. */
static ddp_status start_server(agent *a, const char *host, bool any_fallback, ddp_error *err)
{
    ddprun_opts *o = a->o;
    ddp_store_server_opts so = DDP_STORE_SERVER_OPTS_INIT;
    so.host = host;
    so.port = o->master_port;
    so.token = a->wd.token;
    ddp_status st = ddp_store_server_start(&so, &a->server, err);
    if (st == DDP_ERR_SYSTEM && any_fallback) {
        so.host = NULL;
        st = ddp_store_server_start(&so, &a->server, err);
    }
    if (st == DDP_OK)
        a->wd.master_port = ddp_store_server_port(a->server);
    return st;
}

/* The first address host resolves to, as a number. Under c10d numbering the hosting node listens
 * on that one only, so that a second ddprun on the same machine finds it taken: 'localhost' is
 * often ::1 and 127.0.0.1, and binding whichever is still free would make two node 0s. Clients
 * try the addresses in the same order and so reach it. */
bool agent_first_address(const char *host, char *buf, size_t cap)
{
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(host, NULL, &hints, &res) != 0 || !res)
        return false;
    bool ok = getnameinfo(res->ai_addr, res->ai_addrlen, buf, (socklen_t)cap, NULL, 0,
                          NI_NUMERICHOST) == 0;
    freeaddrinfo(res);
    return ok;
}

/* The cause inside the store client's "cannot reach the store at 'H:P' after T (CAUSE); check
 * that its host …" (the connection's own error), into buf; msg whole when it is not of that
 * form. ddprun's message names the store and says what to do in ddprun's flags: with the
 * client's message inside it, the line said where and what to do twice. */
static const char *store_cause(const char *msg, char *buf, size_t cap)
{
    static const char head[] = "cannot reach the store at '", tail[] = "); check that its host";
    const char *open = strncmp(msg, head, sizeof head - 1) ? NULL : strstr(msg, "' after ");
    open = open ? strchr(open, '(') : NULL;
    const char *close = open ? strstr(open, tail) : NULL;
    if (!close)
        return msg;
    snprintf(buf, cap, "%.*s", (int)(close - open - 1), open + 1);
    return buf;
}

int agent_setup_store(agent *a)
{
    ddprun_opts *o = a->o;
    ddp_error err = {0};
    const char *env_token = getenv("DDP_STORE_TOKEN");
    if (env_token && *env_token) {
        if (strlen(env_token) >= sizeof a->wd.token) {
            ddprun_say("DDP_STORE_TOKEN is longer than %zu characters", sizeof a->wd.token - 1);
            return -1;
        }
        snprintf(a->wd.token, sizeof a->wd.token, "%s", env_token);
    } else if (o->nnodes == 1) {
        if (ddp_random_token(a->wd.token, 32, &err) != DDP_OK) {
            ddprun_say("%s", err.msg);
            return -1;
        }
    }

    a->wd.master_port = o->master_port;
    bool in_use = false; /* c10d numbering: this host found the endpoint's port taken */
    if (o->number_nodes) {
        /* torchrun's c10d rendezvous without --node_rank: the node that can listen on the
         * endpoint (the host it names) hosts the store and is node 0 (is_host=1 insists, with the
         * every-interface fall-back; is_host=0 never hosts); any other, or one that finds the
         * port taken by the host's store on the same machine, joins as a client and is numbered
         * once connected. */
        ddp_status st = DDP_ERR_SYSTEM;
        char first[NI_MAXHOST];
        if (o->is_host != 0)
            st = start_server(
                a,
                agent_first_address(o->master_addr, first, sizeof first) ? first : o->master_addr,
                o->is_host == 1, &err);
        if (st != DDP_OK &&
            (o->is_host == 1 || (st != DDP_ERR_SYSTEM && st != DDP_ERR_ADDR_IN_USE))) {
            ddprun_say("%s", err.msg);
            return -1;
        }
        o->node_rank = st == DDP_OK ? 0 : -1;
        in_use = st == DDP_ERR_ADDR_IN_USE;
    } else if (o->node_rank == 0) {
        if (start_server(a, o->master_addr, o->nnodes > 1, &err) != DDP_OK) {
            ddprun_say("%s", err.msg);
            return -1;
        }
    }
    if (o->nnodes > 1 && o->node_rank == 0 && !a->wd.token[0])
        ddprun_say("warning: DDP_STORE_TOKEN is not set, so the store on '" HOSTF "' accepts any "
                   "connection (as torchrun's does); export the same secret DDP_STORE_TOKEN on "
                   "every node to refuse strangers",
                   HOSTA(o->master_addr, o->master_port));
    ddp_store_opts co = DDP_STORE_OPTS_INIT;
    co.host = o->master_addr;
    co.port = a->wd.master_port;
    co.token = a->wd.token;
    co.timeout_ms = (int)(o->rdzv_timeout * 1000);
    /* Node 0 may not be up yet: retry in short steps, so that Ctrl-C is heard meanwhile. */
    co.connect_timeout_ms = 250;
    int64_t give_up = now_ms() + (int64_t)(o->rdzv_timeout * 1000);
    for (;;) {
        ddp_status st = ddp_store_connect(&co, &a->store, &err);
        if (st == DDP_OK)
            break;
        if (agent_interrupted(a))
            return -1;
        if (st != DDP_ERR_TIMEOUT || now_ms() >= give_up) {
            char cause[sizeof err.msg];
            if (st == DDP_ERR_TIMEOUT)
                ddprun_say("cannot reach the store of node 0 at '" HOSTF "' after %g s (last "
                           "error: %s); start ddprun on node 0, and check --master_addr and "
                           "--master_port (or raise --rdzv_timeout)%s%s",
                           HOSTA(o->master_addr, a->wd.master_port), o->rdzv_timeout,
                           store_cause(err.msg, cause, sizeof cause),
                           o->number_nodes ? "; under c10d numbering the node that can listen on "
                                             "the endpoint hosts it: if none can (a NAT'd name), "
                                             "give that node --rdzv_conf is_host=1"
                                           : "",
                           in_use ? "; this host could not listen there either (address already "
                                    "in use): a program other than ddprun holds that port, so "
                                    "stop it or give every node another --rdzv_endpoint port"
                                  : "");
            else
                ddprun_say("%s%s", err.msg,
                           st == DDP_ERR_AUTH
                               ? (a->wd.token[0] ? " (this node's DDP_STORE_TOKEN is not node 0's: "
                                                   "export the same secret on every node)"
                                                 : " (DDP_STORE_TOKEN is not set on this node: "
                                                   "export node 0's secret here too)")
                           : in_use ? " (this host could not listen on the endpoint: address "
                                      "already in use; if no ddprun of this job runs there, a "
                                      "program other than ddprun holds that port: stop it or give "
                                      "every node another --rdzv_endpoint port)"
                                    : "");
            return -1;
        }
    }
    if (o->node_rank < 0) { /* numbered by the rendezvous: 1, 2, … in the order of joining */
        int64_t n = 0;
        if (ddp_store_add(a->store, "ddprun/numbered", 1, &n) != DDP_OK) {
            ddprun_say("%s", ddp_store_last_error(a->store));
            return -1;
        }
        if (n >= o->nnodes && !o->elastic) { /* elastic: a node's place comes per round */
            ddprun_say("more nodes joined the rendezvous at '" HOSTF "' than --nnodes %d; start "
                       "ddprun on exactly that many nodes (or give each its --node_rank)",
                       HOSTA(o->master_addr, a->wd.master_port), o->nnodes);
            return -1;
        }
        o->node_rank = (int)n;
        if (o->elastic)
            ddprun_say("this is node %d (numbered by the c10d rendezvous at '" HOSTF "'; elastic "
                       "--nnodes %d:%d)",
                       o->node_rank, HOSTA(o->master_addr, a->wd.master_port), o->min_nodes,
                       o->nnodes);
        else
            ddprun_say("this is node %d of %d (numbered by the c10d rendezvous at '" HOSTF "')",
                       o->node_rank, o->nnodes, HOSTA(o->master_addr, a->wd.master_port));
    }
    if (o->nnodes == 1) {
        if (o->run_id_set)
            return 0;
        char id[13];
        if (ddp_random_token(id, 12, &err) != DDP_OK) {
            ddprun_say("%s", err.msg);
            return -1;
        }
        snprintf(o->run_id, sizeof o->run_id, "%s", id);
        return 0;
    }
    /* Several nodes: node 0's id (its --run_id, else one it makes up) is the job's, published
     * for the others; a node without --run_id takes it. One with its own keeps it until the
     * rendezvous, which refuses nodes whose ids differ (torchrun's nodes with different
     * --rdzv_id never meet; here they would run one job under two ids). */
    if (o->node_rank == 0) {
        if (!o->run_id_set) {
            char id[13];
            if (ddp_random_token(id, 12, &err) != DDP_OK) {
                ddprun_say("%s", err.msg);
                return -1;
            }
            snprintf(o->run_id, sizeof o->run_id, "%s", id);
        }
        if (ddp_store_set(a->store, "ddprun/run_id", o->run_id, strlen(o->run_id)) != DDP_OK) {
            ddprun_say("%s", ddp_store_last_error(a->store));
            return -1;
        }
        return 0;
    }
    if (o->run_id_set)
        return 0;
    void *v = NULL;
    size_t n = 0;
    if (ddp_store_get(a->store, "ddprun/run_id", &v, &n) != DDP_OK) {
        ddprun_say("%s", ddp_store_last_error(a->store));
        return -1;
    }
    snprintf(o->run_id, sizeof o->run_id, "%.*s", (int)n, (char *)v);
    free(v);
    return 0;
}

/* ---- node rendezvous ----------------------------------------------------------------------- */

/* A port on host (else on every interface, as the store's own fall-back) that nobody holds: the
 * workers get it as MASTER_PORT, which a program hosting its own store binds (PyTorch's rank 0
 * does, as under torchrun's c10d rendezvous); ddpc's ranks use DDP_STORE_PORT. The port stays
 * bound in a->port_hold for the whole attempt, with SO_REUSEADDR and never listening: a program
 * that binds it with SO_REUSEADDR too (torch's TCPStore, both its backends) can still bind and
 * listen, while any other bind and the kernel's choice of ports for outgoing connections and for
 * bind(port 0) keep off it, so nothing takes it between the pick and rank 0's bind (torchrun's own
 * pick lets it go at once). */
int agent_pick_free_port(agent *a, const char *host)
{
    int why = EADDRNOTAVAIL;
    for (int pass = 0; pass < 2; pass++) {
        struct addrinfo hints = {0}, *res = NULL;
        hints.ai_family = AF_UNSPEC;
        hints.ai_socktype = SOCK_STREAM;
        hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
        if (getaddrinfo(pass == 0 ? host : NULL, "0", &hints, &res) != 0)
            continue;
        int port = -1;
        for (struct addrinfo *ai = res; ai && port < 0; ai = ai->ai_next) {
            int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
            if (fd < 0) {
                why = errno;
                continue;
            }
            int one = 1;
            struct sockaddr_storage ss;
            socklen_t len = sizeof ss;
            if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) == 0 &&
                bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 &&
                getsockname(fd, (struct sockaddr *)&ss, &len) == 0) {
                port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                                      : ((struct sockaddr_in *)&ss)->sin_port);
                a->port_hold = fd;
            } else {
                why = errno;
                close(fd);
            }
        }
        freeaddrinfo(res);
        if (port > 0)
            return port;
    }
    ddprun_say("cannot find a free port on '%s' for the workers' MASTER_PORT: %s", host,
               strerror(why));
    return -1;
}

void agent_release_port(agent *a)
{
    if (a->port_hold >= 0)
        close(a->port_hold);
    a->port_hold = -1;
}

/* Node i's rendezvous record (v: "nproc max_restarts nnodes run_id_set run_id") against this
 * node's flags: 0 and *nproc when they agree, else -1 after saying which flag differs. */
static int check_node_record(agent *a, int i, const char *v, int *nproc)
{
    ddprun_opts *o = a->o;
    int np = 0, mr = 0, nn = 0, id_set = 0;
    char id[sizeof o->run_id];
    if (sscanf(v, "%d %d %d %d %127s", &np, &mr, &nn, &id_set, id) != 5 || np < 1) {
        ddprun_say("node %d sent a malformed rendezvous record; run the same ddprun on every node",
                   i);
        return -1;
    }
    /* Each node's ddprun caps its own --nproc_per_node; a record from something else (a peer
     * that holds the token but is not ddprun) must not make the world size overflow. */
    if (np > DDPRUN_MAX_NPROC) {
        ddprun_say("node %d asks for %d workers, more than ddprun's %d per node; run the same "
                   "ddprun on every node",
                   i, np, DDPRUN_MAX_NPROC);
        return -1;
    }
    if (mr != o->max_restarts || nn != o->nnodes) {
        ddprun_say("node %d runs with --max_restarts %d --nnodes %d but this node with %d "
                   "and %d; give every node the same flags",
                   i, mr, nn, o->max_restarts, o->nnodes);
        return -1;
    }
    if (strcmp(id, o->run_id) != 0) {
        ddprun_say("node %d runs with run id '%s'%s but this node with '%s'%s; give every "
                   "node the same --run_id (--rdzv_id), or leave it out on every node but "
                   "node 0",
                   i, id, id_set ? "" : " (made up: no --run_id)", o->run_id,
                   o->run_id_set       ? ""
                   : o->node_rank == 0 ? " (made up: no --run_id)"
                                       : " (no --run_id: node 0's)");
        return -1;
    }
    *nproc = np;
    return 0;
}

/* While nodes gather: the records that have arrived are checked at once, not only when all
 * --nnodes have joined, because a node started with another --nnodes waits for nodes that never
 * come (or is not waited for): before 2026-11-24 node 0 with --nnodes 3 beside a node with 2
 * waited out --rdzv_timeout and blamed a missing node_rank 2, and a node with --nnodes 3 beside a
 * node 0 with 2 lost the store without a reason. Node 0 checks every node's record; the others
 * check node 0's (one key, not every node's from every node). *checked marks the records done.
 * 0: none disagrees so far; -1: one does, said. */
static int check_arrived_records(agent *a, char **keys, bool *checked)
{
    ddprun_opts *o = a->o;
    int n = o->node_rank == 0 ? o->nnodes : 1;
    for (int i = 0; i < n; i++) {
        bool have = false;
        if (checked[i] || i == o->node_rank || !keys[i])
            continue;
        if (ddp_store_check(a->store, (const char *const *)&keys[i], 1, &have) != DDP_OK || !have)
            continue; /* a lost store is reported by the caller's next check */
        void *v = NULL;
        size_t len = 0;
        if (ddp_store_get(a->store, keys[i], &v, &len) != DDP_OK)
            continue;
        int np = 0, rc = check_node_record(a, i, v, &np);
        free(v);
        if (rc) {
            if (o->node_rank == 0)
                /* Keep the store up a moment, so that the other node reads this node's record
                 * and says the same on its side rather than that the store went away. */
                nap_ms(1000);
            return -1;
        }
        checked[i] = true;
    }
    return 0;
}

int agent_peek_str(ddp_store *s, const char *k, char *buf, size_t cap)
{
    bool have = false;
    const char *keys[1] = {k};
    if (ddp_store_check(s, keys, 1, &have) != DDP_OK)
        return -1;
    if (!have)
        return 1;
    if (!buf)
        return 0;
    void *p = NULL;
    size_t n = 0;
    if (ddp_store_get(s, k, &p, &n) != DDP_OK)
        return -1;
    snprintf(buf, cap, "%.*s", (int)(n < cap ? n : cap - 1), (char *)p);
    free(p);
    return 0;
}

int agent_peek_int(ddp_store *s, const char *k, int64_t *v)
{
    char buf[32];
    int st = agent_peek_str(s, k, buf, sizeof buf);
    if (st == 0)
        *v = strtoll(buf, NULL, 10);
    return st;
}

int agent_follow_attempt(agent *a, int max)
{
    int64_t cur = 0;
    int st = agent_peek_int(a->store, "ddprun/attempt", &cur);
    if (st < 0)
        return -1;
    if (st > 0 || cur <= a->wd.attempt || cur > max)
        return 0;
    a->wd.attempt = (int)cur;
    return 1;
}

/* Claims this node's place in attempt k's rendezvous. A node's ddprun started anew while the job
 * runs (its machine rebooted, a scheduler restarted it: torchrun's agents rejoin the same way)
 * finds its place taken by its earlier self, whose workers are gone: it waits until node 0 has
 * found that node dead and restarted the group, and joins the next attempt. A place taken by a
 * live ddprun (its heartbeat moves: two nodes given one --node_rank) or in a rendezvous still
 * gathering is refused at once, as before. 0, or -1 said. */
static int claim_slot(agent *a)
{
    ddprun_opts *o = a->o;
    ddp_store *s = a->store;
    char k[128];
    bool said = false;
    int64_t hb0 = -1, give_up = now_ms() + (int64_t)(o->rdzv_timeout * 1000);
    /* a node started late joins where node 0 is */
    if (!a->joined && o->node_rank != 0 && agent_follow_attempt(a, o->max_restarts) < 0)
        goto lost;
    for (;;) {
        snprintf(k, sizeof k, "ddprun/a%d/claim/%d", a->wd.attempt, o->node_rank);
        int64_t claims;
        if (ddp_store_add(s, k, 1, &claims) != DDP_OK)
            break;
        if (claims == 1)
            return 0;
        /* Taken. A rendezvous of attempt k that finished (node 0 published the workers' port)
         * with this place in it, while this ddprun never joined: an earlier self's. */
        int64_t port = 0, hb = 0;
        snprintf(k, sizeof k, "ddprun/a%d/master_port", a->wd.attempt);
        int done = agent_peek_int(s, k, &port);
        snprintf(k, sizeof k, "ddprun/hb/%d", o->node_rank);
        int beat = done == 0 ? agent_peek_int(s, k, &hb) : 1;
        if (done < 0 || beat < 0)
            break;
        if (a->joined || done != 0 || (hb0 >= 0 && hb != hb0)) {
            ddprun_say("two nodes claim --node_rank %d; give each node its own --node_rank from 0 "
                       "to %d, or none of them one with --rdzv_backend c10d (ddprun numbers them)",
                       o->node_rank, o->nnodes - 1);
            return -1;
        }
        if (!said) {
            ddprun_say("node %d's place in attempt %d is held by an earlier ddprun of this node; "
                       "waiting for node 0 to find it gone (--agent_timeout %g s) and restart "
                       "the group, to join the next attempt",
                       o->node_rank, a->wd.attempt, o->agent_timeout);
            said = true;
        }
        if (hb0 < 0)
            hb0 = hb;
        /* Wait for node 0's next attempt, watching the holder's heartbeat meanwhile. */
        for (;;) {
            int st = agent_follow_attempt(a, INT_MAX);
            if (st < 0)
                goto lost;
            if (st > 0)
                break;
            if (agent_peek_int(s, k, &hb) < 0)
                goto lost;
            if (hb != hb0)
                break; /* said above, on the next round */
            if (agent_interrupted(a))
                return -1;
            if (now_ms() >= give_up) {
                ddprun_say("node 0 did not restart the group within --rdzv_timeout %g s; the "
                           "earlier ddprun of node %d may still run: stop it, or raise "
                           "--rdzv_timeout",
                           o->rdzv_timeout, o->node_rank);
                return -1;
            }
            nap_ms(200);
        }
    }
lost:
    ddprun_say("%s%s", ddp_store_last_error(s),
               " (the job may have ended: node 0's store is gone)");
    return -1;
}

int agent_rendezvous(agent *a)
{
    ddprun_opts *o = a->o;
    /* Node 0 picks the workers' MASTER_PORT afresh each attempt (a restarted rank 0 binds again),
     * once every node has joined, so that the port is free for as short a time as can be, and
     * hands it to the other nodes through the store. */
    a->wd.free_port = 0;
    agent_release_port(a);
    if (o->elastic)
        return agent_rendezvous_elastic(a);
    a->wd.store_port = a->wd.master_port;
    a->wd.restarts = a->wd.attempt;
    a->wd.group_rank = o->node_rank;
    a->wd.nnodes = o->nnodes;
    for (int i = 0; i < o->nnodes; i++)
        a->member_id[i] = i;
    if (o->nnodes == 1) {
        a->wd.world_size = o->nproc;
        a->wd.rank_offset = 0;
        return (a->wd.free_port = agent_pick_free_port(a, o->master_addr)) < 0 ? -1 : 0;
    }
    ddp_store *s = a->store;
    ddp_store_set_timeout(s, (int)(o->rdzv_timeout * 1000));
    char k[128], val[64 + sizeof o->run_id];
    if (o->node_rank == 0) {
        snprintf(val, sizeof val, "%d", a->wd.attempt);
        if (ddp_store_set(s, "ddprun/attempt", val, strlen(val)) != DDP_OK)
            goto out_store;
    }
    if (claim_slot(a) != 0)
        return -1;
    snprintf(k, sizeof k, "ddprun/a%d/node/%d", a->wd.attempt, o->node_rank);
    snprintf(val, sizeof val, "%d %d %d %d %s", o->nproc, o->max_restarts, o->nnodes,
             o->run_id_set ? 1 : 0, o->run_id);
    if (ddp_store_set(s, k, val, strlen(val)) != DDP_OK)
        goto out_store;

    char **keys = calloc((size_t)o->nnodes, sizeof *keys);
    bool *checked = calloc((size_t)o->nnodes, sizeof *checked);
    if (!keys || !checked) {
        free(keys), free(checked);
        ddprun_say("out of memory in the rendezvous");
        return -1;
    }
    for (int i = 0; i < o->nnodes; i++) {
        keys[i] = malloc(64);
        if (keys[i])
            snprintf(keys[i], 64, "ddprun/a%d/node/%d", a->wd.attempt, i);
    }
    int rc = -1;
    int64_t start = now_ms();
    int64_t give_up = start + (int64_t)(o->rdzv_timeout * 1000), last_scan = 0;
    /* Poll rather than block in a store wait, so that Ctrl-C is heard while nodes gather; each
     * check is short, for the same reason. */
    ddp_store_set_timeout(s, 2000);
    for (;;) {
        bool all = false;
        if (ddp_store_check(s, (const char *const *)keys, (size_t)o->nnodes, &all) != DDP_OK) {
            ddprun_say("%s", ddp_store_last_error(s));
            goto out_free;
        }
        if (all)
            break;
        /* Node 0 reads up to --nnodes - 1 keys: every 200 ms, not at every poll. */
        if (o->node_rank != 0 || now_ms() - last_scan >= 200) {
            last_scan = now_ms();
            if (check_arrived_records(a, keys, checked))
                goto out_free;
        }
        if (agent_interrupted(a))
            goto out_free;
        if (now_ms() >= give_up)
            break;
        nap_ms(20);
    }
    if (now_ms() >= give_up) {
        int joined = 0;
        char missing[200] = "";
        for (int i = 0; i < o->nnodes; i++) {
            bool have = false;
            (void)ddp_store_check(s, (const char *const *)&keys[i], 1, &have);
            if (have) {
                joined++;
            } else {
                size_t l = strlen(missing);
                if (l < sizeof missing - 16)
                    snprintf(missing + l, sizeof missing - l, "%s%d", l ? ", " : "", i);
            }
        }
        if (joined < o->nnodes) {
            /* the store refused connections meanwhile: most likely the missing nodes' token */
            uint64_t refused = a->server ? ddp_store_server_refused(a->server) : 0;
            char why[200] = "";
            if (refused)
                snprintf(why, sizeof why,
                         "; the store refused %llu connection%s meanwhile (above): a node started "
                         "with another DDP_STORE_TOKEN is refused, so export the same one on "
                         "every node",
                         (unsigned long long)refused, refused == 1 ? "" : "s");
            ddprun_say("rendezvous at '" HOSTF "' timed out after %g s (%d of %d nodes joined; "
                       "missing node_rank %s); start ddprun on every node with the same --nnodes, "
                       "--master_addr and --master_port, or raise --rdzv_timeout%s",
                       HOSTA(o->master_addr, a->wd.master_port), o->rdzv_timeout, joined, o->nnodes,
                       missing, why);
            goto out_free;
        }
    }
    a->wd.world_size = 0;
    for (int i = 0; i < o->nnodes; i++) {
        void *v;
        size_t n;
        if (ddp_store_get(s, keys[i], &v, &n) != DDP_OK) {
            ddprun_say("%s", ddp_store_last_error(s));
            goto out_free;
        }
        int np = 0, bad = check_node_record(a, i, v, &np);
        free(v);
        if (bad) {
            if (o->node_rank == 0)
                nap_ms(1000); /* as in check_arrived_records: let the other node read ours */
            goto out_free;
        }
        if (i == o->node_rank)
            a->wd.rank_offset = a->wd.world_size;
        a->wd.world_size += np;
    }
    /* Everyone is here: node 0 picks the workers' MASTER_PORT now and the others read it. */
    snprintf(k, sizeof k, "ddprun/a%d/master_port", a->wd.attempt);
    ddp_store_set_timeout(s, (int)(o->rdzv_timeout * 1000));
    if (o->node_rank == 0) {
        if ((a->wd.free_port = agent_pick_free_port(a, o->master_addr)) < 0)
            goto out_free;
        snprintf(val, sizeof val, "%d", a->wd.free_port);
        if (ddp_store_set(s, k, val, strlen(val)) != DDP_OK) {
            ddprun_say("%s", ddp_store_last_error(s));
            goto out_free;
        }
    } else {
        void *v = NULL;
        size_t n = 0;
        long fp = 0;
        if (ddp_store_get(s, k, &v, &n) != DDP_OK) {
            ddprun_say("%s", ddp_store_last_error(s));
            goto out_free;
        }
        fp = strtol(v, NULL, 10);
        free(v);
        if (fp < 1 || fp > 65535) {
            ddprun_say("node 0 sent a malformed MASTER_PORT; run the same ddprun on every node");
            goto out_free;
        }
        a->wd.free_port = (int)fp;
    }
    if (!a->joined && a->wd.attempt > 0)
        ddprun_say("node %d joined the job at attempt %d of %d", o->node_rank, a->wd.attempt + 1,
                   o->max_restarts + 1);
    a->joined = true;
    for (int i = 0; i < o->nnodes; i++) /* a node found dead before is back (it rejoined) */
        a->node_dead[i] = false, a->gone[i].seen_ms = 0;
    a->wd.restarts = a->wd.attempt; /* claim_slot may have moved it */
    rc = 0;
out_free:
    for (int i = 0; i < o->nnodes; i++)
        free(keys[i]);
    free(keys);
    free(checked);
    return rc;
out_store:
    ddprun_say("%s", ddp_store_last_error(s));
    return -1;
}
