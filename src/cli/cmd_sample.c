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
#include "dtrain/nn.h"
#include "dtrain/train.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const cli_opt sample_opts[] = {
    {"ckpt", 0, CLI_STRING, "PATH", NULL, "DT_CKPT",
     "the model: a run folder, a checkpoint (file or folder), a .dtgw, .safetensors or llm.c .bin",
     NULL, 0, 0},
    {"prompt", 'p', CLI_STRING, "TEXT", "\n", "DT_PROMPT", "text to continue", NULL, 0, 0},
    {"temperature", 0, CLI_DOUBLE, "X", "0.8", "DT_TEMPERATURE",
     "divide logits by X; 0 = always the most likely token", NULL, 0, 100},
    {"top-k", 0, CLI_INT, "K", "40", "DT_TOP_K", "sample among the K most likely tokens; 0 = all",
     NULL, 0, 1 << 24},
    {"tokens", 0, CLI_INT, "N", "256", "DT_SAMPLE_TOKENS", "tokens to generate", NULL, 0, 1e7},
    {"seed", 0, CLI_INT, "S", "1337", "DT_SEED", "random seed", NULL, 0, 9.2e18},
    {"threads", 't', CLI_INT, "N", "0", "DT_THREADS", "compute threads; 0 = all CPUs", NULL, 0,
     1024},
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

static int run_sample(cli_args *a) {
    const char *path = cli_str(a, "ckpt");
    if (!path || !*path)
        cli_usage_error(a->cmd, "--ckpt FILE is required");
    const char *prompt = cli_str(a, "prompt");
    int ntok = (int)cli_int(a, "tokens");
    int threads = (int)cli_int(a, "threads");
    dt_tensor_set_threads(threads > 0 ? threads : dt_cpu_count());

    dt_model_file mf;
    dt_status st = dt_model_open(&mf, path, 0, 0);
    if (st != DT_OK)
        return cli_fail(st);
    dt_gpt *m = mf.model;
    const uint8_t *vocab = mf.vocab;
    int vlen = mf.vocab_len;
    const dt_gpt_config *cfg = dt_gpt_get_config(m);
    int V = cfg->vocab, maxT = cfg->max_seq;
    if (vlen == 0) {
        dt_model_close(&mf);
        return cli_fail(dt_error_set(
            DT_ERR_INVALID, "%s has no tokenizer vocabulary; cannot encode the prompt", path));
    }
    int inv[256];
    for (int i = 0; i < 256; i++)
        inv[i] = -1;
    for (int i = 0; i < vlen; i++)
        inv[vocab[i]] = i;

    size_t plen = strlen(prompt);
    size_t cap = plen + (size_t)ntok + 1;
    int32_t *ids = malloc(cap * sizeof(int32_t));
    scored *scratch = malloc((size_t)V * sizeof(scored));
    if (!ids || !scratch) {
        free(ids);
        free(scratch);
        dt_model_close(&mf);
        return cli_fail(dt_error_set(DT_ERR_NOMEM, "cannot allocate %zu tokens", cap));
    }
    size_t n = 0;
    for (size_t i = 0; i < plen; i++) {
        unsigned char ch = (unsigned char)prompt[i];
        if (inv[ch] < 0) {
            free(ids);
            free(scratch);
            dt_model_close(&mf);
            return cli_fail(dt_error_set(DT_ERR_INVALID,
                                         "prompt character 0x%02x ('%c') at offset %zu is not in "
                                         "the model's vocabulary of %d characters",
                                         ch, ch >= 32 && ch < 127 ? ch : '?', i, vlen));
        }
        ids[n++] = inv[ch];
    }
    if (n == 0)
        ids[n++] = inv['\n'] >= 0 ? inv['\n'] : 0;

    dt_rng rng;
    dt_rng_init(&rng, (uint64_t)cli_int(a, "seed"), dt_rng_stream_id(0, 0, DT_RNG_SAMPLE));
    fwrite(prompt, 1, plen, stdout);
    for (int s = 0; s < ntok; s++) {
        int T = n < (size_t)maxT ? (int)n : maxT;
        const int32_t *ctx = ids + (n - (size_t)T);
        st = dt_gpt_forward(m, ctx, NULL, 1, T, NULL);
        if (st != DT_OK)
            break;
        const float *row = dt_gpt_last_logits(m, 0);
        /* Only the tokenizer's ids stand for bytes: a model trained with a
         * larger --vocab samples among those. */
        int next = pick(row, vlen < V ? vlen : V, cli_double(a, "temperature"),
                        (int)cli_int(a, "top-k"), &rng, scratch);
        ids[n++] = next;
        fputc(vocab[next], stdout);
        fflush(stdout);
    }
    fputc('\n', stdout);
    free(ids);
    free(scratch);
    dt_model_close(&mf);
    return st == DT_OK ? 0 : cli_fail(st);
}

const cli_cmd cli_cmd_sample = {
    .name = "sample",
    .summary = "generate text from a trained model",
    .usage = "dtrain sample --ckpt PATH [--prompt TEXT] [--temperature X] [--top-k K] "
             "[--tokens N] [--seed S]",
    .description = "Loads a model (a run folder, a checkpoint file or folder, a weights file,\n"
                   "a safetensors or llm.c file: told apart by their first bytes), encodes the\n"
                   "prompt and prints the prompt followed by N generated tokens.",
    .opts = sample_opts,
    .run = run_sample,
};
