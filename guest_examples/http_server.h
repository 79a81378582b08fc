/*
 * http_server.h - static inline HTTP/1.1 plumbing shared by the socket example guests
 * (socket_server.c, chat_server.c) on WasmEdge's socket extension (wasi_snapshot_preview1 sock_*).
 *
 *   ws_*                 the sock_* imports (V1 signatures, as mio_wasi / tokio_wasi call them)
 *   http_parse_addr      "A.B.C.D" and "PORT" arguments -> ip[4], port; 0, or -1 if malformed
 *   http_listen          sock_open(INET4, STREAM), SO_REUSEADDR, sock_bind, sock_listen(backlog),
 *                        NONBLOCK, sock_getlocaladdr; a failed call goes to fail(call, errno)
 *   http_send_all        all of data with sock_send or fd_write, waiting in poll_oneoff (up to
 *                        HTTP_WRITE_WAIT_NS) while the socket is full; 0, or the errno
 *   http_respond         "HTTP/1.1 STATUS REASON", text/plain, Content-Length, extra headers,
 *                        "Connection: close" if closing; the head with sock_send, the body with
 *                        sock_send or fd_write (body_fd_write); 0, or the errno
 *   http_frame           the length of the first complete request in a buffer (head + body by
 *                        Content-Length), 0 while incomplete, -1 if it cannot fit HTTP_REQUEST_MAX
 *   http_next_request    http_frame, answering 413 itself when the request cannot fit
 *   http_consume         drop an answered request from the front of a buffer
 *   http_says_close      whether a request head holds "Connection: close" (case-insensitive)
 *   http_sub_read/clock  fill one poll_oneoff subscription
 */
#ifndef HTTP_SERVER_H
#define HTTP_SERVER_H

#include <wasi/api.h>

#include "guest_common.h"

#define WASI_SOCK(name) __attribute__((import_module("wasi_snapshot_preview1"), import_name(name)))

typedef struct {
    uint32_t buf;
    uint32_t buf_len;
} wasi_address_t;

WASI_SOCK("sock_open") int32_t ws_open(int32_t family, int32_t type, uint32_t *fd);
WASI_SOCK("sock_setsockopt")
int32_t ws_setsockopt(int32_t fd, int32_t level, int32_t name, const void *value, uint32_t size);
WASI_SOCK("sock_bind") int32_t ws_bind(int32_t fd, const wasi_address_t *addr, uint32_t port);
WASI_SOCK("sock_listen") int32_t ws_listen(int32_t fd, int32_t backlog);
WASI_SOCK("sock_accept") int32_t ws_accept(int32_t fd, uint32_t *new_fd);
WASI_SOCK("sock_getlocaladdr")
int32_t ws_getlocaladdr(int32_t fd, wasi_address_t *addr, uint32_t *type, uint32_t *port);
WASI_SOCK("sock_getpeeraddr")
int32_t ws_getpeeraddr(int32_t fd, wasi_address_t *addr, uint32_t *type, uint32_t *port);
WASI_SOCK("sock_recv")
int32_t ws_recv(int32_t fd, const __wasi_iovec_t *iovs, uint32_t n, uint32_t flags, uint32_t *nread,
                uint16_t *roflags);
WASI_SOCK("sock_send")
int32_t ws_send(int32_t fd, const __wasi_ciovec_t *iovs, uint32_t n, uint32_t flags, uint32_t *nwritten);
WASI_SOCK("sock_shutdown") int32_t ws_shutdown(int32_t fd, int32_t how);

#define AF_INET4 1
#define SOCK_STREAM 2
#define SOL_SOCKET 0
#define SO_REUSEADDR 0
#define SHUT_RDWR 3
#define HTTP_REQUEST_MAX 16384
#define HTTP_WRITE_WAIT_NS 5000000000ull

static inline int http_parse_addr(const char *addr, const char *port_text, uint8_t ip[4], uint32_t *port) {
    unsigned a, b, c, d, p;
    if (sscanf(addr, "%u.%u.%u.%u", &a, &b, &c, &d) != 4 || a > 255 || b > 255 || c > 255 || d > 255 ||
        sscanf(port_text, "%u", &p) != 1 || p > 65535)
        return -1;
    ip[0] = (uint8_t)a;
    ip[1] = (uint8_t)b;
    ip[2] = (uint8_t)c;
    ip[3] = (uint8_t)d;
    *port = p;
    return 0;
}

/* A listening non-blocking socket on ip:port; *bound_port and *type from sock_getlocaladdr. */
static inline uint32_t http_listen(uint8_t ip[4], uint32_t port, int32_t backlog, uint32_t *bound_port,
                                   uint32_t *type, void (*fail)(const char *call, int32_t rc)) {
    uint32_t listener = 0;
    int32_t rc;
    if ((rc = ws_open(AF_INET4, SOCK_STREAM, &listener)) != 0) fail("sock_open", rc);
    int32_t one = 1;
    if ((rc = ws_setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one)) != 0)
        fail("sock_setsockopt", rc);
    wasi_address_t addr = {.buf = WASI_NN_PTR(ip), .buf_len = 4};
    if ((rc = ws_bind(listener, &addr, port)) != 0) fail("sock_bind", rc);
    if ((rc = ws_listen(listener, backlog)) != 0) fail("sock_listen", rc);
    if ((rc = __wasi_fd_fdstat_set_flags(listener, __WASI_FDFLAGS_NONBLOCK)) != 0)
        fail("fd_fdstat_set_flags", rc);
    if ((rc = ws_getlocaladdr(listener, &addr, type, bound_port)) != 0) fail("sock_getlocaladdr", rc);
    return listener;
}

static inline void http_sub_read(__wasi_subscription_t *sub, uint64_t userdata, uint32_t fd) {
    sub->userdata = userdata;
    sub->u.tag = __WASI_EVENTTYPE_FD_READ;
    sub->u.u.fd_read.file_descriptor = fd;
}

static inline void http_sub_clock(__wasi_subscription_t *sub, uint64_t userdata, uint64_t timeout_ns) {
    sub->userdata = userdata;
    sub->u.tag = __WASI_EVENTTYPE_CLOCK;
    sub->u.u.clock.id = __WASI_CLOCKID_MONOTONIC;
    sub->u.u.clock.timeout = timeout_ns;
}

/* Wait until fd can take more bytes (or HTTP_WRITE_WAIT_NS pass); 0, or the errno. */
static inline int32_t http_wait_writable(uint32_t fd) {
    __wasi_subscription_t subs[2] = {0};
    __wasi_event_t events[2];
    __wasi_size_t n = 0;
    subs[0].userdata = 1;
    subs[0].u.tag = __WASI_EVENTTYPE_FD_WRITE;
    subs[0].u.u.fd_write.file_descriptor = fd;
    http_sub_clock(&subs[1], 2, HTTP_WRITE_WAIT_NS);
    return __wasi_poll_oneoff(subs, events, 2, &n);
}

/* Send all of data with sock_send (use_fd_write == 0) or fd_write. 0, or the errno. */
static inline int32_t http_send_all(uint32_t fd, const char *data, size_t len, int use_fd_write) {
    while (len > 0) {
        __wasi_ciovec_t iov = {.buf = (const uint8_t *)data, .buf_len = len};
        uint32_t sent = 0;
        int32_t rc;
        if (use_fd_write) {
            __wasi_size_t n = 0;
            rc = __wasi_fd_write(fd, &iov, 1, &n);
            sent = n;
        } else {
            rc = ws_send(fd, &iov, 1, 0, &sent);
        }
        if (rc == __WASI_ERRNO_AGAIN) {
            if ((rc = http_wait_writable(fd)) != 0) return rc;
            continue;
        }
        if (rc != 0) return rc;
        data += sent;
        len -= sent;
    }
    return 0;
}

/* extra: more header lines, each ending "\r\n" ("" for none). 0, or the errno of the failed write. */
static inline int32_t http_respond(uint32_t fd, int status, const char *reason, const char *extra,
                                   const char *body, size_t body_len, int closing, int body_fd_write) {
    char head[320];
    int n = snprintf(head, sizeof head,
                     "HTTP/1.1 %d %s\r\nContent-Type: text/plain\r\nContent-Length: %zu\r\n%s%s\r\n", status,
                     reason, body_len, extra, closing ? "Connection: close\r\n" : "");
    int32_t rc = http_send_all(fd, head, (size_t)n, 0);
    if (rc == 0 && body_len > 0) rc = http_send_all(fd, body, body_len, body_fd_write);
    return rc;
}

static inline int http_says_close(const char *head, size_t len) {
    for (size_t i = 0; i + 17 <= len; i++)
        if (strncasecmp(head + i, "connection: close", 17) == 0) return 1;
    return 0;
}

static inline size_t http_content_length(const char *head, size_t len) {
    for (size_t i = 0; i + 15 <= len; i++)
        if (strncasecmp(head + i, "content-length:", 15) == 0) return (size_t)strtoul(head + i + 15, NULL, 10);
    return 0;
}

/* The first request in buf[0..len): its whole length (head + body), 0 while it is incomplete, -1 if
   it cannot fit HTTP_REQUEST_MAX; *head_len and *body_len are set when it is complete. */
static inline long http_frame(const char *buf, size_t len, size_t *head_len, size_t *body_len) {
    size_t head = 0;
    for (size_t i = 0; i + 4 <= len && !head; i++)
        if (memcmp(buf + i, "\r\n\r\n", 4) == 0) head = i + 4;
    if (!head) return len >= HTTP_REQUEST_MAX ? -1 : 0;
    size_t body = http_content_length(buf, head);
    if (head + body > HTTP_REQUEST_MAX) return -1;
    if (len < head + body) return 0; /* the body is still coming */
    *head_len = head;
    *body_len = body;
    return (long)(head + body);
}

/* http_frame, answering 413 "too large" (then the connection must close) when the request cannot fit:
   1 with *head_len and *body_len set when a whole request is buffered, 0 while it is incomplete, -1
   after the 413. */
static inline int http_next_request(uint32_t fd, const char *buf, size_t len, size_t *head_len, size_t *body_len,
                                    int body_fd_write) {
    long whole = http_frame(buf, len, head_len, body_len);
    if (whole < 0) http_respond(fd, 413, "Payload Too Large", "", "too large\n", 10, 1, body_fd_write);
    return whole < 0 ? -1 : whole > 0;
}

/* Drop the first n bytes of buf[0..*len) (a request answered). */
static inline void http_consume(char *buf, size_t *len, size_t n) {
    memmove(buf, buf + n, *len - n);
    *len -= n;
}

#endif
