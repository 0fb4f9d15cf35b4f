/*
 * config.c — comm's knobs, read once per group from DT_* variables.
 * Each has a row in docs/config.md; `dtrain bench comm` exposes the ones a
 * benchmark varies as flags that set the same variables.
 */
#include "comm_internal.h"

static const char *const transport_names[] = {"auto", "shm", "tcp"};
static const char *const cma_names[] = {"auto", "on", "off"};
static const char *const algo_env_names[] = {"auto",   "ring", "rhd",     "tree",
                                             "direct", "hier", "torus2d", "ordered"};
_Static_assert(sizeof algo_env_names / sizeof *algo_env_names == DT_ALGO_COUNT, "algo names");

dt_status dt__config_read(dt__config *c) {
    int64_t v;
    int e;
    DT_CHECK(dt_config_env_double("DT_TIMEOUT", 300, 0.1, 1e7, &c->timeout));
    DT_CHECK(dt_config_env_enum("DT_TRANSPORT", 0, transport_names, 3, &c->transport));
    DT_CHECK(dt_config_env_enum("DT_ALGO", 0, algo_env_names, DT_ALGO_COUNT, &e));
    c->algo = (dt_algo)e;
    DT_CHECK(dt_config_env_int("DT_DETERMINISTIC", 0, 0, 1, &v));
    c->deterministic = v == 1;
    DT_CHECK(dt_config_env_int("DT_TORUS_X", 0, 0, 1 << 20, &v));
    c->torus_x = (int)v;
    DT_CHECK(dt_config_env_int("DT_TOPO_PROBE", 0, 0, 1, &v));
    c->topo_probe = v == 1;
    DT_CHECK(dt_config_env_size("DT_CHUNK_SIZE", 1 << 20, 4096, (size_t)1 << 30, &c->chunk));
    DT_CHECK(dt_config_env_size("DT_SHM_SLOT", 128 << 10, 4096, (size_t)64 << 20, &c->shm_slot));
    DT_CHECK(dt_config_env_int("DT_SHM_SLOTS", 8, 2, 1024, &v));
    c->shm_slots = (int)v;
    DT_CHECK(
        dt_config_env_size("DT_SHM_WINDOW", 1 << 20, 64 << 10, (size_t)1 << 30, &c->shm_window));
    DT_CHECK(dt_config_env_enum("DT_SHM_CMA", 0, cma_names, 3, &c->shm_cma));
    DT_CHECK(dt_config_env_size("DT_SHM_CMA_MIN", 256 << 10, 1, (size_t)1 << 40, &c->shm_cma_min));
    DT_CHECK(dt_config_env_size("DT_SHM_PUSH_MIN", 4 << 20, 1, (size_t)1 << 40, &c->shm_push_min));
    DT_CHECK(dt_config_env_int("DT_SPIN", -1, -1, 1 << 30, &v));
    c->spin = (int)v;
    DT_CHECK(dt_config_env_int("DT_YIELD", -1, -1, 1 << 30, &v));
    c->yield = (int)v;
    DT_CHECK(dt_config_env_int("DT_TCP_SOCKS", 2, 1, DT__MAX_SOCKS, &v));
    c->tcp_socks = (int)v;
    /* unset: chosen per group from the rank and core counts (group.c) */
    DT_CHECK(dt_config_env_size("DT_TCP_BUFFER", SIZE_MAX, 0, (size_t)1 << 30, &c->tcp_buffer));
    DT_CHECK(
        dt_config_env_size("DT_TCP_STRIPE_MIN", 1 << 20, 4096, (size_t)1 << 40, &c->tcp_stripe));
    return DT_OK;
}
