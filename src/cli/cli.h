/*
 * cli.h — the dtrain command's subcommand table and its one flag parser.
 *
 * Every subcommand declares its flags as a table of cli_opt. cli_parse()
 * builds the getopt_long table from it, resolves each value (flag, else the
 * DT_* variable, else the command's --config file if it has a "config"
 * option, else the default), converts and range-checks it with the
 * core config parsers, and on any error prints the message and the usage and
 * exits 2. After a successful parse the typed getters cannot fail.
 */
#ifndef DTRAIN_CLI_H
#define DTRAIN_CLI_H

#include "dtrain/core.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

typedef enum cli_kind {
    CLI_FLAG,   /* no argument; presence sets it */
    CLI_STRING, /* any text */
    CLI_INT,    /* integer in [min, max] */
    CLI_SIZE,   /* size with K/M/G suffix in [min, max] */
    CLI_DOUBLE, /* finite real in [min, max] */
    CLI_BOOL,   /* 1/0, true/false, yes/no, on/off */
    CLI_ENUM,   /* one of choices[] */
} cli_kind;

typedef struct cli_opt {
    const char *name;           /* long name without "--" */
    char short_name;            /* one-letter alias, or 0 */
    cli_kind kind;              /* how the value is parsed */
    const char *metavar;        /* shown in help ("N", "FILE") */
    const char *def;            /* default as text, or NULL for none */
    const char *env;            /* DT_* variable read when the flag is absent */
    const char *help;           /* one line */
    const char *const *choices; /* CLI_ENUM only, NULL-terminated */
    double min, max;            /* CLI_INT / CLI_SIZE / CLI_DOUBLE range */
} cli_opt;

#define CLI_MAX_OPTS 128

typedef struct cli_value {
    bool set;         /* given by a flag, the environment or the --config file */
    const char *from; /* "flag", "env", "config" or "default" */
    const char *text; /* resolved text (flag, env, config or default), or NULL */
    int64_t i;        /* CLI_INT */
    size_t size;      /* CLI_SIZE */
    double d;         /* CLI_DOUBLE */
    bool b;           /* CLI_BOOL and CLI_FLAG */
    int e;            /* CLI_ENUM: index into choices */
} cli_value;

typedef struct cli_cmd cli_cmd;

/* A spelling accepted for an option but not shown in the help: an old name
 * kept after a rename (`bench comm --np` for --nproc). */
typedef struct cli_alias {
    const char *alias; /* long name without "--" */
    const char *name;  /* the option it stands for */
} cli_alias;

typedef struct cli_args {
    const cli_cmd *cmd;
    cli_value values[CLI_MAX_OPTS]; /* parallel to cmd->opts */
    int argc;                       /* positional arguments left */
    char **argv;
    int raw_argc;    /* the argc/argv cli_parse was given (argv[0] is the */
    char **raw_argv; /*   subcommand's name), e.g. to relaunch oneself */
} cli_args;

struct cli_cmd {
    const char *name;        /* "train" */
    const char *parent;      /* "bench" for `dtrain bench comm`, else NULL */
    const char *summary;     /* one line for `dtrain --help` */
    const char *usage;       /* "dtrain train [OPTIONS]" */
    const char *description; /* paragraph(s) for `dtrain help train`, may be NULL */
    const cli_opt *opts;     /* terminated by an entry with name == NULL */
    int (*run)(cli_args *args);
    bool stop_at_positional;    /* true: options end at the first positional (launch) */
    const cli_alias *aliases;   /* hidden spellings, terminated by {NULL}; may be NULL */
    const cli_cmd *const *subs; /* the actions of a command of subcommands (bench, data,
                                   ckpt), for `dtrain help CMD ACTION`; NULL otherwise */
    size_t nsubs;
};

/* Parse argv (argv[0] is the subcommand name). Exits 0 after printing help
 * for --help, exits 2 after printing an error and the usage on bad input. */
void cli_parse(const cli_cmd *cmd, int argc, char **argv, cli_args *out);

const cli_value *cli_get(const cli_args *a, const char *name);
const char *cli_str(const cli_args *a, const char *name);
int64_t cli_int(const cli_args *a, const char *name);
size_t cli_size(const cli_args *a, const char *name);
double cli_double(const cli_args *a, const char *name);
bool cli_bool(const cli_args *a, const char *name);
int cli_enum(const cli_args *a, const char *name);
bool cli_is_set(const cli_args *a, const char *name);

void cli_print_help(const cli_cmd *cmd, FILE *out);
/* Print "dtrain <cmd>: error: <msg>" and the usage, then exit 2. */
_Noreturn void cli_usage_error(const cli_cmd *cmd, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* For a command of subcommands (bench, data, ckpt): parse a->argv as the
 * one of subs[0..n) it names and run it; a missing or unknown name is a
 * usage error ("which WHAT? HINT", "unknown WHAT 'x' HINT"). */
int cli_run_sub(cli_args *a, const cli_cmd *const *subs, size_t n, const char *what,
                const char *hint);
/* The action of `cmd` named `name` (cmd->subs), or NULL. */
const cli_cmd *cli_find_sub(const cli_cmd *cmd, const char *name);
/* Print "dtrain: error: <dt_last_error() or strerror>" and return an exit
 * code for the status (1 in general, 2 for DT_ERR_INVALID). The library's
 * "at file:line" breadcrumbs are left out unless DT_LOG is debug or trace. */
int cli_fail(dt_status st);
/* Threads when --threads is 0: OMP_NUM_THREADS when it holds a count
 * (torchrun sets it per rank), else every CPU. */
int cli_default_threads(void);
/* dt_last_error() without its breadcrumbs (unless DT_LOG is debug or
 * trace): what a user is shown. Points to a static buffer. */
const char *cli_error_text(void);

/* `dtrain train --layout auto` (train_layout.c): the planner's fastest
 * layout for c's model and samples per step on `world` ranks, printed to
 * stderr unless quiet; 0 or an exit code. cli_train_job_world: the size
 * and rank of the job this process belongs to (a cluster file is needed
 * when there are several). */
typedef struct dt_train_config dt_train_config;
typedef struct dt_plan_layout dt_plan_layout;
int cli_train_plan_layout(const cli_args *a, const dt_train_config *c, int world, bool quiet,
                          dt_plan_layout *out);
int cli_train_job_world(const cli_args *a, int *world, int *rank);

/* Subcommands, each defined in src/cli/cmd_<name>.c. */
extern const cli_cmd cli_cmd_version;
extern const cli_cmd cli_cmd_bench;
extern const cli_cmd cli_cmd_ckpt;
extern const cli_cmd cli_cmd_sample;
extern const cli_cmd cli_cmd_plan;
extern const cli_cmd cli_bench_gemm, cli_bench_train, cli_bench_peak; /* cmd_bench_engine.c */
extern const cli_cmd cli_cmd_data;
/* --json output: print `obj` (from json_pack) as one compact line on stdout
 * and release it; a NULL obj (a failed json_pack) is a bug. Reals keep 9
 * significant digits. cli_json_num: a real, or null when not finite. */
void cli_json_line(json_t *obj);
json_t *cli_json_num(double v);
/* --tokenizer: "char", "byte", "gpt2" (GPT-2's BPE from dt_bpe_dir()) or a
 * folder with encoder.json and vocab.bpe; *bpe is loaded for the last two
 * (the caller destroys it), NULL otherwise. */
typedef struct dt_bpe dt_bpe;
dt_status cli_tokenizer(const char *spec, int *kind, dt_bpe **bpe);
/* Sorts n timings ascending (median at n / 2): the benchmarks' one helper
 * for medians, minima and maxima (cmd_bench.c). */
void cli_sort_doubles(double *v, size_t n);
/* Benchmarks listed in cmd_bench.c, each defined in its own file. */
extern const cli_cmd cli_bench_optim;
extern const cli_cmd cli_bench_compress;
extern const cli_cmd cli_bench_gemm_bf16;   /* bench_gemm_bf16.c */
extern const cli_cmd cli_bench_gemm_tn;     /* bench_gemm_tn.c */
extern const cli_cmd cli_bench_amp_convert; /* bench_amp_convert.c */
extern const cli_cmd cli_bench_act16;       /* bench_act16.c */
extern const cli_cmd cli_bench_attention;   /* bench_attention.c */
extern const cli_cmd cli_bench_tokenizer;   /* bench_tokenizer.c */
extern const cli_cmd cli_cmd_launch;
extern const cli_cmd cli_cmd_export;
extern const cli_cmd cli_cmd_train;
extern const cli_cmd cli_cmd_report;                   /* cmd_report.c */
extern const cli_cmd cli_bench_comm, cli_bench_memcpy; /* cmd_bench_comm.c */
extern const cli_cmd cli_bench_topo;                   /* cmd_bench_topo.c */
/* `dtrain bench NAME` with a's flags (minus --nproc) as np local ranks
 * under dtrain launch; returns the exit code (cmd_bench_comm.c). */
int cli_bench_self_launch(int np, const cli_args *a);

#endif /* DTRAIN_CLI_H */
