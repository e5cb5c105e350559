/*
 * server.c — the rendezvous store's server: one thread, one poll() loop, every socket
 * non-blocking.
 *
 * Defences, because anyone who can reach the port can talk to it (DESIGN.md failure model):
 *   - the first frame must be HELLO with the job's token; otherwise the connection is refused,
 *     logged and closed; a connection that says nothing is closed after handshake_ms;
 *   - a frame's length is checked before any byte of its body is buffered, so a huge length
 *     closes the connection instead of growing memory; the store's total size is capped too;
 *   - a connection is served one request at a time and is not read while its reply is unsent,
 *     so a client that never reads cannot make the server queue replies without bound;
 *   - any malformed field closes that connection only; the loop never aborts on input.
 * It deliberately does not persist anything or replicate: the store lives and dies with its host
 * (ddprun on node 0, or rank 0), as TCPStore does.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "ddp/store.h"
#include "store/store_int.h"
#include "util/net.h"
#include "util/util.h"

/* How long the listening socket rests after accept ran out of descriptors or memory. */
#define ACCEPT_PAUSE_MS 100

/* ---- the key-value table: chained hashing, FNV-1a ---------------------------------------- */

typedef struct kv {
    struct kv *next;
    uint64_t hash;
    char *key; /* NUL-terminated, klen bytes before the NUL */
    size_t klen;
    char *val; /* vlen bytes, plus a NUL so counters parse in place */
    size_t vlen;
} kv;

typedef struct table {
    kv **slots;
    size_t nslots; /* power of two */
    size_t count;
    size_t bytes; /* sum of klen + vlen, checked against max_total */
} table;

static uint64_t hash_key(const char *k, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)k[i];
        h *= 1099511628211ull;
    }
    return h;
}

static kv **table_find(table *t, const char *k, size_t n)
{
    if (t->nslots == 0)
        return NULL;
    uint64_t h = hash_key(k, n);
    kv **pp = &t->slots[h & (t->nslots - 1)];
    for (; *pp; pp = &(*pp)->next)
        if ((*pp)->hash == h && (*pp)->klen == n && memcmp((*pp)->key, k, n) == 0)
            return pp;
    return NULL;
}

static kv *table_get(table *t, const char *k, size_t n)
{
    kv **pp = table_find(t, k, n);
    return pp ? *pp : NULL;
}

static bool table_grow(table *t)
{
    size_t n = t->nslots ? t->nslots * 2 : 64;
    kv **s = calloc(n, sizeof *s);
    if (!s)
        return false;
    for (size_t i = 0; i < t->nslots; i++) {
        for (kv *e = t->slots[i], *next; e; e = next) {
            next = e->next;
            e->next = s[e->hash & (n - 1)];
            s[e->hash & (n - 1)] = e;
        }
    }
    free(t->slots);
    t->slots = s;
    t->nslots = n;
    return true;
}

/* Sets key to value; DDP_ERR_TOO_LARGE over max_total, DDP_ERR_NOMEM on allocation failure. */
static ddp_status table_set(table *t, size_t max_total, const char *k, size_t kn, const char *v,
                            size_t vn)
{
    kv *e = table_get(t, k, kn);
    size_t old = e ? e->klen + e->vlen : 0;
    if (t->bytes - old + kn + vn > max_total)
        return DDP_ERR_TOO_LARGE;
    char *nv = malloc(vn + 1);
    if (!nv)
        return DDP_ERR_NOMEM;
    if (vn) /* (an empty value may come as NULL: an on_close mark's, found by fuzzing) */
        memcpy(nv, v, vn);
    nv[vn] = '\0';
    if (e) {
        free(e->val);
        e->val = nv;
        t->bytes += vn - e->vlen;
        e->vlen = vn;
        return DDP_OK;
    }
    if ((t->count + 1 > t->nslots) && !table_grow(t)) {
        free(nv);
        return DDP_ERR_NOMEM;
    }
    e = calloc(1, sizeof *e);
    char *nk = malloc(kn + 1);
    if (!e || !nk) {
        free(e);
        free(nk);
        free(nv);
        return DDP_ERR_NOMEM;
    }
    if (kn)
        memcpy(nk, k, kn);
    nk[kn] = '\0';
    e->key = nk;
    e->klen = kn;
    e->val = nv;
    e->vlen = vn;
    e->hash = hash_key(k, kn);
    e->next = t->slots[e->hash & (t->nslots - 1)];
    t->slots[e->hash & (t->nslots - 1)] = e;
    t->count++;
    t->bytes += kn + vn;
    return DDP_OK;
}

static bool table_delete(table *t, const char *k, size_t n)
{
    kv **pp = table_find(t, k, n);
    if (!pp)
        return false;
    kv *e = *pp;
    *pp = e->next;
    t->bytes -= e->klen + e->vlen;
    t->count--;
    free(e->key);
    free(e->val);
    free(e);
    return true;
}

static void table_free(table *t)
{
    for (size_t i = 0; i < t->nslots; i++) {
        for (kv *e = t->slots[i], *next; e; e = next) {
            next = e->next;
            free(e->key);
            free(e->val);
            free(e);
        }
    }
    free(t->slots);
    memset(t, 0, sizeof *t);
}

/* ---- connections --------------------------------------------------------------------------- */

typedef struct conn {
    int fd;
    bool authed;
    bool parked;  /* the request in `in` waits for keys; re-run it when the table changes */
    bool closing; /* close once `out` is flushed */
    int64_t accepted_ms;
    char peer[64];
    char *in; /* the current frame: 4-byte length, then body; at most max_frame + 4 bytes */
    size_t in_len, in_cap;
    ddp__buf out; /* the reply being sent */
    size_t out_off;
    /* ON_CLOSE: set when this connection closes (its client gone), unless the server stops */
    char *oc_key, *oc_val;
    size_t oc_kn, oc_vn;
    bool oc_if_absent; /* … only if the key is absent then */
    char *ab_key;      /* ABORT_ON: a GET/WAIT that waits ends when this key exists */
    size_t ab_kn;
    bool timed_out; /* keepalive gave up on the peer: not a close the peer made */
} conn;

struct ddp_store_server {
    int lfd;
    int wakefd;
    int port;
    char host[256];
    char *token;
    size_t token_len;
    size_t max_value, max_total, max_frame;
    int max_connections;
    int handshake_ms;
    ddp_store_log_fn log;
    void *log_ctx;
    atomic_bool stop;
    atomic_uint_fast64_t refused;
    atomic_int clients;        /* authenticated connections open now */
    _Atomic int64_t active_ms; /* when a client last connected, sent bytes or hung up */
    pthread_t thread;
    table tab;
    conn **conns;
    size_t nconns, cap_conns;
    /* accept failed for want of descriptors or memory: the listening socket is left out of
     * poll until then (it stays readable: polling it would spin), said once (server thread) */
    int64_t accept_paused_until;
    bool accept_warned;
};

static void default_log(void *ctx, const char *line)
{
    (void)ctx;
    fprintf(stderr, "ddp store: %s\n", line);
}

/* Logs a refusal. After 100 lines only every 1000th is written, so a flood of strangers cannot
 * flood the job's log either. */
static void refuse_log(ddp_store_server *s, const char *fmt, ...) DDP_PRINTF(2, 3);
static void refuse_log(ddp_store_server *s, const char *fmt, ...)
{
    uint64_t n = atomic_fetch_add(&s->refused, 1) + 1;
    if (n > 100 && n % 1000 != 0)
        return;
    char line[600];
    va_list ap;
    va_start(ap, fmt);
    ddp__vfmt(line, sizeof line, fmt, ap);
    va_end(ap);
    if (n > 100) {
        size_t l = strlen(line);
        ddp__fmt(line + l, sizeof line - l, " (%llu refused so far)", (unsigned long long)n);
    }
    s->log(s->log_ctx, line);
}

static void conn_free(ddp_store_server *s, conn *c)
{
    if (!c)
        return;
    if (c->authed)
        atomic_fetch_sub(&s->clients, 1);
    atomic_store(&s->active_ms, ddp__now_ms());
    if (c->fd >= 0)
        close(c->fd);
    free(c->in);
    free(c->oc_key);
    free(c->oc_val);
    free(c->ab_key);
    ddp__buf_free(&c->out);
    free(c);
}

/* Queues a reply frame: code, then (for errors) a message, or (for ok) the caller's fields. */
static void reply_begin(conn *c, uint8_t code)
{
    ddp__buf_frame_begin(&c->out);
    ddp__buf_u8(&c->out, code);
    c->out_off = 0;
}

static void reply_error(conn *c, uint8_t code, const char *msg)
{
    reply_begin(c, code);
    ddp__buf_blob(&c->out, msg, strlen(msg));
    ddp__buf_frame_end(&c->out);
}

/* Closes the connection after a best-effort error reply. */
static void protocol_violation(ddp_store_server *s, conn *c, const char *why)
{
    refuse_log(s, "closed connection from %s: %s", c->peer, why);
    char msg[300];
    ddp__fmt(msg, sizeof msg, "store protocol error: %s", why);
    reply_error(c, DDP__R_PROTOCOL, msg);
    c->closing = true;
}

static bool key_ok(const char *k, size_t n)
{
    return n > 0 && n <= DDP_STORE_MAX_KEY && memchr(k, '\0', n) == NULL;
}

/* A frame may exceed max_value by DDP__STORE_FRAME_SLACK (room for the key), so the value
 * itself is checked too: a bigger one closes the connection, as store.h promises. Only a client
 * that skipped the limit it learnt at HELLO sends one. */
static bool value_too_large(ddp_store_server *s, conn *c, size_t vn)
{
    if (vn <= s->max_value)
        return false;
    char why[160];
    ddp__fmt(why, sizeof why, "a value of %zu bytes, over max_value %zu", vn, s->max_value);
    protocol_violation(s, c, why);
    return true;
}

/* The result of serving one frame. */
enum serve { SERVED, PARKED, BAD };

/* Reads n keys into a table check; returns BAD on a malformed list, else whether all exist. */
static enum serve all_keys_exist(ddp_store_server *s, ddp__rd *r, bool *all)
{
    uint32_t n;
    if (!ddp__rd_u32(r, &n) || n > DDP__STORE_MAX_KEYS)
        return BAD;
    *all = true;
    for (uint32_t i = 0; i < n; i++) {
        const char *k;
        size_t kn;
        if (!ddp__rd_blob(r, &k, &kn) || !key_ok(k, kn))
            return BAD;
        if (*all && !table_get(&s->tab, k, kn))
            *all = false;
    }
    return r->left == 0 ? SERVED : BAD;
}

static bool tokens_equal(const char *a, size_t an, const char *b, size_t bn)
{
    /* Constant time in the token's contents, so the comparison leaks nothing through timing. */
    unsigned char d = an != bn;
    size_t n = an < bn ? an : bn;
    for (size_t i = 0; i < n; i++)
        d |= (unsigned char)(a[i] ^ b[i]);
    return d == 0;
}

/* A GET or WAIT that would wait, on a connection whose ABORT_ON key exists: answered with that
 * key's value (ABORTED) instead of parked. */
static bool aborted(ddp_store_server *s, conn *c)
{
    kv *ab = c->ab_key ? table_get(&s->tab, c->ab_key, c->ab_kn) : NULL;
    if (!ab)
        return false;
    reply_begin(c, DDP__R_ABORTED);
    ddp__buf_blob(&c->out, ab->val, ab->vlen);
    ddp__buf_frame_end(&c->out);
    return true;
}

/* Serves the frame in c->in. Sets *changed when the table changed (parked waiters may proceed).
 * Leaves exactly one reply in c->out unless PARKED. */
static enum serve serve_frame(ddp_store_server *s, conn *c, bool *changed)
{
    ddp__rd r = {c->in + 4, c->in_len - 4};
    uint8_t op;
    if (!ddp__rd_u8(&r, &op))
        return BAD;

    if (!c->authed) {
        uint32_t magic, version;
        const char *tok;
        size_t tn;
        if (op != DDP__OP_HELLO || !ddp__rd_u32(&r, &magic) || magic != DDP__STORE_MAGIC ||
            !ddp__rd_u32(&r, &version) || !ddp__rd_blob(&r, &tok, &tn) || r.left != 0) {
            refuse_log(s,
                       "refused connection from %s: it did not open with a ddp store "
                       "handshake (not a ddp client?)",
                       c->peer);
            reply_error(c, DDP__R_PROTOCOL, "not a ddp store handshake");
            c->closing = true;
            return SERVED;
        }
        if (version != DDP__STORE_VERSION) {
            refuse_log(s, "refused connection from %s: protocol version %u, server speaks %u",
                       c->peer, version, DDP__STORE_VERSION);
            reply_error(c, DDP__R_PROTOCOL,
                        "store protocol version mismatch: use the same ddpc "
                        "build on every node");
            c->closing = true;
            return SERVED;
        }
        /* An empty server token accepts anyone, also a client that shows a token (store.h). */
        if (s->token_len > 0 && !tokens_equal(tok, tn, s->token, s->token_len)) {
            refuse_log(s,
                       "refused connection from %s: wrong store token (a node or rank started "
                       "with another DDP_STORE_TOKEN, or a stranger)",
                       c->peer);
            reply_error(c, DDP__R_AUTH,
                        "wrong store token: every node's launcher and every worker of the job "
                        "must carry the same DDP_STORE_TOKEN");
            c->closing = true;
            return SERVED;
        }
        c->authed = true;
        atomic_fetch_add(&s->clients, 1);
        reply_begin(c, DDP__R_OK);
        ddp__buf_i64(&c->out, (int64_t)s->max_value); /* so clients refuse big values locally */
        ddp__buf_frame_end(&c->out);
        return SERVED;
    }

    const char *k = NULL, *v, *e;
    size_t kn = 0, vn, en;
    switch (op) {
    case DDP__OP_SET: {
        if (!ddp__rd_blob(&r, &k, &kn) || !key_ok(k, kn) || !ddp__rd_blob(&r, &v, &vn) ||
            r.left != 0)
            return BAD;
        if (value_too_large(s, c, vn))
            return SERVED;
        ddp_status st = table_set(&s->tab, s->max_total, k, kn, v, vn);
        if (st == DDP_ERR_TOO_LARGE) {
            reply_error(c, DDP__R_TOO_LARGE, "the store is full (max_total reached)");
            return SERVED;
        }
        if (st != DDP_OK) {
            reply_error(c, DDP__R_TOO_LARGE, "the store's host is out of memory");
            return SERVED;
        }
        *changed = true;
        reply_begin(c, DDP__R_OK);
        break;
    }
    case DDP__OP_GET: {
        if (!ddp__rd_blob(&r, &k, &kn) || !key_ok(k, kn) || r.left != 0)
            return BAD;
        kv *ent = table_get(&s->tab, k, kn);
        if (!ent)
            return aborted(s, c) ? SERVED : PARKED;
        reply_begin(c, DDP__R_OK);
        ddp__buf_blob(&c->out, ent->val, ent->vlen);
        break;
    }
    case DDP__OP_ADD: {
        int64_t delta;
        if (!ddp__rd_blob(&r, &k, &kn) || !key_ok(k, kn) || !ddp__rd_i64(&r, &delta) || r.left != 0)
            return BAD;
        kv *ent = table_get(&s->tab, k, kn);
        long long cur = 0;
        if (ent && !ddp__parse_int(ent->val, INT64_MIN, INT64_MAX, &cur)) {
            reply_error(c, DDP__R_INVALID, "add: the key holds a value that is not an integer");
            return SERVED;
        }
        int64_t next;
        if (__builtin_add_overflow((int64_t)cur, delta, &next)) {
            reply_error(c, DDP__R_INVALID, "add: the counter would overflow 64 bits");
            return SERVED;
        }
        char num[32];
        int nn = snprintf(num, sizeof num, "%lld", (long long)next);
        ddp_status st = table_set(&s->tab, s->max_total, k, kn, num, (size_t)nn);
        if (st != DDP_OK) {
            reply_error(c, DDP__R_TOO_LARGE, "the store is full (max_total reached)");
            return SERVED;
        }
        *changed = true;
        reply_begin(c, DDP__R_OK);
        ddp__buf_i64(&c->out, next);
        break;
    }
    case DDP__OP_CAS: {
        if (!ddp__rd_blob(&r, &k, &kn) || !key_ok(k, kn) || !ddp__rd_blob(&r, &e, &en) ||
            !ddp__rd_blob(&r, &v, &vn) || r.left != 0)
            return BAD;
        if (value_too_large(s, c, vn))
            return SERVED;
        kv *ent = table_get(&s->tab, k, kn);
        bool match = ent ? (ent->vlen == en && memcmp(ent->val, e, en) == 0) : en == 0;
        if (match) {
            if (table_set(&s->tab, s->max_total, k, kn, v, vn) != DDP_OK) {
                reply_error(c, DDP__R_TOO_LARGE, "the store is full (max_total reached)");
                return SERVED;
            }
            *changed = true;
            ent = table_get(&s->tab, k, kn);
        }
        reply_begin(c, DDP__R_OK);
        ddp__buf_blob(&c->out, ent ? ent->val : "", ent ? ent->vlen : 0);
        ddp__buf_u8(&c->out, ent != NULL);
        break;
    }
    case DDP__OP_CHECK:
    case DDP__OP_WAIT: {
        bool all;
        if (all_keys_exist(s, &r, &all) == BAD)
            return BAD;
        if (op == DDP__OP_WAIT && !all)
            return aborted(s, c) ? SERVED : PARKED;
        reply_begin(c, DDP__R_OK);
        if (op == DDP__OP_CHECK)
            ddp__buf_u8(&c->out, all);
        break;
    }
    case DDP__OP_DELETE: {
        if (!ddp__rd_blob(&r, &k, &kn) || !key_ok(k, kn) || r.left != 0)
            return BAD;
        bool existed = table_delete(&s->tab, k, kn);
        reply_begin(c, DDP__R_OK);
        ddp__buf_u8(&c->out, existed);
        break;
    }
    case DDP__OP_ON_CLOSE: {
        uint8_t if_absent = 0;
        if (!ddp__rd_blob(&r, &k, &kn) || (kn && !key_ok(k, kn)) || !ddp__rd_blob(&r, &v, &vn) ||
            (r.left == 1 && (!ddp__rd_u8(&r, &if_absent) || if_absent > 1)) || r.left != 0)
            return BAD;
        if (value_too_large(s, c, vn))
            return SERVED;
        char *nk = kn ? malloc(kn) : NULL, *nv = vn ? malloc(vn) : NULL;
        if ((kn && !nk) || (vn && !nv)) {
            free(nk);
            free(nv);
            reply_error(c, DDP__R_TOO_LARGE, "the store's host is out of memory");
            return SERVED;
        }
        if (kn)
            memcpy(nk, k, kn);
        if (vn)
            memcpy(nv, v, vn);
        free(c->oc_key);
        free(c->oc_val);
        c->oc_key = nk, c->oc_kn = kn, c->oc_val = nv, c->oc_vn = vn;
        c->oc_if_absent = if_absent;
        reply_begin(c, DDP__R_OK);
        break;
    }
    case DDP__OP_ABORT_ON: {
        if (!ddp__rd_blob(&r, &k, &kn) || (kn && !key_ok(k, kn)) || r.left != 0)
            return BAD;
        char *nk = kn ? malloc(kn) : NULL;
        if (kn && !nk) {
            reply_error(c, DDP__R_TOO_LARGE, "the store's host is out of memory");
            return SERVED;
        }
        if (kn)
            memcpy(nk, k, kn);
        free(c->ab_key);
        c->ab_key = nk, c->ab_kn = kn;
        reply_begin(c, DDP__R_OK);
        break;
    }
    case DDP__OP_NUM_KEYS:
        if (r.left != 0)
            return BAD;
        reply_begin(c, DDP__R_OK);
        ddp__buf_i64(&c->out, (int64_t)s->tab.count);
        break;
    default: return BAD;
    }
    ddp__buf_frame_end(&c->out);
    return SERVED;
}

/* Tries to send the pending reply. Returns false if the connection broke. */
static bool flush_out(conn *c)
{
    while (c->out_off < c->out.len) {
        ssize_t k = send(c->fd, c->out.p + c->out_off, c->out.len - c->out_off, MSG_NOSIGNAL);
        if (k > 0) {
            c->out_off += (size_t)k;
            continue;
        }
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return true;
        return false;
    }
    ddp__buf_reset(&c->out);
    c->out_off = 0;
    return true;
}

/* Serves c's complete frame and consumes it unless parked. */
static void serve_conn(ddp_store_server *s, conn *c, bool *changed)
{
    enum serve rc = serve_frame(s, c, changed);
    if (rc == PARKED) {
        c->parked = true;
        return;
    }
    if (rc == BAD)
        protocol_violation(s, c, "malformed request");
    if (c->out.failed) {
        /* The reply could not be built (out of memory): the client would wait for nothing. */
        ddp__buf_reset(&c->out);
        c->closing = true;
    }
    c->parked = false;
    c->in_len = 0;
    if (c->in_cap > 65536) { /* do not keep a big value's buffer per idle connection */
        free(c->in);
        c->in = NULL;
        c->in_cap = 0;
    }
}

/* Reads at most the rest of one frame. Returns false when the connection must close now. */
static bool read_conn(ddp_store_server *s, conn *c, bool *changed)
{
    for (;;) {
        size_t want;
        if (c->in_len < 4) {
            want = 4 - c->in_len;
        } else {
            uint32_t flen = ddp__le32(c->in);
            if (flen == 0 || flen > s->max_frame) {
                char why[160];
                if (flen == 0) /* every frame holds at least its operation byte */
                    ddp__fmt(why, sizeof why,
                             "a message whose length field is 0 (a frame "
                             "holds at least its operation)");
                else
                    ddp__fmt(why, sizeof why, "a message of %u bytes, over the limit of %zu",
                             (unsigned)flen, s->max_frame);
                protocol_violation(s, c, why);
                return true;
            }
            if (!c->authed && flen > DDP__STORE_FRAME_SLACK + 128) {
                protocol_violation(s, c, "an oversized handshake");
                return true;
            }
            want = 4 + (size_t)flen - c->in_len;
            if (c->in_cap < 4 + (size_t)flen) {
                char *p = realloc(c->in, 4 + (size_t)flen);
                if (!p) {
                    protocol_violation(s, c, "no memory for its message");
                    return true;
                }
                c->in = p;
                c->in_cap = 4 + (size_t)flen;
            }
        }
        if (want == 0) {
            serve_conn(s, c, changed);
            return true; /* one frame per wake-up; the loop comes back for more */
        }
        if (c->in_cap < 4) {
            c->in = malloc(64);
            if (!c->in)
                return false;
            c->in_cap = 64;
        }
        ssize_t k = recv(c->fd, c->in + c->in_len, want, 0);
        if (k > 0) {
            c->in_len += (size_t)k;
            continue;
        }
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return true;
        if (k < 0 && (errno == ETIMEDOUT || errno == EHOSTUNREACH))
            c->timed_out = true;
        /* Closed by the peer, or an error. Between frames that is a normal goodbye; in the
         * middle of one it is a truncated message, counted and logged like a malformed one. */
        if (c->in_len > 0)
            refuse_log(s,
                       "closed connection from %s: it ended in the middle of a message "
                       "(%zu bytes received)",
                       c->peer, c->in_len);
        return false;
    }
}

static void accept_conns(ddp_store_server *s)
{
    for (;;) {
        int fd = accept4(s->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            /* EAGAIN: drained. Out of descriptors or memory: the connection waits in the
             * backlog; tried again in ACCEPT_PAUSE_MS, not at once (the socket stays readable,
             * and the loop would spin a core until a descriptor frees up). */
            int e = errno;
            if (e == EMFILE || e == ENFILE || e == ENOBUFS || e == ENOMEM) {
                s->accept_paused_until = ddp__now_ms() + ACCEPT_PAUSE_MS;
                if (!s->accept_warned) {
                    char line[300];
                    ddp__fmt(line, sizeof line,
                             "cannot accept connections: %s%s; they wait and are accepted as "
                             "descriptors free up",
                             strerror(e),
                             e == EMFILE ? " (this process's open-file limit: raise ulimit -n)"
                                         : "");
                    s->log(s->log_ctx, line);
                    s->accept_warned = true;
                }
            }
            return;
        }
        char peer[64];
        ddp__peer_name(fd, peer, sizeof peer);
        if ((int)s->nconns >= s->max_connections) {
            refuse_log(s, "refused connection from %s: %d connections already open", peer,
                       s->max_connections);
            close(fd);
            continue;
        }
        if (s->nconns == s->cap_conns) {
            size_t cap = s->cap_conns ? s->cap_conns * 2 : 16;
            conn **p = realloc(s->conns, cap * sizeof *p);
            if (!p) {
                close(fd);
                continue;
            }
            s->conns = p;
            s->cap_conns = cap;
        }
        conn *c = calloc(1, sizeof *c);
        if (!c) {
            close(fd);
            continue;
        }
        /* A client whose host vanished (no FIN, no RST) would keep its connection, its slot
         * under max_connections and any get it waits in forever: keepalive closes it within
         * 60 s (the server has no call timeout of its own; the clients' default's bound). */
        (void)ddp__tcp_keepalive(fd, DDP_STORE_DEFAULT_TIMEOUT_MS);
        c->fd = fd;
        c->accepted_ms = ddp__now_ms();
        atomic_store(&s->active_ms, c->accepted_ms);
        memcpy(c->peer, peer, sizeof peer);
        s->conns[s->nconns++] = c;
    }
}

/* After the table changed: serves the parked requests it may release, again while serving
 * them changes it. */
static void serve_parked(ddp_store_server *s, bool changed)
{
    while (changed) {
        changed = false;
        for (size_t i = 0; i < s->nconns; i++) {
            conn *c = s->conns[i];
            if (c->parked && !c->closing) {
                serve_conn(s, c, &changed);
                if (!c->parked && !flush_out(c))
                    c->closing = true, c->out.len = 0, c->out_off = 0;
            }
        }
    }
}

static void *server_main(void *arg)
{
    ddp_store_server *s = arg;
    size_t pcap = 64;
    struct pollfd *pfds = malloc(pcap * sizeof *pfds);
    if (!pfds)
        return NULL; /* clients see connections refused and time out with a message */
    while (!atomic_load(&s->stop)) {
        size_t need = s->nconns + 2;
        if (need > pcap) {
            struct pollfd *p = realloc(pfds, need * 2 * sizeof *p);
            if (p) { /* on failure keep serving the connections that fit */
                pfds = p;
                pcap = need * 2;
            }
        }
        size_t n = 0;
        pfds[n++] = (struct pollfd){.fd = s->wakefd, .events = POLLIN};
        int64_t now = ddp__now_ms();
        int timeout = 1000;
        bool paused = now < s->accept_paused_until;
        pfds[n++] = (struct pollfd){.fd = s->lfd, .events = paused ? 0 : POLLIN};
        if (paused)
            timeout = (int)(s->accept_paused_until - now);
        for (size_t i = 0; i < s->nconns && n < pcap; i++) {
            conn *c = s->conns[i];
            short ev = POLLRDHUP;
            if (c->out_off < c->out.len)
                ev |= POLLOUT;
            else if (!c->parked && !c->closing)
                ev |= POLLIN;
            pfds[n++] = (struct pollfd){.fd = c->fd, .events = ev};
            if (!c->authed) {
                int64_t left = c->accepted_ms + s->handshake_ms - now;
                if (left < timeout)
                    timeout = left < 0 ? 0 : (int)left;
            }
        }
        int rc = poll(pfds, n, timeout);
        if (rc < 0 && errno != EINTR)
            break;
        if (rc < 0)
            continue;
        if (pfds[0].revents) {
            uint64_t x;
            ssize_t k = read(s->wakefd, &x, sizeof x);
            (void)k;
            continue; /* re-check stop */
        }
        if (pfds[1].revents & POLLIN)
            accept_conns(s);

        bool changed = false;
        now = ddp__now_ms();
        /* Connections accepted in this round have no pollfd yet; they start next round. */
        size_t polled = n - 2;
        for (size_t i = 0; i < polled && i < s->nconns; i++) {
            conn *c = s->conns[i];
            short re = pfds[i + 2].revents;
            bool keep = true;
            if (re & (POLLIN | POLLHUP | POLLRDHUP | POLLERR))
                atomic_store(&s->active_ms, now);
            if (re & (POLLERR | POLLNVAL))
                keep = false;
            if (keep && (re & POLLOUT))
                keep = flush_out(c);
            if (keep && (re & POLLIN) && !c->parked && c->out_off >= c->out.len)
                keep = read_conn(s, c, &changed);
            if (keep && c->out.len > c->out_off)
                keep = flush_out(c);
            if (keep && c->parked && (re & (POLLRDHUP | POLLHUP)))
                keep = false; /* the waiting client gave up (timed out) or died */
            if (keep && c->closing && c->out.len == 0)
                keep = false;
            if (keep && !c->authed && now - c->accepted_ms >= s->handshake_ms) {
                refuse_log(s, "closed connection from %s: no handshake within %d ms", c->peer,
                           s->handshake_ms);
                keep = false;
            }
            if (!keep)
                c->closing = true, c->out.len = 0, c->out_off = 0;
        }
        /* A change may release parked requests; serving them may change the table again. */
        serve_parked(s, changed);
        changed = false;
        /* Drop closed connections, keeping the order of the rest; a dropped one's ON_CLOSE
         * key is set now (its client is gone), which may release parked requests. */
        size_t w = 0;
        for (size_t i = 0; i < s->nconns; i++) {
            conn *c = s->conns[i];
            if (c->closing && c->out_off >= c->out.len) {
                /* Only a close the peer made (FIN, RST: its process ended or was killed): a
                 * peer that keepalive gave up on may live behind a broken network, which its
                 * other connections' time-outs judge. */
                int soerr = 0;
                socklen_t sl = sizeof soerr;
                if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) == 0 &&
                    (soerr == ETIMEDOUT || soerr == EHOSTUNREACH))
                    c->timed_out = true;
                if (c->oc_key && !c->timed_out &&
                    !(c->oc_if_absent && table_get(&s->tab, c->oc_key, c->oc_kn)) &&
                    table_set(&s->tab, s->max_total, c->oc_key, c->oc_kn, c->oc_val, c->oc_vn) ==
                        DDP_OK)
                    changed = true;
                conn_free(s, c);
            } else {
                s->conns[w++] = c;
            }
        }
        s->nconns = w;
        serve_parked(s, changed);
    }
    free(pfds);
    return NULL;
}

ddp_status ddp_store_server_start(const ddp_store_server_opts *opts, ddp_store_server **out,
                                  ddp_error *err)
{
    ddp_store_server_opts def = DDP_STORE_SERVER_OPTS_INIT;
    if (!opts)
        opts = &def;
    if (!out)
        return ddp__err(err, DDP_ERR_INVALID, "ddp_store_server_start: out is NULL");
    if (opts->max_value == 0 || opts->max_value > (1u << 30) || opts->max_connections < 1 ||
        opts->handshake_ms < 1)
        return ddp__err(err, DDP_ERR_INVALID,
                        "store server options out of range: max_value 1..1 GiB, max_connections "
                        "and handshake_ms at least 1");
    ddp_store_server *s = calloc(1, sizeof *s);
    if (!s)
        return ddp__err(err, DDP_ERR_NOMEM, "out of memory starting the store server");
    s->lfd = s->wakefd = -1;
    const char *tok = opts->token ? opts->token : "";
    s->token = strdup(tok);
    s->token_len = strlen(tok);
    s->max_value = opts->max_value;
    s->max_total = opts->max_total;
    s->max_frame = opts->max_value + DDP__STORE_FRAME_SLACK;
    s->max_connections = opts->max_connections;
    s->handshake_ms = opts->handshake_ms;
    s->log = opts->log ? opts->log : default_log;
    s->log_ctx = opts->log_ctx;
    ddp__fmt(s->host, sizeof s->host, "%s", opts->host && *opts->host ? opts->host : "0.0.0.0");
    ddp_status st = DDP_ERR_NOMEM;
    if (!s->token) {
        ddp__err(err, st, "out of memory starting the store server");
        goto out_free;
    }
    st = ddp__tcp_listen(opts->host, opts->port, 1024, &s->lfd, &s->port, err);
    if (st != DDP_OK)
        goto out_free;
    s->wakefd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (s->wakefd < 0) {
        st = ddp__err(err, DDP_ERR_SYSTEM, "eventfd failed: %s", strerror(errno));
        goto out_close;
    }
    /* The server thread takes no signals: they belong to the program (ddprun's signalfd). */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    int rc = pthread_create(&s->thread, NULL, server_main, s);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        st = ddp__err(err, DDP_ERR_SYSTEM, "cannot start the store thread: %s", strerror(rc));
        goto out_close;
    }
    *out = s;
    return DDP_OK;

out_close:
    if (s->wakefd >= 0)
        close(s->wakefd);
    close(s->lfd);
out_free:
    free(s->token);
    free(s);
    return st;
}

int ddp_store_server_port(const ddp_store_server *srv)
{
    return srv ? srv->port : 0;
}

int ddp__store_server_clients(const ddp_store_server *srv)
{
    return srv ? atomic_load(&((ddp_store_server *)srv)->clients) : 0;
}

int64_t ddp__store_server_active_ms(const ddp_store_server *srv)
{
    return srv ? atomic_load(&((ddp_store_server *)srv)->active_ms) : 0;
}

uint64_t ddp_store_server_refused(const ddp_store_server *srv)
{
    return srv ? atomic_load(&srv->refused) : 0;
}

void ddp_store_server_stop(ddp_store_server *s)
{
    if (!s)
        return;
    atomic_store(&s->stop, true);
    uint64_t one = 1;
    ssize_t k = write(s->wakefd, &one, sizeof one);
    (void)k; /* an eventfd write only fails on overflow, which also wakes the loop */
    pthread_join(s->thread, NULL);
    for (size_t i = 0; i < s->nconns; i++)
        conn_free(s, s->conns[i]);
    free(s->conns);
    table_free(&s->tab);
    close(s->lfd);
    close(s->wakefd);
    free(s->token);
    free(s);
}
