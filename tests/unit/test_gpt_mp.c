/*
 * test_gpt_mp.c — the bf16/fp16 GPT and activation recomputation.
 * bf16 and fp16 overfit one batch like fp32 does (tiny model, 40 AdamW
 * steps). Recomputation: gradients, loss, the last positions' logits
 * and the grad-ready hook order are BIT-IDENTICAL with recompute none,
 * blocks, every:2 and every:3 (in fp32, bf16 and fp16, over two
 * accumulating micro-batches), with the LM head in one chunk and in
 * several vocabulary chunks (which agree with one chunk within rounding);
 * sampling (forward without targets) sees the same last logits; and the
 * memory plan shrinks as documented in docs/engine.md, including the
 * issue's target for --recompute blocks. The weight handle: the
 * optimizer-written 16-bit copy trains bit for bit like rounding at every
 * forward.
 */
#include "dtrain/nn.h"
#include "dtrain/optim.h"
#include "test.h"

static void fill_tokens(int32_t *x, int n, int V, uint64_t seed) {
    dt_rng r;
    dt_rng_init(&r, seed, dt_rng_stream_id(0, 0, DT_RNG_TEST));
    for (int i = 0; i < n; i++)
        x[i] = (int32_t)dt_rng_below(&r, (uint32_t)V);
}

typedef struct hook_log {
    size_t calls;
    size_t seen[16];
} hook_log;

static void hook(void *user, size_t ready_from) {
    hook_log *h = user;
    if (h->calls < 16)
        h->seen[h->calls] = ready_from;
    h->calls++;
}

typedef struct run_out {
    float *grads, *logits, *sampled; /* logits: last positions (B,V) of the second forward;
                                        sampled: the same from a forward without targets */
    float loss[2];
    hook_log hooks;
} run_out;

/* Two micro-batches (the second with a smaller T) accumulated with
 * grad_scale 0.5; the last positions' logits of the second forward are
 * kept. head_cols > 0 forces the LM head's chunk width. */
static void run(const dt_gpt_config *c, dt_precision pr, int every, int head_cols, run_out *o) {
    enum { B = 2, T = 24 };
    dt_gpt_options opt = {.precision = pr, .recompute_every = every};
    dt_gpt *m;
    dt__gpt_head_cols_override(head_cols);
    dt_status st = dt_gpt_create_with(&m, c, B, T, &opt);
    dt__gpt_head_cols_override(0);
    ASSERT_OK(st);
    dt_gpt_init_params(m, 11);
    int32_t in[B * T], tg[B * T];
    size_t n = dt_gpt_num_params(m), V = (size_t)c->vocab;
    o->grads = malloc(n * sizeof(float));
    o->logits = malloc(B * V * sizeof(float));
    o->sampled = malloc(B * V * sizeof(float));
    ASSERT_TRUE(o->grads && o->logits && o->sampled);
    memset(&o->hooks, 0, sizeof o->hooks);
    dt_gpt_zero_grads(m);
    for (int k = 0; k < 2; k++) {
        int t = k == 0 ? T : 17;
        fill_tokens(in, B * t, c->vocab, 1 + k);
        fill_tokens(tg, B * t, c->vocab, 5 + k);
        ASSERT_OK(dt_gpt_forward(m, in, tg, B, t, &o->loss[k]));
        for (int b = 0; k == 1 && b < B; b++)
            memcpy(o->logits + b * V, dt_gpt_last_logits(m, b), V * sizeof(float));
        if (k == 1 && every > 0) /* dt_gpt_logits is (B,V) with recomputation */
            ASSERT_TRUE(memcmp(o->logits, dt_gpt_logits(m), B * V * sizeof(float)) == 0);
        ASSERT_OK(dt_gpt_backward(m, 0.5f, hook, &o->hooks));
    }
    memcpy(o->grads, dt_gpt_grads(m), n * sizeof(float));
    /* sampling: a forward without targets, then its last positions */
    ASSERT_OK(dt_gpt_forward(m, in, NULL, B, 17, NULL));
    for (int b = 0; b < B; b++)
        memcpy(o->sampled + b * V, dt_gpt_last_logits(m, b), V * sizeof(float));
    dt_gpt_destroy(m);
}

static void free_run(run_out *o) {
    free(o->grads);
    free(o->logits);
    free(o->sampled);
}

/* |a - b| <= tol * max|b| over n values */
static void check_near(const char *what, const float *a, const float *b, size_t n, double tol) {
    double mx = 0, err = 0;
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        mx = fabs(b[i]) > mx ? fabs(b[i]) : mx;
        if (fabs(a[i] - b[i]) > err) {
            err = fabs(a[i] - b[i]);
            at = i;
        }
    }
    if (!(err <= tol * mx))
        TEST_FAILF("%s: [%zu] %.9g vs %.9g: error %.3g > %.3g * max %.3g", what, at, a[at], b[at],
                   err, tol, mx);
}

/* head_cols 0: one LM-head chunk (V = 97 is below the automatic width);
 * 16: seven chunks, the last one column wide. */
static void check_identical(dt_precision pr, int head_cols) {
    /* 5 blocks, so every:2 (blocks 0, 2, 4) and every:3 (0, 3) differ;
     * T = 24 and 17: partial attention blocks; head size 16. */
    dt_gpt_config c = {5, 64, 4, 32, 97};
    size_t n = dt_gpt_config_num_params(&c), nl = 2 * (size_t)c.vocab;
    run_out ref, got;
    run(&c, pr, 0, head_cols, &ref);
    for (size_t i = 0; i < n; i++)
        if (!isfinite(ref.grads[i]))
            TEST_FAILF("%s: grad[%zu] = %g", dt_precision_name(pr), i, ref.grads[i]);
    const int modes[] = {1, 2, 3, 7};
    for (size_t k = 0; k < sizeof modes / sizeof modes[0]; k++) {
        char name[32];
        dt_recompute_format(modes[k], name, sizeof name);
        run(&c, pr, modes[k], head_cols, &got);
        if (memcmp(ref.grads, got.grads, n * sizeof(float)) != 0) {
            size_t i = 0;
            while (ref.grads[i] == got.grads[i] ||
                   memcmp(&ref.grads[i], &got.grads[i], sizeof(float)) == 0)
                i++;
            TEST_FAILF("%s head %d recompute %s: grad[%zu] %.9g differs from no "
                       "recomputation's %.9g",
                       dt_precision_name(pr), head_cols, name, i, got.grads[i], ref.grads[i]);
        }
        ASSERT_TRUE(memcmp(ref.logits, got.logits, nl * sizeof(float)) == 0);
        /* without targets only the last rows are computed: same values up
         * to the GEMM's rounding for a different row count */
        check_near("sampled logits", got.sampled, ref.sampled, nl, 1e-5);
        ASSERT_TRUE(memcmp(ref.loss, got.loss, sizeof ref.loss) == 0);
        ASSERT_EQ(got.hooks.calls, ref.hooks.calls);
        ASSERT_EQ(got.hooks.calls, 2 * ((size_t)c.layers + 1));
        for (size_t i = 0; i < ref.hooks.calls; i++)
            ASSERT_EQ(got.hooks.seen[i], ref.hooks.seen[i]);
        free_run(&got);
    }
    free_run(&ref);
}

static void test_identical_fp32(void) {
    check_identical(DT_PRECISION_FP32, 0);
    check_identical(DT_PRECISION_FP32, 16);
}
static void test_identical_bf16(void) {
    check_identical(DT_PRECISION_BF16, 0);
    check_identical(DT_PRECISION_BF16, 16);
}
static void test_identical_fp16(void) {
    check_identical(DT_PRECISION_FP16, 0);
    check_identical(DT_PRECISION_FP16, 16);
}

/* The chunked LM head computes the same function as one chunk: loss,
 * logits and gradients agree within rounding (fp32; the chunks change the
 * order of the log-sum-exp and of the dlnf sum). */
static void test_chunked_head(void) {
    dt_gpt_config c = {2, 64, 4, 32, 97};
    size_t n = dt_gpt_config_num_params(&c);
    run_out one, many;
    run(&c, DT_PRECISION_FP32, 0, 0, &one);
    run(&c, DT_PRECISION_FP32, 0, 16, &many);
    check_near("loss", many.loss, one.loss, 2, 1e-6);
    check_near("logits", many.logits, one.logits, 2 * (size_t)c.vocab, 1e-6);
    check_near("grads", many.grads, one.grads, n, 1e-5);
    printf("  loss %.7f (16-column chunks) vs %.7f (one chunk)\n", many.loss[0], one.loss[0]);
    free_run(&one);
    free_run(&many);
}

static void test_options_rejected(void) {
    dt_gpt_config c = {2, 64, 4, 32, 97};
    dt_gpt *m = NULL;
    dt_gpt_options o = {.precision = DT_PRECISION_FP32, .recompute_every = -1};
    ASSERT_STATUS(dt_gpt_create_with(&m, &c, 1, 8, &o), DT_ERR_INVALID);
    ASSERT_TRUE(strstr(dt_last_error(), "-1") != NULL);
    o = (dt_gpt_options){.precision = (dt_precision)7, .recompute_every = 0};
    ASSERT_STATUS(dt_gpt_create_with(&m, &c, 1, 8, &o), DT_ERR_INVALID);
    ASSERT_TRUE(m == NULL);
}

/* The plan: recomputation keeps the residual stream of every block plus one
 * shared set. The target for blocks, peak <= 1/L of no
 * recomputation's + one block, is asserted where it holds:
 *  - on the blocks' part (saved + shared set) in fp32 for every preset, and
 *    in bf16/fp16 up to L = 9: the kept residual stream stays fp32 (L + 1
 *    tensors of 4C bytes per token) while a 16-bit block is only ~36C, so
 *    for gpt2-124m (L = 12) it exceeds the bound;
 *  - on the whole arena in fp32 for every preset (the LM head is
 *    recomputed in ~2 MiB vocabulary chunks, so gpt2-124m's (B,T,50257)
 *    logits never exist at once), and for tiny in bf16/fp16; not for
 *    16-bit shakespeare-char and gpt2-124m, where the fp32 backward
 *    scratch ((B,T,4C) dfch, dres, dbuf) next to 16-bit blocks exceeds it.
 * docs/engine.md has the numbers. */
static void check_plan(const char *preset, int B, int T, dt_precision pr, bool blocks_part,
                       bool whole_arena) {
    dt_gpt_config c;
    ASSERT_OK(dt_gpt_preset(preset, &c));
    dt_gpt_options none = {.precision = pr, .recompute_every = 0},
                   blocks = {.precision = pr, .recompute_every = 1},
                   two = {.precision = pr, .recompute_every = 2};
    dt_memory_report rn, rb, r2;
    dt_gpt_memory_plan_with(&c, B, T, &none, &rn);
    dt_gpt_memory_plan_with(&c, B, T, &blocks, &rb);
    dt_gpt_memory_plan_with(&c, B, T, &two, &r2);
    size_t L = (size_t)c.layers, stream = (size_t)B * T * c.dim * 4;
    /* none: every block keeps a full set; nothing shared */
    ASSERT_EQ(rn.recompute, 0);
    ASSERT_EQ(rn.saved, L * rn.block + stream);
    ASSERT_EQ(rb.block, rn.block);
    /* blocks: L + 1 residual-stream tensors kept, one set (minus res3) shared */
    ASSERT_EQ(rb.saved, (L + 1) * stream);
    ASSERT_EQ(rb.recompute, rn.block - stream);
    /* ... and the LM head keeps one vocabulary chunk and the last positions
     * instead of all (B,T,V) logits */
    ASSERT_EQ(rn.activations - rb.activations,
              rn.saved - rb.saved - rb.recompute + rn.logits - rb.logits);
    if (c.vocab > 4096 && !(rb.logits * 8 < rn.logits))
        TEST_FAILF("%s: logits with recomputation %zu, without %zu", preset, rb.logits, rn.logits);
    /* every:2 recomputes ceil(L/2) blocks: it saves memory from L = 3 on
     * (below, the blocks' part is the same and only the head differs) */
    if (!(rb.activations < r2.activations &&
          (L < 3 ? r2.activations - r2.logits == rn.activations - rn.logits
                 : r2.activations < rn.activations)))
        TEST_FAILF("%s %s: arena blocks %zu, every:2 %zu, none %zu: not decreasing", preset,
                   dt_precision_name(pr), rb.activations, r2.activations, rn.activations);
    /* the target, on the blocks' part (saved + shared scratch) */
    size_t part_b = rb.saved + rb.recompute, bound_part = rn.saved / L + rn.block;
    if (blocks_part && !(part_b <= bound_part))
        TEST_FAILF("%s %s B%d T%d: blocks' part with recompute blocks %zu > 1/L of %zu + block "
                   "%zu = %zu",
                   preset, dt_precision_name(pr), B, T, part_b, rn.saved, rn.block, bound_part);
    size_t bound = rn.activations / L + rn.block;
    if (whole_arena && !(rb.activations <= bound))
        TEST_FAILF("%s %s B%d T%d: arena with recompute blocks %zu > 1/L of %zu + block %zu = %zu",
                   preset, dt_precision_name(pr), B, T, rb.activations, rn.activations, rn.block,
                   bound);
}

static void test_memory_plan(void) {
    for (int p = 0; p < DT_PRECISION_COUNT; p++) {
        bool f32 = p == DT_PRECISION_FP32;
        check_plan("shakespeare-char", 8, 256, (dt_precision)p, true, f32);
        check_plan("gpt2-124m", 4, 64, (dt_precision)p, f32, f32);
        check_plan("tiny", 2, 64, (dt_precision)p, true, true);
    }
    /* 16-bit activations: the arena is smaller, the weight copy appears */
    dt_gpt_config c;
    ASSERT_OK(dt_gpt_preset("shakespeare-char", &c));
    dt_gpt_options f32 = {.precision = DT_PRECISION_FP32, .recompute_every = 0},
                   b16 = {.precision = DT_PRECISION_BF16, .recompute_every = 0};
    dt_memory_report a, b;
    dt_gpt_memory_plan_with(&c, 8, 256, &f32, &a);
    dt_gpt_memory_plan_with(&c, 8, 256, &b16, &b);
    ASSERT_EQ(a.weights16, 0);
    ASSERT_EQ(b.weights16, dt_gpt_config_num_params(&c) * 2);
    ASSERT_TRUE(b.activations < a.activations * 3 / 4);
    /* a model reports its own plan */
    dt_gpt *m;
    ASSERT_OK(dt_gpt_create_with(&m, &c, 2, 32, &b16));
    dt_gpt_memory(m, &a);
    dt_gpt_memory_plan_with(&c, 2, 32, &b16, &b);
    ASSERT_EQ(a.activations, b.activations);
    ASSERT_EQ(a.saved, b.saved);
    ASSERT_EQ(a.weights16, b.weights16);
    ASSERT_EQ(a.precision, b.precision);
    dt_gpt_destroy(m);
}

/* 40 AdamW steps on one batch; returns the first and the last loss. */
static void overfit(dt_precision pr, int every, float *first, float *last) {
    enum { B = 2, T = 32, STEPS = 40 };
    dt_gpt_config c;
    ASSERT_OK(dt_gpt_preset("tiny", &c));
    dt_gpt_options opt = {.precision = pr, .recompute_every = every};
    dt_gpt *m;
    ASSERT_OK(dt_gpt_create_with(&m, &c, B, T, &opt));
    dt_gpt_init_params(m, 3);
    size_t n = dt_gpt_num_params(m);
    float *mom = calloc(n, sizeof(float)), *var = calloc(n, sizeof(float));
    ASSERT_TRUE(mom && var);
    int32_t in[B * T], tg[B * T];
    fill_tokens(in, B * T, c.vocab, 21);
    fill_tokens(tg, B * T, c.vocab, 22);
    dt_adamw_config ac = {0.9f, 0.95f, 1e-8f, 0.0f};
    for (int s = 1; s <= STEPS; s++) {
        float loss;
        dt_gpt_zero_grads(m);
        ASSERT_OK(dt_gpt_forward(m, in, tg, B, T, &loss));
        ASSERT_OK(dt_gpt_backward(m, 1.0f, NULL, NULL));
        dt_adamw_step(dt_gpt_params(m), dt_gpt_grads(m), mom, var, n, 3e-3f, &ac, s, 0.0f);
        if (s == 1)
            *first = loss;
        *last = loss;
    }
    free(mom);
    free(var);
    dt_gpt_destroy(m);
}

static void test_overfit(void) {
    float f32_first, f32_last;
    overfit(DT_PRECISION_FP32, 0, &f32_first, &f32_last);
    printf("  fp32: loss %.4f -> %.4f\n", f32_first, f32_last);
    ASSERT_TRUE(f32_last < 0.5f * f32_first);
    const dt_precision ps[2] = {DT_PRECISION_BF16, DT_PRECISION_FP16};
    for (int i = 0; i < 2; i++) {
        float first, last;
        overfit(ps[i], i == 0 ? 1 : 0, &first, &last);
        printf("  %s: loss %.4f -> %.4f\n", dt_precision_name(ps[i]), first, last);
        /* same start within rounding, and the same progress within 10% */
        ASSERT_NEAR(first, f32_first, 1e-2, 0.0);
        if (!(last < 0.5f * first && fabsf(last - f32_last) <= 0.1f * f32_last))
            TEST_FAILF("%s: loss %.4f -> %.4f after 40 steps; fp32 %.4f -> %.4f",
                       dt_precision_name(ps[i]), first, last, f32_first, f32_last);
    }
}

/* The weight handle (dt_gpt_set_weights16 + dt_optimizer_set_copy): a
 * model whose copy the optimizer writes as it updates, rounded by the
 * model only when told STALE, trains bit for bit like the default model
 * that rounds at every forward (3 steps of 2 micro-batches, AdamW and SGD
 * with momentum, the params above the optimizer's parallel split). A model
 * told CURRENT whose optimizer did not write the copy computes with the
 * old weights: the state is obeyed, so the equality is the copy's. */
static void handle_run(const dt_gpt_config *c, dt_precision pr, dt_optim_kind kind, int mode,
                       float loss[6], float **params) {
    enum { B = 2, T = 16 };
    dt_gpt_options opt = {.precision = pr};
    dt_gpt *m;
    ASSERT_OK(dt_gpt_create_with(&m, c, B, T, &opt));
    dt_gpt_init_params(m, 5);
    size_t n = dt_gpt_num_params(m), nt = dt_gpt_num_tensors(m);
    dt_optim_tensor *tab = calloc(nt, sizeof *tab);
    ASSERT_TRUE(tab != NULL);
    for (size_t i = 0; i < nt; i++) {
        dt_param_info pi;
        dt_gpt_tensor_info(m, i, &pi);
        tab[i] =
            (dt_optim_tensor){.offset = pi.offset, .count = pi.rows * pi.cols, .decay = pi.decay};
    }
    dt_optim_config oc = dt_optim_config_default();
    oc.kind = kind;
    oc.momentum = 0.9f;
    dt_optimizer *o;
    ASSERT_OK(dt_optimizer_create(&o, &oc, tab, nt, &(dt_range){0, n}, 1));
    ASSERT_TRUE(dt_optimizer_writes_copy(o));
    if (mode == 1) /* the handle: the optimizer writes the copy */
        dt_optimizer_set_copy(o, dt_gpt_write_weights16, m);
    if (mode > 0)
        dt_gpt_set_weights16(m, DT_GPT_W16_STALE);
    int32_t in[B * T], tg[B * T];
    for (int s = 0; s < 3; s++) {
        dt_optimizer_begin(o, s, 1e-2f);
        for (int k = 0; k < 2; k++) {
            fill_tokens(in, B * T, c->vocab, 31 + 2 * s + k);
            fill_tokens(tg, B * T, c->vocab, 61 + 2 * s + k);
            ASSERT_OK(dt_gpt_forward(m, in, tg, B, T, &loss[2 * s + k]));
            if (mode > 0)
                ASSERT_EQ(dt_gpt_weights16_state(m), DT_GPT_W16_CURRENT);
            ASSERT_OK(dt_gpt_backward_mode(m, 0.5f, k ? DT_GRAD_ACCUMULATE : DT_GRAD_OVERWRITE,
                                           NULL, NULL));
        }
        ASSERT_OK(dt_optimizer_step(o, dt_gpt_params(m), dt_gpt_grads(m)));
        dt_optimizer_end(o, true);
        if (mode > 0) /* mode 2 claims so without the copy: stale weights */
            dt_gpt_set_weights16(m, DT_GPT_W16_CURRENT);
    }
    *params = malloc(n * sizeof(float));
    ASSERT_TRUE(*params != NULL);
    memcpy(*params, dt_gpt_params(m), n * sizeof(float));
    dt_optimizer_destroy(o);
    free(tab);
    dt_gpt_destroy(m);
}

static void test_weight_handle(void) {
    dt_gpt_config c;
    ASSERT_OK(dt_gpt_preset("tiny", &c));
    const dt_precision ps[2] = {DT_PRECISION_BF16, DT_PRECISION_FP16};
    const dt_optim_kind ks[2] = {DT_OPTIM_ADAMW, DT_OPTIM_SGD};
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 2; j++) {
            float ref[6], got[6], lie[6], *pref, *pgot, *plie;
            handle_run(&c, ps[i], ks[j], 0, ref, &pref);
            handle_run(&c, ps[i], ks[j], 1, got, &pgot);
            handle_run(&c, ps[i], ks[j], 2, lie, &plie);
            size_t n = dt_gpt_config_num_params(&c);
            ASSERT_TRUE(n >= (1u << 16)); /* the optimizer's chunked path */
            if (memcmp(ref, got, sizeof ref) != 0 || memcmp(pref, pgot, n * sizeof(float)) != 0)
                TEST_FAILF("%s %s: the handle's run differs (loss at step 3 %.9g vs %.9g)",
                           dt_precision_name(ps[i]), dt_optim_names[ks[j]], got[5], ref[5]);
            ASSERT_TRUE(memcmp(ref, lie, 2 * sizeof(float)) == 0); /* step 1: rounded once */
            ASSERT_TRUE(lie[2] != ref[2]); /* step 2 ran with step 1's weights */
            free(pref);
            free(pgot);
            free(plie);
        }
}

int main(void) {
    dt_tensor_set_threads(2);
    RUN(test_identical_fp32);
    RUN(test_identical_bf16);
    RUN(test_identical_fp16);
    RUN(test_chunked_head);
    RUN(test_options_rejected);
    RUN(test_memory_plan);
    RUN(test_overfit);
    RUN(test_weight_handle);
    return TEST_SUMMARY();
}
