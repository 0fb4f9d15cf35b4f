/*
 * cmd_data.c — `dtrain data prepare` and `dtrain data info`: turn a text
 * file into a .tok token file, and show what a token file holds.
 *
 * Both are thin: the library does the tokenizing, the atomic write and the
 * validation (src/data/tokfile.c); this file parses flags and prints.
 */
#include "cli.h"
#include "dtrain/data.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>

static const char *const tokenizer_choices[] = {"byte", "char", NULL};
_Static_assert(DT_TOKENIZER_COUNT == 2, "tokenizer_choices lists every tokenizer");

/* Print bytes as a C string literal body ("\n", "\x01"), at most `max`. */
static void print_escaped(const uint8_t *s, size_t n, size_t max) {
    putchar('"');
    for (size_t i = 0; i < n && i < max; i++) {
        uint8_t c = s[i];
        if (c == '\n')
            fputs("\\n", stdout);
        else if (c == '\t')
            fputs("\\t", stdout);
        else if (c == '"' || c == '\\')
            printf("\\%c", c);
        else if (isprint(c))
            putchar(c);
        else
            printf("\\x%02x", c);
    }
    putchar('"');
    if (n > max)
        fputs("...", stdout);
}

static void print_info(const dt_token_file *f, bool is_tok) {
    const dt_tokenizer *t = dt_token_file_tokenizer(f);
    char buf[32];
    printf("file        %s\n", dt_token_file_path(f));
    if (is_tok)
        printf("format      dtrain token file, version %d\n", DT_TOKEN_FILE_VERSION);
    else
        printf("format      text, tokenized in memory\n");
    printf("tokenizer   %s (V = %d)\n", dt_tokenizer_names[t->kind], t->vocab_size);
    printf("vocabulary  ");
    print_escaped(t->id_to_byte, (size_t)t->vocab_size, 128);
    printf("\ntokens      %zu\n", dt_token_file_count(f));
    printf("size        %s%s\n", dt_format_bytes((double)dt_token_file_bytes(f), buf, sizeof buf),
           is_tok ? "" : " (in memory)");
    printf("checksum    xxh3-64 %016llx (verified)\n",
           (unsigned long long)dt_token_file_checksum(f));
    /* Decode the first tokens as a preview. */
    uint8_t text[80] = {0};
    size_t n = dt_token_file_count(f) < sizeof text ? dt_token_file_count(f) : sizeof text;
    const uint16_t *tok = dt_token_file_tokens(f);
    for (size_t i = 0; i < n; i++)
        text[i] = t->id_to_byte[tok[i]];
    printf("begins      ");
    print_escaped(text, n, sizeof text);
    putchar('\n');
}

/* ---- dtrain data prepare ---- */

static const cli_opt prepare_opts[] = {
    {"output", 'o', CLI_STRING, "FILE", NULL, NULL, "the .tok file to write (required)", NULL, 0,
     0},
    {"tokenizer", 0, CLI_ENUM, "KIND", "char", "DT_TOKENIZER",
     "char (the corpus's distinct bytes) or byte (V=256); the same default as train's",
     tokenizer_choices, 0, 0},
    {0},
};

static int run_prepare(cli_args *a) {
    if (a->argc != 1)
        cli_usage_error(a->cmd, "expected one INPUT text file, got %d arguments", a->argc);
    const char *out = cli_str(a, "output");
    if (!out || !*out)
        cli_usage_error(a->cmd, "the output file is required: -o OUT.tok");
    double t0 = dt_now();
    dt_status st = dt_data_prepare(a->argv[0], out, (dt_tokenizer_kind)cli_enum(a, "tokenizer"));
    if (st != DT_OK)
        return cli_fail(st);
    double dt = dt_now() - t0;
    dt_token_file *f;
    st = dt_token_file_open(&f, out); /* read back: what was written validates */
    if (st != DT_OK)
        return cli_fail(st);
    print_info(f, true);
    printf("wrote       %s in %.2f s\n", out, dt);
    dt_token_file_close(f);
    return 0;
}

static const cli_cmd data_prepare = {
    .name = "prepare",
    .parent = "data",
    .summary = "tokenize a text file into a .tok file",
    .usage = "dtrain data prepare INPUT.txt -o OUT.tok [--tokenizer byte|char]",
    .description = "Writes OUT.tok atomically (temporary file, fsync, rename); an existing\n"
                   "OUT.tok is replaced only once the new one is complete.",
    .opts = prepare_opts,
    .run = run_prepare,
};

/* ---- dtrain data info ---- */

static const cli_opt info_opts[] = {
    {"tokenizer", 0, CLI_ENUM, "KIND", "char", "DT_TOKENIZER",
     "tokenizer for a text FILE (a .tok file names its own)", tokenizer_choices, 0, 0},
    {0},
};

static int run_info(cli_args *a) {
    if (a->argc != 1)
        cli_usage_error(a->cmd, "expected one FILE, got %d arguments", a->argc);
    const char *path = a->argv[0];
    dt_token_file *f;
    dt_status st = dt_data_open(&f, path, (dt_tokenizer_kind)cli_enum(a, "tokenizer"), NULL);
    if (st != DT_OK)
        return cli_fail(st);
    size_t n = strlen(path);
    print_info(f, n >= 4 && strcmp(path + n - 4, ".tok") == 0);
    dt_token_file_close(f);
    return 0;
}

static const cli_cmd data_info = {
    .name = "info",
    .parent = "data",
    .summary = "validate a .tok (or text) file and show what it holds",
    .usage = "dtrain data info FILE.tok",
    .opts = info_opts,
    .run = run_info,
};

/* ---- dispatch ---- */

static const cli_cmd *const data_cmds[] = {&data_prepare, &data_info};
#define NDATA (sizeof data_cmds / sizeof data_cmds[0])

static const cli_opt data_opts[] = {{0}};

static int run_data(cli_args *a) {
    return cli_run_sub(a, data_cmds, NDATA, "action", "(prepare, info; see 'dtrain help data')");
}

const cli_cmd cli_cmd_data = {
    .name = "data",
    .summary = "prepare and inspect token files",
    .usage = "dtrain data prepare|info ...",
    .description = "actions:\n"
                   "  prepare    tokenize a text file into a .tok file\n"
                   "  info       validate a .tok (or text) file and show what it holds\n"
                   "Run 'dtrain data ACTION --help' for an action's options.",
    .opts = data_opts,
    .run = run_data,
    .stop_at_positional = true,
    .subs = data_cmds,
    .nsubs = NDATA,
};
