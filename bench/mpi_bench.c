/*
 * mpi_bench.c — the same measurement as `dtrain bench comm`, done with
 * Open MPI's collectives, so bench/compare-mpi.sh can print both side by
 * side. Same sizes, iteration policy, timing (slowest rank) and columns,
 * and the same buffers: out of place, inputs holding the small integers
 * `dtrain bench comm` checks with, every page written before timing.
 *
 * Why the inputs are filled with data rather than memset to zero: gcc turns
 * malloc + memset(0) into calloc, whose large blocks come straight from
 * mmap and are never written, so every page of the input maps the kernel's
 * one shared zero page. Open MPI then read its inputs from a single 4 KiB
 * page that stays in L1 (memcpy and process_vm_readv alike) and the 16 MiB
 * 2-rank allgather looked faster than a plain 8 MiB memcpy on this machine.
 *
 * The buffers are also placed alike: `dtrain bench comm` gets its buffers
 * from dt_alloc, which puts blocks of 8 MiB and more on 2 MiB boundaries
 * with MADV_HUGEPAGE; bench_alloc does the same here, so neither side's
 * large buffers have fewer TLB misses or cheaper page pinning (which
 * process_vm_readv pays per page) than the other's.
 *
 *   mpicc -O2 -o mpi_bench bench/mpi_bench.c
 *   mpirun -np 4 ./mpi_bench allreduce 8 268435456
 *   mpirun -np 4 -x READ=1 ./mpi_bench ...    each call's output read (--read)
 */
#include "read_all.h"

#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* dt_alloc's placement (src/core/sys.c): huge-page advice from 8 MiB. */
static void *bench_alloc(size_t bytes) {
    const size_t huge_from = (size_t)8 << 20, huge_page = (size_t)2 << 20;
    void *p = NULL;
    if (bytes >= huge_from) {
        bytes = (bytes + huge_page - 1) / huge_page * huge_page;
        if (posix_memalign(&p, huge_page, bytes) != 0)
            return NULL;
        (void)madvise(p, bytes, MADV_HUGEPAGE);
        return p;
    }
    return posix_memalign(&p, 64, bytes) == 0 ? p : NULL;
}

/* in[i] = (i * 7 + rank * 3) % 5 as f32, the values `dtrain bench comm`
 * uses; out gets a non-zero pattern. Written element by element so no
 * compiler can turn it into calloc (see the top of the file). */
static void fill(float *in, float *out, size_t n, int rank) {
    for (size_t i = 0; i < n; i++) {
        in[i] = (float)((i * 7 + (size_t)rank * 3) % 5);
        out[i] = -1.0f;
    }
}

#define FIRST_WARM_S 1.0 /* as `dtrain bench comm`: see its FIRST_WARM_S */

/* One call of the collective; returns the busbw factor (nccl-tests). */
static double run(const char *op, char *in, char *out, size_t cnt, int n) {
    if (strcmp(op, "allreduce") == 0) {
        MPI_Allreduce(in, out, (int)cnt, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        return 2.0 * (n - 1) / n;
    } else if (strcmp(op, "reduce_scatter") == 0) {
        MPI_Reduce_scatter_block(in, out, (int)cnt, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    } else if (strcmp(op, "allgather") == 0) {
        MPI_Allgather(in, (int)cnt, MPI_FLOAT, out, (int)cnt, MPI_FLOAT, MPI_COMM_WORLD);
    } else if (strcmp(op, "broadcast") == 0) {
        MPI_Bcast(out, (int)cnt, MPI_FLOAT, 0, MPI_COMM_WORLD);
        return 1;
    } else if (strcmp(op, "alltoall") == 0) {
        MPI_Alltoall(in, (int)cnt, MPI_FLOAT, out, (int)cnt, MPI_FLOAT, MPI_COMM_WORLD);
    }
    return (double)(n - 1) / n;
}

/* READ=1: after every call each rank reads its whole output, inside the
 * timing, as `dtrain bench comm --read` does. */
static int reading;

/* One timed call: the collective, then with READ=1 its consumer. */
static double call(const char *op, char *in, char *out, size_t cnt, int n) {
    double factor = run(op, in, out, cnt, n);
    if (reading) {
        int whole = strcmp(op, "allgather") == 0 || strcmp(op, "alltoall") == 0;
        read_all(out, cnt * sizeof(float) * (whole ? (size_t)n : 1));
    }
    return factor;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int n, me;
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    const char *op = argc > 1 ? argv[1] : "allreduce";
    reading = getenv("READ") && strcmp(getenv("READ"), "1") == 0;
    size_t lo = argc > 2 ? strtoull(argv[2], NULL, 10) : 8;
    size_t hi = argc > 3 ? strtoull(argv[3], NULL, 10) : (size_t)256 << 20;
    size_t es = sizeof(float);
    size_t cap = hi + 64 * (size_t)n;
    char *in = bench_alloc(cap), *out = bench_alloc(cap);
    if (!in || !out) {
        fprintf(stderr, "mpi_bench: cannot allocate 2 x %zu bytes\n", cap);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    fill((float *)in, (float *)out, cap / sizeof(float), me);
    if (me == 0) {
        printf("# Open MPI bench: %s f32 sum, %d ranks%s\n", op, n,
               reading ? ", every call's output read" : "");
        printf("# %12s %12s %10s %12s %12s\n", "size(B)", "count", "time(us)", "algbw(GB/s)",
               "busbw(GB/s)");
    }
    int first = 1;
    for (size_t bytes = lo; bytes <= hi; bytes *= 2) {
        size_t elems = bytes / es;
        int per = strcmp(op, "allreduce") == 0 || strcmp(op, "broadcast") == 0;
        size_t cnt = per ? elems : elems / (size_t)n;
        if (cnt == 0)
            continue;
        size_t it = ((size_t)256 << 20) / (bytes + 4096);
        int iters = it < 5 ? 5 : it > 2000 ? 2000 : (int)it;
        /* warm-up as in `dtrain bench comm`: 3 calls, the first size as
         * many as it times and at least FIRST_WARM_S seconds (the ranks
         * agree on the elapsed time so all make the same calls) */
        for (int i = 0; i < (first ? iters : 3); i++)
            call(op, in, out, cnt, n);
        for (double t0 = MPI_Wtime(), el = 0; first && el < FIRST_WARM_S;) {
            for (int i = 0; i < iters; i++)
                call(op, in, out, cnt, n);
            el = MPI_Wtime() - t0;
            MPI_Allreduce(MPI_IN_PLACE, &el, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        }
        first = 0;
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime(), factor = 1;
        for (int i = 0; i < iters; i++)
            factor = call(op, in, out, cnt, n);
        double t = (MPI_Wtime() - t0) / iters, tmax;
        MPI_Allreduce(&t, &tmax, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        double algbw = (double)bytes / tmax * 1e-9;
        if (me == 0)
            printf("  %12zu %12zu %10.2f %12.3f %12.3f\n", bytes, cnt, tmax * 1e6, algbw,
                   algbw * factor);
        fflush(stdout);
    }
    free(in);
    free(out);
    MPI_Finalize();
    return 0;
}
