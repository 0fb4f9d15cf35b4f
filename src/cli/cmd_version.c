/*
 * cmd_version.c — `dtrain version`: the version and how this binary was built.
 */
#include "cli.h"

#include <stdio.h>

static const cli_opt version_opts[] = {{0}};

static int run_version(cli_args *args) {
    (void)args;
    printf("dtrain %s\n", DT_VERSION_STRING);
    printf("compiler: %s\n", __VERSION__);
#ifdef __AVX512F__
    printf("built for: avx512\n");
#elif defined(__AVX2__)
    printf("built for: avx2\n");
#else
    printf("built for: baseline x86-64\n");
#endif
    return 0;
}

const cli_cmd cli_cmd_version = {
    .name = "version",
    .summary = "print the version and build information",
    .usage = "dtrain version",
    .opts = version_opts,
    .run = run_version,
};
