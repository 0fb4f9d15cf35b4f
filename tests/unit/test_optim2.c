/*
 * test_optim2.c — the optimizers beyond AdamW and SGD against independent
 * references (tests/reference/optim2_reference.txt, written by
 * gen_optim2_reference.py: PyTorch 1.13 for RAdam, L-BFGS, and AdamW under
 * Lookahead and gradient centralisation; numpy from the papers' equations
 * for LAMB, LARS and Adafactor; K-FAC and 1-bit Adam/LAMB (two workers through
 * the sign codec with error feedback) against kfac_reference.txt and
 * onebit_reference.txt, numpy from the equations, gen_kfac_reference.py and
 * gen_onebit_reference.py), and their properties:
 *   - the AVX-512 and scalar paths (DT_ISA) give the same bits;
 *   - sharded equals unsharded: two threads, each an optimizer owning
 *     pieces that cut tensors mid-row, with a reduce hook that sums their
 *     statistics, against one optimizer owning everything;
 *   - 8-bit AdamW: the code's error bounds, get/set restoring the bytes,
 *     2 bytes of state per parameter, a trajectory close to AdamW's;
 *   - 1-bit Adam/LAMB: premixed momentum equals the dense update;
 *   - offload: every kind that streams gives the same bits with its state
 *     in a file as in memory, over several of the file's pieces (L-BFGS
 *     and K-FAC refuse, naming why);
 *   - bad hyper-parameters are named with their value.
 */
#include "dtrain/compress.h"
#include "dtrain/optim.h"
#include "optim/optim_internal.h"
#include "test.h"

#include <pthread.h>
#include <unistd.h>

#define FIXTURE DT_TEST_DATA_DIR "/reference/optim2_reference.txt"

static char *fixture_text;

static void load_fixture(void) {
    FILE *f = fopen(FIXTURE, "rb");
    if (!f)
        TEST_FAILF("cannot open %s", FIXTURE);
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    fixture_text = malloc((size_t)len + 1);
    ASSERT_TRUE(fixture_text != NULL);
    ASSERT_EQ(fread(fixture_text, 1, (size_t)len, f), len);
    fixture_text[len] = 0;
    fclose(f);
}

/* The named line's values (malloc'ed); *n gets their count. */
static double *fx(const char *name, size_t *n) {
    size_t nl = strlen(name);
    for (const char *p = fixture_text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL) {
        if (strncmp(p, name, nl) == 0 && p[nl] == ' ') {
            char *end;
            size_t count = strtoull(p + nl + 1, &end, 10);
            double *v = malloc((count ? count : 1) * sizeof *v);
            for (size_t i = 0; i < count; i++)
                v[i] = strtod(end, &end);
            *n = count;
            return v;
        }
    }
    TEST_FAILF("fixture %s has no array '%s'", FIXTURE, name);
}

static float *fx_f32(const char *name, size_t expect) {
    size_t n;
    double *d = fx(name, &n);
    ASSERT_EQ(n, expect);
    float *f = malloc(n * sizeof *f);
    for (size_t i = 0; i < n; i++)
        f[i] = (float)d[i];
    free(d);
    return f;
}

static double fx1(const char *name, size_t i) {
    size_t n;
    double *d = fx(name, &n);
    ASSERT_TRUE(i < n);
    double v = d[i];
    free(d);
    return v;
}

#define STEPS 8
#define N     156

static dt_optim_tensor tab[3];
static float *params0, *grads[STEPS];
static float LR;

static void load_problem(void) {
    size_t n;
    double *t = fx("tensors", &n);
    ASSERT_EQ(n, 12);
    for (int i = 0; i < 3; i++) {
        size_t r = (size_t)t[4 * i + 1], c = (size_t)t[4 * i + 2];
        tab[i] = (dt_optim_tensor){.offset = (size_t)t[4 * i],
                                   .count = r * c,
                                   .decay = t[4 * i + 3] != 0,
                                   .rows = r > 1 ? r : 0,
                                   .cols = r > 1 ? c : 0};
    }
    free(t);
    params0 = fx_f32("params0", N);
    for (int k = 0; k < STEPS; k++) {
        char name[16];
        snprintf(name, sizeof name, "grads%d", k);
        grads[k] = fx_f32(name, N);
    }
    LR = (float)fx1("hparams", 0);
}

static dt_optim_config base_config(dt_optim_kind kind) {
    dt_optim_config c = dt_optim_config_default();
    c.kind = kind;
    c.adamw.beta1 = (float)fx1("hparams", 1);
    c.adamw.beta2 = (float)fx1("hparams", 2);
    c.adamw.eps = (float)fx1("hparams", 3);
    c.weight_decay = (float)fx1("hparams", 4);
    return c;
}

/* STEPS steps of c on the fixture's problem with learning rate lr; returns
 * the parameters (malloc'ed). */
static float *run(const dt_optim_config *c, float lr) {
    dt_optimizer *o;
    ASSERT_OK(dt_optimizer_create(&o, c, tab, 3, &(dt_range){0, N}, 1));
    float *p = malloc(N * sizeof *p), g[N];
    memcpy(p, params0, N * sizeof *p);
    for (int k = 0; k < STEPS; k++) {
        memcpy(g, grads[k], sizeof g);
        dt_optimizer_begin(o, k, lr);
        ASSERT_OK(dt_optimizer_step(o, p, g));
        dt_optimizer_end(o, true);
    }
    dt_optimizer_destroy(o);
    return p;
}

static void expect_close(const float *got, const char *ref, size_t n, double rtol, double atol) {
    size_t m;
    double *want = fx(ref, &m);
    ASSERT_EQ(m, n);
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - want[i]);
        if (!(d <= rtol * fabs(want[i]) + atol))
            TEST_FAILF("%s[%zu]: got %.9g, reference %.9g (difference %.3g)", ref, i,
                       (double)got[i], want[i], d);
        double rel = d / fmax(fabs(want[i]), 1e-30);
        worst = rel > worst ? rel : worst;
    }
    printf("  %s: max relative difference %.2g\n", ref, worst);
    free(want);
}

static void check(const dt_optim_config *c, float lr, const char *ref, double rtol) {
    float *p = run(c, lr);
    expect_close(p, ref, N, rtol, 1e-6);
    free(p);
}

static void test_radam_matches_pytorch(void) {
    dt_optim_config c = base_config(DT_OPTIM_RADAM);
    check(&c, LR, "radam_out", 1e-5);
}

static void test_lookahead_matches_reference(void) {
    dt_optim_config c = base_config(DT_OPTIM_LOOKAHEAD);
    c.inner = DT_OPTIM_ADAMW;
    c.lookahead_k = (int)fx1("lookahead_hparams", 0);
    c.lookahead_alpha = (float)fx1("lookahead_hparams", 1);
    check(&c, LR, "lookahead_out", 1e-5);
}

static void test_centralization_matches_reference(void) {
    dt_optim_config c = base_config(DT_OPTIM_ADAMW);
    c.centralize = true;
    check(&c, LR, "gc_adamw_out", 1e-5);
}

static void test_lamb_matches_reference(void) {
    dt_optim_config c = base_config(DT_OPTIM_LAMB);
    check(&c, LR, "lamb_out", 2e-5);
}

static void test_lars_matches_reference(void) {
    dt_optim_config c = base_config(DT_OPTIM_LARS);
    c.momentum = (float)fx1("lars_hparams", 1);
    c.trust_coeff = (float)fx1("lars_hparams", 2);
    c.trust_eps = (float)fx1("lars_hparams", 3);
    float lr = (float)fx1("lars_hparams", 0);
    check(&c, lr, "lars_out", 2e-5);
    c.nesterov = true;
    check(&c, lr, "lars_nesterov_out", 2e-5);
}

static void test_adafactor_matches_reference(void) {
    dt_optim_config c = base_config(DT_OPTIM_ADAFACTOR);
    c.adafactor.decay_rate = (float)fx1("adafactor_hparams", 0);
    c.adafactor.eps1 = (float)fx1("adafactor_hparams", 1);
    c.adafactor.eps2 = (float)fx1("adafactor_hparams", 2);
    c.adafactor.clip_threshold = (float)fx1("adafactor_hparams", 3);
    check(&c, 123.0f /* ignored: relative step */, "adafactor_out", 2e-5);
    c.adafactor.beta1 = 0.9f;
    c.adafactor.relative_step = false;
    c.adafactor.scale_parameter = false;
    check(&c, 0.05f, "adafactor_m_out", 2e-5);
    /* Memory: the factors of the 7 x 9 and 5 x 16 matrices and the
     * vector's v, not a value per matrix element. */
    dt_optimizer *o;
    c.adafactor.beta1 = 0;
    ASSERT_OK(dt_optimizer_create(&o, &c, tab, 3, &(dt_range){0, N}, 1));
    size_t total;
    dt_optimizer_tensor_state(o, 0, NULL, &total);
    ASSERT_EQ(total, 7 + 9 + 5 + 16);
    ASSERT_EQ(dt_optimizer_num_states(o), 1);
    ASSERT_EQ(dt_optimizer_state_count(o, 0), 13);
    dt_optimizer_destroy(o);
}

/* ---- L-BFGS ---------------------------------------------------------------- */

#define LB_N 37

/* f(x) = sum(a/2 (x - c)^2 + (x - c)^4 / 10) and its gradient. */
static double lb_eval(const float *x, float *g, const float *a, const float *c) {
    double f = 0;
    for (int i = 0; i < LB_N; i++) {
        float d = x[i] - c[i];
        f += (double)(0.5f * a[i] * d * d + 0.1f * d * d * d * d);
        g[i] = a[i] * d + 0.4f * d * d * d;
    }
    return f;
}

static void lbfgs_case(const char *name) {
    float *a = fx_f32("lbfgs_a", LB_N), *cc = fx_f32("lbfgs_c", LB_N);
    float *x = fx_f32("lbfgs_x0", LB_N), g[LB_N];
    char key[64];
    snprintf(key, sizeof key, "%s_hparams", name);
    dt_optim_config c = dt_optim_config_default();
    c.kind = DT_OPTIM_LBFGS;
    c.weight_decay = 0;
    float lr = (float)fx1(key, 0);
    c.lbfgs.history = (int)fx1(key, 1);
    c.lbfgs.max_iter = (int)fx1(key, 2);
    c.lbfgs.max_eval = c.lbfgs.max_iter * 5 / 4;
    c.lbfgs.line_search = strcmp(name, "lbfgs_ls") == 0;
    int steps = (int)fx1(key, 3);
    const dt_optim_tensor t = {.offset = 0, .count = LB_N, .decay = false};
    dt_optimizer *o;
    ASSERT_OK(dt_optimizer_create(&o, &c, &t, 1, &(dt_range){0, LB_N}, 1));
    int evals = 0;
    for (int s = 0; s < steps; s++) {
        dt_optimizer_begin(o, s, lr);
        bool more = true;
        while (more) {
            double f = lb_eval(x, g, a, cc);
            evals++;
            ASSERT_OK(dt_lbfgs_next(o, x, g, f, &more));
        }
        dt_optimizer_end(o, true);
        snprintf(key, sizeof key, "%s_x%d", name, s);
        expect_close(x, key, LB_N, 1e-4, 1e-5);
        snprintf(key, sizeof key, "%s_evals", name);
        ASSERT_EQ(evals, (int)fx1(key, (size_t)s));
    }
    /* The history survives a get/set round trip (a checkpoint). */
    size_t ns = dt_optimizer_num_states(o), nsc = dt_optimizer_num_scalars(o);
    ASSERT_EQ(ns, 2 * (size_t)c.lbfgs.history + 2);
    double sc[64];
    dt_optimizer_scalars_get(o, sc);
    ASSERT_OK(dt_optimizer_scalars_set(o, sc));
    ASSERT_TRUE(nsc >= 5);
    dt_optimizer_destroy(o);
    free(a), free(cc), free(x);
}

static void test_lbfgs_matches_pytorch(void) {
    lbfgs_case("lbfgs_ls");
    lbfgs_case("lbfgs_fixed");
}

/* ---- DT_ISA: the vector and scalar paths ------------------------------------ */

static const dt_optim_kind all_kinds[] = {DT_OPTIM_ADAMW,     DT_OPTIM_SGD,      DT_OPTIM_RADAM,
                                          DT_OPTIM_LAMB,      DT_OPTIM_LARS,     DT_OPTIM_ADAFACTOR,
                                          DT_OPTIM_ADAMW8BIT, DT_OPTIM_LOOKAHEAD};
#define NKINDS (sizeof all_kinds / sizeof all_kinds[0])

static dt_optim_config kind_config(dt_optim_kind k, bool gc) {
    dt_optim_config c = base_config(k);
    c.momentum = 0.9f;
    c.inner = DT_OPTIM_LAMB;
    c.adafactor.beta1 = 0.9f;
    c.block = 64;
    c.centralize = gc;
    return c;
}

static void test_isa_paths_agree(void) {
    dt_isa_level top = dt_isa();
    for (size_t i = 0; i < NKINDS; i++)
        for (int gc = 0; gc < 2; gc++) {
            dt_optim_config c = kind_config(all_kinds[i], gc);
            ASSERT_OK(dt_isa_set(DT_ISA_SCALAR));
            float *a = run(&c, LR);
            ASSERT_OK(dt_isa_set(top));
            float *b = run(&c, LR);
            if (memcmp(a, b, N * sizeof *a) != 0)
                TEST_FAILF("%s%s: the scalar and %s paths differ", dt_optim_names[c.kind],
                           gc ? " + centralisation" : "", dt_isa_name(top));
            free(a), free(b);
        }
    printf("  %zu kinds x {plain, centralised}: scalar == %s bit for bit\n", NKINDS,
           dt_isa_name(top));
}

/* ---- sharded == unsharded ----------------------------------------------------- */

/* A larger table: 33 x 47 (decayed), 29 (not), 64 x 21 (decayed), 40 (not). */
#define NS 2964
static const dt_optim_tensor big[] = {
    {.offset = 0, .count = 1551, .decay = true, .rows = 33, .cols = 47},
    {.offset = 1551, .count = 29, .decay = false},
    {.offset = 1580, .count = 1344, .decay = true, .rows = 64, .cols = 21},
    {.offset = 2924, .count = 40, .decay = false}};

/* Two ranks' pieces of every "bucket", cutting rows and tensors anywhere. */
static const dt_range cut_anywhere[2][2] = {{{0, 700}, {1600, 2300}}, {{700, 1600}, {2300, NS}}};
/* The same on multiples of 64 (8-bit AdamW's blocks of 64). */
static const dt_range cut_on_blocks[2][2] = {{{0, 704}, {1600, 2304}}, {{704, 1600}, {2304, NS}}};
static const dt_range (*rank_pieces)[2] = cut_anywhere;

typedef struct share {
    pthread_barrier_t bar;
    double *slot[2];
    size_t n[2];
    int calls[2];
} share;

typedef struct rank_ctx {
    share *sh;
    int rank;
    const dt_optim_config *c;
    float *p;        /* the full buffer; this rank writes its pieces */
    float *g[STEPS]; /* each step's gradient (rewritten by centralisation) */
    dt_status st;
} rank_ctx;

/* The hook: both ranks' values summed in rank order, as an allreduce. */
static dt_status sum2(void *user, double *v, size_t n) {
    rank_ctx *r = user;
    share *s = r->sh;
    s->slot[r->rank] = v;
    s->n[r->rank] = n;
    s->calls[r->rank]++;
    pthread_barrier_wait(&s->bar);
    if (s->n[0] != s->n[1])
        return dt_error_set(DT_ERR_INVALID, "ranks reduce %zu and %zu values", s->n[0], s->n[1]);
    double *other = s->slot[1 - r->rank];
    static _Thread_local double tmp[8192];
    DT_ASSERT(n <= 8192);
    for (size_t i = 0; i < n; i++)
        tmp[i] = r->rank == 0 ? v[i] + other[i] : other[i] + v[i];
    pthread_barrier_wait(&s->bar);
    memcpy(v, tmp, n * sizeof *v);
    return DT_OK;
}

static void *rank_main(void *arg) {
    rank_ctx *r = arg;
    dt_optim_config c = *r->c;
    c.reduce = sum2;
    c.reduce_user = r;
    dt_optimizer *o;
    r->st = dt_optimizer_create(&o, &c, big, 4, rank_pieces[r->rank], 2);
    if (r->st != DT_OK)
        return NULL;
    for (int k = 0; k < STEPS && r->st == DT_OK; k++) {
        dt_optimizer_begin(o, k, 1e-2f);
        r->st = dt_optimizer_step(o, r->p, r->g[k]);
        dt_optimizer_end(o, true);
    }
    dt_optimizer_destroy(o);
    return NULL;
}

static void fill(float *x, size_t n, uint64_t seed, float scale) {
    dt_rng r;
    dt_rng_init(&r, seed, dt_rng_stream_id(0, 7, DT_RNG_TEST));
    for (size_t i = 0; i < n; i++)
        x[i] = dt_rng_normal(&r) * scale;
}

/* Returns the largest relative difference between the sharded and the
 * unsharded parameters (relative to the parameter, at least 1e-3); *absd
 * gets the largest absolute one. */
static double sharded_vs_whole(const dt_optim_config *c, double *absd) {
    float *p1 = malloc(NS * sizeof(float)), *p2 = malloc(NS * sizeof(float));
    float *g1[STEPS], *g2[STEPS];
    fill(p1, NS, 11, 1.0f);
    memcpy(p2, p1, NS * sizeof(float));
    for (int k = 0; k < STEPS; k++) {
        g1[k] = malloc(NS * sizeof(float));
        g2[k] = malloc(NS * sizeof(float));
        fill(g1[k], NS, 100 + (uint64_t)k, 0.3f + 0.1f * (float)k);
        memcpy(g2[k], g1[k], NS * sizeof(float));
    }
    /* Whole. */
    dt_optimizer *o;
    ASSERT_OK(dt_optimizer_create(&o, c, big, 4, &(dt_range){0, NS}, 1));
    for (int k = 0; k < STEPS; k++) {
        dt_optimizer_begin(o, k, 1e-2f);
        ASSERT_OK(dt_optimizer_step(o, p1, g1[k]));
        dt_optimizer_end(o, true);
    }
    dt_optimizer_destroy(o);
    /* Two ranks. */
    share sh = {0};
    pthread_barrier_init(&sh.bar, NULL, 2);
    rank_ctx r[2];
    pthread_t th[2];
    for (int i = 0; i < 2; i++) {
        r[i] = (rank_ctx){.sh = &sh, .rank = i, .c = c, .p = p2};
        memcpy(r[i].g, g2, sizeof g2);
        pthread_create(&th[i], NULL, rank_main, &r[i]);
    }
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    pthread_barrier_destroy(&sh.bar);
    ASSERT_OK(r[0].st);
    ASSERT_OK(r[1].st);
    ASSERT_EQ(sh.calls[0], sh.calls[1]);
    double worst = 0;
    *absd = 0;
    for (size_t i = 0; i < NS; i++) {
        double a = fabs((double)p1[i] - p2[i]), d = a / fmax(fabs((double)p1[i]), 1e-3);
        worst = d > worst ? d : worst;
        *absd = a > *absd ? a : *absd;
    }
    free(p1), free(p2);
    for (int k = 0; k < STEPS; k++)
        free(g1[k]), free(g2[k]);
    return worst;
}

static void test_sharded_equals_unsharded(void) {
    for (size_t i = 0; i < NKINDS; i++)
        for (int gc = 0; gc < 2; gc++) {
            dt_optim_config c = kind_config(all_kinds[i], gc);
            c.block = 100 * 16; /* 8-bit: 1600, so both cuts at 1600 fall on a block edge... */
            double absd, worst = sharded_vs_whole(&c, &absd);
            /* ... but 700 and 2300 do not: a block cut by a shard is two
             * blocks, each with its own scale, so 8-bit AdamW agrees only to
             * its quantisation (here: within a tenth of what 8 steps of lr
             * 1e-2 can move a parameter); everything else to the rounding of
             * the double sums (elementwise kinds: exactly). */
            double tol = 1e-6;
            if (c.kind == DT_OPTIM_ADAMW8BIT) {
                tol = 1e30;
                if (!(absd <= 0.1 * 8 * 1e-2))
                    TEST_FAILF("adamw8bit: sharded differs from unsharded by %.3g", absd);
            }
            bool exact = !gc && (c.kind == DT_OPTIM_ADAMW || c.kind == DT_OPTIM_SGD ||
                                 c.kind == DT_OPTIM_RADAM);
            if (exact)
                tol = 0;
            printf("  %-10s%s: sharded vs whole, max difference %.2g relative, %.2g absolute\n",
                   dt_optim_names[c.kind], gc ? " + gc" : "     ", worst, absd);
            if (!(worst <= tol))
                TEST_FAILF("%s%s: sharded differs from unsharded by %.3g (tolerance %.3g)",
                           dt_optim_names[c.kind], gc ? " + centralisation" : "", worst, tol);
        }
    /* 8-bit with shard cuts on block edges: bit for bit. */
    dt_optim_config c = kind_config(DT_OPTIM_ADAMW8BIT, false);
    c.block = 64;
    rank_pieces = cut_on_blocks;
    double absd;
    ASSERT_TRUE(sharded_vs_whole(&c, &absd) == 0.0);
    rank_pieces = cut_anywhere;
}

/* ---- 8-bit AdamW ---------------------------------------------------------------- */

static void test_q8_code(void) {
    /* Every code decodes and re-encodes to itself; codes cover [0, 1]. */
    for (int c = 0; c < 256; c++) {
        if ((c & 0x7f) <= (int)DT__Q8_M_ONE)
            ASSERT_EQ(dt__q8_encode_m(dt__q8_decode_m((uint8_t)c)), c);
        if (c <= (int)DT__Q8_R_ONE)
            ASSERT_EQ(dt__q8_encode_r(dt__q8_decode_r((uint8_t)c)), c);
    }
    ASSERT_TRUE(dt__q8_decode_m(DT__Q8_M_ONE) == 1.0f);
    ASSERT_TRUE(dt__q8_decode_r(DT__Q8_R_ONE) == 1.0f);
    /* Error bounds: half a unit of the 3-bit (m) or 5-bit (r) mantissa,
     * relative, above the smallest normal code (2^-14, 2^-6); half the
     * subnormal step below it (r: a whole step, since a positive r never
     * rounds to 0). */
    dt_rng r;
    dt_rng_init(&r, 5, dt_rng_stream_id(0, 3, DT_RNG_TEST));
    double worst_m = 0, worst_r = 0;
    for (int i = 0; i < 200000; i++) {
        float y = (float)(2 * dt_rng_uniform(&r) - 1) * powf(2.0f, -(float)dt_rng_below(&r, 20));
        float em = fabsf(dt__q8_decode_m(dt__q8_encode_m(y)) - y);
        float er = fabsf(dt__q8_decode_r(dt__q8_encode_r(fabsf(y))) - fabsf(y));
        if (!(em <= fmaxf(fabsf(y) / 16, 0x1p-18f)) || !(er <= fmaxf(fabsf(y) / 64, 0x1p-11f)))
            TEST_FAILF("y %.9g: m error %.3g, r error %.3g", (double)y, (double)em, (double)er);
        if (fabsf(y) >= 0x1p-14f)
            worst_m = fmax(worst_m, em / fabsf(y));
        if (fabsf(y) >= 0x1p-6f)
            worst_r = fmax(worst_r, er / fabsf(y));
        ASSERT_TRUE(y == 0 || dt__q8_encode_r(fabsf(y)) > 0);
    }
    printf("  worst relative error above the subnormals: m %.4f (bound 1/16), r %.4f (bound "
           "1/64)\n",
           worst_m, worst_r);
    /* The vector quantiser agrees with the scalar one. */
    float x[100];
    uint8_t qa[100], qb[100];
    fill(x, 100, 8, 1.0f);
    for (int is_m = 0; is_m < 2; is_m++) {
        if (!is_m)
            for (int i = 0; i < 100; i++)
                x[i] = fabsf(x[i]);
        dt__q8_quantise_vec(qa, x, 100, 2.5f, is_m);
        dt__q8_quantise_scalar(qb, x, 100, 2.5f, is_m);
        ASSERT_EQ(memcmp(qa, qb, sizeof qa), 0);
    }
}

static void test_adamw8bit(void) {
    /* 2 bytes per parameter plus two scales per block. */
    dt_optim_config c = base_config(DT_OPTIM_ADAMW8BIT);
    dt_optimizer *o, *ref;
    ASSERT_OK(dt_optimizer_create(&o, &c, big, 4, &(dt_range){0, NS}, 1));
    size_t nblocks = (NS + 2047) / 2048;
    ASSERT_EQ(dt_optimizer_state_bytes(o), 2 * NS + 2 * nblocks * sizeof(float));
    /* A noisy quadratic, 300 steps against AdamW. */
    c.kind = DT_OPTIM_ADAMW;
    ASSERT_OK(dt_optimizer_create(&ref, &c, big, 4, &(dt_range){0, NS}, 1));
    float *target = malloc(NS * sizeof(float)), *p8 = malloc(NS * sizeof(float));
    float *p32 = malloc(NS * sizeof(float)), *g = malloc(NS * sizeof(float));
    float *noise = malloc(NS * sizeof(float));
    fill(target, NS, 21, 1.0f);
    fill(p8, NS, 22, 1.0f);
    memcpy(p32, p8, NS * sizeof(float));
    double loss0 = 0, loss8 = 0, loss32 = 0;
    for (size_t i = 0; i < NS; i++)
        loss0 += 0.5 * (p8[i] - target[i]) * (p8[i] - target[i]);
    for (int k = 0; k < 300; k++) {
        fill(noise, NS, 1000 + (uint64_t)k, 0.05f);
        dt_optimizer_begin(o, k, 1e-2f);
        dt_optimizer_begin(ref, k, 1e-2f);
        for (size_t i = 0; i < NS; i++)
            g[i] = (p8[i] - target[i]) * (1.0f + (float)(i % 7)) + noise[i];
        ASSERT_OK(dt_optimizer_step(o, p8, g));
        for (size_t i = 0; i < NS; i++)
            g[i] = (p32[i] - target[i]) * (1.0f + (float)(i % 7)) + noise[i];
        ASSERT_OK(dt_optimizer_step(ref, p32, g));
        dt_optimizer_end(o, true);
        dt_optimizer_end(ref, true);
    }
    double dist = 0, norm = 0;
    for (size_t i = 0; i < NS; i++) {
        loss8 += 0.5 * (p8[i] - target[i]) * (p8[i] - target[i]);
        loss32 += 0.5 * (p32[i] - target[i]) * (p32[i] - target[i]);
        dist += (double)(p8[i] - p32[i]) * (p8[i] - p32[i]);
        norm += (double)p32[i] * p32[i];
    }
    printf("  noisy quadratic, 300 steps: loss %.4g -> AdamW %.4g, 8-bit %.4g; |p8 - p32| / "
           "|p32| = %.3g\n",
           loss0, loss32, loss8, sqrt(dist / norm));
    /* Both reduce the loss 100-fold; quantisation noise moves where each
     * ends by a few percent of the parameters (the shakespeare-char
     * benchmark, bench/optimizers.sh, measures the loss that matters). */
    ASSERT_TRUE(loss8 < loss0 / 50 && fabs(loss8 - loss32) <= 0.3 * loss32);
    ASSERT_TRUE(sqrt(dist / norm) < 0.05);
    /* get then set restores the state exactly, and so the next step. */
    float *s[2];
    for (int i = 0; i < 2; i++) {
        s[i] = malloc(NS * sizeof(float));
        dt_optimizer_state_get(o, (size_t)i, s[i]);
        dt_optimizer_state_set(o, (size_t)i, s[i]);
        float *again = malloc(NS * sizeof(float));
        dt_optimizer_state_get(o, (size_t)i, again);
        ASSERT_EQ(memcmp(again, s[i], NS * sizeof(float)), 0);
        free(again);
    }
    const char *name;
    ASSERT_TRUE(dt_optimizer_state(o, 1, &name) == NULL);
    ASSERT_STREQ(name, "adamw8bit.r");
    dt_optimizer_destroy(o);
    dt_optimizer_destroy(ref);
    free(target), free(p8), free(p32), free(g), free(noise), free(s[0]), free(s[1]);
}

/* ---- 1-bit Adam and 1-bit LAMB --------------------------------------------------- */

/* One process, no compression: premixing the gradient and updating from
 * the averaged mix is AdamW with v frozen from the same step. */
static void test_onebit_premix(void) {
    const int freeze = 3;
    for (int lamb = 0; lamb < 2; lamb++) {
        dt_optim_config c = base_config(lamb ? DT_OPTIM_ONEBIT_LAMB : DT_OPTIM_ONEBIT_ADAM);
        c.freeze_v_from = freeze;
        dt_optim_config r = c;
        r.kind = lamb ? DT_OPTIM_LAMB : DT_OPTIM_ADAMW;
        r.freeze_v_from = lamb ? -1 : freeze;
        dt_optimizer *o, *ref;
        ASSERT_OK(dt_optimizer_create(&o, &c, tab, 3, &(dt_range){0, N}, 1));
        ASSERT_OK(dt_optimizer_create(&ref, &r, tab, 3, &(dt_range){0, N}, 1));
        float p[N], q[N], g[N], h[N];
        memcpy(p, params0, sizeof p);
        memcpy(q, params0, sizeof q);
        for (int k = 0; k < STEPS; k++) {
            memcpy(g, grads[k], sizeof g);
            memcpy(h, grads[k], sizeof h);
            dt_optimizer_begin(o, k, LR);
            dt_optimizer_begin(ref, k, LR);
            ASSERT_EQ(dt_optimizer_premixing(o), k >= freeze);
            ASSERT_EQ(dt_optimizer_rangewise(o), !lamb || k >= freeze);
            dt_optimizer_premix(o, g, 0, N, 4.0f); /* a loss scale of 4 ... */
            for (int i = 0; i < N; i++)
                g[i] *= 0.25f; /* ... removed by the unscale */
            ASSERT_OK(dt_optimizer_step(o, p, g));
            if (!lamb || k < freeze)
                ASSERT_OK(dt_optimizer_step(ref, q, h));
            dt_optimizer_end(o, true);
            dt_optimizer_end(ref, true);
        }
        if (!lamb) {
            double worst = 0;
            for (int i = 0; i < N; i++)
                worst = fmax(worst, fabs((double)p[i] - q[i]) / fmax(fabs((double)q[i]), 1e-3));
            printf("  onebit-adam (premixed, frozen v from step %d) vs adamw: %.2g\n", freeze,
                   worst);
            ASSERT_TRUE(worst < 1e-5);
        } else {
            /* The ratios were frozen at the end of the warm-up. */
            size_t total;
            float *ratio = dt_optimizer_tensor_state(o, 0, NULL, &total);
            ASSERT_EQ(total, 3);
            ASSERT_TRUE(ratio[0] > 0 && ratio[1] == 1.0f && ratio[2] > 0);
        }
        dt_optimizer_destroy(o);
        dt_optimizer_destroy(ref);
    }
}

/* ---- offload: the state in a file --------------------------------------------------- */

/* A table over 2.5M parameters, so that the owned ranges span several of
 * the file's pieces (2^20 values): 1500 x 1111 (decayed), 777 (not),
 * 700 x 1200 (decayed), 301 (not); owned in two ranges that cut rows. */
#define NO (1666500 + 777 + 840000 + 301)
static const dt_optim_tensor off_tab[] = {
    {.offset = 0, .count = 1666500, .decay = true, .rows = 1500, .cols = 1111},
    {.offset = 1666500, .count = 777, .decay = false},
    {.offset = 1667277, .count = 840000, .decay = true, .rows = 700, .cols = 1200},
    {.offset = 2507277, .count = 301, .decay = false}};
static const dt_range off_owned[2] = {{0, 1300001}, {1400003, NO}};

/* Five steps of c (the 1-bit kinds: frozen from step 2) on fixed data;
 * the parameters, and every state as fp32 values in *state (malloc'ed,
 * one after another). */
static float *offload_run(const dt_optim_config *c, float **state, size_t *nstate) {
    dt_optimizer *o;
    ASSERT_OK(dt_optimizer_create(&o, c, off_tab, 4, off_owned, 2));
    float *p = malloc(NO * sizeof(float)), *g = malloc(NO * sizeof(float));
    fill(p, NO, 31, 1.0f);
    for (int k = 0; k < 5; k++) {
        fill(g, NO, 40 + (uint64_t)k, 0.5f);
        dt_optimizer_begin(o, k, 1e-2f);
        if (dt_optimizer_rangewise(o))
            for (int r = 1; r >= 0; r--) /* from the end, in two calls each (the bucket order) */
                for (int h = 1; h >= 0; h--) {
                    dt_range w = off_owned[r];
                    size_t mid = w.begin + (w.end - w.begin) / 3;
                    dt_optimizer_update(o, p, g, h ? mid : w.begin, h ? w.end : mid);
                }
        else
            ASSERT_OK(dt_optimizer_step(o, p, g));
        dt_optimizer_end(o, true);
    }
    size_t total = 0;
    for (size_t i = 0; i < dt_optimizer_num_states(o); i++)
        total += dt_optimizer_state_count(o, i);
    *state = malloc((total + 1) * sizeof(float));
    *nstate = total;
    for (size_t i = 0, at = 0; i < dt_optimizer_num_states(o); i++) {
        dt_optimizer_state_get(o, i, *state + at);
        at += dt_optimizer_state_count(o, i);
    }
    if (c->offload_dir) {
        /* State bytes count the state wherever it is; the file holds the
         * per-parameter part (the 8-bit codes: 2 bytes per parameter). */
        size_t owned = dt_optimizer_owned_count(o), fb = dt_optimizer_offload_bytes(o);
        bool none = (c->kind == DT_OPTIM_SGD || c->kind == DT_OPTIM_LARS) && c->momentum == 0;
        ASSERT_TRUE(none ? fb == 0 : fb >= 2 * owned - 8192);
        ASSERT_TRUE(fb <= dt_optimizer_state_bytes(o) + 4 * 8192);
        dt_optimizer_settle(o);
    }
    dt_optimizer_destroy(o);
    free(g);
    return p;
}

static void test_offload_equals_memory(void) {
    char dir[] = "/tmp/dt-optim2-offload-XXXXXX";
    ASSERT_TRUE(mkdtemp(dir) != NULL);
    static const dt_optim_kind kinds[] = {
        DT_OPTIM_ADAMW,     DT_OPTIM_SGD,       DT_OPTIM_RADAM,       DT_OPTIM_LAMB,
        DT_OPTIM_LARS,      DT_OPTIM_ADAFACTOR, DT_OPTIM_ADAMW8BIT,   DT_OPTIM_LOOKAHEAD,
        DT_OPTIM_LOOKAHEAD, DT_OPTIM_LOOKAHEAD, DT_OPTIM_ONEBIT_ADAM, DT_OPTIM_ONEBIT_LAMB};
    static const dt_optim_kind inner[] = {
        0, 0, 0, 0, 0, 0, 0, DT_OPTIM_ADAMW, DT_OPTIM_LAMB, DT_OPTIM_ADAMW8BIT};
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++)
        for (int gc = 0; gc < 2; gc++) {
            if (gc && kinds[i] != DT_OPTIM_ADAMW && kinds[i] != DT_OPTIM_LAMB)
                continue;
            dt_optim_config c = kind_config(kinds[i], gc);
            c.block = 2048;
            c.lookahead_k = 2;
            if (i < sizeof inner / sizeof inner[0] && kinds[i] == DT_OPTIM_LOOKAHEAD)
                c.inner = inner[i];
            if (kinds[i] == DT_OPTIM_ONEBIT_ADAM || kinds[i] == DT_OPTIM_ONEBIT_LAMB)
                c.freeze_v_from = 2;
            float *sa, *sb;
            size_t na, nb;
            float *a = offload_run(&c, &sa, &na);
            c.offload_dir = dir;
            float *b = offload_run(&c, &sb, &nb);
            char what[64];
            snprintf(what, sizeof what, "%s%s%s%s", dt_optim_names[c.kind],
                     c.kind == DT_OPTIM_LOOKAHEAD ? "(" : "",
                     c.kind == DT_OPTIM_LOOKAHEAD ? dt_optim_names[c.inner] : "",
                     c.kind == DT_OPTIM_LOOKAHEAD ? ")" : "");
            ASSERT_EQ(na, nb);
            if (memcmp(a, b, NO * sizeof *a) != 0 || memcmp(sa, sb, na * sizeof *sa) != 0)
                TEST_FAILF("%s%s: offloaded state gives other bits than in memory", what,
                           gc ? " + centralisation" : "");
            printf("  %-20s%s offloaded == in memory (%zu state values)\n", what,
                   gc ? " + gc" : "     ", na);
            free(a), free(b), free(sa), free(sb);
        }
    /* The kinds that step over the whole buffer refuse, naming why. */
    dt_optim_config c = base_config(DT_OPTIM_LBFGS);
    c.weight_decay = 0;
    c.offload_dir = dir;
    dt_optimizer *o;
    ASSERT_STATUS(dt_optimizer_create(&o, &c, tab, 3, &(dt_range){0, N}, 1), DT_ERR_INVALID);
    ASSERT_CONTAINS(dt_last_error(), "lbfgs: its state cannot be offloaded");
    c = base_config(DT_OPTIM_KFAC);
    c.offload_dir = dir;
    ASSERT_STATUS(dt_optimizer_create(&o, &c, tab, 3, &(dt_range){0, N}, 1), DT_ERR_INVALID);
    ASSERT_CONTAINS(dt_last_error(), "kfac: its state cannot be offloaded");
    /* Nothing left behind: the files were unlinked at creation. */
    ASSERT_EQ(rmdir(dir), 0);
}

/* ---- configuration errors ------------------------------------------------------------ */

static void expect_bad(dt_optim_config c, const char *needle) {
    dt_optimizer *o;
    ASSERT_STATUS(dt_optimizer_create(&o, &c, tab, 3, &(dt_range){0, N}, 1), DT_ERR_INVALID);
    ASSERT_CONTAINS(dt_last_error(), needle);
}

static void test_bad_hyperparameters(void) {
    dt_optim_config c = base_config(DT_OPTIM_ADAFACTOR);
    c.adafactor.decay_rate = 0.5f;
    expect_bad(c, "decay rate 0.5");
    c = base_config(DT_OPTIM_LARS);
    c.trust_coeff = -1;
    expect_bad(c, "trust coefficient -1");
    c = base_config(DT_OPTIM_ADAMW8BIT);
    c.block = 100;
    expect_bad(c, "block 100");
    c = base_config(DT_OPTIM_LAMB);
    c.adamw.beta2 = 1.0f;
    expect_bad(c, "betas (0.9, 1)");
    c = base_config(DT_OPTIM_LOOKAHEAD);
    c.inner = DT_OPTIM_LBFGS;
    expect_bad(c, "inner optimizer lbfgs");
    c.inner = DT_OPTIM_ADAMW;
    c.lookahead_alpha = 1.5f;
    expect_bad(c, "alpha 1.5");
    c = base_config(DT_OPTIM_ONEBIT_ADAM);
    c.freeze_v_from = 0;
    expect_bad(c, "freeze_v_from 0");
    c = base_config(DT_OPTIM_LBFGS);
    expect_bad(c, "L-BFGS has none");
    c = base_config(DT_OPTIM_ADAMW);
    const dt_optim_tensor wrong = {.offset = 0, .count = 10, .rows = 3, .cols = 4};
    dt_optimizer *o;
    ASSERT_STATUS(dt_optimizer_create(&o, &c, &wrong, 1, &(dt_range){0, 10}, 1), DT_ERR_INVALID);
    ASSERT_CONTAINS(dt_last_error(), "3 x 4 but holds 10");
}

/* Reads another fixture file into fixture_text; returns the one it replaced. */
static char *swap_fixture(const char *path) {
    char *saved = fixture_text;
    FILE *f = fopen(path, "rb");
    if (!f)
        TEST_FAILF("cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    fixture_text = malloc((size_t)len + 1);
    ASSERT_EQ(fread(fixture_text, 1, (size_t)len, f), len);
    fixture_text[len] = 0;
    fclose(f);
    return saved;
}

/* 1-bit Adam and 1-bit LAMB for two workers, through the sign codec with
 * error feedback (what the DDP buckets do with --optimizer onebit-adam /
 * onebit-lamb), against onebit_reference.txt: numpy from Tang et al.'s and
 * Li et al.'s equations, compressing each worker's momentum
 * (gen_onebit_reference.py). dtrain compresses the premixed gradient
 * instead, which the scaled sign turns into the same thing up to rounding.
 * A decayed tensor and a vector: LAMB's ratio applies to the first only. */
static void onebit_reference_case(bool lamb) {
    char *saved = swap_fixture(DT_TEST_DATA_DIR "/reference/onebit_reference.txt");
    size_t n;
    double *cf = fx("onebit_config", &n);
    ASSERT_EQ(n, 10);
    size_t np = (size_t)cf[0];
    int steps = (int)cf[1], freeze = (int)cf[2], workers = (int)cf[3];
    ASSERT_EQ(workers, 2);
    dt_optim_config c = dt_optim_config_default();
    c.kind = lamb ? DT_OPTIM_ONEBIT_LAMB : DT_OPTIM_ONEBIT_ADAM;
    c.adamw.beta1 = (float)cf[5];
    c.adamw.beta2 = (float)cf[6];
    c.adamw.eps = (float)cf[7];
    c.weight_decay = (float)cf[8];
    c.freeze_v_from = freeze;
    float lr = (float)cf[4];
    size_t nd = (size_t)cf[9];
    const dt_optim_tensor t[2] = {{.offset = 0, .count = nd, .decay = true},
                                  {.offset = nd, .count = np - nd, .decay = false}};
    dt_optimizer *o;
    ASSERT_OK(dt_optimizer_create(&o, &c, t, 2, &(dt_range){0, np}, 1));
    dt_codec_spec spec;
    ASSERT_OK(dt_codec_parse("test", "sign", &spec));
    dt_compressor *comp[2];
    for (int r = 0; r < 2; r++) {
        dt_compressor_config cc = dt_compressor_config_default();
        cc.rank = (uint32_t)r;
        cc.ef = DT_EF_ON;
        ASSERT_OK(dt_compressor_create(&comp[r], &spec, np, &cc));
    }
    size_t cap = dt_compressor_encoded_bytes(comp[0]), used;
    uint8_t *buf = malloc(cap);
    float *p = fx_f32("onebit_p0", np), *avg = malloc(np * sizeof *avg);
    float *x = malloc(np * sizeof *x);
    for (int k = 0; k < steps; k++) {
        float *g[2];
        for (int r = 0; r < 2; r++) {
            char name[32];
            snprintf(name, sizeof name, "onebit_g%d_%d", k, r);
            g[r] = fx_f32(name, np);
        }
        dt_optimizer_begin(o, k, lr);
        ASSERT_EQ(dt_optimizer_premixing(o), k >= freeze);
        if (!dt_optimizer_premixing(o)) {
            for (size_t i = 0; i < np; i++)
                avg[i] = (g[0][i] + g[1][i]) * 0.5f;
        } else {
            memset(avg, 0, np * sizeof *avg);
            for (int r = 0; r < 2; r++) {
                memcpy(x, g[r], np * sizeof *x);
                dt_optimizer_premix(o, x, 0, np, 1.0f);
                ASSERT_OK(dt_compressor_compress(comp[r], x, (uint64_t)k, buf, cap, &used));
                ASSERT_OK(dt_codec_decode(buf, used, np, avg, DT_DECODE_ADD));
            }
            for (size_t i = 0; i < np; i++)
                avg[i] *= 0.5f;
        }
        ASSERT_OK(dt_optimizer_step(o, p, avg));
        dt_optimizer_end(o, true);
        free(g[0]), free(g[1]);
    }
    float *ref = fx_f32(lamb ? "onebit_lamb_p" : "onebit_p", np);
    double worst = 0;
    for (size_t i = 0; i < np; i++) {
        double e = fabs((double)p[i] - ref[i]) / fmax(fabs((double)ref[i]), 1e-3);
        if (!(e <= 1e-5))
            TEST_FAILF("%s: parameter %zu = %.9g, reference %.9g", dt_optim_names[c.kind], i,
                       (double)p[i], (double)ref[i]);
        worst = fmax(worst, e);
    }
    printf("  %s, 2 workers, sign + EF from step %d: within %.2g of the numpy reference\n",
           dt_optim_names[c.kind], freeze + 1, worst);
    for (int r = 0; r < 2; r++)
        dt_compressor_destroy(comp[r]);
    dt_optimizer_destroy(o);
    free(buf), free(p), free(avg), free(x), free(ref), free(cf);
    free(fixture_text);
    fixture_text = saved;
}

static void test_onebit_matches_reference(void) {
    onebit_reference_case(false);
    onebit_reference_case(true);
}

/* K-FAC: one linear layer and a bias for 5 steps (inverses every 2, the KL
 * clip active in three) against tests/reference/kfac_reference.txt, numpy
 * in float64 from the equations (gen_kfac_reference.py). The factors are
 * summed in float by sgemm and kept in float: 1e-5 relative. */
static void test_kfac_matches_reference(void) {
    char *saved = swap_fixture(DT_TEST_DATA_DIR "/reference/kfac_reference.txt");
    size_t n;
    double *cf = fx("kfac_config", &n);
    ASSERT_EQ(n, 12);
    int out = (int)cf[0], in = (int)cf[1], ntok = (int)cf[2], steps = (int)cf[3];
    dt_optim_config c = dt_optim_config_default();
    c.kind = DT_OPTIM_KFAC;
    c.kfac =
        (dt_kfac_config){.damping = cf[5], .inv_every = (int)cf[6], .ema = cf[7], .kl_clip = cf[8]};
    c.momentum = (float)cf[9];
    c.weight_decay = (float)cf[10];
    float lr = (float)cf[4], scale = (float)cf[11];
    size_t nw = (size_t)(out * in), np = nw + (size_t)out;
    const dt_optim_tensor t[2] = {{.offset = 0,
                                   .count = nw,
                                   .decay = true,
                                   .rows = (size_t)out,
                                   .cols = (size_t)in,
                                   .linear = true},
                                  {.offset = nw, .count = (size_t)out, .decay = false}};
    dt_optimizer *o;
    ASSERT_OK(dt_optimizer_create(&o, &c, t, 2, &(dt_range){0, np}, 1));
    float *p = malloc(np * sizeof *p), *g = malloc(np * sizeof *g);
    float *w0 = fx_f32("kfac_w0", nw), *b0 = fx_f32("kfac_b0", (size_t)out);
    memcpy(p, w0, nw * sizeof *p);
    memcpy(p + nw, b0, (size_t)out * sizeof *p);
    for (int k = 0; k < steps; k++) {
        char name[32];
        snprintf(name, sizeof name, "kfac_x%d", k);
        float *x = fx_f32(name, (size_t)(ntok * in));
        snprintf(name, sizeof name, "kfac_dy%d", k);
        float *dy = fx_f32(name, (size_t)(ntok * out));
        snprintf(name, sizeof name, "kfac_gw%d", k);
        float *gw = fx_f32(name, nw);
        snprintf(name, sizeof name, "kfac_gb%d", k);
        float *gb = fx_f32(name, (size_t)out);
        memcpy(g, gw, nw * sizeof *g);
        memcpy(g + nw, gb, (size_t)out * sizeof *g);
        dt_optimizer_begin(o, k, lr);
        ASSERT_OK(dt_kfac_accumulate(o, 0, x, dy, ntok, in, out, scale));
        ASSERT_OK(dt_optimizer_step(o, p, g));
        dt_optimizer_end(o, true);
        free(x), free(dy), free(gw), free(gb);
    }
    float *w = fx_f32("kfac_w", nw), *b = fx_f32("kfac_b", (size_t)out);
    double worst = 0;
    for (size_t i = 0; i < np; i++) {
        double r = i < nw ? w[i] : b[i - nw];
        double e = fabs((double)p[i] - r) / fmax(fabs(r), 1e-3);
        if (!(e <= 1e-5))
            TEST_FAILF("kfac: parameter %zu = %.9g, reference %.9g", i, (double)p[i], r);
        worst = fmax(worst, e);
    }
    printf("  kfac: %d steps within %.2g of the numpy reference\n", steps, worst);
    /* A statistic for an offset that is no linear tensor is refused. */
    ASSERT_STATUS(dt_kfac_accumulate(o, nw, p, p, 1, in, out, 1.0f), DT_ERR_INVALID);
    dt_optimizer_destroy(o);
    free(p), free(g), free(w0), free(b0), free(w), free(b), free(cf);
    free(fixture_text);
    fixture_text = saved;
}

int main(void) {
    load_fixture();
    load_problem();
    RUN(test_radam_matches_pytorch);
    RUN(test_lookahead_matches_reference);
    RUN(test_centralization_matches_reference);
    RUN(test_lamb_matches_reference);
    RUN(test_lars_matches_reference);
    RUN(test_adafactor_matches_reference);
    RUN(test_lbfgs_matches_pytorch);
    RUN(test_kfac_matches_reference);
    RUN(test_isa_paths_agree);
    RUN(test_sharded_equals_unsharded);
    RUN(test_q8_code);
    RUN(test_adamw8bit);
    RUN(test_onebit_premix);
    RUN(test_onebit_matches_reference);
    RUN(test_offload_equals_memory);
    RUN(test_bad_hyperparameters);
    free(params0);
    for (int k = 0; k < STEPS; k++)
        free(grads[k]);
    free(fixture_text);
    return TEST_SUMMARY();
}
