/*
 * test_gpt_cp.c — a context-parallel model part against the whole model,
 * with real processes: cp = 2 and 4 ranks each hold T/cp tokens of every
 * sequence (Ulysses: contiguous; ring: the zig-zag chunks) and every rank
 * also builds the unsharded model from the same seed. Checked per rank,
 * for each mode, fp32 and bf16 (and the ring in fp16), with and without
 * recomputation, at sequence lengths whose per-rank share is even
 * and odd, at head sizes 16 (the register-tile kernels) and 8 (the tiles):
 *   - two accumulated micro-batches: the loss each forward reports is the
 *     whole model's (the mean over every rank's tokens), and the average
 *     over the group of each rank's gradients (what synchronisation over
 *     dp x cp computes) equals the whole model's within a tolerance for
 *     the changed summation order (fp32: 1e-4 relative L2 per tensor;
 *     bf16: 4e-2);
 *   - backward split into B and W (zero-bubble) gives the bits of one;
 *   - the saved activations per rank are 1/cp of the whole model's, and the
 *     communication points were timed;
 *   - what cannot be split is refused with the numbers: heads not divisible
 *     by cp (Ulysses), T not divisible by 2 cp (ring), sampling (no
 *     targets), a part without its communication points.
 */
#include "comm/harness.h"
#include "dtrain/nn.h"
#include "dtrain/parallel.h"

#include <math.h>

static const dt_gpt_config cfg = {.layers = 2, .dim = 64, .heads = 4, .max_seq = 48, .vocab = 97};
/* Head size 8: attention in the tile kernels (the register tiles take 16-64). */
static const dt_gpt_config cfg8 = {.layers = 1, .dim = 64, .heads = 8, .max_seq = 48, .vocab = 97};
enum { B = 2, MAXN = B * 48 };

static void tokens(int32_t *x, int n, uint64_t stream) {
    dt_rng r;
    dt_rng_init(&r, 42, dt_rng_stream_id(0, stream, DT_RNG_TEST));
    for (int i = 0; i < n; i++)
        x[i] = (int32_t)dt_rng_below(&r, (uint32_t)cfg.vocab);
}

static void near(const char *what, double a, double b, double tol) {
    if (!(fabs(a - b) <= tol * fabs(b) + 1e-6))
        TEST_FAILF("%s: context-parallel %.9g, whole model %.9g (tolerance %g)", what, a, b, tol);
}

/* Every tensor of g (the group's average) against the whole model's. */
static void compare_grads(const char *what, dt_gpt *part, const float *g, dt_gpt *whole,
                          double tol) {
    const float *w = dt_gpt_grads(whole);
    for (size_t i = 0; i < dt_gpt_num_tensors(part); i++) {
        dt_param_info p;
        dt_gpt_tensor_info(part, i, &p);
        double num = 0, den = 0;
        for (size_t k = 0; k < p.rows * p.cols; k++) {
            double d = (double)g[p.offset + k] - w[p.offset + k];
            num += d * d;
            den += (double)w[p.offset + k] * w[p.offset + k];
        }
        if (sqrt(num) > tol * sqrt(den) + 1e-12)
            TEST_FAILF("%s: gradient of %s differs (relative L2 %.3g > %.3g)", what, p.name,
                       sqrt(num / (den > 0 ? den : 1)), tol);
    }
}

static void run_model(const dt_gpt_config *mc, dt_group *w, dt_cp *cp, int rank, int size,
                      dt_cp_mode mode, dt_precision pr, int recompute, int T) {
    char what[128];
    snprintf(what, sizeof what, "cp %d %s %s recompute %d T %d heads %d", size,
             dt_cp_mode_name(mode), dt_precision_name(pr), recompute, T, mc->heads);
    dt_gpt_options wo = {.precision = pr, .recompute_every = recompute};
    dt_gpt_options co = wo;
    co.part = (dt_gpt_part){
        .cp_rank = rank, .cp_size = size, .cp_mode = mode, .cp_regions = dt_cp_regions_of(cp)};
    dt_gpt *whole, *part, *split;
    ASSERT_OK(dt_gpt_create_with(&whole, mc, B, T, &wo));
    ASSERT_OK(dt_gpt_create_with(&part, mc, B, T, &co));
    co.split_weight_grads = true;
    ASSERT_OK(dt_gpt_create_with(&split, mc, B, T, &co));
    dt_gpt_init_params(whole, 7);
    dt_gpt_init_params(part, 7);
    dt_gpt_init_params(split, 7);
    const bool fp32 = pr == DT_PRECISION_FP32;
    int32_t x[MAXN], y[MAXN];
    for (int k = 0; k < 2; k++) {
        tokens(x, B * T, 2 * (uint64_t)k);
        tokens(y, B * T, 2 * (uint64_t)k + 1);
        float lw, lc;
        ASSERT_OK(dt_gpt_forward(whole, x, y, B, T, &lw));
        ASSERT_OK(dt_gpt_forward(part, x, y, B, T, &lc));
        near(what, lc, lw, fp32 ? 1e-5 : 1e-2);
        dt_grad_mode gm = k == 0 ? DT_GRAD_OVERWRITE : DT_GRAD_ACCUMULATE;
        ASSERT_OK(dt_gpt_backward_mode(whole, 0.5f, gm, NULL, NULL));
        ASSERT_OK(dt_gpt_backward_mode(part, 0.5f, gm, NULL, NULL));
        ASSERT_OK(dt_gpt_forward(split, x, y, B, T, NULL));
        ASSERT_OK(dt_gpt_backward_mode(split, 0.5f, gm, NULL, NULL));
        ASSERT_OK(dt_gpt_weight_stage(split, 0, 0, gm, NULL, NULL));
    }
    size_t n = dt_gpt_num_params(part);
    if (memcmp(dt_gpt_grads(part), dt_gpt_grads(split), n * sizeof(float)) != 0)
        TEST_FAILF("%s: the split backward's gradients differ from one backward's", what);
    float *avg = malloc(n * sizeof(float));
    ASSERT_TRUE(avg != NULL);
    ASSERT_OK(dt_group_allreduce(w, dt_gpt_grads(part), avg, n, DT_F32, DT_SUM));
    for (size_t i = 0; i < n; i++)
        avg[i] /= (float)size;
    compare_grads(what, part, avg, whole, fp32 ? 1e-4 : 4e-2);
    free(avg);
    ASSERT_TRUE(dt_gpt_take_comm_ms(part) > 0);
    /* Memory: what a rank keeps from forward to backward is 1/cp. */
    dt_memory_report rw, rc;
    dt_gpt_memory(whole, &rw);
    dt_gpt_memory(part, &rc);
    double ratio = (double)rc.saved * size / (double)rw.saved;
    if (ratio < 0.95 || ratio > 1.05)
        TEST_FAILF("%s: saved activations %zu bytes per rank, the whole model %zu (x cp: %.3f)",
                   what, rc.saved, rw.saved, ratio);
    /* Sampling needs the last position, which one rank holds: refused. */
    ASSERT_STATUS(dt_gpt_forward(part, x, NULL, B, T, NULL), DT_ERR_UNSUPPORTED);
    ASSERT_CONTAINS(dt_last_error(), "context-parallel");
    dt_gpt_destroy(split);
    dt_gpt_destroy(part);
    dt_gpt_destroy(whole);
    if (rank == 0)
        printf("  %s: ok\n", what);
}

static void run_variant(dt_group *w, dt_cp *cp, int rank, int size, dt_cp_mode mode,
                        dt_precision pr, int recompute, int T) {
    run_model(&cfg, w, cp, rank, size, mode, pr, recompute, T);
}

static void refusals(dt_cp *cp) {
    dt_gpt_options o = dt_gpt_options_default();
    dt_gpt *m = NULL;
    o.part = (dt_gpt_part){.cp_rank = 0, .cp_size = 3, .cp_regions = dt_cp_regions_of(cp)};
    ASSERT_STATUS(dt_gpt_create_with(&m, &cfg, B, 48, &o), DT_ERR_INVALID);
    ASSERT_CONTAINS(dt_last_error(), "--cp 3 does not divide the 4 attention heads");
    o.part.cp_size = 2;
    o.part.cp_mode = DT_CP_RING;
    ASSERT_STATUS(dt_gpt_create_with(&m, &cfg, B, 18, &o), DT_ERR_INVALID);
    ASSERT_CONTAINS(dt_last_error(), "sequence length 18 is not a multiple of 4");
    o.part.cp_mode = DT_CP_ULYSSES;
    ASSERT_STATUS(dt_gpt_create_with(&m, &cfg, B, 17, &o), DT_ERR_INVALID);
    ASSERT_CONTAINS(dt_last_error(), "sequence length 17 is not a multiple of 2");
    o.part.cp_mode = DT_CP_RING;
    o.part.cp_regions = NULL;
    ASSERT_STATUS(dt_gpt_create_with(&m, &cfg, B, 16, &o), DT_ERR_INVALID);
    ASSERT_CONTAINS(dt_last_error(), "cp_regions");
}

static void cp_case(int rank, int size) {
    dt_group *w = NULL;
    ASSERT_OK(dt_group_init_from_env(&w));
    dt_cp *cp;
    ASSERT_OK(dt_cp_create(&cp, w));
    /* Per-rank shares: Ulysses T/cp, the ring's chunks T/(2cp); odd ones too. */
    const int ulysses_T[] = {8 * size, 3 * size}, ring_T[] = {8 * size, 6 * size};
    for (int rc = 0; rc < 2; rc++)
        for (int k = 0; k < 2; k++) {
            run_variant(w, cp, rank, size, DT_CP_ULYSSES, DT_PRECISION_FP32, rc, ulysses_T[k]);
            run_variant(w, cp, rank, size, DT_CP_RING, DT_PRECISION_FP32, rc, ring_T[k]);
        }
    run_variant(w, cp, rank, size, DT_CP_ULYSSES, DT_PRECISION_BF16, 0, 8 * size);
    run_variant(w, cp, rank, size, DT_CP_ULYSSES, DT_PRECISION_BF16, 1, 3 * size);
    run_variant(w, cp, rank, size, DT_CP_RING, DT_PRECISION_BF16, 0, 8 * size);
    run_variant(w, cp, rank, size, DT_CP_RING, DT_PRECISION_FP16, 1, 6 * size);
    run_model(&cfg8, w, cp, rank, size, DT_CP_ULYSSES, DT_PRECISION_FP32, 0, 10 * size);
    run_model(&cfg8, w, cp, rank, size, DT_CP_RING, DT_PRECISION_FP32, 1, 10 * size);
    refusals(cp);
    dt_cp_destroy(cp);
    dt_group_destroy(w);
}

int main(int argc, char **argv) {
    static const hcase cases[] = {
        {"cp_2", 2, cp_case, {NULL}, -1, 240},
        {"cp_4", 4, cp_case, {NULL}, -1, 300},
    };
    return harness_main(argc, argv, cases, (int)(sizeof cases / sizeof cases[0]));
}
