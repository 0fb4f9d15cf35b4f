/*
 * net.c — TCP socket helpers and the job-token handshake.
 *
 * Every connection dtrain accepts (store or data) starts with a dt__hs
 * record carrying the job token. The server compares it in constant time and
 * answers with one status word; on a wrong token it says DT_ERR_AUTH and
 * closes, so a process outside the job can neither read the store nor
 * inject frames into a collective. All blocking I/O here has a deadline and
 * survives EINTR and short reads/writes.
 */
#include "comm_internal.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define HS_MAGIC   0x53485444u /* "DTHS" */
#define HS_VERSION 1

dt_status dt__net_set_nonblocking(int fd) {
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
        return dt_error_set_errno(DT_ERR_SYSTEM, "fcntl(O_NONBLOCK)");
    return DT_OK;
}

void dt__net_tune(int fd, size_t bufsize) {
    int one = 1;
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (bufsize > 0) {
        int b = bufsize > (size_t)(1 << 30) ? (1 << 30) : (int)bufsize;
        (void)setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &b, sizeof b);
        (void)setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &b, sizeof b);
    }
}

dt_status dt__net_listen(const char *addr, int port, int *fd_out, int *bound_port) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return dt_error_set_errno(DT_ERR_SYSTEM, "socket");
    int one = 1;
    (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_ANY);
    if (addr && *addr && inet_pton(AF_INET, addr, &sa.sin_addr) != 1)
        sa.sin_addr.s_addr = htonl(INADDR_ANY);
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
        dt_status st = dt_error_set_errno(DT_ERR_SYSTEM, "bind to port %d", port);
        close(fd);
        return st;
    }
    if (listen(fd, 1024) < 0) {
        dt_status st = dt_error_set_errno(DT_ERR_SYSTEM, "listen on port %d", port);
        close(fd);
        return st;
    }
    socklen_t len = sizeof sa;
    if (getsockname(fd, (struct sockaddr *)&sa, &len) < 0) {
        dt_status st = dt_error_set_errno(DT_ERR_SYSTEM, "getsockname");
        close(fd);
        return st;
    }
    *bound_port = ntohs(sa.sin_port);
    *fd_out = fd;
    return DT_OK;
}

static dt_status resolve(const char *host, int port, struct sockaddr_in *out) {
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *res = NULL;
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    int rc = getaddrinfo(host, ps, &hints, &res);
    if (rc != 0 || !res)
        return dt_error_set(DT_ERR_INVALID, "cannot resolve host \"%s\": %s", host,
                            gai_strerror(rc));
    memcpy(out, res->ai_addr, sizeof *out);
    freeaddrinfo(res);
    return DT_OK;
}

dt_status dt__net_connect(const char *host, int port, double deadline, int *fd_out) {
    struct sockaddr_in sa;
    DT_CHECK(resolve(host, port, &sa));
    unsigned backoff_ms = 1;
    for (;;) {
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0)
            return dt_error_set_errno(DT_ERR_SYSTEM, "socket");
        int rc;
        do
            rc = connect(fd, (struct sockaddr *)&sa, sizeof sa);
        while (rc < 0 && errno == EINTR);
        if (rc == 0) {
            *fd_out = fd;
            return DT_OK;
        }
        int err = errno;
        close(fd);
        if (err != ECONNREFUSED && err != ETIMEDOUT && err != ENETUNREACH && err != EAGAIN &&
            err != ECONNRESET)
            return dt_error_set(DT_ERR_SYSTEM, "connect to %s:%d: %s", host, port, strerror(err));
        if (dt_now() > deadline)
            return dt_error_set(DT_ERR_TIMEOUT, "connect to %s:%d: %s (gave up after DT_TIMEOUT)",
                                host, port, strerror(err));
        dt_sleep_ms(backoff_ms);
        if (backoff_ms < 100)
            backoff_ms *= 2;
    }
}

/* Wait for fd to become readable/writable before the deadline. */
static dt_status wait_fd(int fd, short events, double deadline, const char *what) {
    for (;;) {
        double left = deadline - dt_now();
        if (left <= 0)
            return dt_error_set(DT_ERR_TIMEOUT, "%s: timed out", what);
        struct pollfd p = {.fd = fd, .events = events};
        int ms = left > 1000 ? 1000 : (int)(left * 1000) + 1;
        int rc = poll(&p, 1, ms);
        if (rc < 0 && errno != EINTR)
            return dt_error_set_errno(DT_ERR_SYSTEM, "%s: poll", what);
        if (rc > 0)
            return DT_OK;
    }
}

dt_status dt__net_read(int fd, void *buf, size_t n, double deadline) {
    char *p = buf;
    while (n > 0) {
        ssize_t r = recv(fd, p, n, MSG_DONTWAIT);
        if (r > 0) {
            p += r;
            n -= (size_t)r;
        } else if (r == 0) {
            return dt_error_set(DT_ERR_PEER, "connection closed by peer");
        } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
            DT_CHECK(wait_fd(fd, POLLIN, deadline, "read"));
        } else if (errno != EINTR) {
            return dt_error_set_errno(DT_ERR_PEER, "read from peer");
        }
    }
    return DT_OK;
}

dt_status dt__net_write(int fd, const void *buf, size_t n, double deadline) {
    const char *p = buf;
    while (n > 0) {
        ssize_t r = send(fd, p, n, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (r > 0) {
            p += r;
            n -= (size_t)r;
        } else if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            DT_CHECK(wait_fd(fd, POLLOUT, deadline, "write"));
        } else if (r < 0 && errno != EINTR) {
            return dt_error_set_errno(DT_ERR_PEER, "write to peer");
        }
    }
    return DT_OK;
}

dt_status dt__net_hs_client(int fd, const dt__hs *hs_in, double deadline) {
    dt__hs hs = *hs_in;
    hs.magic = HS_MAGIC;
    hs.version = HS_VERSION;
    DT_CHECK(dt__net_write(fd, &hs, sizeof hs, deadline));
    int32_t verdict[2];
    dt_status st = dt__net_read(fd, verdict, sizeof verdict, deadline);
    if (st != DT_OK)
        return dt_error_set(DT_ERR_AUTH, "handshake refused (connection closed; wrong job "
                                         "token or not a dtrain endpoint?)");
    if ((uint32_t)verdict[0] != HS_MAGIC)
        return dt_error_set(DT_ERR_PROTOCOL, "handshake reply has bad magic 0x%08x",
                            (uint32_t)verdict[0]);
    if (verdict[1] == DT_ERR_AUTH)
        return dt_error_set(DT_ERR_AUTH, "the server refused our job token (DT_JOB_TOKEN "
                                         "differs from the job's)");
    if (verdict[1] != DT_OK)
        return dt_error_set(DT_ERR_PROTOCOL, "handshake refused with status %d", verdict[1]);
    return DT_OK;
}

dt_status dt__net_hs_server(int fd, const char *token, int purpose, dt__hs *out, double deadline) {
    dt__hs hs;
    DT_CHECK(dt__net_read(fd, &hs, sizeof hs, deadline));
    int32_t verdict[2] = {(int32_t)HS_MAGIC, DT_OK};
    unsigned diff = 0; /* constant time: no early exit on the first wrong byte */
    for (int i = 0; i < DT__TOKEN_LEN; i++)
        diff |= (unsigned char)hs.token[i] ^ (unsigned char)token[i];
    dt_status st = DT_OK;
    if (hs.magic != HS_MAGIC || hs.version != HS_VERSION || hs.purpose != purpose)
        st = dt_error_set(DT_ERR_PROTOCOL, "bad handshake (magic 0x%08x, version %u, purpose %u)",
                          hs.magic, (unsigned)hs.version, (unsigned)hs.purpose);
    else if (diff != 0)
        st = dt_error_set(DT_ERR_AUTH, "refused a connection with a wrong job token");
    verdict[1] = st;
    (void)dt__net_write(fd, verdict, sizeof verdict, deadline);
    if (st == DT_OK) {
        hs.group[sizeof hs.group - 1] = 0;
        *out = hs;
    }
    return st;
}

void dt__net_local_addr(const char *master, char *out, size_t n) {
    const char *env = getenv("DT_IFADDR");
    if (env && *env) {
        snprintf(out, n, "%s", env);
        return;
    }
    snprintf(out, n, "127.0.0.1");
    /* The address of the interface that routes to the master: a UDP
     * "connect" sends nothing but makes the kernel pick the source. */
    struct sockaddr_in sa;
    if (!master || resolve(master, 9, &sa) != DT_OK) {
        dt_error_clear();
        return;
    }
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return;
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0) {
        struct sockaddr_in me;
        socklen_t len = sizeof me;
        if (getsockname(fd, (struct sockaddr *)&me, &len) == 0)
            inet_ntop(AF_INET, &me.sin_addr, out, (socklen_t)n);
    }
    close(fd);
}
