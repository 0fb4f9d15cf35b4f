/*
 * dtrain/elastic.h — a job whose membership changes while it runs: ranks
 * that die are dropped, new processes join, and the survivors keep their
 * processes (and the memory they hold) instead of restarting.
 *
 * Overview
 * --------
 * An elastic job goes through generations. Each generation is a fixed
 * membership with its own world group (dtrain/comm.h), ranks 0..size-1. A
 * generation ends when it is revoked: a member saw a collective fail (a
 * peer died) or the members chose to let newcomers in. Then every live
 * member and every waiting newcomer meets in the rendezvous store, one of
 * them writes the next generation's membership once (ULFM's revoke /
 * agree / shrink, with the store as the place of agreement), and each
 * creates the new world group:
 *
 *   1. Revoke. The member marks the generation revoked in the store and
 *      registers with the step its state is at.
 *   2. Agree. The decider is the lowest-ranked member of the generation
 *      that is still alive; "alive" is what the store sees: each process
 *      holds a key that disappears when its connection closes (the kernel
 *      closes it when the process dies). The decider waits until every
 *      live member has registered (bounded by the round's timeout), adds
 *      the live newcomers up to `max`, and writes the membership with a
 *      set-if-absent, so that a second decider can only read the first
 *      one's. Survivors keep their order; newcomers come after them.
 *   3. Shrink / grow. Each member creates the world group of the new
 *      generation; a member that dies meanwhile revokes it too, and the
 *      round starts over. Fewer than `min` members fails the job on every
 *      rank with one message.
 *
 * The store survives the death of its host. Every member binds a
 * listening socket when it joins and publishes its address; the store is
 * served by the lowest-ranked member (rank 0 of the first generation
 * serves it on the job's master port). When a request finds the store
 * gone, the process tries the members in rank order: a refused connection
 * means that member is dead, the first one that accepts is the new host,
 * and the first live member in that order starts serving on its socket
 * (and on the job's master port when it can bind it, so newcomers given
 * the job's address still find it). The new store starts empty: everything
 * the store holds is soft state that its clients publish again (liveness,
 * the last membership, revocations, join requests), and the round in
 * progress starts over.
 *
 * The state to continue from is the caller's: dt_elastic_reform names the
 * member whose state is the most advanced (the highest step registered),
 * and the caller broadcasts it over the new world group (dtrain train:
 * the model and optimizer state every data-parallel rank holds).
 *
 * Ownership and rules
 * -------------------
 *   1. One dt_elastic per process; it owns the store client (and the
 *      store server while this process hosts it) and the groups it
 *      returns are the caller's (dt_group_destroy them).
 *   2. Before dt_elastic_reform the caller destroys every group of the
 *      current generation (after a failure, dt_group_abort the world first
 *      so that members blocked in a collective hear of it at once).
 *   3. Every member of a generation calls dt_elastic_reform (after a
 *      failure, or at the same step when the members agreed to grow, e.g.
 *      on rank 0's dt_elastic_joiners broadcast over the world).
 *   4. dt_elastic_destroy is called by every member at the end; the store
 *      host waits (10 s at most) until the others have left.
 *   5. Not thread-safe: one thread calls these functions.
 *
 * Worked example: an allreduce loop that survives a dead rank
 * -----------------------------------------------------------
 *     // started by `dtrain launch -n 4 ./prog` (DT_RANK, DT_JOB_TOKEN, ...)
 *     dt_elastic *e;
 *     dt_group *world;
 *     dt_elastic_options o = {.min = 2, .max = 4};
 *     DT_CHECK(dt_elastic_create(&e, &o, &world));
 *     for (int64_t step = 0; step < 100;) {
 *         if (dt_group_allreduce(world, x, x, n, DT_F32, DT_SUM) == DT_OK) {
 *             step++;
 *             continue;
 *         }
 *         dt_group_abort(world);                      // revoke
 *         dt_group_destroy(world);
 *         dt_elastic_view v;
 *         DT_CHECK(dt_elastic_reform(e, step, &world, &v));   // agree, shrink
 *         dt_group_broadcast(world, &step, 1, DT_I64, v.root);
 *     }
 *     dt_group_destroy(world);
 *     dt_elastic_destroy(e);
 */
#ifndef DTRAIN_ELASTIC_H
#define DTRAIN_ELASTIC_H

#include "dtrain/comm.h"
#include "dtrain/core.h"

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dt_elastic dt_elastic;

typedef struct dt_elastic_options {
    int min, max; /* world sizes the job may run at, 1 <= min <= max */
    /* NULL: this process is a rank of the job's first generation, started
     * by `dtrain launch` (DT_RANK, DT_WORLD_SIZE, DT_MASTER_ADDR,
     * DT_MASTER_PORT, DT_JOB_TOKEN). "ADDR:PORT": a newcomer that joins the
     * running job whose store is there (DT_JOB_TOKEN must be the job's). */
    const char *join;
    double timeout; /* bound on one membership round, seconds; <= 0: DT_TIMEOUT */
} dt_elastic_options;

/* What a membership round decided, seen from this process. */
typedef struct dt_elastic_view {
    int generation;       /* 0: the launcher's ranks; +1 per round */
    int rank, size;       /* this process in the new world */
    int prev_rank;        /* in the previous generation; -1 for a newcomer */
    int prev_size;        /* size of the previous generation (0 for a newcomer) */
    int root;             /* new rank of the member whose state is the most advanced */
    int64_t root_step;    /* the step it registered */
    int lost;             /* members of the previous generation left out (dead) */
    int joined;           /* newcomers let in */
    char lost_ranks[256]; /* their ranks in the previous generation: "1,3" ("" if none) */
    double seconds;       /* from entering dt_elastic_reform to the new world group */
} dt_elastic_view;

/* Join the job (see dt_elastic_options.join). A rank of the first
 * generation gets its world group in *world (collective over the
 * launcher's ranks); a newcomer gets *world = NULL and is let in by a later
 * dt_elastic_reform. */
dt_status dt_elastic_create(dt_elastic **out, const dt_elastic_options *o, dt_group **world);

/* Newcomers waiting to be let in, up to the room left below max (0 when
 * the job is full). A few store requests: call it on one rank per step and
 * share the answer. */
dt_status dt_elastic_joiners(dt_elastic *e, int *count);

/* Collective over the live members of the current generation and the
 * newcomers (see the overview): agree on the next membership and create
 * its world group (*world; the caller destroyed the old one). `step` is
 * the state this process can give: the number of optimizer steps it has
 * completed, or -1 when it has none (a newcomer). DT_ERR_PEER with one
 * message when fewer than min members remain or no member has a state;
 * DT_ERR_TIMEOUT when the round does not finish within the timeout. */
dt_status dt_elastic_reform(dt_elastic *e, int64_t step, dt_group **world, dt_elastic_view *view);

/* The current generation (-1 for a newcomer not let in yet). */
int dt_elastic_generation(const dt_elastic *e);

/* Leave the job (every member, at the end; see rule 4). NULL-safe. */
void dt_elastic_destroy(dt_elastic *e);

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_ELASTIC_H */
