/*
 * backend.h — the seam between a group and whatever executes its operations.
 *
 * A group holds one backend table, chosen at creation from DT_BACKEND
 * (native by default). Every operation, once its turn comes on the group's
 * progress thread (or inline on the caller when the group is idle), is
 * executed by backend->run[op->coll](op). The native backend (native.c)
 * picks an algorithm from tune.c and runs it over our transports.
 *
 * Adding a backend (as DT_BACKEND=mpi was added, mapping each collective onto
 * MPI_Allreduce & co. in src/comm/mpi_backend.c) is one new file plus one
 * line in the table in group.c:
 *
 *   1. Define `const dt__backend dt__backend_mpi` with .name = "mpi",
 *      .api_version = DT__BACKEND_API, an init() that builds the group's
 *      communicator from g->world[] (MPI_Comm_create_group over the world
 *      ranks; init runs collectively on every member), a fini(), and one
 *      run[] entry per dt_coll. An entry reads op->send, op->recv,
 *      op->count, op->dtype, op->redop, op->root, op->tag and returns a
 *      dt_status with dt_error_set() on failure.
 *   2. Add it to `backends[]` in group.c; add src/comm/deps.cmake linking
 *      MPI::MPI_C when the build enables it.
 *
 * Nothing else changes: no algorithm, transport or public header. Group
 * creation, split, the work queue, failure bookkeeping and AVG scaling stay
 * in group.c, so every backend inherits them. A NULL run[] entry makes that
 * collective return DT_ERR_UNSUPPORTED naming the backend.
 */
#ifndef DTRAIN_COMM_BACKEND_H
#define DTRAIN_COMM_BACKEND_H

#include "comm_internal.h"

#define DT__BACKEND_API 1

struct dt__backend {
    const char *name; /* value of DT_BACKEND */
    int api_version;  /* DT__BACKEND_API it was written against */
    /* Collective over the new group's members: set up g->backend_state
     * (connections, communicators). g->rank/size/world/host are filled. */
    dt_status (*init)(dt_group *g);
    /* Tear down; clean = false after a failure (do not wait for peers). */
    void (*fini)(dt_group *g, bool clean);
    /* One entry per operation. AVG arrives as AVG; unless avg_native is
     * set, the entry reduces it like SUM and group.c divides afterwards. */
    dt_status (*run[DT_COLL_COUNT])(dt__op *op);
    /* true if AVG results are already divided by the group size */
    bool avg_native;
};

extern const dt__backend dt__backend_native;
#ifdef DT_HAVE_MPI
extern const dt__backend dt__backend_mpi; /* mpi_backend.c */
#endif

#endif /* DTRAIN_COMM_BACKEND_H */
