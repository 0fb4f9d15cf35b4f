/*
 * args.c — the one flag parser shared by every subcommand.
 *
 * A value comes from, in order of precedence: the flag, the DT_* variable,
 * the --config file (when the command has a "config" option), the default.
 * The --config file is either `key = value` lines or a JSON object (a run's
 * config.json), its keys the long option names. An unknown option gets a
 * suggestion: the same name with dashes for underscores, the dtrain name of
 * a nanoGPT / torchrun / DeepSpeed spelling, or the nearest name.
 */
#include "cli.h"

#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int count_opts(const cli_opt *opts) {
    int n = 0;
    while (opts && opts[n].name)
        n++;
    DT_ASSERT(n < CLI_MAX_OPTS);
    return n;
}

static int count_choices(const char *const *choices) {
    int n = 0;
    while (choices && choices[n])
        n++;
    return n;
}

static const char *kind_metavar(const cli_opt *o) {
    if (o->metavar)
        return o->metavar;
    switch (o->kind) {
    case CLI_INT: return "N";
    case CLI_SIZE: return "SIZE";
    case CLI_DOUBLE: return "X";
    case CLI_BOOL: return "BOOL";
    case CLI_ENUM: return "CHOICE";
    default: return "VALUE";
    }
}

void cli_print_help(const cli_cmd *cmd, FILE *out) {
    fprintf(out, "usage: %s\n", cmd->usage);
    if (cmd->summary)
        fprintf(out, "\n%s\n", cmd->summary);
    if (cmd->description)
        fprintf(out, "\n%s\n", cmd->description);
    int n = count_opts(cmd->opts);
    fprintf(out, "\noptions:\n");
    for (int i = 0; i < n; i++) {
        const cli_opt *o = &cmd->opts[i];
        char left[96];
        int len;
        if (o->short_name)
            len = snprintf(left, sizeof left, "  -%c, --%s", o->short_name, o->name);
        else
            len = snprintf(left, sizeof left, "      --%s", o->name);
        if (o->kind != CLI_FLAG && len > 0 && (size_t)len < sizeof left)
            snprintf(left + len, sizeof left - (size_t)len, " %s", kind_metavar(o));
        fprintf(out, "%-32s %s", left, o->help ? o->help : "");
        if (o->kind == CLI_ENUM) {
            fprintf(out, " (");
            for (int c = 0; o->choices[c]; c++)
                fprintf(out, "%s%s", c ? "|" : "", o->choices[c]);
            fprintf(out, ")");
        }
        if (o->def) {
            /* Defaults are shown as text a shell user could type: a newline
             * as \n, an empty string as "". */
            fprintf(out, " [default: ");
            if (!*o->def)
                fprintf(out, "\"\"");
            for (const char *c = o->def; *c; c++) {
                if (*c == '\n')
                    fprintf(out, "\\n");
                else if (*c == '\t')
                    fprintf(out, "\\t");
                else
                    fputc(*c, out);
            }
            fprintf(out, "]");
        }
        if (o->env)
            fprintf(out, " [env: %s]", o->env);
        fprintf(out, "\n");
    }
    fprintf(out, "%-32s %s\n", "  -h, --help", "show this help");
}

static void print_usage_short(const cli_cmd *cmd) {
    fprintf(stderr, "usage: %s\n", cmd->usage);
    if (cmd->parent)
        fprintf(stderr, "Run 'dtrain %s %s --help' for every option and its default.\n",
                cmd->parent, cmd->name);
    else
        fprintf(stderr, "Run 'dtrain help %s' for every option and its default.\n", cmd->name);
}

void cli_usage_error(const cli_cmd *cmd, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "dtrain %s%s%s: error: ", cmd->parent ? cmd->parent : "",
            cmd->parent ? " " : "", cmd->name);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    print_usage_short(cmd);
    exit(2);
}

const char *cli_error_text(void) {
    static char buf[4096];
    snprintf(buf, sizeof buf, "%s", dt_last_error());
    if (dt_log_enabled(DT_LOG_LEVEL_DEBUG, NULL))
        return buf;
    /* Breadcrumbs are lines "\n    at FILE:LINE" appended by DT_CHECK. */
    char *at;
    while ((at = strstr(buf, "\n    at ")) != NULL) {
        char *end = strchr(at + 1, '\n');
        memmove(at, end ? end : at + strlen(at), strlen(end ? end : at + strlen(at)) + 1);
    }
    return buf;
}

int cli_default_threads(void) {
    const char *omp = getenv("OMP_NUM_THREADS");
    char *end = NULL;
    long v = omp && *omp ? strtol(omp, &end, 10) : 0;
    if (v >= 1 && v <= 4096 && end && *end == '\0')
        return (int)v;
    return dt_cpu_count();
}

int cli_fail(dt_status st) {
    const char *msg = cli_error_text();
    fprintf(stderr, "dtrain: error: %s\n", *msg ? msg : dt_strerror(st));
    return st == DT_ERR_INVALID ? 2 : 1;
}

/* ------------------------------------------------------------------------ */
/* Suggestions for an unknown option                                        */
/* ------------------------------------------------------------------------ */

/* Spellings of other tools (nanoGPT's configurator, torchrun, DeepSpeed,
 * llm.c, HF Trainer) and the dtrain option each means; used only when the
 * command has that option. Names are compared after '_' -> '-'. */
/* clang-format off */
static const char *const other_spellings[][2] = {
    {"learning-rate", "lr"},        {"max-lr", "lr"},               {"min-learning-rate", "min-lr"},
    {"batch-size", "batch"},        {"micro-batch-size", "batch"},  {"train-micro-batch-size-per-gpu", "batch"},
    {"per-device-train-batch-size", "batch"}, {"global-batch-size", "global-batch"},
    {"train-batch-size", "global-batch"},
    {"max-iters", "steps"},         {"max-steps", "steps"},         {"iters", "steps"},
    {"num-iterations", "steps"},    {"lr-decay-iters", "steps"},    {"train-iters", "steps"},
    {"warmup-iters", "warmup"},     {"warmup-steps", "warmup"},     {"lr-warmup-iters", "warmup"},
    {"gradient-accumulation-steps", "accum"}, {"grad-accum", "accum"},
    {"grad-clip", "clip"},          {"max-grad-norm", "clip"},      {"clip-grad", "clip"},
    {"eval-interval", "eval-every"}, {"val-loss-every", "eval-every"}, {"eval-steps", "eval-every"},
    {"eval-iters", "eval-batches"}, {"val-max-steps", "eval-batches"},
    {"out-dir", "run-dir"},         {"output-dir", "run-dir"},      {"save-dir", "ckpt-dir"},
    {"checkpoint-dir", "ckpt-dir"}, {"save-interval", "ckpt-every"}, {"checkpoint-every", "ckpt-every"},
    {"n-layer", "layers"},          {"num-layers", "layers"},       {"n-head", "heads"},
    {"num-attention-heads", "heads"}, {"n-embd", "dim"},            {"hidden-size", "dim"},
    {"block-size", "seq"},          {"seq-len", "seq"},             {"seq-length", "seq"},
    {"sequence-length", "seq"},     {"vocab-size", "vocab"},        {"input-bin", "data"},
    {"dataset", "data"},            {"train-data", "data"},         {"input-val-bin", "val-data"},
    {"dtype", "precision"},         {"bf16", "precision"},          {"fp16", "precision"},
    {"mixed-precision", "precision"}, {"activation-checkpointing", "recompute"},
    {"gradient-checkpointing", "recompute"}, {"recompute-activations", "recompute"},
    {"resume-from-checkpoint", "resume"},
    {"nproc-per-node", "nproc"},    {"np", "nproc"},                {"world-size", "nproc"},
    {"master-addr", "master"},      {"master-port", "master"},
    {"rdzv-endpoint", "master"},    {"max-new-tokens", "tokens"},   {"start", "prompt"},
    {"num-threads", "threads"},     {"omp-num-threads", "threads"}, {"wandb-log", "run-dir"},
    {"beta-1", "beta1"},            {"beta-2", "beta2"},            {"adam-beta1", "beta1"},
    {"adam-beta2", "beta2"},        {"adam-eps", "eps"},            {"adam-epsilon", "eps"},
    {"lr-scheduler", "schedule"},   {"lr-decay-style", "schedule"}, {"decay-lr", "schedule"},
    {"ddp-bucket-size", "bucket-size"}, {"bucket-cap-mb", "bucket-size"},
    {"tensor-model-parallel-size", "tp"}, {"pipeline-model-parallel-size", "pp"},
    {"sequence-parallel", "sp"},    {"ckpt", "ckpt-dir"},           {"checkpoint", "ckpt"},
    {"model-path", "init-from"},    {"weights", "init-from"},       {"load", "init-from"},
};
/* clang-format on */

/* Options of other tools that have no dtrain counterpart, and why: said
 * instead of a suggestion, so that nobody hunts for the right spelling. */
static const char *const no_counterpart[][2] = {
    {"device", "dtrain trains on the CPU; there is no --device"},
    {"compile", "dtrain's kernels are compiled ahead of time; there is no --compile"},
    {"dropout", "dtrain's GPT has no dropout"},
    {"bias", "dtrain's GPT always has biases, as GPT-2"},
    {"wandb-project", "no experiment tracker: metrics.jsonl in the run folder has every step"},
    {"backend", "the backend is chosen by DT_BACKEND=native|mpi, not a flag"},
};

static size_t edit_distance(const char *a, const char *b) {
    size_t na = strlen(a), nb = strlen(b);
    if (na > 63 || nb > 63)
        return 99;
    size_t row[64];
    for (size_t j = 0; j <= nb; j++)
        row[j] = j;
    for (size_t i = 1; i <= na; i++) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= nb; j++) {
            size_t up = row[j];
            size_t best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best)
                best = up + 1;
            if (row[j - 1] + 1 < best)
                best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[nb];
}

static bool has_option(const cli_cmd *cmd, const char *name) {
    for (int i = 0; cmd->opts && cmd->opts[i].name; i++)
        if (strcmp(cmd->opts[i].name, name) == 0)
            return true;
    return false;
}

/* Write " (did you mean --X?)" for an unknown long option `given` (without
 * dashes, possibly "name=value") into out, or "". */
static void suggest(const cli_cmd *cmd, const char *given, char *out, size_t len) {
    char norm[64];
    size_t n = 0;
    for (; given[n] && given[n] != '=' && n + 1 < sizeof norm; n++)
        norm[n] = given[n] == '_' ? '-' : (char)tolower((unsigned char)given[n]);
    norm[n] = '\0';
    out[0] = '\0';
    const char *best = NULL;
    if (has_option(cmd, norm)) {
        snprintf(out, len, " (did you mean '--%s'?)", norm);
        return;
    }
    for (size_t i = 0; i < sizeof no_counterpart / sizeof no_counterpart[0]; i++)
        if (strcmp(norm, no_counterpart[i][0]) == 0) {
            snprintf(out, len, " (%s)", no_counterpart[i][1]);
            return;
        }
    for (size_t i = 0; i < sizeof other_spellings / sizeof other_spellings[0]; i++)
        if (strcmp(norm, other_spellings[i][0]) == 0 && has_option(cmd, other_spellings[i][1]))
            best = other_spellings[i][1];
    if (!best) {
        size_t bd = n <= 3 ? 1 : n <= 6 ? 2 : 3;
        for (int i = 0; cmd->opts && cmd->opts[i].name; i++) {
            size_t d = edit_distance(norm, cmd->opts[i].name);
            if (d <= bd && (!best || d < bd))
                best = cmd->opts[i].name, bd = d;
        }
    }
    if (best)
        snprintf(out, len, " (did you mean '--%s'?)", best);
}

/* The options whose names start with `prefix` (an abbreviation getopt found
 * ambiguous), as "--a, --b" into out. Returns how many. */
static int prefix_matches(const cli_cmd *cmd, const char *prefix, char *out, size_t len) {
    size_t n = strcspn(prefix, "=");
    int count = 0;
    size_t off = 0;
    out[0] = '\0';
    for (int i = 0; cmd->opts && cmd->opts[i].name; i++) {
        if (strncmp(cmd->opts[i].name, prefix, n) != 0)
            continue;
        if (off < len)
            off += (size_t)snprintf(out + off, len - off, "%s--%s", count ? ", " : "",
                                    cmd->opts[i].name);
        count++;
    }
    return count;
}

static _Noreturn void unknown_option(const cli_cmd *cmd, const char *arg) {
    if (arg[0] == '-' && arg[1] == '-') {
        char which[512];
        if (prefix_matches(cmd, arg + 2, which, sizeof which) > 1)
            cli_usage_error(cmd, "ambiguous option '%.*s': it could be %s", (int)strcspn(arg, "="),
                            arg, which);
        char hint[128];
        suggest(cmd, arg + 2, hint, sizeof hint);
        cli_usage_error(cmd, "unknown option '%.*s'%s", (int)strcspn(arg, "="), arg, hint);
    }
    cli_usage_error(cmd, "unknown option '%s'", arg);
}

/* What a parse hands out (positional lists, config values in use) lives
 * until exit, like argv. One global list keeps it reachable, so that
 * LeakSanitizer sees that and callers need no static cli_args of their own;
 * a parser used many times leaks nothing. */
static void **kept;
static size_t nkept, capkept;

static void keep_until_exit(void *p) {
    if (nkept == capkept) {
        capkept = capkept ? 2 * capkept : 16;
        void **grown = realloc(kept, capkept * sizeof *kept);
        DT_ASSERT(grown);
        kept = grown;
    }
    kept[nkept++] = p;
}

/* Convert the resolved text of option i; on error print and exit 2. */
static void convert(const cli_cmd *cmd, const cli_opt *o, cli_value *v, const char *knob) {
    dt_status st = DT_OK;
    int64_t i;
    switch (o->kind) {
    case CLI_FLAG: st = dt_config_parse_bool(knob, v->text, &v->b); break;
    case CLI_STRING: break;
    case CLI_INT:
        st = dt_config_parse_int(knob, v->text, (int64_t)o->min, (int64_t)o->max, &i);
        if (st == DT_OK)
            v->i = i;
        break;
    case CLI_SIZE:
        st = dt_config_parse_size(knob, v->text, (size_t)o->min,
                                  o->max >= 1.8e19 ? SIZE_MAX : (size_t)o->max, &v->size);
        break;
    case CLI_DOUBLE: st = dt_config_parse_double(knob, v->text, o->min, o->max, &v->d); break;
    case CLI_BOOL: st = dt_config_parse_bool(knob, v->text, &v->b); break;
    case CLI_ENUM:
        st = dt_config_parse_enum(knob, v->text, o->choices, count_choices(o->choices), &v->e);
        break;
    }
    if (st != DT_OK)
        cli_usage_error(cmd, "%s", dt_last_error());
}

static char *trim(char *s) {
    while (isspace((unsigned char)*s))
        s++;
    size_t n = strlen(s);
    while (n > 0 && isspace((unsigned char)s[n - 1]))
        s[--n] = '\0';
    return s;
}

/* A config file is a few lines of `key = value`: anything bigger is not
 * one (`--config /dev/zero` used to be read until memory ran out). */
#define CONFIG_MAX_BYTES (1 << 20)
#define CONFIG_MAX_LINE  4096

/* The whole of a config file, at most CONFIG_MAX_BYTES, NUL-terminated
 * (a pipe such as `--config <(...)` is fine; its size is only known at its
 * end). The caller frees it. */
static char *slurp_config(const cli_cmd *cmd, const char *path, size_t *len) {
    FILE *f = fopen(path, "r");
    if (!f)
        cli_usage_error(cmd, "--config %s: %s", path, strerror(errno));
    char *text = malloc(CONFIG_MAX_BYTES + 2);
    DT_ASSERT(text);
    size_t n = fread(text, 1, CONFIG_MAX_BYTES + 1, f);
    int err = ferror(f) ? errno : 0;
    fclose(f);
    if (err)
        cli_usage_error(cmd, "--config %s: read error: %s", path, strerror(err));
    if (n > CONFIG_MAX_BYTES)
        cli_usage_error(cmd,
                        "--config %s: larger than 1 MiB (a config file holds `key = value` "
                        "lines or one JSON object)",
                        path);
    text[n] = '\0';
    *len = n;
    return text;
}

/* Read a `key = value` file (keys are long option names, '#' starts a
 * comment at the start of a line or after a space, a value may be quoted)
 * into text[] / knob[], indexed like cmd->opts. Strings live until exit,
 * like argv. Any problem is a usage error naming the file, line and key. */
/* The index of the option a config key names ('_' read as '-', so that
 * older config.json files and Python-style keys work too), or -1. */
static int config_key_index(const cli_cmd *cmd, int n, const char *key) {
    char norm[128];
    size_t k = 0;
    for (; key[k] && k + 1 < sizeof norm; k++)
        norm[k] = key[k] == '_' ? '-' : key[k];
    norm[k] = '\0';
    for (int i = 0; i < n; i++)
        if (strcmp(cmd->opts[i].name, norm) == 0)
            return strcmp(norm, "config") == 0 ? -1 : i;
    return -1;
}

static _Noreturn void unknown_key(const cli_cmd *cmd, const char *where, const char *key) {
    char hint[128];
    suggest(cmd, key, hint, sizeof hint);
    cli_usage_error(cmd,
                    "%s: unknown key '%s'%s (keys are the long option names of 'dtrain %s', "
                    "without the dashes)",
                    where, key, hint, cmd->name);
}

/* The shortest "%.Ng" text that reads back as v. */
static void format_real(char *b, size_t len, double v) {
    for (int prec = 15; prec <= 17; prec++) {
        snprintf(b, len, "%.*g", prec, v);
        if (strtod(b, NULL) == v)
            return;
    }
}

/* A JSON object (a run's config.json): each member a key as in the
 * `key = value` form; null leaves the option unset; an object-valued
 * "info" member (what a run records about itself) is skipped. */
static void read_config_json(const cli_cmd *cmd, const char *path, const char *all, size_t size,
                             int n, char **text, char **knob) {
    json_error_t err;
    json_t *root = json_loadb(all, size, JSON_REJECT_DUPLICATES, &err);
    if (!root)
        cli_usage_error(cmd, "--config %s:%d:%d: %s", path, err.line, err.column, err.text);
    if (!json_is_object(root))
        cli_usage_error(cmd, "--config %s: expected a JSON object of option names and values",
                        path);
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        if (strcmp(key, "info") == 0 && json_is_object(v))
            continue;
        char where[600];
        snprintf(where, sizeof where, "%s: \"%s\"", path, key);
        int idx = config_key_index(cmd, n, key);
        if (idx < 0)
            unknown_key(cmd, path, key);
        if (text[idx])
            cli_usage_error(cmd, "%s: '%s' is given twice (as '%s' and '%s')", path,
                            cmd->opts[idx].name, cmd->opts[idx].name, key);
        char buf[64];
        const char *val;
        switch (json_typeof(v)) {
        case JSON_NULL: continue;
        case JSON_STRING: val = json_string_value(v); break;
        case JSON_INTEGER:
            snprintf(buf, sizeof buf, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
            val = buf;
            break;
        case JSON_REAL:
            format_real(buf, sizeof buf, json_real_value(v));
            val = buf;
            break;
        case JSON_TRUE: val = "true"; break;
        case JSON_FALSE: val = "false"; break;
        default: cli_usage_error(cmd, "%s: expected a string, number, boolean or null", where);
        }
        text[idx] = strdup(val);
        knob[idx] = strdup(where);
        DT_ASSERT(text[idx] && knob[idx]);
    }
    json_decref(root);
}

static void read_config_file(const cli_cmd *cmd, const char *path, int n, char **text,
                             char **knob) {
    size_t size;
    char *all = slurp_config(cmd, path, &size);
    size_t lead = 0;
    while (lead < size && isspace((unsigned char)all[lead]))
        lead++;
    if (lead < size && all[lead] == '{') {
        read_config_json(cmd, path, all, size, n, text, knob);
        free(all);
        return;
    }
    int first_line[CLI_MAX_OPTS] = {0};
    int lineno = 0;
    for (size_t at = 0; at < size;) {
        lineno++;
        char *line = all + at, *nl = memchr(line, '\n', size - at);
        size_t len = nl ? (size_t)(nl - line) : size - at;
        at += len + 1;
        if (len > CONFIG_MAX_LINE)
            cli_usage_error(cmd, "%s:%d: line longer than %d bytes", path, lineno, CONFIG_MAX_LINE);
        if (memchr(line, '\0', len))
            cli_usage_error(cmd, "%s:%d: a NUL byte (not a text file?)", path, lineno);
        line[len] = '\0';
        char quote = 0; /* '#' inside a quoted value is text */
        for (char *c = line; *c; c++) {
            if (*c == '"' || *c == '\'')
                quote = quote == *c ? 0 : quote ? quote : *c;
            if (!quote && *c == '#' && (c == line || isspace((unsigned char)c[-1]))) {
                *c = '\0';
                break;
            }
        }
        char *s = trim(line);
        if (*s == '\0')
            continue;
        char *eq = strchr(s, '=');
        if (!eq)
            cli_usage_error(cmd, "%s:%d: expected 'key = value', got '%s'", path, lineno, s);
        *eq = '\0';
        char *key = trim(s), *val = trim(eq + 1);
        size_t vl = strlen(val);
        if (vl >= 2 &&
            ((val[0] == '"' && val[vl - 1] == '"') || (val[0] == '\'' && val[vl - 1] == '\''))) {
            val[vl - 1] = '\0';
            val++;
        }
        int idx = config_key_index(cmd, n, key);
        if (idx < 0) {
            char where[600];
            snprintf(where, sizeof where, "%s:%d", path, lineno);
            unknown_key(cmd, where, key);
        }
        if (first_line[idx])
            cli_usage_error(cmd, "%s:%d: duplicate key '%s' (first set on line %d)", path, lineno,
                            key, first_line[idx]);
        first_line[idx] = lineno;
        char k[512];
        snprintf(k, sizeof k, "%s:%d: %s", path, lineno, key);
        text[idx] = strdup(val);
        knob[idx] = strdup(k);
        DT_ASSERT(text[idx] && knob[idx]);
    }
    free(all);
}

void cli_parse(const cli_cmd *cmd, int argc, char **argv, cli_args *out) {
    memset(out, 0, sizeof *out);
    out->cmd = cmd;
    out->raw_argc = argc;
    out->raw_argv = argv;
    int n = count_opts(cmd->opts);
    int nalias = 0;
    while (cmd->aliases && cmd->aliases[nalias].alias)
        nalias++;
    DT_ASSERT(nalias <= 16);
    struct option longopts[CLI_MAX_OPTS + 2 + 16];
    char shortopts[2 * CLI_MAX_OPTS + 4];
    size_t sp = 0;
    shortopts[sp++] = cmd->stop_at_positional ? '+' : '-';
    shortopts[sp++] = ':';
    for (int i = 0; i < n; i++) {
        const cli_opt *o = &cmd->opts[i];
        longopts[i] = (struct option){
            o->name, o->kind == CLI_FLAG ? no_argument : required_argument, NULL, 1000 + i};
        if (o->short_name) {
            shortopts[sp++] = o->short_name;
            if (o->kind != CLI_FLAG)
                shortopts[sp++] = ':';
        }
    }
    for (int k = 0; k < nalias; k++) {
        int idx = -1;
        for (int i = 0; i < n; i++)
            if (strcmp(cmd->opts[i].name, cmd->aliases[k].name) == 0)
                idx = i;
        DT_ASSERT(idx >= 0);
        longopts[n + k] = (struct option){
            cmd->aliases[k].alias,
            cmd->opts[idx].kind == CLI_FLAG ? no_argument : required_argument, NULL, 1000 + idx};
    }
    longopts[n + nalias] = (struct option){"help", no_argument, NULL, 'h'};
    longopts[n + nalias + 1] = (struct option){0};
    shortopts[sp++] = 'h';
    shortopts[sp] = '\0';

    /* Positionals are collected in order; '-' mode returns them as 1. */
    char **positional = calloc((size_t)argc + 1, sizeof *positional);
    DT_ASSERT(positional);
    keep_until_exit(positional);
    int npos = 0;
    optind = 0; /* 0, not 1: glibc then re-reads this optstring's ordering mode (+/-) */
    opterr = 0;
    for (;;) {
        int longidx = -1;
        int c = getopt_long(argc, argv, shortopts, longopts, &longidx);
        if (c == -1)
            break;
        if (c == 1) {
            positional[npos++] = optarg;
            continue;
        }
        if (c == 'h') {
            cli_print_help(cmd, stdout);
            exit(0);
        }
        if (c == '?') {
            if (optopt && optopt < 1000)
                cli_usage_error(cmd, "unknown option '-%c'", optopt);
            unknown_option(cmd, argv[optind - 1]);
        }
        if (c == ':')
            cli_usage_error(cmd, "option '%s' needs a value", argv[optind - 1]);
        int idx = -1;
        if (c >= 1000)
            idx = c - 1000;
        else
            for (int i = 0; i < n; i++)
                if (cmd->opts[i].short_name == c)
                    idx = i;
        DT_ASSERT(idx >= 0 && idx < n);
        cli_value *v = &out->values[idx];
        v->set = true;
        v->text = cmd->opts[idx].kind == CLI_FLAG ? "1" : optarg;
    }
    for (int i = optind; i < argc; i++)
        positional[npos++] = argv[i];
    out->argc = npos;
    out->argv = positional; /* lives until exit, like argv */

    /* --config FILE (flag or its variable) supplies values below flags and
     * the environment. */
    char *cfg_text[CLI_MAX_OPTS] = {0}, *cfg_knob[CLI_MAX_OPTS] = {0};
    for (int i = 0; i < n; i++) {
        if (strcmp(cmd->opts[i].name, "config") != 0 || cmd->opts[i].kind != CLI_STRING)
            continue;
        const char *path = out->values[i].set ? out->values[i].text
                           : cmd->opts[i].env ? getenv(cmd->opts[i].env)
                                              : NULL;
        if (path && *path)
            read_config_file(cmd, path, n, cfg_text, cfg_knob);
    }

    for (int i = 0; i < n; i++) {
        const cli_opt *o = &cmd->opts[i];
        cli_value *v = &out->values[i];
        char knob[512];
        snprintf(knob, sizeof knob, "--%s", o->name);
        v->from = v->set ? "flag" : NULL;
        if (!v->set && o->env) {
            const char *e = getenv(o->env);
            if (e && *e) {
                v->set = true;
                v->text = e;
                v->from = "env";
                snprintf(knob, sizeof knob, "%s", o->env);
            }
        }
        if (!v->set && cfg_text[i]) {
            v->set = true;
            v->text = cfg_text[i];
            v->from = "config";
            snprintf(knob, sizeof knob, "%s", cfg_knob[i]);
        }
        if (!v->set)
            v->from = "default";
        if (!v->set)
            v->text = o->kind == CLI_FLAG ? "0" : o->def;
        if (v->text)
            convert(cmd, o, v, knob);
    }
    /* Config values in use are kept (see keep_until_exit); the rest go. */
    for (int i = 0; i < n; i++) {
        free(cfg_knob[i]);
        if (cfg_text[i] && out->values[i].text == cfg_text[i])
            keep_until_exit(cfg_text[i]);
        else
            free(cfg_text[i]);
    }
}

static int find(const cli_args *a, const char *name) {
    for (int i = 0; a->cmd->opts[i].name; i++)
        if (strcmp(a->cmd->opts[i].name, name) == 0)
            return i;
    dt__assert_fail(name, __FILE__, __LINE__, "cli option lookup");
}

void cli_json_line(json_t *obj) {
    DT_ASSERT(obj);
    char *s = json_dumps(obj, JSON_COMPACT | JSON_REAL_PRECISION(9));
    DT_ASSERT(s);
    printf("%s\n", s);
    free(s);
    json_decref(obj);
}

json_t *cli_json_num(double v) { return isfinite(v) ? json_real(v) : json_null(); }

const cli_value *cli_get(const cli_args *a, const char *name) { return &a->values[find(a, name)]; }
const char *cli_str(const cli_args *a, const char *name) { return cli_get(a, name)->text; }
int64_t cli_int(const cli_args *a, const char *name) { return cli_get(a, name)->i; }
size_t cli_size(const cli_args *a, const char *name) { return cli_get(a, name)->size; }
double cli_double(const cli_args *a, const char *name) { return cli_get(a, name)->d; }
bool cli_bool(const cli_args *a, const char *name) { return cli_get(a, name)->b; }
int cli_enum(const cli_args *a, const char *name) { return cli_get(a, name)->e; }
bool cli_is_set(const cli_args *a, const char *name) { return cli_get(a, name)->set; }

const cli_cmd *cli_find_sub(const cli_cmd *cmd, const char *name) {
    for (size_t i = 0; i < cmd->nsubs; i++)
        if (strcmp(cmd->subs[i]->name, name) == 0)
            return cmd->subs[i];
    return NULL;
}

int cli_run_sub(cli_args *a, const cli_cmd *const *subs, size_t n, const char *what,
                const char *hint) {
    if (a->argc < 1)
        cli_usage_error(a->cmd, "which %s? %s", what, hint);
    for (size_t i = 0; i < n; i++) {
        if (strcmp(subs[i]->name, a->argv[0]) == 0) {
            cli_args sub;
            cli_parse(subs[i], a->argc, a->argv, &sub);
            return subs[i]->run(&sub);
        }
    }
    cli_usage_error(a->cmd, "unknown %s '%s' %s", what, a->argv[0], hint);
}
