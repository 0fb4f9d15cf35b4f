/*
 * jobenv.c — read rank, size, local rank and the meeting place from DT_*,
 * Open MPI, MPICH/PMI or Slurm variables (see jobenv.h for the order and
 * the invariants).
 */
#include "jobenv.h"

#include "dtrain/comm.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *const launcher_names[] = {"none",     "dtrain launch", "torchrun",
                                             "Open MPI", "MPICH/PMI",     "Slurm"};
_Static_assert(sizeof launcher_names / sizeof launcher_names[0] == DT__LAUNCHER_COUNT,
               "launcher names out of sync");

const char *dt__launcher_name(dt__launcher l) {
    return (unsigned)l < DT__LAUNCHER_COUNT ? launcher_names[l] : "?";
}

static const char *env(const char *name) {
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

/* Integer variable in [min, max]; *out untouched when unset. */
static dt_status env_int(const char *name, int64_t min, int64_t max, int *out, bool *found) {
    const char *v = env(name);
    if (found)
        *found = v != NULL;
    if (!v)
        return DT_OK;
    int64_t x;
    DT_CHECK(dt_config_parse_int(name, v, min, max, &x));
    *out = (int)x;
    return DT_OK;
}

dt_status dt__slurm_first_host(const char *list, char *out, size_t len) {
    /* Grammar (what srun prints): item[,item...], item = prefix or
     * prefix[range[,range...]]suffix, range = a or a-b with zero padding
     * kept. The first host is the prefix, the first range's start, and the
     * text after ']'. */
    size_t n = strcspn(list, ",[");
    if (n == 0 || n >= len)
        return dt_error_set(DT_ERR_INVALID, "Slurm node list \"%s\" does not start with a host",
                            list);
    memcpy(out, list, n);
    out[n] = '\0';
    if (list[n] != '[')
        return DT_OK;
    const char *start = list + n + 1;
    size_t digits = strspn(start, "0123456789");
    const char *close = strchr(start, ']');
    if (digits == 0 || !close || n + digits >= len)
        return dt_error_set(DT_ERR_INVALID, "Slurm node list \"%s\": bad range", list);
    memcpy(out + n, start, digits);
    out[n + digits] = '\0';
    size_t suffix = strcspn(close + 1, ",");
    if (n + digits + suffix >= len)
        return dt_error_set(DT_ERR_INVALID, "Slurm node list \"%s\": host name too long", list);
    memcpy(out + n + digits, close + 1, suffix);
    out[n + digits + suffix] = '\0';
    return DT_OK;
}

dt_status dt__slurm_tasks_on_node(const char *spec, int node, int *out) {
    /* "2(x3),1": nodes 0-2 run 2 tasks each, node 3 runs 1. */
    const char *p = spec;
    int first = 0;
    while (*p) {
        char *end;
        long tasks = strtol(p, &end, 10);
        long reps = 1;
        if (end == p || tasks < 0)
            break;
        p = end;
        if (strncmp(p, "(x", 2) == 0) {
            reps = strtol(p + 2, &end, 10);
            if (end == p + 2 || *end != ')' || reps < 1)
                break;
            p = end + 1;
        }
        if (node < first + reps) {
            *out = (int)tasks;
            return DT_OK;
        }
        first += (int)reps;
        if (*p == ',')
            p++;
        else if (*p)
            break;
    }
    return dt_error_set(DT_ERR_INVALID, "SLURM_TASKS_PER_NODE \"%s\" says nothing about node %d",
                        spec, node);
}

/* A token every rank can compute from the job id: two XXH3 hashes. */
/* The store's port when nobody chose one: from the job id, so every rank
 * finds the same, and in [20000, 32768), below Linux's default range of
 * ephemeral ports (32768-60999): a port in that range may be the local end
 * of some outgoing connection on rank 0's host at that moment. */
static int derive_port(const char *job_id) {
    return 20000 + (int)(dt_hash64(job_id, strlen(job_id), 0) % 12768);
}

static void derive_token(const char *job_id, char *out) {
    uint64_t a = dt_hash64(job_id, strlen(job_id), 0x64747261696e31ull);
    uint64_t b = dt_hash64(job_id, strlen(job_id), 0x64747261696e32ull);
    snprintf(out, 33, "%016llx%016llx", (unsigned long long)a, (unsigned long long)b);
}

static dt_status read_launcher(dt__jobenv *e) {
    bool r, s;
    /* 1. dtrain launch */
    DT_CHECK(env_int("DT_RANK", 0, INT32_MAX, &e->rank, &r));
    DT_CHECK(env_int("DT_WORLD_SIZE", 1, INT32_MAX, &e->size, &s));
    if (r || s) {
        if (!(r && s))
            return dt_error_set(DT_ERR_INVALID, "%s is set but %s is not (set both, or neither)",
                                r ? "DT_RANK" : "DT_WORLD_SIZE", r ? "DT_WORLD_SIZE" : "DT_RANK");
        e->launcher = DT__LAUNCHER_DTRAIN;
        return DT_OK;
    }
    /* 2. torchrun (and anything that follows PyTorch's env:// convention):
     * RANK and WORLD_SIZE alone are too common names to mean a job, so a
     * master address must be there too. */
    if (env("RANK") && env("WORLD_SIZE") && env("MASTER_ADDR")) {
        e->launcher = DT__LAUNCHER_TORCH;
        DT_CHECK(env_int("RANK", 0, INT32_MAX, &e->rank, NULL));
        DT_CHECK(env_int("WORLD_SIZE", 1, INT32_MAX, &e->size, NULL));
        DT_CHECK(env_int("LOCAL_RANK", 0, INT32_MAX, &e->local_rank, NULL));
        DT_CHECK(env_int("LOCAL_WORLD_SIZE", 1, INT32_MAX, &e->local_size, NULL));
        DT_CHECK(env_int("GROUP_RANK", 0, INT32_MAX, &e->node_rank, NULL));
        DT_CHECK(env_int("MASTER_PORT", 1, 65535, &e->master_port, NULL));
        const char *agent = env("TORCHELASTIC_USE_AGENT_STORE");
        if (e->master_port && agent && strcmp(agent, "True") == 0)
            e->master_port = e->master_port < 65535 ? e->master_port + 1 : 65534;
        if (strlen(env("MASTER_ADDR")) >= sizeof e->master_addr)
            return dt_error_set(DT_ERR_INVALID, "MASTER_ADDR: \"%.40s...\" is too long",
                                env("MASTER_ADDR"));
        snprintf(e->master_addr, sizeof e->master_addr, "%s", env("MASTER_ADDR"));
        const char *run = env("TORCHELASTIC_RUN_ID"), *restart = env("TORCHELASTIC_RESTART_COUNT");
        snprintf(e->job_id, sizeof e->job_id, "torch-%.40s-%.40s:%d-%.8s", run ? run : "none",
                 e->master_addr, e->master_port, restart ? restart : "0");
        return DT_OK;
    }
    /* 3. Open MPI */
    DT_CHECK(env_int("OMPI_COMM_WORLD_RANK", 0, INT32_MAX, &e->rank, &r));
    DT_CHECK(env_int("OMPI_COMM_WORLD_SIZE", 1, INT32_MAX, &e->size, &s));
    if (r && s) {
        e->launcher = DT__LAUNCHER_OMPI;
        DT_CHECK(env_int("OMPI_COMM_WORLD_LOCAL_RANK", 0, INT32_MAX, &e->local_rank, NULL));
        DT_CHECK(env_int("OMPI_COMM_WORLD_LOCAL_SIZE", 1, INT32_MAX, &e->local_size, NULL));
        const char *id = env("OMPI_MCA_ess_base_jobid");
        if (!id)
            id = env("PMIX_NAMESPACE");
        if (!id)
            id = env("OMPI_MCA_orte_ess_jobid");
        if (id)
            snprintf(e->job_id, sizeof e->job_id, "ompi-%s", id);
        return DT_OK;
    }
    /* 4. MPICH / Hydra */
    DT_CHECK(env_int("PMI_RANK", 0, INT32_MAX, &e->rank, &r));
    DT_CHECK(env_int("PMI_SIZE", 1, INT32_MAX, &e->size, &s));
    if (r && s) {
        e->launcher = DT__LAUNCHER_PMI;
        DT_CHECK(env_int("MPI_LOCALRANKID", 0, INT32_MAX, &e->local_rank, NULL));
        DT_CHECK(env_int("MPI_LOCALNRANKS", 1, INT32_MAX, &e->local_size, NULL));
        const char *id = env("PMI_KVSNAME");
        if (id)
            snprintf(e->job_id, sizeof e->job_id, "pmi-%s", id);
        return DT_OK;
    }
    /* 5. srun: only inside a job step (a batch script has SLURM_PROCID=0
     * too, and is not a rank of anything). */
    if (env("SLURM_STEP_ID") && env("SLURM_PROCID") &&
        (env("SLURM_STEP_NUM_TASKS") || env("SLURM_NTASKS"))) {
        e->launcher = DT__LAUNCHER_SLURM;
        DT_CHECK(env_int("SLURM_PROCID", 0, INT32_MAX, &e->rank, NULL));
        if (env("SLURM_STEP_NUM_TASKS"))
            DT_CHECK(env_int("SLURM_STEP_NUM_TASKS", 1, INT32_MAX, &e->size, NULL));
        else
            DT_CHECK(env_int("SLURM_NTASKS", 1, INT32_MAX, &e->size, NULL));
        DT_CHECK(env_int("SLURM_LOCALID", 0, INT32_MAX, &e->local_rank, NULL));
        DT_CHECK(env_int("SLURM_NODEID", 0, INT32_MAX, &e->node_rank, NULL));
        const char *tpn = env("SLURM_STEP_TASKS_PER_NODE");
        if (!tpn)
            tpn = env("SLURM_TASKS_PER_NODE");
        if (tpn && e->node_rank >= 0)
            DT_CHECK(dt__slurm_tasks_on_node(tpn, e->node_rank, &e->local_size));
        const char *nodes = env("SLURM_STEP_NODELIST");
        if (!nodes)
            nodes = env("SLURM_JOB_NODELIST");
        if (nodes)
            DT_CHECK(dt__slurm_first_host(nodes, e->master_addr, sizeof e->master_addr));
        snprintf(e->job_id, sizeof e->job_id, "slurm-%s.%s",
                 env("SLURM_JOB_ID") ? env("SLURM_JOB_ID") : "0", env("SLURM_STEP_ID"));
        e->master_port = derive_port(e->job_id);
        return DT_OK;
    }
    e->launcher = DT__LAUNCHER_NONE;
    e->rank = 0;
    e->size = 1;
    return DT_OK;
}

dt_status dt__jobenv_read(dt__jobenv *out) {
    dt__jobenv e;
    memset(&e, 0, sizeof e);
    e.local_rank = e.local_size = e.node_rank = -1;
    DT_CHECK(read_launcher(&e));
    const char *who = dt__launcher_name(e.launcher);
    static const char *const vars[][2] = {
        {"rank", "size"},         {"DT_RANK", "DT_WORLD_SIZE"},
        {"RANK", "WORLD_SIZE"},   {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},
        {"PMI_RANK", "PMI_SIZE"}, {"SLURM_PROCID", "SLURM_NTASKS"}};
    _Static_assert(sizeof vars / sizeof vars[0] == DT__LAUNCHER_COUNT, "vars out of sync");
    if (e.rank >= e.size)
        return dt_error_set(DT_ERR_INVALID, "%s=%d is not below %s=%d (from %s)",
                            vars[e.launcher][0], e.rank, vars[e.launcher][1], e.size, who);

    /* DT_* win over whatever the launcher said. */
    DT_CHECK(env_int("DT_LOCAL_RANK", 0, INT32_MAX, &e.local_rank, NULL));
    DT_CHECK(env_int("DT_LOCAL_WORLD_SIZE", 1, INT32_MAX, &e.local_size, NULL));
    DT_CHECK(env_int("DT_NODE_RANK", 0, INT32_MAX, &e.node_rank, NULL));
    DT_CHECK(env_int("DT_MASTER_PORT", 1, 65535, &e.master_port, NULL));
    const char *v;
    if ((v = env("DT_MASTER_ADDR")) != NULL) {
        if (strlen(v) >= sizeof e.master_addr)
            return dt_error_set(DT_ERR_INVALID, "DT_MASTER_ADDR: \"%.40s...\" is too long", v);
        snprintf(e.master_addr, sizeof e.master_addr, "%s", v);
    }
    if ((v = env("DT_JOB_ID")) != NULL)
        snprintf(e.job_id, sizeof e.job_id, "%s", v);
    if ((v = env("DT_JOB_TOKEN")) != NULL) {
        if (strlen(v) != 32 || strspn(v, "0123456789abcdefABCDEF") != 32)
            return dt_error_set(DT_ERR_INVALID,
                                "DT_JOB_TOKEN: \"%.40s\" is not 32 hexadecimal characters", v);
        snprintf(e.token, sizeof e.token, "%s", v);
    } else if (e.launcher != DT__LAUNCHER_DTRAIN && e.job_id[0]) {
        derive_token(e.job_id, e.token);
        e.token_derived = true;
    }

    if ((e.local_rank < 0) != (e.local_size < 0)) {
        /* Half an answer is no answer: topology comes from host names. */
        e.local_rank = e.local_size = -1;
    }
    if (e.local_rank >= 0 && e.local_rank >= e.local_size)
        return dt_error_set(DT_ERR_INVALID, "local rank %d is not below the local size %d (%s)",
                            e.local_rank, e.local_size, who);
    *out = e;
    return DT_OK;
}

dt_status dt__random_token(char *out) {
    unsigned char raw[16];
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return dt_error_set_errno(DT_ERR_SYSTEM, "cannot open /dev/urandom");
    ssize_t got = read(fd, raw, sizeof raw);
    close(fd);
    if (got != (ssize_t)sizeof raw)
        return dt_error_set(DT_ERR_SYSTEM, "short read from /dev/urandom");
    for (size_t i = 0; i < sizeof raw; i++)
        snprintf(out + 2 * i, 3, "%02x", raw[i]);
    return DT_OK;
}

/* What the environment can tell without MPI. */
static dt_status fill_without_mpi(dt__jobenv *e, const char *who) {
    if (!e->master_addr[0]) {
        if (e->local_size != e->size)
            return dt_error_set(DT_ERR_INVALID,
                                "started by %s on several hosts: set DT_MASTER_ADDR (rank 0's "
                                "host) and DT_MASTER_PORT, e.g. mpirun -x DT_MASTER_ADDR=host0 -x "
                                "DT_MASTER_PORT=29500 (a build with MPI finds them itself)",
                                who);
        snprintf(e->master_addr, sizeof e->master_addr, "127.0.0.1");
    }
    if (!e->master_port)
        e->master_port = derive_port(e->job_id);
    if (!e->token[0])
        return dt_error_set(DT_ERR_INVALID,
                            "started by %s without a job id to derive a token from: set "
                            "DT_JOB_TOKEN (32 hex characters, the same on every rank)",
                            who);
    return DT_OK;
}

dt_status dt__jobenv_export(void) {
    dt__jobenv e;
    DT_CHECK(dt__jobenv_read(&e));
    if (e.launcher == DT__LAUNCHER_DTRAIN || e.launcher == DT__LAUNCHER_NONE)
        return DT_OK;
    const char *who = dt__launcher_name(e.launcher);
#ifdef DT_HAVE_MPI
    /* Slurm already names the master and the port; starting MPI only for a
     * random token is not worth it (and MPI_Init under srun depends on how
     * Slurm and MPI were built), unless the mpi backend needs MPI anyway. */
    const char *be = getenv("DT_BACKEND");
    bool use_mpi = e.launcher == DT__LAUNCHER_OMPI || e.launcher == DT__LAUNCHER_PMI ||
                   (e.launcher == DT__LAUNCHER_SLURM && be && strcmp(be, "mpi") == 0);
    dt_status st = use_mpi ? dt__mpi_bootstrap(&e) : DT_ERR_UNSUPPORTED;
    if (st == DT_ERR_UNSUPPORTED) /* not wanted, or MPI does not see this job */
        st = fill_without_mpi(&e, who);
    if (st != DT_OK) {
        dt_error_prefix("started by %s: bootstrap", who);
        return st;
    }
#else
    DT_CHECK(fill_without_mpi(&e, who));
#endif
    char port[16];
    snprintf(port, sizeof port, "%d", e.master_port);
    if (setenv("DT_MASTER_ADDR", e.master_addr, 1) != 0 || setenv("DT_MASTER_PORT", port, 1) != 0 ||
        setenv("DT_JOB_TOKEN", e.token, 1) != 0 ||
        (e.job_id[0] && setenv("DT_JOB_ID", e.job_id, 1) != 0))
        return dt_error_set_errno(DT_ERR_SYSTEM, "setenv");
    DT_DEBUG("comm", "started by %s: rank %d of %d, master %s:%d, job %s", who, e.rank, e.size,
             e.master_addr, e.master_port, e.job_id);
    return DT_OK;
}

dt_status dt_job_info_read(dt_job_info *out) {
    if (!out)
        return dt_error_set(DT_ERR_INVALID, "dt_job_info_read: out is NULL");
    DT_CHECK(dt__jobenv_export());
    dt__jobenv e;
    DT_CHECK(dt__jobenv_read(&e));
    memset(out, 0, sizeof *out);
    out->rank = e.rank;
    out->size = e.size;
    out->local_rank = e.local_rank;
    out->local_size = e.local_size;
    snprintf(out->master_addr, sizeof out->master_addr, "%s", e.master_addr);
    out->master_port = e.master_port;
    snprintf(out->token, sizeof out->token, "%s", e.token);
    snprintf(out->job_id, sizeof out->job_id, "%s", e.job_id);
    return DT_OK;
}
