/*
 * socket_server.c - a tiny HTTP/1.1 server on WasmEdge's socket extension that answers completions.
 *
 * Usage:  socket_server.wasm ALIAS ADDR PORT
 *   ALIAS  name of a model preloaded by the host (load_by_name_with_config, config from the
 *          environment as in guest_common.h)
 *   ADDR   IPv4 address to listen on (dotted quad); PORT  port (0: any free port)
 *
 * Drives the socket ABI the way mio_wasi / tokio_wasi (LlamaEdge's servers) do:
 *   sock_open(INET4, STREAM) -> sock_setsockopt(SOL_SOCKET, SO_REUSEADDR) -> sock_bind ->
 *   sock_listen -> fd_fdstat_set_flags(NONBLOCK) -> sock_getlocaladdr (V1), then a loop:
 *   poll_oneoff over the listener, every connection and a 250 ms relative clock;
 *   sock_accept (V1, two arguments) until AGAIN; on each new connection fd_fdstat_set_flags(NONBLOCK),
 *   fd_fdstat_get (checks the socket file type and NONBLOCK; exit 1 if wrong) and sock_getpeeraddr;
 *   reads with sock_recv on even connections and fd_read on odd ones (numbered from 0); writes the
 *   status line and headers with sock_send and the body with fd_write (as hyper does: two writes);
 *   a full socket waits in poll_oneoff for fd_write; sock_shutdown + fd_close to end a connection.
 *
 * A server must outlive its clients, so a problem with one client ends only that connection:
 *   - a client that resets before the server has looked at it (sock_getpeeraddr returns NOTCONN, 53) is
 *     closed and forgotten;
 *   - at most MAX_CONNS (64) connections are served at once; when the table is full, or the host refuses
 *     another socket (sock_accept returns MFILE 33 or NFILE 41, the host's socket caps), the connection
 *     that has been quiet longest is closed to make room, so idle clients cannot starve an active one;
 *   - a connection quiet for 30 s (env idle_timeout, in seconds; 0: never) is closed;
 *   - any other error of sock_accept is reported and the server keeps serving.
 *
 * Routes (HTTP/1.1 keep-alive; "Connection: close" in a request closes after the answer):
 *   GET /health     -> 200 "ok\n"
 *   GET /peer       -> 200 "A.B.C.D:PORT\n", the client's address from sock_getpeeraddr
 *   POST /complete  -> 200 the generated text for the body as the prompt (one execution context,
 *                      made on first use, reused); 500 "wasi-nn error: CALL returned N\n" on an error
 *   POST /quit      -> 200 "bye\n", then every socket is closed and the guest exits 0
 *   anything else   -> 404 "not found\n"; a request over 16 KiB -> 413 and the connection closes
 *
 * Output:
 *   stdout: "listening on A.B.C.D:PORT\n" once listening (flushed); "bye after N requests\n" at the end.
 *   stderr: one line per connection event: "connection K from A.B.C.D:PORT",
 *           "connection K closed by the peer", "connection K closed by the peer mid-request (N bytes)",
 *           "connection K: recv error E" (then closed), "connection K closed to make room" (the quietest,
 *           when full), "connection K closed after S s idle", "a connection left before it was served
 *           (sock_getpeeraddr returned E)", "sock_accept returned E".
 * Exit: 0 after /quit; 1 if a socket call fails (the line "socket error: CALL returned E" on stderr);
 *   2 wrong arguments.
 */
#include "http_server.h"

#define MAX_CONNS 64
#define IDLE_SECONDS 30 /* default of env idle_timeout */
#define TICK_NS 250000000ull

typedef struct {
    int open;
    uint32_t fd;
    unsigned id;
    uint64_t active_ns; /* when the connection was accepted or last sent bytes (monotonic clock) */
    size_t len;
    char buf[HTTP_REQUEST_MAX];
    char peer[32];
} conn_t;

static conn_t conns[MAX_CONNS];
static unsigned next_id, served;
static uint32_t nn_ctx;
static int nn_ready;
static const char *alias;
static unsigned idle_seconds = IDLE_SECONDS;

static void sock_fail(const char *call, int32_t rc) {
    fprintf(stderr, "socket error: %s returned %d\n", call, (int)rc);
    exit(1);
}

static uint64_t now_ns(void) {
    __wasi_timestamp_t t = 0;
    int32_t rc = __wasi_clock_time_get(__WASI_CLOCKID_MONOTONIC, 1, &t);
    if (rc != 0) sock_fail("clock_time_get", rc);
    return t;
}

static void format_addr(const uint8_t ip[4], uint32_t port, char *out, size_t cap) {
    snprintf(out, cap, "%u.%u.%u.%u:%u", ip[0], ip[1], ip[2], ip[3], (unsigned)port);
}

static void close_conn(conn_t *c) {
    ws_shutdown(c->fd, SHUT_RDWR); /* may fail with NOTCONN when the peer has gone: fine */
    int32_t rc = __wasi_fd_close(c->fd);
    if (rc != 0) sock_fail("fd_close", rc);
    c->open = 0;
}

/* Headers with sock_send, then the body with fd_write. 0, or the errno of the failed write. */
static int32_t respond(conn_t *c, int status, const char *reason, const char *body, size_t body_len,
                       int closing) {
    return http_respond(c->fd, status, reason, "", body, body_len, closing, 1);
}

/* The completion of prompt into out; *status 200 or 500 (out then holds the error line). */
static size_t complete(const char *prompt, size_t len, char *out, size_t cap, int *status) {
    int32_t rc;
    const char *call = NULL;
    size_t out_len = 0;
    *status = 500;
    if (!nn_ready) {
        strbuf_t config = {0};
        build_config_json(&config);
        uint32_t graph = 0;
        rc = wasi_nn_load_by_name_with_config(WASI_NN_PTR(alias), (uint32_t)strlen(alias),
                                              WASI_NN_PTR(config.data), (uint32_t)config.len,
                                              WASI_NN_PTR(&graph));
        sb_free(&config);
        if (rc != 0) {
            call = "load_by_name_with_config";
        } else if ((rc = wasi_nn_init_execution_context(graph, WASI_NN_PTR(&nn_ctx))) != 0) {
            call = "init_execution_context";
        } else {
            nn_ready = 1;
        }
    }
    if (!call && (rc = nn_set_prompt(nn_ctx, prompt, len)) != 0) call = "set_input";
    if (!call && (rc = wasi_nn_compute(nn_ctx)) != 0) call = "compute";
    if (!call && (rc = nn_get_output(nn_ctx, WASI_NN_INDEX_PROMPT, out, cap, &out_len)) != 0)
        call = "get_output";
    if (call) return (size_t)snprintf(out, cap, "wasi-nn error: %s returned %d\n", call, (int)rc);
    *status = 200;
    return out_len;
}

/* Answer every complete request in c->buf. Returns 1 to close the connection, 2 to quit, else 0. */
static int serve_buffered(conn_t *c) {
    static char out[GUEST_OUTPUT_MAX];
    for (;;) {
        size_t head_len = 0, body_len = 0;
        int got = http_next_request(c->fd, c->buf, c->len, &head_len, &body_len, 1);
        if (got <= 0) return got < 0; /* incomplete, or too large: answered 413, close */
        const char *end = c->buf + head_len;
        int closing = http_says_close(c->buf, head_len);
        int quit = 0;
        int32_t rc;
        served++;
        if (strncmp(c->buf, "GET /health ", 12) == 0) {
            rc = respond(c, 200, "OK", "ok\n", 3, closing);
        } else if (strncmp(c->buf, "GET /peer ", 10) == 0) {
            char line[40];
            int n = snprintf(line, sizeof line, "%s\n", c->peer);
            rc = respond(c, 200, "OK", line, (size_t)n, closing);
        } else if (strncmp(c->buf, "POST /complete ", 15) == 0) {
            int status = 0;
            size_t n = complete(end, body_len, out, sizeof out, &status);
            rc = respond(c, status, status == 200 ? "OK" : "Internal Server Error", out, n, closing);
        } else if (strncmp(c->buf, "POST /quit ", 11) == 0) {
            rc = respond(c, 200, "OK", "bye\n", 4, 1);
            quit = 1;
        } else {
            rc = respond(c, 404, "Not Found", "not found\n", 10, closing);
        }
        http_consume(c->buf, &c->len, head_len + body_len);
        if (quit) return 2;
        if (rc != 0) {
            fprintf(stderr, "connection %u: send error %d\n", c->id, (int)rc);
            return 1;
        }
        if (closing) return 1;
    }
}

/* Read what has arrived on c. Returns 1 to close, 2 to quit, else 0. */
static int on_readable(conn_t *c) {
    if (c->len == HTTP_REQUEST_MAX) return serve_buffered(c);
    __wasi_iovec_t iov = {.buf = (uint8_t *)c->buf + c->len, .buf_len = HTTP_REQUEST_MAX - c->len};
    uint32_t got = 0;
    int32_t rc;
    if (c->id % 2 == 0) {
        uint16_t roflags = 0;
        rc = ws_recv(c->fd, &iov, 1, 0, &got, &roflags);
    } else {
        __wasi_size_t n = 0;
        rc = __wasi_fd_read(c->fd, &iov, 1, &n);
        got = n;
    }
    if (rc == __WASI_ERRNO_AGAIN) return 0;
    if (rc != 0) {
        fprintf(stderr, "connection %u: recv error %d\n", c->id, (int)rc);
        return 1;
    }
    if (got == 0) {
        if (c->len)
            fprintf(stderr, "connection %u closed by the peer mid-request (%zu bytes)\n", c->id, c->len);
        else
            fprintf(stderr, "connection %u closed by the peer\n", c->id);
        return 1;
    }
    c->len += got;
    c->active_ns = now_ns();
    return serve_buffered(c);
}

/* The open connection quiet for longest, or NULL if none is open. */
static conn_t *quietest(void) {
    conn_t *q = NULL;
    for (int i = 0; i < MAX_CONNS; i++)
        if (conns[i].open && (!q || conns[i].active_ns < q->active_ns)) q = &conns[i];
    return q;
}

static void close_quietest(void) {
    conn_t *q = quietest();
    if (!q) return;
    fprintf(stderr, "connection %u closed to make room\n", q->id);
    close_conn(q);
}

/* Accept every waiting connection. Returns 0, or 1 when the listener should rest for a tick (the host
   refused a socket and no connection could be closed to make room, or accept failed). */
static int accept_all(uint32_t listener) {
    for (;;) {
        uint32_t fd = 0;
        int32_t rc = ws_accept(listener, &fd);
        if (rc == __WASI_ERRNO_AGAIN) return 0;
        if (rc == __WASI_ERRNO_MFILE || rc == __WASI_ERRNO_NFILE) { /* the host's socket caps */
            if (!quietest()) {
                fprintf(stderr, "sock_accept returned %d\n", (int)rc);
                return 1;
            }
            close_quietest();
            continue;
        }
        if (rc != 0) { /* e.g. a client that gave up while queued: not the server's problem */
            fprintf(stderr, "sock_accept returned %d\n", (int)rc);
            return 1;
        }
        if ((rc = __wasi_fd_fdstat_set_flags(fd, __WASI_FDFLAGS_NONBLOCK)) != 0)
            sock_fail("fd_fdstat_set_flags", rc);
        __wasi_fdstat_t stat;
        if ((rc = __wasi_fd_fdstat_get(fd, &stat)) != 0) sock_fail("fd_fdstat_get", rc);
        if (stat.fs_filetype != __WASI_FILETYPE_SOCKET_STREAM || !(stat.fs_flags & __WASI_FDFLAGS_NONBLOCK)) {
            fprintf(stderr, "socket error: fd_fdstat_get says filetype %d flags %d\n", stat.fs_filetype,
                    stat.fs_flags);
            exit(1);
        }
        uint8_t ip[4] = {0};
        wasi_address_t addr = {.buf = WASI_NN_PTR(ip), .buf_len = 4};
        uint32_t type = 0, port = 0;
        if ((rc = ws_getpeeraddr(fd, &addr, &type, &port)) != 0) { /* NOTCONN: the client reset already */
            fprintf(stderr, "a connection left before it was served (sock_getpeeraddr returned %d)\n", (int)rc);
            if ((rc = __wasi_fd_close(fd)) != 0) sock_fail("fd_close", rc);
            continue;
        }
        conn_t *c = NULL;
        for (int i = 0; i < MAX_CONNS && !c; i++)
            if (!conns[i].open) c = &conns[i];
        if (!c) { /* full: the quietest connection makes room for the new one */
            c = quietest();
            fprintf(stderr, "connection %u closed to make room\n", c->id);
            close_conn(c);
        }
        c->open = 1;
        c->fd = fd;
        c->id = next_id++;
        c->len = 0;
        c->active_ns = now_ns();
        format_addr(ip, port, c->peer, sizeof c->peer);
        fprintf(stderr, "connection %u from %s\n", c->id, c->peer);
    }
}

/* Close the connections quiet for more than idle_seconds (0: never). */
static void close_idle(void) {
    if (idle_seconds == 0) return;
    uint64_t now = now_ns();
    for (int i = 0; i < MAX_CONNS; i++) {
        conn_t *c = &conns[i];
        if (c->open && now - c->active_ns > (uint64_t)idle_seconds * 1000000000ull) {
            fprintf(stderr, "connection %u closed after %u s idle\n", c->id, idle_seconds);
            close_conn(c);
        }
    }
}

int main(int argc, char **argv) {
    uint8_t ip[4];
    uint32_t port = 0;
    if (argc != 4 || http_parse_addr(argv[2], argv[3], ip, &port) != 0) {
        fputs("usage: socket_server.wasm ALIAS ADDR PORT\n", stderr);
        return 2;
    }
    alias = argv[1];
    const char *idle = env_get("idle_timeout");
    if (idle) {
        long long v = env_parse_int("idle_timeout", idle);
        if (v < 0 || v > 86400) {
            fputs("error: env idle_timeout: seconds from 0 to 86400\n", stderr);
            return 2;
        }
        idle_seconds = (unsigned)v;
    }
    int32_t rc;
    uint32_t type = 0, bound_port = 0;
    /* a backlog of 1024 as tokio's: a burst of connections waits in the queue, not in SYN retries */
    uint32_t listener = http_listen(ip, port, 1024, &bound_port, &type, sock_fail);
    if (type != 4) sock_fail("sock_getlocaladdr (address type)", (int32_t)type);
    char where[32];
    format_addr(ip, bound_port, where, sizeof where);
    printf("listening on %s\n", where);
    fflush(stdout);

    static __wasi_subscription_t subs[MAX_CONNS + 2];
    static __wasi_event_t events[MAX_CONNS + 2];
    int listener_rests = 0;
    for (;;) {
        __wasi_size_t nsubs = 0, nevents = 0;
        memset(subs, 0, sizeof subs);
        if (!listener_rests) {
            http_sub_read(&subs[nsubs++], 0, listener);
        }
        listener_rests = 0;
        for (int i = 0; i < MAX_CONNS; i++) {
            if (!conns[i].open) continue;
            http_sub_read(&subs[nsubs++], (uint64_t)(i + 1), conns[i].fd);
        }
        http_sub_clock(&subs[nsubs++], UINT64_MAX, TICK_NS);
        if ((rc = __wasi_poll_oneoff(subs, events, nsubs, &nevents)) != 0) sock_fail("poll_oneoff", rc);
        int quit = 0;
        for (__wasi_size_t e = 0; e < nevents && !quit; e++) {
            uint64_t who = events[e].userdata;
            if (events[e].error != 0) sock_fail("poll_oneoff (event)", events[e].error);
            if (who == UINT64_MAX) continue; /* the clock: nothing to do, poll again */
            if (who == 0) {
                listener_rests = accept_all(listener);
                continue;
            }
            conn_t *c = &conns[who - 1];
            if (!c->open) continue;
            int what = on_readable(c);
            if (what >= 1) close_conn(c);
            if (what == 2) quit = 1;
        }
        if (quit) break;
        close_idle();
    }
    for (int i = 0; i < MAX_CONNS; i++)
        if (conns[i].open) close_conn(&conns[i]);
    if ((rc = __wasi_fd_close(listener)) != 0) sock_fail("fd_close", rc);
    printf("bye after %u requests\n", served);
    return 0;
}
