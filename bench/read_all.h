/*
 * read_all.h — the consumer of the standalone benchmarks (mpi_bench.c,
 * shm-copy.c): load every byte of a collective's output once, as the code
 * that uses the result would. `dtrain bench comm --read` does the same in
 * src/cli/cmd_bench_comm.c (the CLI does not include bench/).
 */
#ifndef DTRAIN_BENCH_READ_ALL_H
#define DTRAIN_BENCH_READ_ALL_H

#include <stdint.h>
#include <string.h>

static inline void read_all(const void *p, size_t bytes) {
    static volatile uint64_t sink;
    const unsigned char *b = p;
    uint64_t s = 0, w;
    for (size_t i = 0; i + 8 <= bytes; i += 8) {
        memcpy(&w, b + i, 8);
        s += w;
    }
    sink += s;
}

#endif
