/*
 * node.c — the meeting of the launchers of a multi-node job, and the small
 * socket helpers the launcher needs (master address parsing, port checks).
 *
 * Node 0's launcher listens on the master port; every other launcher
 * connects (retrying until the timeout, so nodes may be started in any
 * order) and says HELLO with its node rank, node count, ranks per node and
 * token. Node 0 waits for all of them and only then answers: WELCOME with
 * the job id, token and store port when everybody agrees, REFUSE with the
 * reason to everybody otherwise. No rank is started on any node before the
 * meeting succeeded, so a mismatch leaves nothing running anywhere.
 *
 * Invariants: every length read from the socket is checked against
 * DT__MSG_TEXT_MAX before it is used; every wait is bounded by the timeout.
 */
#include "launch_internal.h"

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

/* ---------------------------------------------------------------------- */
/* Framing                                                                  */
/* ---------------------------------------------------------------------- */

typedef struct wire_header {
    uint32_t magic, version, type;
    int32_t a, b, c;
    uint32_t len;
} wire_header;

static dt_status write_all(int fd, const void *buf, size_t len) {
    const char *p = buf;
    while (len > 0) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return dt_error_set_errno(DT_ERR_PEER, "launcher connection: send");
        }
        p += n;
        len -= (size_t)n;
    }
    return DT_OK;
}

static dt_status read_all(int fd, void *buf, size_t len, double deadline) {
    char *p = buf;
    while (len > 0) {
        double left = deadline - dt_now();
        if (left <= 0)
            return dt_error_set(DT_ERR_TIMEOUT,
                                "launcher connection: no message within the timeout");
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        int r = poll(&pfd, 1, (int)(left * 1000) + 1);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return dt_error_set_errno(DT_ERR_SYSTEM, "launcher connection: poll");
        if (r == 0)
            continue;
        ssize_t n = recv(fd, p, len, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return dt_error_set_errno(DT_ERR_PEER, "launcher connection: recv");
        if (n == 0)
            return dt_error_set(DT_ERR_PEER, "launcher connection closed by the other node");
        p += n;
        len -= (size_t)n;
    }
    return DT_OK;
}

dt_status dt__msg_send(int fd, uint32_t type, int32_t a, int32_t b, int32_t c, const char *text) {
    size_t len = text ? strlen(text) : 0;
    if (len > DT__MSG_TEXT_MAX)
        len = DT__MSG_TEXT_MAX;
    wire_header h = {DT__MSG_MAGIC, DT__MSG_VERSION, type, a, b, c, (uint32_t)len};
    DT_CHECK(write_all(fd, &h, sizeof h));
    if (len)
        DT_CHECK(write_all(fd, text, len));
    return DT_OK;
}

dt_status dt__msg_recv(int fd, double timeout, dt__msg *m) {
    double deadline = dt_now() + timeout;
    wire_header h;
    DT_CHECK(read_all(fd, &h, sizeof h, deadline));
    if (h.magic != DT__MSG_MAGIC)
        return dt_error_set(DT_ERR_PROTOCOL,
                            "launcher connection: bad magic 0x%08x (is something other than a "
                            "dtrain launcher on the master port?)",
                            h.magic);
    if (h.version != DT__MSG_VERSION)
        return dt_error_set(DT_ERR_PROTOCOL,
                            "launcher connection: protocol version %u, this launcher speaks %u",
                            h.version, DT__MSG_VERSION);
    if (h.len > DT__MSG_TEXT_MAX)
        return dt_error_set(DT_ERR_PROTOCOL, "launcher connection: message of %u bytes (max %u)",
                            h.len, DT__MSG_TEXT_MAX);
    m->type = h.type;
    m->a = h.a;
    m->b = h.b;
    m->c = h.c;
    m->len = h.len;
    DT_CHECK(read_all(fd, m->text, h.len, deadline));
    m->text[h.len] = '\0';
    return DT_OK;
}

/* ---------------------------------------------------------------------- */
/* Addresses and ports                                                      */
/* ---------------------------------------------------------------------- */

dt_status dt__parse_master(const char *flag, const char *master, char *addr, size_t addr_len,
                           int *port) {
    const char *colon = strrchr(master, ':');
    size_t n = colon ? (size_t)(colon - master) : strlen(master);
    if (n == 0 || n >= addr_len)
        return dt_error_set(DT_ERR_INVALID, "%s: \"%s\" is not ADDR:PORT", flag, master);
    memcpy(addr, master, n);
    addr[n] = '\0';
    *port = 0;
    if (colon) {
        char *end;
        long p = strtol(colon + 1, &end, 10);
        if (colon[1] == '\0' || *end != '\0' || p < 1 || p > 65534)
            return dt_error_set(DT_ERR_INVALID, "%s: port \"%s\" in \"%s\" is not in [1, 65534]",
                                flag, colon + 1, master);
        *port = (int)p;
    }
    /* Resolved here, before anything starts: an address nobody can reach
     * ("abc", "256.1.1.1") used to pass and fail every rank instead. */
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *ai = NULL;
    int gai = getaddrinfo(addr, NULL, &hints, &ai);
    if (gai != 0)
        return dt_error_set(DT_ERR_INVALID,
                            "%s: \"%s\" is not an IPv4 address or a host name that "
                            "resolves (%s)",
                            flag, addr, gai == EAI_SYSTEM ? strerror(errno) : gai_strerror(gai));
    freeaddrinfo(ai);
    return DT_OK;
}

static int bind_any(int port) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_ANY);
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    return fd;
}

dt_status dt__check_port_free(int port, const char *what) {
    int fd = bind_any(port);
    if (fd < 0)
        return dt_error_set_errno(DT_ERR_IO, "%s port %d is not free on this machine", what, port);
    close(fd);
    return DT_OK;
}

dt_status dt__free_port(int *port) {
    int fd = bind_any(0);
    if (fd < 0)
        return dt_error_set_errno(DT_ERR_SYSTEM, "cannot find a free TCP port");
    struct sockaddr_in sa;
    socklen_t len = sizeof sa;
    if (getsockname(fd, (struct sockaddr *)&sa, &len) != 0) {
        close(fd);
        return dt_error_set_errno(DT_ERR_SYSTEM, "getsockname");
    }
    close(fd);
    *port = ntohs(sa.sin_port);
    return DT_OK;
}

/* ---------------------------------------------------------------------- */
/* The meeting                                                              */
/* ---------------------------------------------------------------------- */

/* The launchers' connections live as long as the job and carry almost
 * nothing, so a peer machine that vanishes (no FIN, no RST) would go
 * unnoticed: keepalive probes find it within about 15 s. */
static void tune_ctrl(int fd) {
    int one = 1, idle = 5, intvl = 2, cnt = 5;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
}

void dt__meeting_close(dt__meeting *m) {
    int n = m->node_rank == 0 ? m->nnodes - 1 : 1;
    for (int i = 0; m->fds && i < n; i++)
        if (m->fds[i] >= 0)
            close(m->fds[i]);
    free(m->fds);
    m->fds = NULL;
}

static void refuse_all(dt__meeting *m, const char *why) {
    for (int i = 0; i < m->nnodes - 1; i++)
        if (m->fds[i] >= 0)
            (void)dt__msg_send(m->fds[i], DT__MSG_REFUSE, 0, 0, 0, why);
}

static dt_status meet_as_master(dt__meeting *m) {
    int lfd = bind_any(m->port);
    if (lfd < 0)
        return dt_error_set_errno(DT_ERR_IO, "master port %d is not free on node 0", m->port);
    if (listen(lfd, 128) != 0) {
        close(lfd);
        return dt_error_set_errno(DT_ERR_SYSTEM, "listen on master port %d", m->port);
    }
    double deadline = dt_now() + m->timeout;
    int joined = 0;
    dt_status st = DT_OK;
    char why[512] = "";
    while (joined < m->nnodes - 1) {
        double left = deadline - dt_now();
        if (left <= 0 && m->problem)
            break;
        if (left <= 0) {
            char missing[256] = "";
            size_t off = 0;
            for (int i = 0; i < m->nnodes - 1 && off < sizeof missing - 16; i++)
                if (m->fds[i] < 0)
                    off += (size_t)snprintf(missing + off, sizeof missing - off, "%s%d",
                                            off ? "," : "", i + 1);
            st = dt_error_set(DT_ERR_TIMEOUT,
                              "only %d of %d nodes joined on port %d within %.0f s (missing node "
                              "ranks: %s)",
                              joined + 1, m->nnodes, m->port, m->timeout, missing);
            snprintf(why, sizeof why, "%s", dt_last_error());
            break;
        }
        struct pollfd pfd = {.fd = lfd, .events = POLLIN};
        int r = poll(&pfd, 1, (int)(left * 1000) + 1);
        if (r <= 0)
            continue;
        int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0)
            continue;
        tune_ctrl(fd);
        dt__msg h;
        if (dt__msg_recv(fd, 10.0 < left ? 10.0 : left, &h) != DT_OK || h.type != DT__MSG_HELLO) {
            /* A port scanner or a stray client: ignore it, keep waiting. */
            close(fd);
            continue;
        }
        int nr = h.a;
        if (m->problem) {
            /* Node 0 itself cannot run the job: tell each node as it comes. */
            char msg[DT__MSG_TEXT_MAX];
            snprintf(msg, sizeof msg, "node 0 cannot run the job: %s", m->problem);
            (void)dt__msg_send(fd, DT__MSG_REFUSE, 0, 0, 0, msg);
            close(fd);
            joined++;
            continue;
        }
        if (h.text[0] == '!') {
            st = dt_error_set(DT_ERR_NOT_FOUND, "node %d cannot run the job: %s", nr, h.text + 1);
        } else if (h.b != m->nnodes || h.c != m->nproc) {
            st = dt_error_set(DT_ERR_MISMATCH,
                              "node %d was started with --nnodes %d -n %d (world size %d) but node "
                              "0 with --nnodes %d -n %d (world size %d)",
                              nr, h.b, h.c, h.b * h.c, m->nnodes, m->nproc, m->nnodes * m->nproc);
        } else if (nr < 1 || nr >= m->nnodes) {
            st = dt_error_set(DT_ERR_MISMATCH, "a node joined with --node-rank %d, expected 1..%d",
                              nr, m->nnodes - 1);
        } else if (m->fds[nr - 1] >= 0) {
            st = dt_error_set(DT_ERR_MISMATCH, "two nodes were started with --node-rank %d", nr);
        } else if (strcmp(h.text, m->token_given ? m->token : "") != 0) {
            st = dt_error_set(DT_ERR_AUTH,
                              "node %d has %s DT_JOB_TOKEN than node 0 (set the same DT_JOB_TOKEN "
                              "on every node, or on none)",
                              nr, h.text[0] ? "a different" : "no");
        }
        if (st != DT_OK) {
            snprintf(why, sizeof why, "%s", dt_last_error());
            (void)dt__msg_send(fd, DT__MSG_REFUSE, 0, 0, 0, why);
            close(fd);
            break;
        }
        m->fds[nr - 1] = fd;
        joined++;
        DT_DEBUG("launch", "node %d joined (%d of %d)", nr, joined + 1, m->nnodes);
    }
    close(lfd);
    if (m->problem)
        return dt_error_set(DT_ERR_NOT_FOUND, "%s (%d of %d other nodes were told)", m->problem,
                            joined, m->nnodes - 1);
    if (st != DT_OK) {
        refuse_all(m, why);
        return st;
    }
    char text[160];
    snprintf(text, sizeof text, "%s %s", m->job_id, m->token);
    for (int i = 0; i < m->nnodes - 1; i++)
        DT_CHECK(dt__msg_send(m->fds[i], DT__MSG_WELCOME, m->store_port, 0, 0, text));
    return DT_OK;
}

static dt_status meet_as_node(dt__meeting *m) {
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *ai = NULL;
    char portstr[16];
    snprintf(portstr, sizeof portstr, "%d", m->port);
    int gai = getaddrinfo(m->addr, portstr, &hints, &ai);
    if (gai != 0)
        return dt_error_set(DT_ERR_INVALID, "--master: cannot resolve \"%s\": %s", m->addr,
                            gai_strerror(gai));
    double deadline = dt_now() + m->timeout;
    int fd = -1, last_errno = 0;
    unsigned backoff_ms = 50;
    while (fd < 0) {
        if (dt_now() >= deadline) {
            freeaddrinfo(ai);
            errno = last_errno;
            return dt_error_set_errno(DT_ERR_TIMEOUT,
                                      "cannot reach the master %s:%d within %.0f s (is node 0's "
                                      "launcher running, and the address right?)",
                                      m->addr, m->port, m->timeout);
        }
        fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0) {
            freeaddrinfo(ai);
            return dt_error_set_errno(DT_ERR_SYSTEM, "socket");
        }
        int r = connect(fd, ai->ai_addr, ai->ai_addrlen);
        if (r != 0 && errno == EINPROGRESS) {
            /* Bounded connect: an unroutable address must not hang for
             * the kernel's SYN retry time. */
            double left = deadline - dt_now();
            struct pollfd pfd = {.fd = fd, .events = POLLOUT};
            int pr = poll(&pfd, 1, left > 0 ? (int)(left * 1000) + 1 : 0);
            int err = ETIMEDOUT;
            socklen_t el = sizeof err;
            if (pr > 0)
                getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el);
            r = err == 0 ? 0 : -1;
            errno = err;
        }
        if (r != 0) {
            last_errno = errno;
            close(fd);
            fd = -1;
            dt_sleep_ms(backoff_ms);
            if (backoff_ms < 1000)
                backoff_ms *= 2;
        }
    }
    freeaddrinfo(ai);
    /* Back to blocking: reads are bounded by poll() in read_all. */
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    tune_ctrl(fd);
    m->fds[0] = fd;
    char problem[DT__MSG_TEXT_MAX];
    if (m->problem)
        snprintf(problem, sizeof problem, "!%s", m->problem);
    DT_CHECK(dt__msg_send(fd, DT__MSG_HELLO, m->node_rank, m->nnodes, m->nproc,
                          m->problem       ? problem
                          : m->token_given ? m->token
                                           : ""));
    dt__msg w;
    double left = deadline - dt_now();
    dt_status st = dt__msg_recv(fd, left > 1 ? left : 1, &w);
    if (st != DT_OK) {
        dt_error_prefix("waiting for node 0 to accept this node");
        return st;
    }
    if (w.type == DT__MSG_REFUSE)
        return dt_error_set(DT_ERR_MISMATCH, "node 0 refused the job: %s", w.text);
    if (w.type != DT__MSG_WELCOME)
        return dt_error_set(DT_ERR_PROTOCOL, "node 0 sent message type %u, expected WELCOME",
                            w.type);
    char job[64], token[64];
    if (sscanf(w.text, "%63s %63s", job, token) != 2 || strlen(token) != DT_LAUNCH_TOKEN_HEX)
        return dt_error_set(DT_ERR_PROTOCOL, "node 0 sent a malformed WELCOME");
    snprintf(m->job_id, sizeof m->job_id, "%s", job);
    memcpy(m->token, token, sizeof m->token); /* length checked: DT_LAUNCH_TOKEN_HEX + NUL */
    if (w.a < 1 || w.a > 65535)
        return dt_error_set(DT_ERR_PROTOCOL, "node 0 sent store port %d", w.a);
    m->store_port = w.a;
    return DT_OK;
}

dt_status dt__meet(dt__meeting *m) {
    int n = m->node_rank == 0 ? m->nnodes - 1 : 1;
    m->fds = malloc((size_t)n * sizeof *m->fds);
    if (!m->fds)
        return dt_error_set(DT_ERR_NOMEM, "launcher meeting");
    for (int i = 0; i < n; i++)
        m->fds[i] = -1;
    dt_status st = m->node_rank == 0 ? meet_as_master(m) : meet_as_node(m);
    if (st != DT_OK)
        dt__meeting_close(m);
    return st;
}
