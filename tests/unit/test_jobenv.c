/*
 * test_jobenv.c — rank/size/local rank/master from DT_*, Open MPI, MPICH
 * and Slurm variables (src/comm/jobenv.c), including precedence, derived
 * tokens, Slurm hostlists and task specs, and every error case.
 */
#include "comm/jobenv.h"
#include "test.h"

static const char *const all_vars[] = {"DT_RANK",
                                       "DT_WORLD_SIZE",
                                       "DT_LOCAL_RANK",
                                       "DT_LOCAL_WORLD_SIZE",
                                       "DT_NODE_RANK",
                                       "DT_MASTER_ADDR",
                                       "DT_MASTER_PORT",
                                       "DT_JOB_ID",
                                       "DT_JOB_TOKEN",
                                       "OMPI_COMM_WORLD_RANK",
                                       "OMPI_COMM_WORLD_SIZE",
                                       "OMPI_COMM_WORLD_LOCAL_RANK",
                                       "OMPI_COMM_WORLD_LOCAL_SIZE",
                                       "OMPI_MCA_ess_base_jobid",
                                       "PMIX_NAMESPACE",
                                       "OMPI_MCA_orte_ess_jobid",
                                       "PMI_RANK",
                                       "PMI_SIZE",
                                       "MPI_LOCALRANKID",
                                       "MPI_LOCALNRANKS",
                                       "PMI_KVSNAME",
                                       "SLURM_STEP_ID",
                                       "SLURM_PROCID",
                                       "SLURM_NTASKS",
                                       "SLURM_STEP_NUM_TASKS",
                                       "SLURM_LOCALID",
                                       "SLURM_NODEID",
                                       "SLURM_STEP_TASKS_PER_NODE",
                                       "SLURM_TASKS_PER_NODE",
                                       "SLURM_STEP_NODELIST",
                                       "SLURM_JOB_NODELIST",
                                       "SLURM_JOB_ID",
                                       NULL};

static void clear(void) {
    for (int i = 0; all_vars[i]; i++)
        unsetenv(all_vars[i]);
}

static void test_none(void) {
    clear();
    dt__jobenv e;
    ASSERT_OK(dt__jobenv_read(&e));
    ASSERT_EQ(e.launcher, DT__LAUNCHER_NONE);
    ASSERT_EQ(e.rank, 0);
    ASSERT_EQ(e.size, 1);
    ASSERT_EQ(e.local_rank, -1);
    ASSERT_STREQ(e.token, "");
}

static void test_dtrain(void) {
    clear();
    setenv("DT_RANK", "5", 1);
    setenv("DT_WORLD_SIZE", "8", 1);
    setenv("DT_LOCAL_RANK", "1", 1);
    setenv("DT_LOCAL_WORLD_SIZE", "4", 1);
    setenv("DT_NODE_RANK", "1", 1);
    setenv("DT_MASTER_ADDR", "10.0.0.1", 1);
    setenv("DT_MASTER_PORT", "29501", 1);
    setenv("DT_JOB_TOKEN", "0123456789abcdef0123456789ABCDEF", 1);
    setenv("OMPI_COMM_WORLD_RANK", "2", 1); /* DT_* win */
    setenv("OMPI_COMM_WORLD_SIZE", "3", 1);
    dt__jobenv e;
    ASSERT_OK(dt__jobenv_read(&e));
    ASSERT_EQ(e.launcher, DT__LAUNCHER_DTRAIN);
    ASSERT_EQ(e.rank, 5);
    ASSERT_EQ(e.size, 8);
    ASSERT_EQ(e.local_rank, 1);
    ASSERT_EQ(e.local_size, 4);
    ASSERT_EQ(e.node_rank, 1);
    ASSERT_STREQ(e.master_addr, "10.0.0.1");
    ASSERT_EQ(e.master_port, 29501);
    ASSERT_STREQ(e.token, "0123456789abcdef0123456789ABCDEF");
    ASSERT_TRUE(!e.token_derived);
}

static void test_ompi(void) {
    clear();
    setenv("OMPI_COMM_WORLD_RANK", "3", 1);
    setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
    setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1", 1);
    setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "2", 1);
    setenv("PMIX_NAMESPACE", "prterun-host-123@1", 1);
    setenv("DT_MASTER_ADDR", "a", 1);
    setenv("DT_MASTER_PORT", "29500", 1);
    dt__jobenv e;
    ASSERT_OK(dt__jobenv_read(&e));
    ASSERT_EQ(e.launcher, DT__LAUNCHER_OMPI);
    ASSERT_STREQ(dt__launcher_name(e.launcher), "Open MPI");
    ASSERT_EQ(e.rank, 3);
    ASSERT_EQ(e.size, 4);
    ASSERT_EQ(e.local_rank, 1);
    ASSERT_EQ(e.local_size, 2);
    ASSERT_STREQ(e.job_id, "ompi-prterun-host-123@1");
    ASSERT_EQ(strlen(e.token), 32);
    ASSERT_TRUE(e.token_derived);
    char first[33];
    snprintf(first, sizeof first, "%s", e.token);
    /* Same job, another rank: same token. Another job: another token. */
    setenv("OMPI_COMM_WORLD_RANK", "0", 1);
    ASSERT_OK(dt__jobenv_read(&e));
    ASSERT_STREQ(e.token, first);
    setenv("PMIX_NAMESPACE", "prterun-host-124@1", 1);
    ASSERT_OK(dt__jobenv_read(&e));
    ASSERT_TRUE(strcmp(e.token, first) != 0);
}

static void test_pmi(void) {
    clear();
    setenv("PMI_RANK", "1", 1);
    setenv("PMI_SIZE", "2", 1);
    setenv("MPI_LOCALRANKID", "1", 1);
    setenv("MPI_LOCALNRANKS", "2", 1);
    setenv("PMI_KVSNAME", "kvs_77_0", 1);
    dt__jobenv e;
    ASSERT_OK(dt__jobenv_read(&e));
    ASSERT_EQ(e.launcher, DT__LAUNCHER_PMI);
    ASSERT_EQ(e.rank, 1);
    ASSERT_EQ(e.size, 2);
    ASSERT_EQ(e.local_rank, 1);
    ASSERT_EQ(e.local_size, 2);
    ASSERT_STREQ(e.job_id, "pmi-kvs_77_0");
}

static void test_slurm(void) {
    clear();
    setenv("SLURM_STEP_ID", "0", 1);
    setenv("SLURM_JOB_ID", "4242", 1);
    setenv("SLURM_PROCID", "5", 1);
    setenv("SLURM_NTASKS", "7", 1);
    setenv("SLURM_LOCALID", "1", 1);
    setenv("SLURM_NODEID", "2", 1);
    setenv("SLURM_STEP_TASKS_PER_NODE", "2(x3),1", 1);
    setenv("SLURM_STEP_NODELIST", "gpu[007-009,12],cpu1", 1);
    dt__jobenv e;
    ASSERT_OK(dt__jobenv_read(&e));
    ASSERT_EQ(e.launcher, DT__LAUNCHER_SLURM);
    ASSERT_EQ(e.rank, 5);
    ASSERT_EQ(e.size, 7);
    ASSERT_EQ(e.local_rank, 1);
    ASSERT_EQ(e.local_size, 2);
    ASSERT_EQ(e.node_rank, 2);
    ASSERT_STREQ(e.master_addr, "gpu007");
    ASSERT_STREQ(e.job_id, "slurm-4242.0");
    ASSERT_TRUE(e.master_port >= 20000 && e.master_port < 32768);
    ASSERT_TRUE(e.token_derived);
    /* A batch script (no step) is not a rank. */
    unsetenv("SLURM_STEP_ID");
    ASSERT_OK(dt__jobenv_read(&e));
    ASSERT_EQ(e.launcher, DT__LAUNCHER_NONE);
}

static void test_slurm_parsers(void) {
    char h[64];
    ASSERT_OK(dt__slurm_first_host("node1", h, sizeof h));
    ASSERT_STREQ(h, "node1");
    ASSERT_OK(dt__slurm_first_host("a,b", h, sizeof h));
    ASSERT_STREQ(h, "a");
    ASSERT_OK(dt__slurm_first_host("n[03-05]-ib,x", h, sizeof h));
    ASSERT_STREQ(h, "n03-ib");
    ASSERT_STATUS(dt__slurm_first_host("[1-2]", h, sizeof h), DT_ERR_INVALID);
    ASSERT_STATUS(dt__slurm_first_host("n[x]", h, sizeof h), DT_ERR_INVALID);
    int t = -1;
    ASSERT_OK(dt__slurm_tasks_on_node("4", 0, &t));
    ASSERT_EQ(t, 4);
    ASSERT_OK(dt__slurm_tasks_on_node("2(x3),1", 2, &t));
    ASSERT_EQ(t, 2);
    ASSERT_OK(dt__slurm_tasks_on_node("2(x3),1", 3, &t));
    ASSERT_EQ(t, 1);
    ASSERT_STATUS(dt__slurm_tasks_on_node("2(x3),1", 4, &t), DT_ERR_INVALID);
    ASSERT_CONTAINS(dt_last_error(), "node 4");
    ASSERT_STATUS(dt__slurm_tasks_on_node("2(x", 0, &t), DT_ERR_INVALID);
}

static void test_errors(void) {
    dt__jobenv e;
    clear();
    setenv("DT_RANK", "1", 1);
    ASSERT_STATUS(dt__jobenv_read(&e), DT_ERR_INVALID);
    ASSERT_CONTAINS(dt_last_error(), "DT_RANK is set but DT_WORLD_SIZE is not");
    setenv("DT_WORLD_SIZE", "1", 1);
    ASSERT_STATUS(dt__jobenv_read(&e), DT_ERR_INVALID);
    ASSERT_CONTAINS(dt_last_error(), "DT_RANK=1 is not below DT_WORLD_SIZE=1 (from dtrain launch)");
    setenv("DT_WORLD_SIZE", "two", 1);
    ASSERT_STATUS(dt__jobenv_read(&e), DT_ERR_INVALID);
    ASSERT_CONTAINS(dt_last_error(), "DT_WORLD_SIZE");
    ASSERT_CONTAINS(dt_last_error(), "two");
    setenv("DT_WORLD_SIZE", "2", 1);
    setenv("DT_MASTER_PORT", "70000", 1);
    ASSERT_STATUS(dt__jobenv_read(&e), DT_ERR_INVALID);
    ASSERT_CONTAINS(dt_last_error(), "DT_MASTER_PORT");
    unsetenv("DT_MASTER_PORT");
    setenv("DT_JOB_TOKEN", "abc", 1);
    ASSERT_STATUS(dt__jobenv_read(&e), DT_ERR_INVALID);
    ASSERT_CONTAINS(dt_last_error(), "DT_JOB_TOKEN: \"abc\"");
    unsetenv("DT_JOB_TOKEN");
    setenv("DT_LOCAL_RANK", "3", 1);
    setenv("DT_LOCAL_WORLD_SIZE", "2", 1);
    ASSERT_STATUS(dt__jobenv_read(&e), DT_ERR_INVALID);
    ASSERT_CONTAINS(dt_last_error(), "local rank 3 is not below the local size 2");
}

int main(void) {
    RUN(test_none);
    RUN(test_dtrain);
    RUN(test_ompi);
    RUN(test_pmi);
    RUN(test_slurm);
    RUN(test_slurm_parsers);
    RUN(test_errors);
    return TEST_SUMMARY();
}
