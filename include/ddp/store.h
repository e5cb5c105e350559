/*
 * ddp/store.h — the rendezvous store: a TCP key-value server and its client.
 *
 * Workers meet through it before any collective exists: they publish addresses, count arrivals
 * and wait for each other. Operations follow torch's TCPStore (set, get, add, compare_set, check,
 * wait, delete, num_keys) with three differences that users of TCPStore asked for:
 *   - every call has a deadline, and a timeout names the key and the time waited;
 *   - a per-job token is checked on every connection; a stranger is refused and logged;
 *   - message sizes and the store's total size are bounded; a malformed message closes that
 *     connection only.
 * Keys are NUL-terminated strings of at most DDP_STORE_MAX_KEY bytes; values are bytes. Counters
 * made by ddp_store_add() are stored as decimal text ("42"), so ddp_store_get() can read them.
 *
 * Threads: a ddp_store client handle is used from one thread at a time; use one handle per
 * thread. The server runs its own thread and is safe to stop from any one thread.
 */
#ifndef DDP_STORE_H
#define DDP_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ddp/status.h"
#include "ddp/world.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DDP_STORE_MAX_KEY 4096                  /* bytes in one key, without the NUL */
#define DDP_STORE_DEFAULT_TIMEOUT_MS 300000     /* 5 min, torch's TCPStore default */
#define DDP_STORE_DEFAULT_MAX_VALUE (64u << 20) /* bytes in one value */

/* ---------------------------------------------------------------------------------------- */
/* Server                                                                                   */

typedef struct ddp_store_server ddp_store_server;

/* Called from the server thread for each refused connection or dropped message, with one line
 * of text. ctx is the opts' log_ctx. Must not call back into the server. */
typedef void (*ddp_store_log_fn)(void *ctx, const char *line);

typedef struct ddp_store_server_opts {
    const char *host;     /* address to listen on; NULL or "" listens on all interfaces */
    int port;             /* 0 picks a free port (see ddp_store_server_port()) */
    const char *token;    /* required of every client; "" accepts anyone (as TCPStore does) */
    size_t max_value;     /* largest value accepted; bigger messages close the connection */
    size_t max_total;     /* bytes of keys+values the store may hold; a set beyond it fails */
    int max_connections;  /* connections beyond it are closed at once */
    int handshake_ms;     /* a connection that has not shown its token by then is closed */
    ddp_store_log_fn log; /* NULL logs to stderr as "ddp store: …" */
    void *log_ctx;
} ddp_store_server_opts;

#define DDP_STORE_SERVER_OPTS_INIT                                                                 \
    {                                                                                              \
        NULL, 0, "", DDP_STORE_DEFAULT_MAX_VALUE, (size_t)1 << 30, 4096, 10000, NULL, NULL         \
    }

/* Binds, listens and starts the server thread. A taken port fails with DDP_ERR_ADDR_IN_USE and a
 * message naming address and port. *out written only on DDP_OK; err may be NULL. */
ddp_status ddp_store_server_start(const ddp_store_server_opts *opts, ddp_store_server **out,
                                  ddp_error *err);

/* The port the server listens on (useful after asking for port 0). */
int ddp_store_server_port(const ddp_store_server *srv);

/* Connections refused so far (wrong token, malformed or oversized messages, over the limit). */
uint64_t ddp_store_server_refused(const ddp_store_server *srv);

/* Stops the thread, closes every connection and frees srv. Clients blocked in get/wait see the
 * connection drop (DDP_ERR_NETWORK). NULL is a no-op. */
void ddp_store_server_stop(ddp_store_server *srv);

/* ---------------------------------------------------------------------------------------- */
/* Client                                                                                   */

typedef struct ddp_store ddp_store;

typedef struct ddp_store_opts {
    const char *host; /* store address (name or IP) */
    int port;
    const char *token;      /* the job's token; NULL or "" for a server without one */
    int timeout_ms;         /* deadline of each call; ≤ 0 means DDP_STORE_DEFAULT_TIMEOUT_MS */
    int connect_timeout_ms; /* how long to keep retrying a refused connection, at the first
                               connect and at a call's reconnection; ≤ 0: the call timeout
                               (timeout_ms, then ddp_store_set_timeout's) */
} ddp_store_opts;

#define DDP_STORE_OPTS_INIT                                                                        \
    {                                                                                              \
        "127.0.0.1", DDP_DEFAULT_MASTER_PORT, "", 0, 0                                             \
    }

/* Connects and shows the token, retrying a refused connection until connect_timeout_ms (the
 * server may not be up yet). A wrong token fails with DDP_ERR_AUTH. *out written only on DDP_OK. */
ddp_status ddp_store_connect(const ddp_store_opts *opts, ddp_store **out, ddp_error *err);

/* A new connection to the store s talks to (its address, token and timeouts; never a server of
 * its own, even when s hosts one): torch's Store.clone(), for another thread, since a handle is
 * used from one thread at a time. *out written only on DDP_OK. */
ddp_status ddp_store_clone(const ddp_store *s, ddp_store **out, ddp_error *err);

/* Connects to the job's store as the environment in w describes it. When a launcher hosts the
 * store (ddprun), this connects to it. When the program was started by hand or by another
 * launcher (RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT set, no agent store), rank 0 starts a server
 * on MASTER_ADDR:MASTER_PORT inside this handle and the other ranks connect to it; such a server
 * stops when rank 0 closes its handle; under srun without MASTER_ADDR/MASTER_PORT that is rank 0's
 * node and a port derived from the job (ddp_world_from_env). A world of one (or a launcher's world
 * of one with no store address) gets a private server on a free loopback port. A world of several
 * started by mpirun or a PMI launcher with no store address fails with DDP_ERR_INVALID saying
 * what to do: nothing else could tell its ranks where to meet. timeout_ms bounds the connection and
 * becomes the handle's call timeout (≤ 0: the default). *out written only on DDP_OK.
 * The hosting rank's ddp_store_close() waits for the other ranks to disconnect (see below). */
ddp_status ddp_store_open_world(const ddp_world *w, int timeout_ms, ddp_store **out,
                                ddp_error *err);

/* Closes the connection. A handle that hosts the store (rank 0 started by hand) first waits
 * until every other client has disconnected, then stops the server: so rank 0 finishing first
 * does not cut the others off mid-call. The wait ends early once every client left has been
 * silent (no request, no connect, no hang-up) for 2 s, since a rank whose host vanished never
 * hangs up, and lasts at most the handle's timeout or 30 s. NULL is a no-op. */
void ddp_store_close(ddp_store *s);

/* Sets the deadline used by every later call on s; ≤ 0 restores the default. */
void ddp_store_set_timeout(ddp_store *s, int timeout_ms);

/* Whether the last call on s failed because its connection was gone and the store's host refused
 * a new one for connect_timeout_ms (nothing listens there: the store's process ended), rather than
 * timing out (a slow or unreachable host, which may come back). A call reconnects for at most
 * connect_timeout_ms. false for NULL and after a call that succeeded or failed otherwise. */
bool ddp_store_refused(const ddp_store *s);

/* Stores len bytes of value under key, replacing any old value, and wakes waiters on key.
 * Borrows key and value for the call. */
ddp_status ddp_store_set(ddp_store *s, const char *key, const void *value, size_t len);

/* Waits until key exists, then returns its value in a new buffer (*value, *len), NUL-terminated
 * for convenience (the NUL is not counted in *len); caller frees with free(). Times out with
 * DDP_ERR_TIMEOUT naming the key. */
ddp_status ddp_store_get(ddp_store *s, const char *key, void **value, size_t *len);

/* Atomically adds delta to the counter at key (created at 0) and returns the new value in *out
 * (out may be NULL). Fails with DDP_ERR_INVALID if key holds something that is not an integer. */
ddp_status ddp_store_add(ddp_store *s, const char *key, int64_t delta, int64_t *out);

/* Atomically: if key is absent and expected_len is 0, or key holds exactly `expected`, sets it to
 * `desired`. Either way returns what key holds afterwards in a new buffer (*current, *current_len;
 * caller frees with free(); an absent key gives an empty buffer). Both out arguments may be NULL.
 */
ddp_status ddp_store_compare_set(ddp_store *s, const char *key, const void *expected,
                                 size_t expected_len, const void *desired, size_t desired_len,
                                 void **current, size_t *current_len);

/* Sets *out to whether all n keys exist, without waiting. */
ddp_status ddp_store_check(ddp_store *s, const char *const *keys, size_t n, bool *out);

/* Waits until all n keys exist. Times out with DDP_ERR_TIMEOUT naming the keys still missing. */
ddp_status ddp_store_wait(ddp_store *s, const char *const *keys, size_t n);

/* Removes key; *deleted (may be NULL) says whether it existed. */
ddp_status ddp_store_delete(ddp_store *s, const char *key, bool *deleted);

/* Sets *out to the number of keys in the store. */
ddp_status ddp_store_num_keys(ddp_store *s, int64_t *out);

/* Asks the server to set key = value once this connection closes without the server stopping:
 * the client died, its process was killed (the kernel closes its socket), or it called
 * ddp_store_close(). A presence mark: another client learns at once that this one is gone. The
 * registration belongs to the connection: one made anew after an error (the next call
 * reconnects) has none, and the broken one's key is set. An empty or NULL key cancels. */
ddp_status ddp_store_on_close(ddp_store *s, const char *key, const void *value, size_t len);
/* As ddp_store_on_close, but at the close the key is set only if it is absent then: a mark that
 * must not replace a cause set before it (the first failure of a group, docs/group.md). */
ddp_status ddp_store_on_close_first(ddp_store *s, const char *key, const void *value, size_t len);

/* From now on a get, wait or barrier on this handle that waits for a key ends as soon as key
 * exists, with DDP_ERR_CLOSED and key's value as its message (ddp_store_last_error): a failure
 * another client announces by setting key ("rank 3 failed while the group formed: …"), so that
 * the others stop at once rather than at their timeout. One key per handle; it holds across
 * reconnections; NULL or "" clears it. DDP_ERR_INVALID for a bad key. Not thread-safe with other
 * calls on the handle. */
ddp_status ddp_store_abort_on(ddp_store *s, const char *key);
/* Whether the abort key exists now, without waiting: DDP_ERR_CLOSED with its value as the message
 * if it does, DDP_OK if not (or none is set), a store error otherwise. For a wait that is not on
 * the store (a socket's accept) to look between its polls. */
ddp_status ddp_store_check_abort(ddp_store *s);

/* A barrier through the store for nranks participants. name must be new for each use (add a
 * counter: "step/17"). A timeout says how many of nranks arrived: "barrier 'x' timed out after
 * 30 s (3 of 4 ranks arrived)". */
ddp_status ddp_store_barrier(ddp_store *s, const char *name, int nranks);

/* Writes len random lowercase hex characters and a NUL into out (len+1 bytes), from the
 * kernel's random source: for store tokens and run ids. len ≤ 128. */
ddp_status ddp_random_token(char *out, size_t len, ddp_error *err);

/* The message of the last failed call on s, one line; "" if none. Owned by s, valid until the
 * next call on s. */
const char *ddp_store_last_error(const ddp_store *s);

#ifdef __cplusplus
}
#endif
#endif /* DDP_STORE_H */
