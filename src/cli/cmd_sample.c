/*
 * cmd_sample.c — `dtrain sample`: generate text from a trained model: a
 * weights file, a checkpoint, a run folder, a safetensors or llm.c file
 * (dt_model_open tells them apart).
 *
 * The file carries the token -> byte table of its tokenizer (char-level:
 * the corpus's byte values; byte-level: 0..255), so the prompt is encoded
 * and the output decoded without the corpus. Generation re-runs the forward
 * pass over the last max_seq tokens for every new token (no KV cache: the
 * models sampled here are small). Sampling: logits / temperature, keep the
 * top-k, softmax, draw from a Philox stream keyed by --seed; temperature 0
 * is greedy (argmax).
 */
#include "cli.h"
#include "dtrain/data.h"
#include "dtrain/nn.h"
#include "dtrain/train.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const cli_opt sample_opts[] = {
    {"ckpt", 0, CLI_STRING, "PATH", NULL, "DT_CKPT",
     "the model: a run folder, a checkpoint (file or folder), a .dtgw, .safetensors or llm.c .bin "
     "(default: the newest run under runs/)",
     NULL, 0, 0},
    {"prompt", 'p', CLI_STRING, "TEXT", "\n", "DT_PROMPT", "text to continue", NULL, 0, 0},
    {"temperature", 0, CLI_DOUBLE, "X", "0.8", "DT_TEMPERATURE",
     "divide logits by X; 0 = always the most likely token", NULL, 0, 100},
    {"top-k", 0, CLI_INT, "K", "40", "DT_TOP_K", "sample among the K most likely tokens; 0 = all",
     NULL, 0, 1 << 24},
    {"tokens", 0, CLI_INT, "N", "256", "DT_SAMPLE_TOKENS", "tokens to generate", NULL, 0, 1e7},
    {"seed", 0, CLI_INT, "S", "1337", "DT_SEED", "random seed", NULL, 0, 9.2e18},
    {"threads", 't', CLI_INT, "N", "0", "DT_THREADS",
     "compute threads; 0: OMP_NUM_THREADS, else all CPUs", NULL, 0, 1024},
    {"tokenizer", 0, CLI_STRING, "KIND", NULL, NULL,
     "byte, gpt2 or a BPE folder (default: the model file's table, else gpt2)", NULL, 0, 0},
    {0},
};

typedef struct scored {
    float logit;
    int id;
} scored;

static int by_logit_desc(const void *a, const void *b) {
    float x = ((const scored *)a)->logit, y = ((const scored *)b)->logit;
    return (x < y) - (x > y);
}

/* Pick the next token from one row of logits (V). scratch: V entries. */
static int pick(const float *logits, int V, double temperature, int top_k, dt_rng *rng,
                scored *scratch) {
    if (temperature == 0.0) {
        int best = 0;
        for (int i = 1; i < V; i++)
            if (logits[i] > logits[best])
                best = i;
        return best;
    }
    for (int i = 0; i < V; i++)
        scratch[i] = (scored){logits[i], i};
    qsort(scratch, (size_t)V, sizeof *scratch, by_logit_desc);
    int k = top_k > 0 && top_k < V ? top_k : V;
    double sum = 0.0, mx = scratch[0].logit;
    for (int i = 0; i < k; i++)
        sum += exp((scratch[i].logit - mx) / temperature);
    double u = dt_rng_uniform(rng) * sum, acc = 0.0;
    for (int i = 0; i < k; i++) {
        acc += exp((scratch[i].logit - mx) / temperature);
        if (u < acc)
            return scratch[i].id;
    }
    return scratch[k - 1].id;
}

/* The tokenizer of a table stored in a model file. A corpus's char table is
 * increasing (dt_tokenizer_init_table checks that); a weights file written
 * by a program through dt_gpt_save_weights may list its bytes in any order,
 * and is taken as it is when they are distinct. */
static dt_status table_tokenizer(dt_tokenizer *t, int kind, const uint8_t *table, int n) {
    dt_status st = dt_tokenizer_init_table(t, (dt_tokenizer_kind)kind, table, n);
    if (st == DT_OK || kind != DT_TOKENIZER_CHAR || n < 1 || n > 256)
        return st;
    memset(t, 0, sizeof *t);
    t->kind = DT_TOKENIZER_CHAR;
    for (int b = 0; b < 256; b++)
        t->byte_to_id[b] = -1;
    for (int i = 0; i < n; i++) {
        if (t->byte_to_id[table[i]] >= 0)
            return dt_error_set(DT_ERR_CORRUPT, "vocabulary table holds byte 0x%02x twice",
                                table[i]);
        t->id_to_byte[i] = table[i];
        t->byte_to_id[table[i]] = (int16_t)i;
    }
    t->vocab_size = n;
    return DT_OK;
}

/* Without --ckpt, as nanoGPT's sample.py reads its out/: the run folder
 * under runs/ whose model.dtgw was written last (dtrain train saves every
 * run there). Empty when there is none. */
static void newest_run(char *out, size_t len) {
    out[0] = '\0';
    DIR *d = opendir("runs");
    if (!d)
        return;
    struct timespec best = {0, 0};
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        char w[4096];
        struct stat sb;
        snprintf(w, sizeof w, "runs/%s/model.dtgw", e->d_name);
        if (stat(w, &sb) != 0 || !S_ISREG(sb.st_mode))
            continue;
        if (out[0] && (sb.st_mtim.tv_sec < best.tv_sec ||
                       (sb.st_mtim.tv_sec == best.tv_sec && sb.st_mtim.tv_nsec <= best.tv_nsec)))
            continue;
        best = sb.st_mtim;
        snprintf(out, len, "runs/%s", e->d_name);
    }
    closedir(d);
}

static int run_sample(cli_args *a) {
    const char *path = cli_str(a, "ckpt");
    char newest[4096];
    if (!path || !*path) {
        newest_run(newest, sizeof newest);
        if (!newest[0])
            cli_usage_error(a->cmd, "--ckpt PATH is required (there is no runs/*/model.dtgw here "
                                    "to default to)");
        path = newest;
        fprintf(stderr, "sampling from %s (the newest run here; --ckpt PATH to choose)\n", path);
    }
    const char *prompt = cli_str(a, "prompt");
    int ntok = (int)cli_int(a, "tokens");
    int threads = (int)cli_int(a, "threads");
    dt_tensor_set_threads(threads > 0 ? threads : cli_default_threads());

    dt_model_file mf;
    dt_status st = dt_model_open(&mf, path, 0, 0);
    if (st != DT_OK)
        return cli_fail(st);
    dt_gpt *m = mf.model;
    const dt_gpt_config *cfg = dt_gpt_get_config(m);
    int V = cfg->vocab, maxT = cfg->max_seq;
    /* The tokenizer: --tokenizer, else the table the file carries, else
     * GPT-2's BPE (a model without a table was trained on bpe data). */
    const char *spec = cli_str(a, "tokenizer");
    dt_tokenizer tok;
    dt_bpe *bpe = NULL;
    if ((!spec || !*spec) && mf.vocab_len > 0) {
        st = table_tokenizer(&tok, mf.tok_kind, mf.vocab, mf.vocab_len);
    } else {
        int kind;
        st = cli_tokenizer(spec && *spec ? spec : "gpt2", &kind, &bpe);
        if (st == DT_OK && bpe)
            dt_tokenizer_init_bpe(&tok, bpe);
        else if (st == DT_OK && kind == DT_TOKENIZER_BYTE)
            dt_tokenizer_init_byte(&tok);
        else if (st == DT_OK)
            st = dt_error_set(DT_ERR_INVALID,
                              "--tokenizer char: the char table comes from the model file, and "
                              "%s has none",
                              path);
        if (st != DT_OK)
            dt_error_prefix("%s has no tokenizer table: --tokenizer", path);
    }
    int Vt = st == DT_OK ? tok.vocab_size : 0;
    if (st == DT_OK && Vt > V)
        st = dt_error_set(DT_ERR_INVALID, "the tokenizer has %d tokens, the model only %d", Vt, V);
    int32_t *ids = NULL;
    size_t n = 0;
    if (st == DT_OK) {
        st = dt_tokenizer_encode_any(&tok, prompt, strlen(prompt), &ids, &n);
        if (st != DT_OK && tok.kind != DT_TOKENIZER_BPE)
            dt_error_prefix("--prompt: a character not in the model's vocabulary");
    }
    if (st == DT_OK && n == 0) { /* no prompt: start after a newline */
        int32_t *nl = NULL;
        size_t k = 0;
        int32_t first = dt_tokenizer_encode_any(&tok, "\n", 1, &nl, &k) == DT_OK && k ? nl[0] : 0;
        free(nl);
        int32_t *g = realloc(ids, sizeof *ids);
        if (!g)
            st = dt_error_set(DT_ERR_NOMEM, "one token");
        else
            (ids = g)[n++] = first;
    }
    size_t cap = n + (size_t)ntok + 1;
    int32_t *grown = st == DT_OK ? realloc(ids, cap * sizeof *ids) : NULL;
    scored *scratch = st == DT_OK ? malloc((size_t)V * sizeof(scored)) : NULL;
    if (st == DT_OK && (!grown || !scratch))
        st = dt_error_set(DT_ERR_NOMEM, "cannot allocate %zu tokens", cap);
    if (grown)
        ids = grown;
    if (st != DT_OK) {
        free(ids);
        free(scratch);
        dt_bpe_destroy(bpe);
        dt_model_close(&mf);
        return cli_fail(st);
    }

    dt_rng rng;
    dt_rng_init(&rng, (uint64_t)cli_int(a, "seed"), dt_rng_stream_id(0, 0, DT_RNG_SAMPLE));
    fwrite(prompt, 1, strlen(prompt), stdout);
    for (int s = 0; s < ntok; s++) {
        int T = n < (size_t)maxT ? (int)n : maxT;
        const int32_t *ctx = ids + (n - (size_t)T);
        st = dt_gpt_forward(m, ctx, NULL, 1, T, NULL);
        if (st != DT_OK)
            break;
        const float *row = dt_gpt_last_logits(m, 0);
        /* Only the tokenizer's ids stand for text: a model trained with a
         * larger --vocab samples among those. */
        int next =
            pick(row, Vt, cli_double(a, "temperature"), (int)cli_int(a, "top-k"), &rng, scratch);
        ids[n++] = next;
        size_t len;
        const uint8_t *b = dt_tokenizer_token(&tok, next, &len);
        if (b)
            fwrite(b, 1, len, stdout);
        fflush(stdout);
    }
    fputc('\n', stdout);
    free(ids);
    free(scratch);
    dt_bpe_destroy(bpe);
    dt_model_close(&mf);
    return st == DT_OK ? 0 : cli_fail(st);
}

const cli_cmd cli_cmd_sample = {
    .name = "sample",
    .summary = "generate text from a trained model",
    .usage = "dtrain sample [--ckpt PATH] [--prompt TEXT] [--temperature X] [--top-k K] "
             "[--tokens N] [--seed S]",
    .description = "Loads a model (a run folder, a checkpoint file or folder, a weights file,\n"
                   "a safetensors or llm.c file: told apart by their first bytes), encodes the\n"
                   "prompt and prints the prompt followed by N generated tokens.",
    .opts = sample_opts,
    .run = run_sample,
};
