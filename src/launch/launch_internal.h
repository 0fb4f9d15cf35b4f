/*
 * launch_internal.h — what launch.c (the local job) and node.c (the meeting
 * of the launchers of a multi-node job) share. Not a public header.
 *
 * The launchers of a multi-node job talk over one TCP connection per node
 * (node 0 accepts, the others connect). Every message is a fixed header
 * followed by `len` bytes of text:
 *
 *     HELLO   node -> 0   a = node_rank, b = nnodes, c = nproc; text = token or "",
 *                         or "!" and why this node cannot run the job
 *     WELCOME 0 -> node   a = store port; text = "job_id token"
 *     REFUSE  0 -> node   text = why (a mismatch, a duplicate node rank)
 *     RESULT  node -> 0   a = exit code, b = DT__RESULT_*; text = summary
 *     STOP    0 -> node   stop the local ranks now (another node failed)
 *     RESTART 0 -> node   a = restart count, b = store port
 *     END     0 -> node   a = exit code, b = DT__RESULT_*; text = summary
 *
 * Lengths are validated before use (DT__MSG_TEXT_MAX).
 */
#ifndef DTRAIN_LAUNCH_INTERNAL_H
#define DTRAIN_LAUNCH_INTERNAL_H

#include "dtrain/launch.h"

#include <stdint.h>

#define DT__MSG_MAGIC    0x52544c44u /* "DLTR" little-endian */
#define DT__MSG_VERSION  1u
#define DT__MSG_TEXT_MAX 2048u

typedef enum dt__msg_type {
    DT__MSG_HELLO = 1,
    DT__MSG_WELCOME,
    DT__MSG_REFUSE,
    DT__MSG_RESULT,
    DT__MSG_STOP,
    DT__MSG_RESTART,
    DT__MSG_END,
} dt__msg_type;

/* How an attempt ended on one node. */
typedef enum dt__result {
    DT__RESULT_OK,      /* every rank exited 0 */
    DT__RESULT_FAILED,  /* a rank failed on its own (or the launch failed) */
    DT__RESULT_STOPPED, /* ranks were stopped because another node failed */
} dt__result;

typedef struct dt__msg {
    uint32_t type;
    int32_t a, b, c;
    uint32_t len;
    char text[DT__MSG_TEXT_MAX + 1]; /* NUL-terminated */
} dt__msg;

/* Send/receive one message; the receive waits at most timeout seconds. */
dt_status dt__msg_send(int fd, uint32_t type, int32_t a, int32_t b, int32_t c, const char *text);
dt_status dt__msg_recv(int fd, double timeout, dt__msg *m);

/* Parse "ADDR:PORT" or "ADDR" (port 0); ADDR must resolve to an IPv4 address.
 * Errors name the flag the value came from ("--master", "--join"). */
dt_status dt__parse_master(const char *flag, const char *master, char *addr, size_t addr_len,
                           int *port);

/* Fail with a clear message when TCP port `port` cannot be bound here. */
dt_status dt__check_port_free(int port, const char *what);
/* A TCP port that was free a moment ago. */
dt_status dt__free_port(int *port);

/* The multi-node meeting. On node 0 `fds` receives nnodes - 1 connected
 * sockets (index node_rank - 1); elsewhere fds[0] is the connection to node
 * 0. job_id/token are filled (node 0's win) and *store_port is set. */
typedef struct dt__meeting {
    int nnodes, node_rank, nproc;
    const char *addr; /* master address */
    int port;         /* launchers' port */
    double timeout;
    char job_id[64];
    char token[DT_LAUNCH_TOKEN_HEX + 1];
    bool token_given;    /* token came from DT_JOB_TOKEN on this node */
    const char *problem; /* why this node cannot run the job, or NULL: a
                            joining node sends it to node 0, which refuses
                            everybody; node 0 refuses each node that comes */
    int store_port;
    int *fds; /* nnodes - 1 (node 0) or 1 entries, -1 when closed */
} dt__meeting;

dt_status dt__meet(dt__meeting *m);
void dt__meeting_close(dt__meeting *m);

#endif /* DTRAIN_LAUNCH_INTERNAL_H */
