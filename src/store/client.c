/*
 * client.c — the store client: one blocking TCP connection, one request at a time, a deadline
 * on every call.
 *
 * A call that times out closes its connection, because the server may still answer it later
 * and the answer would be taken for the next call's; the next call reconnects. Nothing is
 * retried behind the caller's back (an add must not happen twice).
 * Also here: ddp_store_open_world(), which decides who hosts the store, and the store barrier.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ddp/store.h"
#include "store/store_int.h"
#include "util/net.h"
#include "util/util.h"

/* The handshake's reply: a code and an i64, or an error's one-line message. */
#define HELLO_REPLY_MAX ((size_t)4096)
/* A reply's buffer grows by doubling from this, as its bytes arrive. */
#define REPLY_STEP ((size_t)64 << 10)
/* The most a server may say it accepts in a value (ddp_store_server_start's own limit). */
#define MAX_VALUE_MAX ((int64_t)1 << 30)

struct ddp_store {
    int fd; /* -1 when disconnected */
    char host[256];
    int port;
    char *token;
    int timeout_ms;
    int connect_timeout_ms;
    size_t max_value;         /* the server's limit, learnt at HELLO */
    ddp_store_server *server; /* owned when this handle hosts the store */
    ddp__buf req;
    char *reply; /* the last reply frame's body */
    size_t reply_len, reply_cap;
    char err[DDP_ERRMSG_MAX];
    bool refused; /* the last call could not reconnect: the store's host refused (ddp_store_refused)
                   */
    char *abort_key; /* ddp_store_abort_on's key (NULL: none) */
    bool abort_sent; /* … registered on this connection */
};

/* A key as it appears in messages: quoted, cut to keep the message one readable line. */
static void show_key(char *buf, size_t cap, const char *key)
{
    if (strlen(key) > 80)
        ddp__fmt(buf, cap, "'%.80s…'", key);
    else
        ddp__fmt(buf, cap, "'%s'", key);
}

static void disconnect(ddp_store *s)
{
    if (s->fd >= 0) {
        close(s->fd);
        s->fd = -1;
    }
    s->abort_sent = false; /* a registration belongs to its connection */
}

static void begin(ddp_store *s, uint8_t op);

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* Receives one reply frame into s->reply. Its length is checked against the largest reply that
 * can come (before the handshake: a short one; after it: a value of the store's max_value and its
 * frame), and the buffer grows with the bytes that actually arrive, so 4 bytes from something
 * that is not the store (another service on the port, a scanner) cannot make this allocate
 * gigabytes. */
static ddp_status recv_reply(ddp_store *s, int64_t deadline, ddp_error *e)
{
    unsigned char hdr[4];
    ddp_status st = ddp__recv_all(s->fd, hdr, 4, deadline, e);
    if (st != DDP_OK)
        return st;
    size_t n = ddp__le32(hdr);
    size_t limit = s->max_value ? s->max_value + DDP__STORE_FRAME_SLACK : HELLO_REPLY_MAX;
    if (n == 0 || n > limit)
        return ddp__err(e, DDP_ERR_PROTOCOL,
                        "the store sent a reply of %zu bytes (at most %zu expected): is it a "
                        "ddpc store?",
                        n, limit);
    for (size_t got = 0; got < n;) {
        if (got == s->reply_cap) {
            size_t cap = s->reply_cap < REPLY_STEP ? REPLY_STEP : 2 * s->reply_cap;
            if (cap > n)
                cap = n;
            char *p = realloc(s->reply, cap + 1);
            if (!p)
                return ddp__err(e, DDP_ERR_NOMEM, "no memory for a store reply of %zu bytes", n);
            s->reply = p;
            s->reply_cap = cap;
        }
        size_t k = (n < s->reply_cap ? n : s->reply_cap) - got;
        if ((st = ddp__recv_all(s->fd, s->reply + got, k, deadline, e)) != DDP_OK)
            return st;
        got += k;
    }
    s->reply_len = n;
    return DDP_OK;
}

/* Sends s->req and receives the reply; on DDP_OK, *r is positioned after the reply code.
 * Error replies become statuses with the server's message. Any failure but an error reply
 * closes the connection. */
static ddp_status roundtrip(ddp_store *s, int64_t deadline, ddp__rd *r, ddp_error *e)
{
    if (s->req.failed)
        return ddp__err(e, DDP_ERR_NOMEM, "out of memory building a store request");
    ddp_status st = ddp__send_all(s->fd, s->req.p, s->req.len, deadline, e);
    if (st == DDP_OK)
        st = recv_reply(s, deadline, e);
    if (st != DDP_OK) {
        disconnect(s);
        return st;
    }
    *r = (ddp__rd){s->reply, s->reply_len};
    uint8_t code;
    if (!ddp__rd_u8(r, &code)) {
        disconnect(s);
        return ddp__err(e, DDP_ERR_PROTOCOL, "the store sent an empty reply");
    }
    if (code == DDP__R_OK)
        return DDP_OK;
    const char *msg = "";
    size_t mn = 0;
    (void)ddp__rd_blob(r, &msg, &mn);
    switch (code) {
    case DDP__R_AUTH: st = DDP_ERR_AUTH; break;
    case DDP__R_INVALID: st = DDP_ERR_INVALID; break;
    case DDP__R_TOO_LARGE: st = DDP_ERR_TOO_LARGE; break;
    case DDP__R_ABORTED: st = DDP_ERR_CLOSED; break; /* the abort key's value: a failure */
    default: st = DDP_ERR_PROTOCOL; break;
    }
    if (code == DDP__R_AUTH || code == DDP__R_PROTOCOL)
        disconnect(s); /* the server closes these */
    return ddp__err(e, st, "%.*s", (int)(mn > 300 ? 300 : mn), msg);
}

/* One connection attempt with handshake. */
static ddp_status connect_once(ddp_store *s, int64_t deadline, ddp_error *e)
{
    ddp_status st = ddp__tcp_connect(s->host, s->port, deadline, &s->fd, e);
    if (st != DDP_OK)
        return st;
    /* A server whose host vanishes (no FIN, no RST) fails a call blocked in get/wait within
     * the keepalive bound (at most 60 s) instead of the call's whole timeout (300 s by
     * default), and the connection of an idle client does not stay open to nobody. */
    (void)ddp__tcp_keepalive(s->fd, s->timeout_ms);
    ddp__buf_frame_begin(&s->req);
    ddp__buf_u8(&s->req, DDP__OP_HELLO);
    ddp__buf_u32(&s->req, DDP__STORE_MAGIC);
    ddp__buf_u32(&s->req, DDP__STORE_VERSION);
    ddp__buf_blob(&s->req, s->token, strlen(s->token));
    ddp__buf_frame_end(&s->req);
    ddp__rd r;
    st = roundtrip(s, deadline, &r, e);
    if (st != DDP_OK)
        return st;
    int64_t maxv;
    if (!ddp__rd_i64(&r, &maxv) || maxv <= 0 || maxv > MAX_VALUE_MAX || r.left) {
        disconnect(s);
        return ddp__err(e, DDP_ERR_PROTOCOL, "the store's handshake reply is malformed");
    }
    s->max_value = (size_t)maxv;
    return DDP_OK;
}

/* The bound on retrying refused connections: connect_timeout_ms, or the call timeout when it was
 * not given (it then follows ddp_store_set_timeout). */
static int connect_ms(const ddp_store *s)
{
    return s->connect_timeout_ms > 0 ? s->connect_timeout_ms : s->timeout_ms;
}

/* Connects, each try with the call's deadline (a slow or lossy network gets all of it, SYN
 * retransmits included), retrying refused connections until refuse_deadline (≤ deadline: the
 * server may not be up yet), the last try at it (giving up one backoff early made a 200 ms
 * timeout end after 120–150 ms when the sleeps woke late). */
static ddp_status ensure_connected(ddp_store *s, int64_t deadline, int64_t refuse_deadline)
{
    if (s->fd >= 0)
        return DDP_OK;
    int64_t start = ddp__now_ms();
    int backoff = 10;
    ddp_error refusal = {0}; /* the last refused try's message */
    for (;;) {
        ddp_error e = {0};
        int64_t t0 = ddp__now_ms();
        ddp_status st = connect_once(s, deadline, &e);
        if (st == DDP_OK)
            return DDP_OK;
        s->refused = st == DDP_ERR_NETWORK && errno == ECONNREFUSED;
        if (s->refused)
            refusal = e;
        else if (st == DDP_ERR_TIMEOUT && refusal.msg[0] && deadline - t0 < 100) {
            /* a last try with (almost) no time left cannot hear a remote host's refusal: the
             * earlier tries did, and that is what happened */
            s->refused = true;
            st = DDP_ERR_NETWORK;
            e = refusal;
        }
        int64_t left = refuse_deadline - ddp__now_ms();
        bool retry = st == DDP_ERR_NETWORK && left > 0;
        if (!retry) {
            char waited[32];
            ddp__fmt_duration(waited, sizeof waited, ddp__now_ms() - start);
            if (st == DDP_ERR_AUTH)
                return ddp__errmsg(s->err, st, "the store at '%s:%d' refused our token: %s",
                                   s->host, s->port, e.msg);
            if (st == DDP_ERR_NETWORK || st == DDP_ERR_TIMEOUT)
                return ddp__errmsg(
                    s->err, DDP_ERR_TIMEOUT,
                    "cannot reach the store at '%s:%d' after %s (%s); check that its host "
                    "(ddprun on node 0, or rank 0) is running and that MASTER_ADDR and "
                    "MASTER_PORT (DDP_STORE_PORT under ddprun) point at it",
                    s->host, s->port, waited, e.msg);
            return ddp__errmsg(s->err, st, "connecting to the store at '%s:%d' failed: %s", s->host,
                               s->port, e.msg);
        }
        sleep_ms(backoff < left ? backoff : (int)left);
        if (backoff < 200)
            backoff *= 2;
    }
}

/* Registers s->abort_key on this connection (a new one has none), keeping the caller's request
 * aside. A server that does not know the operation (an older ddpc) closes the connection: the
 * key is then dropped (waits are not ended early, as before) and the connection made anew. */
static ddp_status send_abort_on(ddp_store *s, int64_t deadline, ddp_error *e)
{
    ddp__buf saved = s->req;
    s->req = (ddp__buf){0};
    begin(s, DDP__OP_ABORT_ON);
    ddp__buf_blob(&s->req, s->abort_key, strlen(s->abort_key));
    ddp__buf_frame_end(&s->req);
    ddp__rd r;
    ddp_status st = roundtrip(s, deadline, &r, e);
    ddp__buf_free(&s->req);
    s->req = saved;
    if (st == DDP_OK) {
        s->abort_sent = true;
        return DDP_OK;
    }
    if (st != DDP_ERR_PROTOCOL)
        return st;
    free(s->abort_key);
    s->abort_key = NULL;
    disconnect(s);
    saved = s->req; /* the handshake is built in s->req too */
    s->req = (ddp__buf){0};
    st = ensure_connected(s, deadline, deadline);
    ddp__buf_free(&s->req);
    s->req = saved;
    return st;
}

/* Runs the request in s->req for operation `op` on `key` (for messages) with the call timeout. */
static ddp_status call(ddp_store *s, const char *op, const char *key, ddp__rd *r)
{
    int64_t start = ddp__now_ms();
    int64_t deadline = start + s->timeout_ms;
    /* A refused reconnection is retried for connect_timeout_ms at most, as the first connection
     * (a store that restarts comes back within it; one that is gone is said to be at once, not
     * at the call's whole timeout: ddprun's nodes found node 0 gone minutes late); a try that
     * only waits for an answer has the call's whole deadline, as before. */
    int64_t reconnect = start + connect_ms(s);
    s->refused = false;
    /* ensure_connected() may have to rebuild s->req for the handshake: keep the request aside. */
    ddp__buf saved = s->req;
    s->req = (ddp__buf){0};
    ddp_status st = ensure_connected(s, deadline, reconnect < deadline ? reconnect : deadline);
    ddp__buf_free(&s->req);
    s->req = saved;
    if (st != DDP_OK)
        return st;
    ddp_error e = {0};
    if (s->abort_key && !s->abort_sent && (st = send_abort_on(s, deadline, &e)) != DDP_OK)
        return ddp__errmsg(s->err, st, "store: registering the abort key failed: %s", e.msg);
    st = roundtrip(s, deadline, r, &e);
    if (st == DDP_OK)
        return DDP_OK;
    if (st == DDP_ERR_CLOSED) /* the abort key's value says it all (if it says anything) */
        return ddp__errmsg(s->err, st, "%s",
                           e.msg[0] ? e.msg : "store: a wait ended by the abort key, set empty");
    char k[100] = "";
    if (key)
        show_key(k, sizeof k, key);
    char waited[32];
    ddp__fmt_duration(waited, sizeof waited, ddp__now_ms() - start);
    if (st == DDP_ERR_TIMEOUT)
        return ddp__errmsg(s->err, st, "store %s(%s) timed out after %s at '%s:%d'", op, k, waited,
                           s->host, s->port);
    if (st == DDP_ERR_NETWORK)
        return ddp__errmsg(
            s->err, st,
            "store %s(%s) failed: lost the connection to the store at '%s:%d' (%s); its "
            "host (ddprun on node 0, or rank 0) has probably exited",
            op, k, s->host, s->port, e.msg);
    return ddp__errmsg(s->err, st, "store %s(%s) failed: %s", op, k, e.msg);
}

/* Every call on a handle starts here or in keys_request, num_keys or barrier, which check s
 * themselves: a NULL handle is DDP_ERR_INVALID (with no handle to hold a message), never a
 * crash. */
static ddp_status check_key(ddp_store *s, const char *op, const char *key)
{
    if (!s)
        return DDP_ERR_INVALID;
    if (!key)
        return ddp__errmsg(s->err, DDP_ERR_INVALID, "store %s: key is NULL", op);
    size_t n = strlen(key);
    if (n == 0 || n > DDP_STORE_MAX_KEY)
        return ddp__errmsg(s->err, DDP_ERR_INVALID,
                           "store %s: a key must have 1 to %d bytes, not %zu", op,
                           DDP_STORE_MAX_KEY, n);
    return DDP_OK;
}

static ddp_status check_value(ddp_store *s, const char *op, const char *key, size_t len)
{
    size_t limit = s->max_value ? s->max_value : DDP_STORE_DEFAULT_MAX_VALUE;
    if (len > limit) {
        char k[100];
        show_key(k, sizeof k, key);
        return ddp__errmsg(
            s->err, DDP_ERR_TOO_LARGE,
            "store %s(%s): a value of %zu bytes is over the store's limit of %zu; keep "
            "large data out of the store (it is for rendezvous, not for tensors)",
            op, k, len, limit);
    }
    return DDP_OK;
}

static void begin(ddp_store *s, uint8_t op)
{
    ddp__buf_frame_begin(&s->req);
    ddp__buf_u8(&s->req, op);
}

static ddp_status malformed(ddp_store *s, const char *op)
{
    disconnect(s);
    return ddp__errmsg(s->err, DDP_ERR_PROTOCOL, "store %s: the server's reply is malformed", op);
}

/* Copies a blob into a new NUL-terminated buffer. */
static ddp_status copy_out(ddp_store *s, const char *data, size_t n, void **out, size_t *len)
{
    char *p = malloc(n + 1);
    if (!p)
        return ddp__errmsg(s->err, DDP_ERR_NOMEM,
                           "out of memory copying a store value of %zu bytes", n);
    memcpy(p, data, n);
    p[n] = '\0';
    *out = p;
    if (len)
        *len = n;
    return DDP_OK;
}

/* ---- public API ----------------------------------------------------------------------------- */

ddp_status ddp_store_connect(const ddp_store_opts *opts, ddp_store **out, ddp_error *err)
{
    if (!opts || !out || !opts->host)
        return ddp__err(err, DDP_ERR_INVALID,
                        "ddp_store_connect: opts, opts->host and out are "
                        "required");
    if (strlen(opts->host) >= 256 || opts->port < 1 || opts->port > 65535)
        return ddp__err(err, DDP_ERR_INVALID, "ddp_store_connect: bad address '%s:%d'", opts->host,
                        opts->port);
    ddp_store *s = calloc(1, sizeof *s);
    if (!s)
        return ddp__err(err, DDP_ERR_NOMEM, "out of memory creating a store client");
    s->fd = -1;
    memcpy(s->host, opts->host, strlen(opts->host) + 1);
    s->port = opts->port;
    s->token = strdup(opts->token ? opts->token : "");
    s->timeout_ms = opts->timeout_ms > 0 ? opts->timeout_ms : DDP_STORE_DEFAULT_TIMEOUT_MS;
    s->connect_timeout_ms = opts->connect_timeout_ms > 0 ? opts->connect_timeout_ms : 0;
    if (!s->token) {
        free(s);
        return ddp__err(err, DDP_ERR_NOMEM, "out of memory creating a store client");
    }
    int64_t dl = ddp__now_ms() + connect_ms(s);
    ddp_status st = ensure_connected(s, dl, dl);
    if (st != DDP_OK) {
        ddp__err(err, st, "%s", s->err);
        ddp_store_close(s);
        return st;
    }
    *out = s;
    return DDP_OK;
}

ddp_status ddp_store_clone(const ddp_store *s, ddp_store **out, ddp_error *err)
{
    if (!s || !out)
        return ddp__err(err, DDP_ERR_INVALID, "ddp_store_clone: s and out are required");
    ddp_store_opts o = {.host = s->host,
                        .port = s->port,
                        .token = s->token,
                        .timeout_ms = s->timeout_ms,
                        .connect_timeout_ms = s->connect_timeout_ms};
    return ddp_store_connect(&o, out, err);
}

void ddp_store_close(ddp_store *s)
{
    if (!s)
        return;
    disconnect(s);
    if (s->server) {
        /* Other ranks may still be between their last calls (the reply to a final barrier
         * reaches them before they hang up): let them leave first, for a bounded time. A client
         * silent for DDP__STORE_CLOSE_QUIET_MS is not waited for: its host may be gone without
         * a FIN (power loss), and before 2026-11-25 the process lingered up to DDP_TIMEOUT
         * (30 s at most) after the job had already reported its error. */
        int64_t t0 = ddp__now_ms();
        int64_t linger =
            s->timeout_ms < DDP__STORE_CLOSE_LINGER_MS ? s->timeout_ms : DDP__STORE_CLOSE_LINGER_MS;
        int64_t until = t0 + linger;
        for (;;) {
            int64_t now = ddp__now_ms();
            int64_t active = ddp__store_server_active_ms(s->server);
            if (active < t0)
                active = t0;
            if (ddp__store_server_clients(s->server) == 0 || now >= until ||
                now - active >= DDP__STORE_CLOSE_QUIET_MS)
                break;
            sleep_ms(5);
        }
    }
    ddp_store_server_stop(s->server);
    ddp__buf_free(&s->req);
    free(s->reply);
    free(s->token);
    free(s->abort_key);
    free(s);
}

void ddp_store_set_timeout(ddp_store *s, int timeout_ms)
{
    if (!s)
        return;
    s->timeout_ms = timeout_ms > 0 ? timeout_ms : DDP_STORE_DEFAULT_TIMEOUT_MS;
    if (s->fd >= 0) /* the keepalive follows the timeout, as a new connection's would */
        (void)ddp__tcp_keepalive(s->fd, s->timeout_ms);
}

bool ddp_store_refused(const ddp_store *s)
{
    return s && s->refused;
}

const char *ddp_store_last_error(const ddp_store *s)
{
    return s ? s->err : "no store handle";
}

ddp_status ddp_store_set(ddp_store *s, const char *key, const void *value, size_t len)
{
    ddp_status st;
    if ((st = check_key(s, "set", key)) || (st = check_value(s, "set", key, len)))
        return st;
    if (!value && len)
        return ddp__errmsg(s->err, DDP_ERR_INVALID, "store set: value is NULL");
    begin(s, DDP__OP_SET);
    ddp__buf_blob(&s->req, key, strlen(key));
    ddp__buf_blob(&s->req, value, len);
    ddp__buf_frame_end(&s->req);
    ddp__rd r;
    return call(s, "set", key, &r);
}

ddp_status ddp_store_get(ddp_store *s, const char *key, void **value, size_t *len)
{
    ddp_status st = check_key(s, "get", key);
    if (st)
        return st;
    if (!value)
        return ddp__errmsg(s->err, DDP_ERR_INVALID, "store get: value is NULL");
    begin(s, DDP__OP_GET);
    ddp__buf_blob(&s->req, key, strlen(key));
    ddp__buf_frame_end(&s->req);
    ddp__rd r;
    st = call(s, "get", key, &r);
    /* Only a get that reached the store and waited: not one that could not reconnect. */
    if (st == DDP_ERR_TIMEOUT && strncmp(s->err, "store get(", 10) == 0) {
        size_t l = strlen(s->err);
        ddp__fmt(s->err + l, sizeof s->err - l,
                 ": no one set the key; the rank that should have may have failed or not started");
    }
    if (st)
        return st;
    const char *v;
    size_t vn;
    if (!ddp__rd_blob(&r, &v, &vn) || r.left)
        return malformed(s, "get");
    return copy_out(s, v, vn, value, len);
}

ddp_status ddp_store_add(ddp_store *s, const char *key, int64_t delta, int64_t *out)
{
    ddp_status st = check_key(s, "add", key);
    if (st)
        return st;
    begin(s, DDP__OP_ADD);
    ddp__buf_blob(&s->req, key, strlen(key));
    ddp__buf_i64(&s->req, delta);
    ddp__buf_frame_end(&s->req);
    ddp__rd r;
    if ((st = call(s, "add", key, &r)))
        return st;
    int64_t v;
    if (!ddp__rd_i64(&r, &v) || r.left)
        return malformed(s, "add");
    if (out)
        *out = v;
    return DDP_OK;
}

ddp_status ddp_store_compare_set(ddp_store *s, const char *key, const void *expected,
                                 size_t expected_len, const void *desired, size_t desired_len,
                                 void **current, size_t *current_len)
{
    ddp_status st;
    if ((st = check_key(s, "compare_set", key)) ||
        (st = check_value(s, "compare_set", key, expected_len)) ||
        (st = check_value(s, "compare_set", key, desired_len)))
        return st;
    if ((!expected && expected_len) || (!desired && desired_len))
        return ddp__errmsg(s->err, DDP_ERR_INVALID,
                           "store compare_set: expected or desired is NULL");
    begin(s, DDP__OP_CAS);
    ddp__buf_blob(&s->req, key, strlen(key));
    ddp__buf_blob(&s->req, expected, expected_len);
    ddp__buf_blob(&s->req, desired, desired_len);
    ddp__buf_frame_end(&s->req);
    ddp__rd r;
    if ((st = call(s, "compare_set", key, &r)))
        return st;
    const char *v;
    size_t vn;
    uint8_t exists;
    if (!ddp__rd_blob(&r, &v, &vn) || !ddp__rd_u8(&r, &exists) || r.left)
        return malformed(s, "compare_set");
    if (!current) {
        if (current_len)
            *current_len = vn;
        return DDP_OK;
    }
    return copy_out(s, v, vn, current, current_len);
}

static ddp_status keys_request(ddp_store *s, const char *op, uint8_t code, const char *const *keys,
                               size_t n)
{
    if (!s)
        return DDP_ERR_INVALID;
    if (n && !keys)
        return ddp__errmsg(s->err, DDP_ERR_INVALID, "store %s: keys is NULL (%zu keys)", op, n);
    if (n > DDP__STORE_MAX_KEYS)
        return ddp__errmsg(s->err, DDP_ERR_INVALID, "store %s: between 0 and %d keys, not %zu", op,
                           DDP__STORE_MAX_KEYS, n);
    for (size_t i = 0; i < n; i++) {
        ddp_status st = check_key(s, op, keys[i]);
        if (st)
            return st;
    }
    begin(s, code);
    ddp__buf_u32(&s->req, (uint32_t)n);
    for (size_t i = 0; i < n; i++)
        ddp__buf_blob(&s->req, keys[i], strlen(keys[i]));
    ddp__buf_frame_end(&s->req);
    return DDP_OK;
}

ddp_status ddp_store_check(ddp_store *s, const char *const *keys, size_t n, bool *out)
{
    ddp_status st = keys_request(s, "check", DDP__OP_CHECK, keys, n);
    if (st)
        return st;
    ddp__rd r;
    if ((st = call(s, "check", n ? keys[0] : NULL, &r)))
        return st;
    uint8_t all;
    if (!ddp__rd_u8(&r, &all) || r.left)
        return malformed(s, "check");
    if (out)
        *out = all != 0;
    return DDP_OK;
}

ddp_status ddp_store_wait(ddp_store *s, const char *const *keys, size_t n)
{
    ddp_status st = keys_request(s, "wait", DDP__OP_WAIT, keys, n);
    if (st)
        return st;
    int64_t start = ddp__now_ms();
    ddp__rd r;
    st = call(s, "wait", n == 1 ? keys[0] : NULL, &r);
    if (st != DDP_ERR_TIMEOUT || n < 2)
        return st;
    /* Say which keys are missing: ask again on a fresh connection, each key alone, briefly. */
    char waited[32];
    ddp__fmt_duration(waited, sizeof waited, ddp__now_ms() - start);
    int saved = s->timeout_ms;
    s->timeout_ms = 2000;
    size_t missing = 0;
    bool known = true;
    char list[200] = "";
    for (size_t i = 0; i < n; i++) {
        bool have = true;
        if (ddp_store_check(s, &keys[i], 1, &have) != DDP_OK) {
            known = false;
            break;
        }
        if (!have && missing++ < 3) {
            size_t l = strlen(list);
            char k[100];
            show_key(k, sizeof k, keys[i]);
            ddp__fmt(list + l, sizeof list - l, "%s%s", l ? ", " : "", k);
        }
    }
    s->timeout_ms = saved;
    if (!known || !missing)
        return ddp__errmsg(s->err, DDP_ERR_TIMEOUT,
                           "store wait for %zu keys timed out after %s at '%s:%d'", n, waited,
                           s->host, s->port);
    return ddp__errmsg(
        s->err, DDP_ERR_TIMEOUT,
        "store wait for %zu keys timed out after %s at '%s:%d'; %zu of %zu keys still "
        "missing: %s%s",
        n, waited, s->host, s->port, missing, n, list, missing > 3 ? ", …" : "");
}

ddp_status ddp_store_delete(ddp_store *s, const char *key, bool *deleted)
{
    ddp_status st = check_key(s, "delete", key);
    if (st)
        return st;
    begin(s, DDP__OP_DELETE);
    ddp__buf_blob(&s->req, key, strlen(key));
    ddp__buf_frame_end(&s->req);
    ddp__rd r;
    if ((st = call(s, "delete", key, &r)))
        return st;
    uint8_t existed;
    if (!ddp__rd_u8(&r, &existed) || r.left)
        return malformed(s, "delete");
    if (deleted)
        *deleted = existed != 0;
    return DDP_OK;
}

static ddp_status on_close(ddp_store *s, const char *key, const void *value, size_t len,
                           bool if_absent)
{
    ddp_status st;
    const char *k = key ? key : "";
    if (!s)
        return DDP_ERR_INVALID;
    if ((*k && (st = check_key(s, "on_close", k))) || (st = check_value(s, "on_close", k, len)))
        return st;
    if (!value && len)
        return ddp__errmsg(s->err, DDP_ERR_INVALID, "store on_close: value is NULL");
    begin(s, DDP__OP_ON_CLOSE);
    ddp__buf_blob(&s->req, k, strlen(k));
    ddp__buf_blob(&s->req, value, len);
    if (if_absent) /* absent: the request as before 2026-11-26, set whatever the key holds */
        ddp__buf_u8(&s->req, 1);
    ddp__buf_frame_end(&s->req);
    ddp__rd r;
    return call(s, "on_close", k, &r);
}

ddp_status ddp_store_on_close(ddp_store *s, const char *key, const void *value, size_t len)
{
    return on_close(s, key, value, len, false);
}

ddp_status ddp_store_on_close_first(ddp_store *s, const char *key, const void *value, size_t len)
{
    return on_close(s, key, value, len, true);
}

ddp_status ddp_store_abort_on(ddp_store *s, const char *key)
{
    if (!s)
        return DDP_ERR_INVALID;
    if (key && *key) {
        ddp_status st = check_key(s, "abort_on", key);
        if (st)
            return st;
        char *k = strdup(key);
        if (!k)
            return ddp__errmsg(s->err, DDP_ERR_NOMEM, "out of memory for the store's abort key");
        free(s->abort_key);
        s->abort_key = k;
        s->abort_sent = false; /* registered with the next call */
        return DDP_OK;
    }
    bool was = s->abort_key && s->abort_sent && s->fd >= 0;
    free(s->abort_key);
    s->abort_key = NULL;
    s->abort_sent = false;
    if (!was)
        return DDP_OK;
    begin(s, DDP__OP_ABORT_ON); /* cleared on the connection too */
    ddp__buf_blob(&s->req, "", 0);
    ddp__buf_frame_end(&s->req);
    ddp__rd r;
    return call(s, "abort_on", NULL, &r);
}

ddp_status ddp_store_check_abort(ddp_store *s)
{
    if (!s)
        return DDP_ERR_INVALID;
    if (!s->abort_key)
        return DDP_OK;
    const char *keys[1] = {s->abort_key};
    bool set = false;
    ddp_status st = ddp_store_check(s, keys, 1, &set);
    if (st != DDP_OK || !set)
        return st;
    void *v = NULL;
    size_t len = 0;
    if ((st = ddp_store_get(s, keys[0], &v, &len)) != DDP_OK)
        return st;
    if (len)
        ddp__errmsg(s->err, DDP_ERR_CLOSED, "%.*s", (int)(len > 400 ? 400 : len), (const char *)v);
    else /* set empty: still a message, as call() gives */
        ddp__errmsg(s->err, DDP_ERR_CLOSED, "store: the abort key '%s' is set, empty", keys[0]);
    free(v);
    return DDP_ERR_CLOSED;
}

ddp_status ddp_store_num_keys(ddp_store *s, int64_t *out)
{
    if (!s)
        return DDP_ERR_INVALID;
    begin(s, DDP__OP_NUM_KEYS);
    ddp__buf_frame_end(&s->req);
    ddp__rd r;
    ddp_status st = call(s, "num_keys", NULL, &r);
    if (st)
        return st;
    int64_t v;
    if (!ddp__rd_i64(&r, &v) || r.left)
        return malformed(s, "num_keys");
    if (out)
        *out = v;
    return DDP_OK;
}

ddp_status ddp_store_barrier(ddp_store *s, const char *name, int nranks)
{
    if (!s)
        return DDP_ERR_INVALID;
    if (!name || nranks < 1 || strlen(name) > DDP_STORE_MAX_KEY - 32)
        return ddp__errmsg(s->err, DDP_ERR_INVALID, "store barrier: needs a name and nranks ≥ 1");
    char count_key[DDP_STORE_MAX_KEY + 1], done_key[DDP_STORE_MAX_KEY + 1];
    ddp__fmt(count_key, sizeof count_key, "barrier/%s/count", name);
    ddp__fmt(done_key, sizeof done_key, "barrier/%s/done", name);
    int64_t start = ddp__now_ms();
    int64_t n;
    ddp_status st = ddp_store_add(s, count_key, 1, &n);
    if (st)
        return st;
    if (n > nranks)
        return ddp__errmsg(
            s->err, DDP_ERR_INVALID,
            "barrier '%s' was entered by more than %d rank%s: use a new name for each "
            "barrier (add a counter)",
            name, nranks, nranks == 1 ? "" : "s");
    if (n == nranks && (st = ddp_store_set(s, done_key, "1", 1)))
        return st;
    const char *keys[1] = {done_key};
    st = ddp_store_wait(s, keys, 1);
    if (st != DDP_ERR_TIMEOUT)
        return st;
    char msg[DDP_ERRMSG_MAX];
    memcpy(msg, s->err, sizeof msg);
    int saved = s->timeout_ms;
    s->timeout_ms = 2000;
    int64_t arrived = -1;
    (void)ddp_store_add(s, count_key, 0, &arrived);
    s->timeout_ms = saved;
    char waited[32];
    ddp__fmt_duration(waited, sizeof waited, ddp__now_ms() - start);
    if (arrived >= 0)
        return ddp__errmsg(
            s->err, DDP_ERR_TIMEOUT,
            "barrier '%s' timed out after %s (%lld of %d rank%s arrived); the missing "
            "ranks may have failed, hung, or not been started",
            name, waited, (long long)arrived, nranks, nranks == 1 ? "" : "s");
    return ddp__errmsg(s->err, DDP_ERR_TIMEOUT, "barrier '%s' timed out after %s (%s)", name,
                       waited, msg);
}

ddp_status ddp_random_token(char *out, size_t len, ddp_error *err)
{
    if (!out || len > 128)
        return ddp__err(err, DDP_ERR_INVALID, "ddp_random_token: out is NULL or len > 128");
    char hex[129];
    ddp_status st = ddp__random_hex(hex, (len + 1) / 2, err);
    if (st)
        return st;
    memcpy(out, hex, len);
    out[len] = '\0';
    return DDP_OK;
}

/* ---- who hosts the store -------------------------------------------------------------------- */

/* Rank 0's store could not listen on a taken port: net.c's message with its advice (ddprun's
 * flags) replaced by the launcher's. */
static ddp_status port_taken(ddp_error *err, ddp_status st, const char *advice)
{
    char why[DDP_ERRMSG_MAX];
    snprintf(why, sizeof why, "%s", err->msg);
    char *cut = strstr(why, "; another job or program holds this port");
    if (cut)
        *cut = '\0';
    return ddp__err(err, st, "%s; another job or program holds this port: %s", why, advice);
}

ddp_status ddp_store_open_world(const ddp_world *w, int timeout_ms, ddp_store **out, ddp_error *err)
{
    if (!w || !out)
        return ddp__err(err, DDP_ERR_INVALID, "ddp_store_open_world: w and out are required");
    ddp_store_opts o = DDP_STORE_OPTS_INIT;
    o.host = w->master_addr;
    o.port = w->master_port;
    o.token = w->store_token;
    o.timeout_ms = timeout_ms;
    o.connect_timeout_ms = timeout_ms;
    ddp_store_server *srv = NULL;
    char token[65];
    ddp_status st;

    bool private_store =
        !w->launched || (w->world_size == 1 && !w->agent_store && !w->master_known);
    if (!w->agent_store && !w->master_known && w->world_size > 1 &&
        w->launcher != DDP_LAUNCHER_ENV && w->launcher != DDP_LAUNCHER_NONE) {
        /* mpirun or a PMI launcher without a store address: each rank would otherwise guess
         * 127.0.0.1:29500, or worse, run alone. Only a self-bootstrapping backend (MPI) can
         * bring this world up without one. Under srun (its node list missing: a stripped
         * environment) mpirun's -x is no advice. */
        if (w->launcher == DDP_LAUNCHER_SLURM)
            return ddp__err(
                err, DDP_ERR_INVALID,
                "this process is rank %d of %d started by srun, but no rendezvous "
                "store address is known (MASTER_ADDR and MASTER_PORT are unset, and "
                "no SLURM_STEP_NODELIST, SLURM_JOB_NODELIST or SLURM_NODELIST names "
                "rank 0's host); export MASTER_ADDR=<rank 0's host> and MASTER_PORT="
                "<free port> for every task, or use the MPI backend (docs/launchers.md)",
                w->rank, w->world_size);
        return ddp__err(err, DDP_ERR_INVALID,
                        "this process is rank %d of %d started by %s, but no rendezvous store "
                        "address is known (MASTER_ADDR and MASTER_PORT are unset); use the MPI "
                        "backend (--backend mpi, in a ddpc built with MPI) or give every rank "
                        "the store's address, e.g. 'mpirun -x MASTER_ADDR=<rank 0's host> -x "
                        "MASTER_PORT=<free port> …' (docs/launchers.md)",
                        w->rank, w->world_size,
                        w->launcher == DDP_LAUNCHER_ENV ? "hand" : ddp_launcher_name(w->launcher));
    }
    if (private_store) {
        /* A world of one: a private server on a free loopback port with a fresh token. */
        if ((st = ddp_random_token(token, 32, err)))
            return st;
        ddp_store_server_opts so = DDP_STORE_SERVER_OPTS_INIT;
        so.host = "127.0.0.1";
        so.token = token;
        if ((st = ddp_store_server_start(&so, &srv, err)))
            return st;
        o.host = "127.0.0.1";
        o.port = ddp_store_server_port(srv);
        o.token = token;
    } else if (!w->agent_store && w->rank == 0) {
        /* Started by hand or by another launcher: rank 0 hosts, like torch's env:// init. */
        ddp_store_server_opts so = DDP_STORE_SERVER_OPTS_INIT;
        so.host = w->master_addr;
        so.port = w->master_port;
        so.token = w->store_token;
        st = ddp_store_server_start(&so, &srv, err);
        if (st == DDP_ERR_SYSTEM) {
            /* MASTER_ADDR may name this host by an address we cannot bind (NAT, an alias):
             * listen on every interface instead. */
            so.host = NULL;
            st = ddp_store_server_start(&so, &srv, err);
        }
        if (st == DDP_ERR_ADDR_IN_USE && err) {
            /* net.c's advice names ddprun's flags; rank 0 here was started otherwise. */
            char adv[300];
            if (w->beside_torch_store)
                snprintf(adv, sizeof adv,
                         "under torchrun's static rendezvous its own store holds MASTER_PORT "
                         "%d, and rank 0 hosts ddpc's on the next port: give torchrun a "
                         "--master_port whose next port is free too",
                         w->master_port - 1);
            else if (w->launcher == DDP_LAUNCHER_SLURM)
                snprintf(adv, sizeof adv,
                         "under srun without MASTER_PORT the port comes from SLURM_JOB_ID and "
                         "the step, and another job's step on this node may hold it: export "
                         "MASTER_PORT=<a free port> for every task");
            else
                snprintf(adv, sizeof adv,
                         "rank 0 hosts the store on MASTER_PORT (started by %s): give every rank "
                         "another free MASTER_PORT",
                         w->launcher == DDP_LAUNCHER_ENV ? "hand" : ddp_launcher_name(w->launcher));
            return port_taken(err, st, adv);
        }
        if (st)
            return st;
        if (!w->store_token[0] && w->world_size > 1)
            fprintf(stderr,
                    "ddp: the store on '%s:%d' accepts any connection because "
                    "DDP_STORE_TOKEN is not set; set it to the same secret on every rank "
                    "(ddprun does this for you)\n",
                    w->master_addr, w->master_port);
    }
    ddp_store *s = NULL;
    st = ddp_store_connect(&o, &s, err);
    if (st) {
        ddp_store_server_stop(srv);
        return st;
    }
    s->server = srv;
    *out = s;
    return DDP_OK;
}
