/*
 * allreduce.c — the smallest distributed program on libdtrain: every rank
 * joins the job its launcher describes (dtrain launch, mpirun, srun,
 * torchrun), contributes its rank + 1 to a vector, and checks the average.
 *
 *     cc allreduce.c $(pkg-config --cflags --libs dtrain) -o allreduce
 *     dtrain launch -n 4 ./allreduce
 */
#include <dtrain/comm.h>

#include <stdio.h>

int main(void) {
    dt_group *world = NULL;
    if (dt_group_init_from_env(&world) != DT_OK) {
        fprintf(stderr, "allreduce: %s\n", dt_last_error());
        return 1;
    }
    int rank = dt_group_rank(world), n = dt_group_size(world);
    enum { COUNT = 1 << 16 };
    static float v[COUNT];
    for (int i = 0; i < COUNT; i++)
        v[i] = (float)(rank + 1);
    dt_status st = dt_group_allreduce(world, v, v, COUNT, DT_F32, DT_AVG);
    float want = (float)(n + 1) / 2.0f; /* the mean of 1..n */
    int wrong = 0;
    for (int i = 0; st == DT_OK && i < COUNT; i++)
        wrong += v[i] != want;
    if (st != DT_OK)
        fprintf(stderr, "rank %d: %s\n", rank, dt_last_error());
    else
        printf("rank %d of %d: average %g over %d floats, %d wrong\n", rank, n, (double)v[0], COUNT,
               wrong);
    dt_group_destroy(world);
    return st == DT_OK && wrong == 0 ? 0 : 1;
}
