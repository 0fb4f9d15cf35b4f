/*
 * sample_e2e.c — end to end: train the tiny GPT on a repeated phrase until
 * it has memorised it, save a weights file with its character table, then
 * run `dtrain sample` greedily and check that it continues the phrase.
 * Also checks that the CLI rejects a prompt character outside the vocabulary.
 *
 * usage: sample_e2e DTRAIN_BINARY
 */
#include "dtrain/nn.h"
#include "dtrain/optim.h"
#include "test.h"

#include <unistd.h>

static const char phrase[] = "to be or not to be, ";

static void run(const char *cmd, char *out, size_t cap) {
    FILE *p = popen(cmd, "r");
    if (!p)
        TEST_FAILF("cannot run %s", cmd);
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = 0;
    (void)pclose(p);
}

static void test_train_save_sample(const char *dtrain) {
    /* character table of the phrase */
    uint8_t vocab[256];
    int inv[256], V = 0;
    for (int i = 0; i < 256; i++)
        inv[i] = -1;
    for (const char *c = phrase; *c; c++)
        if (inv[(uint8_t)*c] < 0) {
            inv[(uint8_t)*c] = V;
            vocab[V++] = (uint8_t)*c;
        }
    dt_gpt_config cfg;
    ASSERT_OK(dt_gpt_preset("tiny", &cfg));
    cfg.vocab = V;
    cfg.max_seq = 32;
    int B = 4, T = 32, L = (int)strlen(phrase);
    dt_gpt *m;
    ASSERT_OK(dt_gpt_create(&m, &cfg, B, T));
    dt_gpt_init_params(m, 5);
    size_t n = dt_gpt_num_params(m);
    float *mo = calloc(n, 4), *va = calloc(n, 4);
    int32_t in[4 * 32], tg[4 * 32];
    dt_adamw_config ac = {0.9f, 0.95f, 1e-8f, 0.0f};
    float loss = 0.0f;
    for (int s = 1; s <= 300; s++) {
        for (int b = 0; b < B; b++) {
            int start = (s * 7 + b * 5) % L; /* every phase of the phrase */
            for (int t = 0; t < T; t++) {
                in[b * T + t] = inv[(uint8_t)phrase[(start + t) % L]];
                tg[b * T + t] = inv[(uint8_t)phrase[(start + t + 1) % L]];
            }
        }
        dt_gpt_zero_grads(m);
        ASSERT_OK(dt_gpt_forward(m, in, tg, B, T, &loss));
        ASSERT_OK(dt_gpt_backward(m, 1.0f, NULL, NULL));
        dt_adamw_step(dt_gpt_params(m), dt_gpt_grads(m), mo, va, n, 3e-3f, &ac, s, 0.0f);
    }
    printf("# loss after 300 steps: %.4f\n", loss);
    ASSERT_TRUE(loss < 0.2f); /* the first characters of a window are ambiguous */
    char path[] = "/tmp/dt_sample_e2e_XXXXXX";
    int fd = mkstemp(path);
    ASSERT_TRUE(fd >= 0);
    close(fd);
    ASSERT_OK(dt_gpt_save_weights(m, path, vocab, V));

    char cmd[1024], out[4096];
    snprintf(cmd, sizeof cmd,
             "%s sample --ckpt %s --prompt 'to be or' --temperature 0 --tokens 30 --threads 1",
             dtrain, path);
    run(cmd, out, sizeof out);
    printf("# %s\n# -> %s", cmd, out);
    const char *want = "to be or not to be, to be or not t";
    if (strncmp(out, want, strlen(want)) != 0)
        TEST_FAILF("sample output\n    got:  \"%.200s\"\n    want: \"%s...\"", out, want);
    /* a prompt character the model has never seen is a clear error */
    snprintf(cmd, sizeof cmd, "%s sample --ckpt %s --prompt 'xyz' --tokens 3 --threads 1 2>&1",
             dtrain, path);
    run(cmd, out, sizeof out);
    ASSERT_TRUE(strstr(out, "not in the model's vocabulary") != NULL);
    /* sampling with temperature and top-k runs and is reproducible by seed */
    char a[256], b[256];
    snprintf(cmd, sizeof cmd,
             "%s sample --ckpt %s --prompt 'to' --temperature 1.0 --top-k 3 --tokens 20 "
             "--seed 9 --threads 1",
             dtrain, path);
    run(cmd, a, sizeof a);
    run(cmd, b, sizeof b);
    ASSERT_TRUE(strcmp(a, b) == 0 && strlen(a) == 2 + 20 + 1);
    unlink(path);
    free(mo);
    free(va);
    dt_gpt_destroy(m);
}

static const char *g_dtrain;
static void test_sample_e2e(void) { test_train_save_sample(g_dtrain); }

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s DTRAIN_BINARY\n", argv[0]);
        return 2;
    }
    g_dtrain = argv[1];
    dt_tensor_set_threads(1);
    RUN(test_sample_e2e);
    return TEST_SUMMARY();
}
