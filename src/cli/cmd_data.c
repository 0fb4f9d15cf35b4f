/*
 * cmd_data.c — `dtrain data prepare`, `dtrain data info` and `dtrain data
 * tokenizer train`: turn a text file into a .tok token file, show what a
 * token file holds, learn a byte-level BPE vocabulary from a corpus.
 *
 * All are thin: the library does the tokenizing, the atomic write and the
 * validation (src/data/tokfile.c, src/data/bpe.c); this file parses flags
 * and prints. cli_tokenizer() is the one reading of --tokenizer.
 */
#include "cli.h"
#include "dtrain/data.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

dt_status cli_tokenizer(const char *spec, int *kind, dt_bpe **bpe) {
    *bpe = NULL;
    if (!spec || strcmp(spec, "char") == 0) {
        *kind = (int)DT_TOKENIZER_CHAR;
        return DT_OK;
    }
    if (strcmp(spec, "byte") == 0) {
        *kind = DT_TOKENIZER_BYTE;
        return DT_OK;
    }
    struct stat sb;
    if (strcmp(spec, "gpt2") != 0 && (stat(spec, &sb) != 0 || !S_ISDIR(sb.st_mode)))
        return dt_error_set(DT_ERR_INVALID,
                            "--tokenizer: \"%s\" is not char, byte, gpt2 or a folder holding "
                            "encoder.json and vocab.bpe",
                            spec);
    *kind = DT_TOKENIZER_BPE;
    return dt_bpe_open(bpe, spec);
}

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
        printf("format      dtrain token file, version %d\n",
               t->kind == DT_TOKENIZER_BPE ? DT_TOKEN_FILE_VERSION : 1);
    else
        printf("format      text, tokenized in memory\n");
    if (t->kind == DT_TOKENIZER_BPE) {
        printf("tokenizer   bpe %s (V = %d, hash %016llx)\n", t->bpe ? dt_bpe_name(t->bpe) : "",
               t->vocab_size, (unsigned long long)t->bpe_hash);
    } else {
        printf("tokenizer   %s (V = %d)\n", dt_tokenizer_names[t->kind], t->vocab_size);
        printf("vocabulary  ");
        print_escaped(t->id_to_byte, (size_t)t->vocab_size, 128);
        printf("\n");
    }
    printf("tokens      %zu\n", dt_token_file_count(f));
    printf("size        %s%s\n", dt_format_bytes((double)dt_token_file_bytes(f), buf, sizeof buf),
           is_tok ? "" : " (in memory)");
    printf("checksum    xxh3-64 %016llx (verified)\n",
           (unsigned long long)dt_token_file_checksum(f));
    /* Decode the first tokens as a preview (ids when the BPE is not loaded). */
    uint8_t text[80] = {0};
    size_t n = 0, count = dt_token_file_count(f);
    const uint16_t *tok = dt_token_file_tokens(f);
    printf("begins      ");
    if (t->kind == DT_TOKENIZER_BPE && !t->bpe) {
        for (size_t i = 0; i < count && i < 16; i++)
            printf("%s%u", i ? " " : "[", tok[i]);
        printf("]\n");
        return;
    }
    for (size_t i = 0; i < count && n < sizeof text; i++) {
        size_t len;
        const uint8_t *b = dt_tokenizer_token(t, tok[i], &len);
        for (size_t k = 0; b && k < len && n < sizeof text; k++)
            text[n++] = b[k];
    }
    print_escaped(text, n, sizeof text);
    putchar('\n');
}

/* ---- dtrain data prepare ---- */

static const cli_opt prepare_opts[] = {
    {"output", 'o', CLI_STRING, "FILE", NULL, NULL, "the .tok file to write (required)", NULL, 0,
     0},
    {"tokenizer", 0, CLI_STRING, "KIND", "char", "DT_TOKENIZER",
     "char (the corpus's distinct bytes), byte (V=256), gpt2 (GPT-2's BPE, V=50257) or a folder "
     "with encoder.json and vocab.bpe; the same default as train's",
     NULL, 0, 0},
    {0},
};

static int run_prepare(cli_args *a) {
    if (a->argc != 1)
        cli_usage_error(a->cmd, "expected one INPUT text file, got %d arguments", a->argc);
    const char *out = cli_str(a, "output");
    if (!out || !*out)
        cli_usage_error(a->cmd, "the output file is required: -o OUT.tok");
    int kind;
    dt_bpe *bpe;
    dt_status st = cli_tokenizer(cli_str(a, "tokenizer"), &kind, &bpe);
    if (st != DT_OK)
        return cli_fail(st);
    dt_tokenizer tok;
    if (bpe)
        dt_tokenizer_init_bpe(&tok, bpe);
    double t0 = dt_now();
    st = bpe ? dt_data_prepare_with(a->argv[0], out, &tok)
             : dt_data_prepare(a->argv[0], out, (dt_tokenizer_kind)kind);
    double dt = dt_now() - t0;
    dt_token_file *f = NULL;
    if (st == DT_OK) /* read back: what was written validates */
        st = dt_data_open(&f, out, (dt_tokenizer_kind)kind, bpe ? &tok : NULL);
    if (st != DT_OK) {
        dt_bpe_destroy(bpe);
        return cli_fail(st);
    }
    print_info(f, true);
    printf("wrote       %s in %.2f s\n", out, dt);
    dt_token_file_close(f);
    dt_bpe_destroy(bpe);
    return 0;
}

static const cli_cmd data_prepare = {
    .name = "prepare",
    .parent = "data",
    .summary = "tokenize a text file into a .tok file",
    .usage = "dtrain data prepare INPUT.txt -o OUT.tok [--tokenizer char|byte|gpt2|DIR]",
    .description = "Writes OUT.tok atomically (temporary file, fsync, rename); an existing\n"
                   "OUT.tok is replaced only once the new one is complete.",
    .opts = prepare_opts,
    .run = run_prepare,
};

/* ---- dtrain data info ---- */

static const cli_opt info_opts[] = {
    {"tokenizer", 0, CLI_STRING, "KIND", "char", "DT_TOKENIZER",
     "tokenizer for a text FILE (a .tok file names its own; gpt2 or DIR decodes a bpe one)", NULL,
     0, 0},
    {0},
};

static int run_info(cli_args *a) {
    if (a->argc != 1)
        cli_usage_error(a->cmd, "expected one FILE, got %d arguments", a->argc);
    const char *path = a->argv[0];
    dt_token_file *f;
    int kind;
    dt_bpe *bpe;
    dt_tokenizer tok;
    dt_status st = cli_tokenizer(cli_str(a, "tokenizer"), &kind, &bpe);
    if (bpe)
        dt_tokenizer_init_bpe(&tok, bpe);
    if (st == DT_OK)
        st = dt_data_open(&f, path, (dt_tokenizer_kind)kind, bpe ? &tok : NULL);
    if (st != DT_OK) {
        dt_bpe_destroy(bpe);
        return cli_fail(st);
    }
    size_t n = strlen(path);
    print_info(f, n >= 4 && strcmp(path + n - 4, ".tok") == 0);
    dt_token_file_close(f);
    dt_bpe_destroy(bpe);
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

/* ---- dtrain data tokenizer train ---- */

static const cli_opt tok_train_opts[] = {
    {"vocab-size", 0, CLI_INT, "V", "4096", NULL,
     "tokens of the vocabulary: 256 bytes, V - 257 merges, <|endoftext|>", NULL, 257, 65536},
    {"output", 'o', CLI_STRING, "DIR", NULL, NULL,
     "the folder to write encoder.json and vocab.bpe into (required)", NULL, 0, 0},
    {0},
};

static int run_tok_train(cli_args *a) {
    if (a->argc != 1)
        cli_usage_error(a->cmd, "expected one corpus FILE, got %d arguments", a->argc);
    const char *out = cli_str(a, "output");
    if (!out || !*out)
        cli_usage_error(a->cmd, "the output folder is required: -o DIR");
    FILE *f = fopen(a->argv[0], "rb");
    if (!f)
        return cli_fail(dt_error_set_errno(DT_ERR_IO, "cannot open %s", a->argv[0]));
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = len >= 0 ? malloc((size_t)len + 1) : NULL;
    if (!text || fread(text, 1, (size_t)len, f) != (size_t)len) {
        fclose(f);
        free(text);
        return cli_fail(dt_error_set(DT_ERR_IO, "cannot read %s", a->argv[0]));
    }
    fclose(f);
    double t0 = dt_now();
    dt_bpe *b = NULL;
    dt_status st = dt_bpe_train(&b, text, (size_t)len, (int)cli_int(a, "vocab-size"));
    double secs = dt_now() - t0;
    if (st == DT_OK)
        st = dt_bpe_save(b, out);
    if (st == DT_OK) {
        int32_t *ids = NULL;
        size_t n = 0;
        st = dt_bpe_encode(b, text, (size_t)len, &ids, &n);
        if (st == DT_OK)
            printf("learned %d tokens (%d merges) from %s (%ld bytes) in %.2f s: %.2f bytes per "
                   "token on it\nwrote %s/encoder.json and %s/vocab.bpe (--tokenizer %s)\n",
                   dt_bpe_vocab_size(b), dt_bpe_vocab_size(b) - 257, a->argv[0], len, secs,
                   n ? (double)len / (double)n : 0.0, out, out, out);
        free(ids);
    }
    dt_bpe_destroy(b);
    free(text);
    return st == DT_OK ? 0 : cli_fail(st);
}

static const cli_cmd tok_train = {
    .name = "train",
    .parent = "data tokenizer",
    .summary = "learn a byte-level BPE vocabulary from a corpus",
    .usage = "dtrain data tokenizer train --vocab-size V -o DIR FILE",
    .description = "Cuts FILE into pieces with GPT-2's pattern and merges the most frequent\n"
                   "adjacent pair until the vocabulary has V tokens; writes GPT-2's two files,\n"
                   "which --tokenizer DIR then uses (data prepare, train, sample).",
    .opts = tok_train_opts,
    .run = run_tok_train,
};

static const cli_cmd *const tok_cmds[] = {&tok_train};
static const cli_opt tok_opts[] = {{0}};

static int run_tok(cli_args *a) {
    return cli_run_sub(a, tok_cmds, 1, "action", "(train; see 'dtrain help data tokenizer')");
}

static const cli_cmd data_tokenizer = {
    .name = "tokenizer",
    .parent = "data",
    .summary = "learn a tokenizer: dtrain data tokenizer train",
    .usage = "dtrain data tokenizer train --vocab-size V -o DIR FILE",
    .description = "actions:\n  train      learn a byte-level BPE vocabulary from a corpus",
    .opts = tok_opts,
    .run = run_tok,
    .stop_at_positional = true,
    .subs = tok_cmds,
    .nsubs = 1,
};

/* ---- dispatch ---- */

static const cli_cmd *const data_cmds[] = {&data_prepare, &data_info, &data_tokenizer};
#define NDATA (sizeof data_cmds / sizeof data_cmds[0])

static const cli_opt data_opts[] = {{0}};

static int run_data(cli_args *a) {
    return cli_run_sub(a, data_cmds, NDATA, "action",
                       "(prepare, info, tokenizer; see 'dtrain help data')");
}

const cli_cmd cli_cmd_data = {
    .name = "data",
    .summary = "prepare and inspect token files",
    .usage = "dtrain data prepare|info|tokenizer ...",
    .description = "actions:\n"
                   "  prepare    tokenize a text file into a .tok file\n"
                   "  info       validate a .tok (or text) file and show what it holds\n"
                   "  tokenizer  learn a byte-level BPE vocabulary (tokenizer train)\n"
                   "Run 'dtrain data ACTION --help' for an action's options.",
    .opts = data_opts,
    .run = run_data,
    .stop_at_positional = true,
    .subs = data_cmds,
    .nsubs = NDATA,
};
