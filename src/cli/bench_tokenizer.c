/*
 * bench_tokenizer.c — `dtrain bench tokenizer FILE`: encoding throughput of
 * a byte-level BPE (GPT-2's by default) on a file, the median of several
 * runs, each from a cold piece cache. bench/tokenizer.sh runs js-tiktoken
 * on the same file in the same session and prints the ratio.
 */
#include "cli.h"
#include "dtrain/data.h"

#include <stdio.h>
#include <stdlib.h>

static const cli_opt tok_opts[] = {
    {"tokenizer", 0, CLI_STRING, "KIND", "gpt2", NULL,
     "gpt2 or a folder with encoder.json and vocab.bpe", NULL, 0, 0},
    {"runs", 'r', CLI_INT, "N", "5", NULL, "timed runs (the median is shown)", NULL, 1, 1000},
    {"json", 0, CLI_FLAG, NULL, NULL, NULL, "print one JSON object instead of the table", NULL, 0,
     0},
    {0},
};

static int run_tok(cli_args *a) {
    if (a->argc != 1)
        cli_usage_error(a->cmd, "expected one text FILE");
    FILE *f = fopen(a->argv[0], "rb");
    if (!f)
        return cli_fail(dt_error_set_errno(DT_ERR_IO, "cannot open %s", a->argv[0]));
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = len > 0 ? malloc((size_t)len) : NULL;
    size_t got = text ? fread(text, 1, (size_t)len, f) : 0;
    fclose(f);
    if (!text || got != (size_t)len) {
        free(text);
        return cli_fail(dt_error_set(DT_ERR_IO, "cannot read %s (or it is empty)", a->argv[0]));
    }
    int runs = (int)cli_int(a, "runs");
    double *t = calloc((size_t)runs, sizeof *t);
    int32_t *ids = NULL;
    size_t n = 0;
    dt_status st = t ? DT_OK : DT_ERR_NOMEM;
    for (int r = 0; st == DT_OK && r < runs; r++) {
        /* Each run loads afresh, so none starts from a warm piece cache. */
        dt_bpe *b;
        st = dt_bpe_open(&b, cli_str(a, "tokenizer"));
        if (st != DT_OK)
            break;
        double t0 = dt_now();
        st = dt_bpe_encode(b, text, (size_t)len, &ids, &n);
        t[r] = dt_now() - t0;
        dt_bpe_destroy(b);
    }
    if (st == DT_OK) {
        cli_sort_doubles(t, (size_t)runs);
        double med = t[runs / 2];
        if (cli_bool(a, "json"))
            cli_json_line(json_pack("{s:s, s:I, s:I, s:o, s:o}", "file", a->argv[0], "bytes",
                                    (json_int_t)len, "tokens", (json_int_t)n, "seconds",
                                    cli_json_num(med), "mb_per_s",
                                    cli_json_num((double)len / med * 1e-6)));
        else
            printf("%-10s %12s %10s %10s %10s %12s\n%-10s %12ld %10zu %10.4f %10.1f %12.0f\n",
                   "tokenizer", "bytes", "tokens", "seconds", "MB/s", "tokens/s",
                   cli_str(a, "tokenizer"), len, n, med, (double)len / med * 1e-6, (double)n / med);
    }
    free(ids);
    free(t);
    free(text);
    return st == DT_OK ? 0 : cli_fail(st);
}

const cli_cmd cli_bench_tokenizer = {
    .name = "tokenizer",
    .parent = "bench",
    .summary = "BPE encoding throughput on a file (bench/tokenizer.sh: against js-tiktoken)",
    .usage = "dtrain bench tokenizer [--tokenizer gpt2|DIR] [--runs N] [--json] FILE",
    .opts = tok_opts,
    .run = run_tok,
};
