/*
 * jobenv_print.c — print what dt__jobenv_read() finds, one line, for the
 * mpirun test (tests/launch/mpirun_jobenv.sh): under a real mpirun the
 * variables are Open MPI's own, not ones a unit test made up.
 */
#include "comm/jobenv.h"

#include <stdio.h>

int main(void) {
    dt__jobenv e;
    if (dt__jobenv_read(&e) != DT_OK) {
        fprintf(stderr, "jobenv_print: %s\n", dt_last_error());
        return 1;
    }
    printf("launcher=%s rank=%d size=%d local=%d/%d job=%s token=%s derived=%d\n",
           dt__launcher_name(e.launcher), e.rank, e.size, e.local_rank, e.local_size, e.job_id,
           e.token, (int)e.token_derived);
    return 0;
}
