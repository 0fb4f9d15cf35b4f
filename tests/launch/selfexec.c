/*
 * selfexec.c — a program that launches itself the way `dtrain train --nproc
 * N` does: `selfexec --nproc N [ARGS...]`. Outside a job it calls
 * dt_launch_self(); inside one (DT_RANK set) it prints its rank and the
 * arguments it was given, which must no longer contain --nproc.
 */
#include "dtrain/launch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    int nproc = 1;
    for (int i = 1; i < argc && strcmp(argv[i], "--") != 0; i++) {
        if (strcmp(argv[i], "--nproc") == 0 && i + 1 < argc)
            nproc = atoi(argv[i + 1]);
        else if (strncmp(argv[i], "--nproc=", 8) == 0)
            nproc = atoi(argv[i] + 8);
    }
    if (nproc > 1 && !dt_launch_in_job()) {
        dt_launch_options o;
        dt_launch_options_init(&o);
        o.nproc = nproc;
        o.tag_output = true;
        int code;
        if (dt_launch_self(&o, argc, argv, "--nproc", &code) != DT_OK)
            fprintf(stderr, "selfexec: error: %s\n", dt_last_error());
        return code;
    }
    printf("rank %s of %s args:", getenv("DT_RANK"), getenv("DT_WORLD_SIZE"));
    for (int i = 1; i < argc; i++)
        printf(" %s", argv[i]);
    printf(" nproc-env=%s\n", getenv("DT_NPROC") ? getenv("DT_NPROC") : "unset");
    return 0;
}
