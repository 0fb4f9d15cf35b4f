/*
 * jobenv.h — who this process is in its job, whichever launcher started it.
 *
 * dt_group_init_from_env() needs a rank, a world size, a local rank and a
 * place to meet (master address and port, job token). `dtrain launch` sets
 * DT_*; mpirun and srun set their own variables. dt__jobenv_read() looks at
 * them in a fixed order and says where each answer came from:
 *
 *   1. DT_RANK + DT_WORLD_SIZE                  dtrain launch (or by hand)
 *   2. RANK + WORLD_SIZE + MASTER_ADDR          torchrun (PyTorch's env://)
 *   3. OMPI_COMM_WORLD_RANK + _SIZE             Open MPI mpirun
 *   4. PMI_RANK + PMI_SIZE                      MPICH / Hydra mpiexec
 *   5. SLURM_PROCID + SLURM_NTASKS, in a step   srun
 *
 * Every other DT_* variable (DT_LOCAL_RANK, DT_LOCAL_WORLD_SIZE,
 * DT_NODE_RANK, DT_MASTER_ADDR, DT_MASTER_PORT, DT_JOB_ID, DT_JOB_TOKEN)
 * wins over what a launcher provides, so a user can always fill a gap by
 * hand (`mpirun -x DT_MASTER_ADDR=...`).
 *
 * What a foreign launcher cannot give is filled where it can be:
 *   - Slurm: master address = the first host of SLURM_STEP_NODELIST (or
 *     SLURM_JOB_NODELIST), port = 20000 + (hash of the job/step id % 20000).
 *   - torchrun: LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK (the node),
 *     MASTER_ADDR and MASTER_PORT; when torchrun's own agent serves its
 *     store on MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE=True, its static
 *     rendezvous), rank 0 serves dtrain's on MASTER_PORT + 1.
 *   - job id: SLURM_JOB_ID.SLURM_STEP_ID, OMPI's jobid or PMIx namespace,
 *     MPICH's PMI_KVSNAME, torchrun's TORCHELASTIC_RUN_ID with the master
 *     and the restart count.
 *   - token: when none is given, one derived from the job id
 *     (token_derived = true). Every rank derives the same one, which keeps
 *     unrelated jobs apart, but it is not a secret: export DT_JOB_TOKEN, or
 *     let the MPI bootstrap broadcast a random one, where that matters.
 *
 * Invariants: on DT_OK, 0 <= rank < size; local_rank/local_size are both
 * known (>= 0, local_rank < local_size) or both -1; strings are NUL
 * terminated ("" = unknown). Bad values are DT_ERR_INVALID naming the
 * variable and its text.
 */
#ifndef DTRAIN_COMM_JOBENV_H
#define DTRAIN_COMM_JOBENV_H

#include "dtrain/core.h"

typedef enum dt__launcher {
    DT__LAUNCHER_NONE,   /* no variables at all: a single process */
    DT__LAUNCHER_DTRAIN, /* DT_RANK / DT_WORLD_SIZE */
    DT__LAUNCHER_TORCH,  /* torchrun: RANK / WORLD_SIZE / MASTER_ADDR */
    DT__LAUNCHER_OMPI,   /* Open MPI */
    DT__LAUNCHER_PMI,    /* MPICH Hydra (PMI-1/2) */
    DT__LAUNCHER_SLURM,  /* srun */
    DT__LAUNCHER_COUNT
} dt__launcher;

typedef struct dt__jobenv {
    dt__launcher launcher; /* where rank and size came from */
    int rank, size;        /* world rank and size */
    int local_rank;        /* rank among this host's processes, or -1 */
    int local_size;        /* processes on this host, or -1 */
    int node_rank;         /* DT_NODE_RANK or SLURM_NODEID, or -1 */
    char master_addr[256]; /* "" when unknown */
    int master_port;       /* 0 when unknown */
    char job_id[128];      /* "" when unknown */
    char token[33];        /* 32 hex characters, or "" */
    bool token_derived;    /* token computed from job_id, not secret */
} dt__jobenv;

dt_status dt__jobenv_read(dt__jobenv *e);
/* "dtrain launch", "Open MPI", "MPICH/PMI", "Slurm", "none". */
const char *dt__launcher_name(dt__launcher l);

/* Exposed for tests: the first host of a Slurm hostlist ("n[03-05,9],x"
 * gives "n03"). DT_ERR_INVALID for text that is not a hostlist. */
dt_status dt__slurm_first_host(const char *list, char *out, size_t len);
/* Exposed for tests: processes on node `node` from "2(x3),1" style text. */
dt_status dt__slurm_tasks_on_node(const char *spec, int node, int *out);

/* For dt_group_init_from_env: under mpirun/srun, fill in the meeting place
 * the launcher did not give and export it as DT_MASTER_ADDR,
 * DT_MASTER_PORT, DT_JOB_TOKEN and DT_JOB_ID (what comm reads). With MPI
 * (DT_HAVE_MPI) under mpirun rank 0 decides and broadcasts
 * (dt__mpi_bootstrap); otherwise (no MPI, or srun, which names the master
 * itself) one host means 127.0.0.1 and a port and token derived from the
 * job id, and several hosts need DT_MASTER_ADDR from the user (a clear
 * error says so). A no-op under dtrain launch or without any launcher. */
dt_status dt__jobenv_export(void);

/* 32 hex characters from /dev/urandom (out has 33 bytes). */
dt_status dt__random_token(char *out);

#ifdef DT_HAVE_MPI
/* Collective over MPI_COMM_WORLD: rank 0 fills what e lacks (address, a
 * free port, a fresh random token) and broadcasts it. DT_ERR_UNSUPPORTED
 * when MPI's world is not the launcher's (each rank a singleton: srun
 * without PMI), and the caller falls back. mpi_backend.c. */
dt_status dt__mpi_bootstrap(dt__jobenv *e);
#endif

#endif /* DTRAIN_COMM_JOBENV_H */
