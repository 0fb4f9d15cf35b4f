/*
 * args.c — the one flag parser shared by every subcommand.
 *
 * A value comes from, in order of precedence: the flag, the DT_* variable,
 * the --config file (when the command has a "config" option), the default.
 */
#include "cli.h"

#include <ctype.h>
#include <errno.h>
#include <getopt.h>
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
        if (o->def)
            fprintf(out, " [default: %s]", o->def);
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

int cli_fail(dt_status st) {
    const char *msg = dt_last_error();
    fprintf(stderr, "dtrain: error: %s\n", msg && *msg ? msg : dt_strerror(st));
    return st == DT_ERR_INVALID ? 2 : 1;
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
                        "lines)",
                        path);
    text[n] = '\0';
    *len = n;
    return text;
}

/* Read a `key = value` file (keys are long option names, '#' starts a
 * comment at the start of a line or after a space, a value may be quoted)
 * into text[] / knob[], indexed like cmd->opts. Strings live until exit,
 * like argv. Any problem is a usage error naming the file, line and key. */
static void read_config_file(const cli_cmd *cmd, const char *path, int n, char **text,
                             char **knob) {
    size_t size;
    char *all = slurp_config(cmd, path, &size);
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
        int idx = -1;
        for (int i = 0; i < n; i++)
            if (strcmp(cmd->opts[i].name, key) == 0)
                idx = i;
        if (idx < 0 || strcmp(key, "config") == 0)
            cli_usage_error(cmd,
                            "%s:%d: unknown key '%s' (keys are the long option names of "
                            "'dtrain %s', without the dashes)",
                            path, lineno, key, cmd->name);
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
    struct option longopts[CLI_MAX_OPTS + 2];
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
    longopts[n] = (struct option){"help", no_argument, NULL, 'h'};
    longopts[n + 1] = (struct option){0};
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
            if (optopt)
                cli_usage_error(cmd, "unknown option '-%c'", optopt);
            cli_usage_error(cmd, "unknown option '%s'", argv[optind - 1]);
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

const cli_value *cli_get(const cli_args *a, const char *name) { return &a->values[find(a, name)]; }
const char *cli_str(const cli_args *a, const char *name) { return cli_get(a, name)->text; }
int64_t cli_int(const cli_args *a, const char *name) { return cli_get(a, name)->i; }
size_t cli_size(const cli_args *a, const char *name) { return cli_get(a, name)->size; }
double cli_double(const cli_args *a, const char *name) { return cli_get(a, name)->d; }
bool cli_bool(const cli_args *a, const char *name) { return cli_get(a, name)->b; }
int cli_enum(const cli_args *a, const char *name) { return cli_get(a, name)->e; }
bool cli_is_set(const cli_args *a, const char *name) { return cli_get(a, name)->set; }

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
