/*
 * shm-copy.c — what the bytes of a 2-rank shared-memory allgather cost on
 * this machine, with no library in the way: the floor docs/comm.md quotes.
 *
 *   cc -O2 -o shm-copy bench/shm-copy.c
 *   ./shm-copy MODE BLOCK_KIB PIECE_KIB ITERS      e.g. ./shm-copy both 8192 256 100
 *   BLOCKS=4 ./shm-copy floor ...                  output of 4 blocks (the floor of a
 *                                                  4-rank allgather; run two at once)
 *   HUGE=1 ./shm-copy ...                          buffers on transparent huge pages
 *   READ=1 ./shm-copy ...                          each call also reads its whole output
 *                                                  (the consumer), inside the timing
 *
 * Two processes (fork) each own an input block of BLOCK bytes, written with
 * data (never the zero page), and an output of 2 x BLOCK. Per call, between
 * two spin barriers, each process does MODE:
 *   memcpy  copy its own block into its output
 *   pull    process_vm_readv the peer's block into its output, PIECE at a time
 *   both    own memcpy and peer pull alternating PIECE by PIECE, the order
 *           rotated by rank (dtrain's direct allgather)
 *   serial  one pull of the whole peer block, then one memcpy of the own
 *           (Open MPI's two_procs allgather over vader's CMA)
 *   push    process_vm_writev of the own block into the peer's output, then
 *           the own memcpy, PIECE by PIECE
 *   floor   memcpy of the own block into every block of the output, PIECE by
 *           PIECE: the allgather's footprint and bytes with nothing read
 *           across processes, so no allgather can take less time
 * and prints the best and the median call time of each process.
 */
#define _GNU_SOURCE
#include "read_all.h"

#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef struct ctl {
    _Alignas(64) _Atomic long flag[2];
    _Alignas(64) uintptr_t in[2], out[2];
    pid_t pid[2];
    double best[2], median[2];
} ctl;

static ctl *c;
static int me;
static long epoch;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* spins, then yields: another process may want the core */
static void barrier(void) {
    atomic_store(&c->flag[me], ++epoch);
    for (int spins = 0; atomic_load(&c->flag[!me]) < epoch;)
        if (++spins > 1000)
            sched_yield();
}

static void cma(int write, void *local, uintptr_t remote, size_t len) {
    struct iovec l = {local, len}, r = {(void *)remote, len};
    ssize_t got = write ? process_vm_writev(c->pid[!me], &l, 1, &r, 1, 0)
                        : process_vm_readv(c->pid[!me], &l, 1, &r, 1, 0);
    if (got != (ssize_t)len) {
        perror(write ? "process_vm_writev" : "process_vm_readv");
        exit(1);
    }
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: %s memcpy|pull|both|serial|push|floor BLOCK_KIB PIECE_KIB ITERS\n",
                argv[0]);
        return 2;
    }
    const char *mode = argv[1];
    size_t block = (size_t)atol(argv[2]) << 10, piece = (size_t)atol(argv[3]) << 10;
    int iters = atoi(argv[4]);
    if (!block || !piece || iters < 1)
        return 2;
    c = mmap(NULL, sizeof *c, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (c == MAP_FAILED)
        return 1;
    pid_t kid = fork();
    me = kid == 0;
    c->pid[me] = getpid();
    size_t align = 2 << 20, inb = (block + align - 1) / align * align;
    int blocks = getenv("BLOCKS") ? atoi(getenv("BLOCKS")) : 2;
    if (blocks < 2 || blocks > 64 || (blocks != 2 && strcmp(mode, "floor") != 0))
        return 2;
    char *in = aligned_alloc(align, inb), *out = aligned_alloc(align, (size_t)blocks * inb);
    double *t = malloc(sizeof *t * (size_t)iters);
    if (!in || !out || !t)
        return 1;
    if (getenv("HUGE")) {
        madvise(in, inb, MADV_HUGEPAGE);
        madvise(out, (size_t)blocks * inb, MADV_HUGEPAGE);
    }
    for (size_t i = 0; i < block; i++)
        in[i] = (char)(i * 7 + (size_t)me * 3);
    memset(out, 1, (size_t)blocks * inb);
    c->in[me] = (uintptr_t)in;
    c->out[me] = (uintptr_t)out;
    barrier();
    char *mine = out + (size_t)me * block, *theirs = out + (size_t)!me * block;
    for (int it = -5; it < iters; it++) {
        double t0 = now();
        barrier();
        if (strcmp(mode, "serial") == 0) {
            cma(0, theirs, c->in[!me], block);
            memcpy(mine, in, block);
        } else {
            for (size_t off = 0; off < block; off += piece) {
                size_t len = block - off < piece ? block - off : piece;
                for (int k = 0; k < 2; k++) {
                    int own = (me + k) % 2 == me;
                    if (strcmp(mode, "push") == 0)
                        own ? memcpy(mine + off, in + off, len)
                            : cma(1, in + off, c->out[!me] + (size_t)me * block + off, len);
                    else if (own && strcmp(mode, "pull") != 0)
                        memcpy(mine + off, in + off, len);
                    else if (strcmp(mode, "floor") == 0) {
                        for (int b = 0; b < blocks; b++)
                            if (out + (size_t)b * block != mine)
                                memcpy(out + (size_t)b * block + off, in + off, len);
                    } else if (!own && strcmp(mode, "memcpy") != 0)
                        cma(0, theirs + off, c->in[!me] + off, len);
                }
            }
        }
        barrier();
        if (getenv("READ")) /* the consumer: read the whole output once */
            read_all(out, (size_t)blocks * block);
        if (it >= 0)
            t[it] = now() - t0;
    }
    qsort(t, (size_t)iters, sizeof *t, cmp);
    c->best[me] = t[0];
    c->median[me] = t[iters / 2];
    barrier();
    if (me == 0) {
        printf("%-6s block %zu KiB piece %zu KiB%s: best %.0f / %.0f us, median %.0f / %.0f us "
               "(rank 0 / 1)\n",
               mode, block >> 10, piece >> 10, getenv("HUGE") ? " huge" : "", c->best[0] * 1e6,
               c->best[1] * 1e6, c->median[0] * 1e6, c->median[1] * 1e6);
        waitpid(kid, NULL, 0);
    }
    return 0;
}
