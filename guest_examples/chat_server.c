/*
 * chat_server.c - an HTTP/1.1 chat server in the shape of LlamaEdge's OpenAI API server: every chat
 * request opens a new execution context and never finalizes it (as llama-api-server does on
 * WasmEdge, which never frees them either), so a host must keep thousands of idle contexts cheap.
 *
 * Usage:  chat_server.wasm ALIAS ADDR PORT
 *   ALIAS  name of a model preloaded by the host (load_by_name_with_config once, config from the
 *          environment as in guest_common.h; the same config is the metadata of every context)
 *   ADDR   IPv4 address to listen on (dotted quad); PORT  port (0: any free port)
 *
 * Routes (HTTP/1.1 keep-alive; "Connection: close" in a request closes after the answer):
 *   GET /health               -> 200 "ok\n"
 *   POST /v1/chat/completions -> the body is the prompt: init_execution_context, set_input
 *                                (metadata if configured, then the prompt), compute, get_output(0),
 *                                get_output(1); 200 with the generated text and the header
 *                                "X-Context: N" (the new context's handle), or 500
 *                                "wasi-nn error: CALL returned N\n"
 *   POST /quit                -> 200 "bye\n", then every socket is closed and the guest exits 0
 *   anything else             -> 404 "not found\n"; a request over 16 KiB -> 413, connection closed
 *
 * A connection's trouble is that connection's alone: a client that resets before it is served
 * (sock_getpeeraddr or a read fails), a failed write, or no free connection slot (64) closes that
 * connection and the server goes on.  Sockets are non-blocking, served from one poll_oneoff loop.
 *
 * Output: stdout "listening on A.B.C.D:PORT\n" once listening (flushed), "bye after N chats\n" at the
 * end; stderr one line per dropped connection or failed chat.
 * Exit: 0 after /quit; 1 if the listener fails; 2 wrong arguments.
 */
#include "http_server.h"

#define MAX_CONNS 64
#define TICK_NS 250000000ull

typedef struct {
    int open;
    uint32_t fd;
    size_t len;
    char buf[HTTP_REQUEST_MAX];
} conn_t;

static conn_t conns[MAX_CONNS];
static unsigned chats;
static uint32_t graph;
static int graph_ready;
static strbuf_t config;
static int configured;
static const char *alias;

static void listener_fail(const char *call, int32_t rc) {
    fprintf(stderr, "socket error: %s returned %d\n", call, (int)rc);
    exit(1);
}

static void close_fd(uint32_t fd) {
    int32_t rc = __wasi_fd_close(fd);
    if (rc != 0) fprintf(stderr, "fd_close returned %d\n", (int)rc);
}

static void drop_conn(conn_t *c) {
    ws_shutdown(c->fd, SHUT_RDWR); /* NOTCONN when the peer has gone: fine */
    close_fd(c->fd);
    c->open = 0;
}

static int32_t respond(conn_t *c, int status, const char *reason, const char *extra, const char *body,
                       size_t body_len, int closing) {
    return http_respond(c->fd, status, reason, extra, body, body_len, closing, 0);
}

/* One chat: a new execution context, never finalized. *status 200 or 500; *ctx its handle. */
static size_t chat(const char *prompt, size_t len, char *out, size_t cap, int *status, uint32_t *ctx) {
    static char meta[GUEST_METADATA_MAX];
    int32_t rc = 0;
    const char *call = NULL;
    size_t out_len = 0, meta_len = 0;
    *status = 500;
    if (!graph_ready) {
        configured = build_config_json(&config);
        rc = wasi_nn_load_by_name_with_config(WASI_NN_PTR(alias), (uint32_t)strlen(alias),
                                              WASI_NN_PTR(config.data), (uint32_t)config.len,
                                              WASI_NN_PTR(&graph));
        if (rc != 0) call = "load_by_name_with_config";
        else graph_ready = 1;
    }
    if (!call && (rc = wasi_nn_init_execution_context(graph, WASI_NN_PTR(ctx))) != 0) call = "init_execution_context";
    if (!call && configured && (rc = nn_set_text(*ctx, WASI_NN_INDEX_METADATA, config.data, config.len)) != 0)
        call = "set_input (metadata)";
    if (!call && (rc = nn_set_prompt(*ctx, prompt, len)) != 0) call = "set_input";
    if (!call && (rc = wasi_nn_compute(*ctx)) != 0) call = "compute";
    if (!call && (rc = nn_get_output(*ctx, WASI_NN_INDEX_PROMPT, out, cap, &out_len)) != 0) call = "get_output";
    if (!call && (rc = nn_get_metadata(*ctx, meta, sizeof meta, &meta_len)) != 0) call = "get_output (metadata)";
    if (call) {
        fprintf(stderr, "chat %u: %s returned %d\n", chats, call, (int)rc);
        return (size_t)snprintf(out, cap, "wasi-nn error: %s returned %d\n", call, (int)rc);
    }
    *status = 200;
    return out_len;
}

/* Answer every complete request in c->buf. Returns 1 to close the connection, 2 to quit, else 0. */
static int serve_buffered(conn_t *c) {
    static char out[GUEST_OUTPUT_MAX];
    for (;;) {
        size_t head_len = 0, body_len = 0;
        int got = http_next_request(c->fd, c->buf, c->len, &head_len, &body_len, 0);
        if (got <= 0) return got < 0; /* incomplete, or too large: answered 413, close */
        const char *end = c->buf + head_len;
        int closing = http_says_close(c->buf, head_len), quit = 0;
        int32_t rc;
        if (strncmp(c->buf, "GET /health ", 12) == 0) {
            rc = respond(c, 200, "OK", "", "ok\n", 3, closing);
        } else if (strncmp(c->buf, "POST /v1/chat/completions ", 26) == 0) {
            int status = 0;
            uint32_t ctx = 0;
            char extra[40] = "";
            size_t n = chat(end, body_len, out, sizeof out, &status, &ctx);
            chats++;
            if (status == 200) snprintf(extra, sizeof extra, "X-Context: %u\r\n", (unsigned)ctx);
            rc = respond(c, status, status == 200 ? "OK" : "Internal Server Error", extra, out, n, closing);
        } else if (strncmp(c->buf, "POST /quit ", 11) == 0) {
            rc = respond(c, 200, "OK", "", "bye\n", 4, 1);
            quit = 1;
        } else {
            rc = respond(c, 404, "Not Found", "", "not found\n", 10, closing);
        }
        http_consume(c->buf, &c->len, head_len + body_len);
        if (quit) return 2;
        if (rc != 0 || closing) return 1;
    }
}

/* Read what has arrived on c. Returns 1 to close, 2 to quit, else 0. */
static int on_readable(conn_t *c) {
    if (c->len == HTTP_REQUEST_MAX) return serve_buffered(c);
    __wasi_iovec_t iov = {.buf = (uint8_t *)c->buf + c->len, .buf_len = HTTP_REQUEST_MAX - c->len};
    uint32_t got = 0;
    uint16_t roflags = 0;
    int32_t rc = ws_recv(c->fd, &iov, 1, 0, &got, &roflags);
    if (rc == __WASI_ERRNO_AGAIN) return 0;
    if (rc != 0 || got == 0) return 1; /* reset or closed by the peer */
    c->len += got;
    return serve_buffered(c);
}

static void accept_all(uint32_t listener) {
    for (;;) {
        uint32_t fd = 0;
        int32_t rc = ws_accept(listener, &fd);
        if (rc == __WASI_ERRNO_AGAIN) return;
        if (rc != 0) { /* e.g. the client reset before it was accepted, or no descriptor left */
            fprintf(stderr, "accept: sock_accept returned %d\n", (int)rc);
            return;
        }
        conn_t *c = NULL;
        for (int i = 0; i < MAX_CONNS && !c; i++)
            if (!conns[i].open) c = &conns[i];
        uint8_t ip[4] = {0};
        wasi_address_t addr = {.buf = WASI_NN_PTR(ip), .buf_len = 4};
        uint32_t type = 0, port = 0;
        if (!c || __wasi_fd_fdstat_set_flags(fd, __WASI_FDFLAGS_NONBLOCK) != 0 ||
            (rc = ws_getpeeraddr(fd, &addr, &type, &port)) != 0) {
            fprintf(stderr, "accept: connection dropped (%s)\n", c ? "the client has gone" : "no free slot");
            ws_shutdown(fd, SHUT_RDWR);
            close_fd(fd);
            continue;
        }
        c->open = 1;
        c->fd = fd;
        c->len = 0;
    }
}

int main(int argc, char **argv) {
    uint8_t ip[4];
    uint32_t port = 0;
    if (argc != 4 || http_parse_addr(argv[2], argv[3], ip, &port) != 0) {
        fputs("usage: chat_server.wasm ALIAS ADDR PORT\n", stderr);
        return 2;
    }
    alias = argv[1];
    int32_t rc;
    uint32_t type = 0, bound_port = 0;
    uint32_t listener = http_listen(ip, port, 64, &bound_port, &type, listener_fail);
    printf("listening on %u.%u.%u.%u:%u\n", ip[0], ip[1], ip[2], ip[3], (unsigned)bound_port);
    fflush(stdout);

    static __wasi_subscription_t subs[MAX_CONNS + 2];
    static __wasi_event_t events[MAX_CONNS + 2];
    int quit = 0;
    while (!quit) {
        __wasi_size_t nsubs = 0, nevents = 0;
        memset(subs, 0, sizeof subs);
        http_sub_read(&subs[nsubs++], 0, listener);
        for (int i = 0; i < MAX_CONNS; i++) {
            if (!conns[i].open) continue;
            http_sub_read(&subs[nsubs++], (uint64_t)(i + 1), conns[i].fd);
        }
        http_sub_clock(&subs[nsubs++], UINT64_MAX, TICK_NS);
        if ((rc = __wasi_poll_oneoff(subs, events, nsubs, &nevents)) != 0) listener_fail("poll_oneoff", rc);
        for (__wasi_size_t e = 0; e < nevents && !quit; e++) {
            uint64_t who = events[e].userdata;
            if (who == UINT64_MAX) continue; /* the clock: poll again */
            if (who == 0) {
                if (events[e].error != 0) listener_fail("poll_oneoff (listener)", events[e].error);
                accept_all(listener);
                continue;
            }
            conn_t *c = &conns[who - 1];
            if (!c->open) continue;
            int what = events[e].error != 0 ? 1 : on_readable(c);
            if (what >= 1) drop_conn(c);
            if (what == 2) quit = 1;
        }
    }
    for (int i = 0; i < MAX_CONNS; i++)
        if (conns[i].open) drop_conn(&conns[i]);
    close_fd(listener);
    sb_free(&config);
    printf("bye after %u chats\n", chats);
    return 0;
}
