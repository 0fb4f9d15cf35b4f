/*
 * test_pipeline_run.c — the pipeline executor with real processes: P = 2,
 * 3 and 4 ranks run every schedule kind on their stage of a small GPT, and
 * every rank also runs the whole model in one process on the same
 * micro-batches. Checked per rank and schedule:
 *   - the loss of the step (on the last stage) has the whole model's bits;
 *   - every gradient of the stage has the whole model's bits, but the tied
 *     embedding's (its two parts are summed over the first and last stage
 *     in another order: 1e-6 relative L2);
 *   - the peak of live micro-batches measured by the runner equals the
 *     checker's prediction for this rank;
 *   - a second step gives the same gradients (the executor's state resets);
 *   - evaluation (forward only) gives the whole model's loss on every rank.
 * And: ranks given different schedules fail at start (DT_ERR_MISMATCH
 * naming the rank), a model part that is not the rank's stage is refused.
 */
#include "comm/harness.h"
#include "dtrain/nn.h"
#include "dtrain/optim.h"
#include "dtrain/parallel.h"

#include <math.h>

enum { B = 2, T = 16, N = B * T, MAXM = 8 };

static void tokens(int32_t *x, size_t n, int V, uint64_t stream) {
    dt_rng r;
    dt_rng_init(&r, 7, dt_rng_stream_id(0, stream, DT_RNG_TEST));
    for (size_t i = 0; i < n; i++)
        x[i] = (int32_t)dt_rng_below(&r, (uint32_t)V);
}

/* A gradient synchronisation that communicates nothing (a world of one
 * replica): DDP over no group, with an optimizer it never steps here. */
static dt_grad_sync *local_sync(dt_gpt *m, dt_optimizer **opt) {
    size_t n = dt_gpt_num_params(m);
    dt_optim_tensor t = {.offset = 0, .count = n, .decay = true};
    dt_optim_config oc = dt_optim_config_default();
    dt_range all = {0, n};
    ASSERT_OK(dt_optimizer_create(opt, &oc, &t, 1, &all, 1));
    dt_ddp_sync_config sc = {.params = dt_gpt_params(m),
                             .grads = dt_gpt_grads(m),
                             .n = n,
                             .opt = *opt,
                             .ddp = dt_ddp_options_default()};
    dt_grad_sync *s;
    ASSERT_OK(dt_ddp_sync_create(&s, &sc));
    return s;
}

static void run_schedule(dt_group *g, int rank, int P, dt_pp_kind kind, int V, int M) {
    char what[64];
    snprintf(what, sizeof what, "P %d %s V %d M %d", P, dt_pp_kind_names[kind], V, M);
    dt_gpt_config cfg = {.layers = 2 * P * V, .dim = 32, .heads = 2, .max_seq = T, .vocab = 61};
    dt_pp_schedule *s;
    ASSERT_OK(dt_pp_schedule_create(&s, kind, P, V, M));
    dt_pp_report rep;
    ASSERT_OK(dt_pp_check(s, NULL, &rep));
    dt_gpt_options o = {.precision = DT_PRECISION_FP32,
                        .recompute_every = kind == DT_PP_ZB ? 3 : 0};
    dt_gpt *whole, *part;
    ASSERT_OK(dt_gpt_create_with(&whole, &cfg, B, T, &o));
    o.slots = dt_pp_slots(s, &rep, rank);
    o.split_weight_grads = s->split_w;
    ASSERT_OK(dt_pp_model_part(s, cfg.layers, rank, &o.part));
    ASSERT_OK(dt_gpt_create_with(&part, &cfg, B, T, &o));
    dt_gpt_init_params(whole, 11);
    dt_gpt_init_params(part, 11);
    int32_t x[MAXM * N], y[MAXM * N];
    tokens(x, (size_t)M * N, cfg.vocab, 1);
    tokens(y, (size_t)M * N, cfg.vocab, 2);
    /* The whole model, micro-batch after micro-batch. */
    double wl = 0;
    for (int k = 0; k < M; k++) {
        float l;
        ASSERT_OK(dt_gpt_forward(whole, x + k * N, y + k * N, B, T, &l));
        wl += l;
        ASSERT_OK(dt_gpt_backward_mode(whole, 1.0f / M, k ? DT_GRAD_ACCUMULATE : DT_GRAD_OVERWRITE,
                                       NULL, NULL));
    }
    dt_runner *r;
    ASSERT_OK(dt_pp_runner_create(&r, &(dt_pp_runner_config){part, s, g}));
    dt_optimizer *opt;
    dt_grad_sync *sync = local_sync(part, &opt);
    size_t n = dt_gpt_num_params(part);
    float *first = malloc(n * sizeof(float));
    for (int step = 0; step < 2; step++) {
        dt_run_result res;
        ASSERT_OK(dt_grad_sync_begin_step(sync, &(dt_sync_step){.lr = 0.0f, .loss_scale = 1.0f}));
        ASSERT_OK(dt_runner_step(r, &(dt_run_batch){x, y, M, B, T, 1.0f / M}, sync, &res));
        dt_sync_result sr;
        ASSERT_OK(dt_grad_sync_finish(sync, &sr));
        if (res.peak_live != rep.peak_live[rank])
            TEST_FAILF("%s rank %d: %d micro-batches alive at most, the checker predicted %d", what,
                       rank, res.peak_live, rep.peak_live[rank]);
        ASSERT_TRUE(res.has_loss == (rank == P - 1));
        if (res.has_loss && memcmp(&res.loss, &wl, sizeof wl) != 0)
            TEST_FAILF("%s: loss %.9g, whole model %.9g", what, res.loss, wl);
        ASSERT_TRUE(res.bubble >= 0 && res.bubble < 1 && res.busy_ms > 0);
        if (step == 0)
            memcpy(first, dt_gpt_grads(part), n * sizeof(float));
        else if (memcmp(first, dt_gpt_grads(part), n * sizeof(float)) != 0)
            TEST_FAILF("%s rank %d: the second step's gradients differ from the first's", what,
                       rank);
    }
    for (size_t i = 0; i < dt_gpt_num_tensors(part); i++) {
        dt_param_info p, w;
        dt_gpt_tensor_info(part, i, &p);
        dt_gpt_tensor_info(whole, (size_t)p.global, &w);
        const float *a = dt_gpt_grads(part) + p.offset, *b = dt_gpt_grads(whole) + w.offset;
        size_t k = p.rows * p.cols;
        if (strcmp(p.name, "wte") != 0) {
            if (memcmp(a, b, k * sizeof(float)) != 0)
                TEST_FAILF("%s rank %d: gradient of %s differs from the whole model's", what, rank,
                           p.name);
            continue;
        }
        double num = 0, den = 0;
        for (size_t j = 0; j < k; j++) {
            num += ((double)a[j] - b[j]) * ((double)a[j] - b[j]);
            den += (double)b[j] * b[j];
        }
        if (!(sqrt(num) <= 1e-6 * sqrt(den)))
            TEST_FAILF("%s rank %d: wte gradient: relative L2 difference %.3g", what, rank,
                       sqrt(num / den));
    }
    /* Evaluation: the loss of one batch, on every rank. */
    double el;
    float wel;
    ASSERT_OK(dt_runner_eval(r, x, y, B, T, &el));
    ASSERT_OK(dt_gpt_forward(whole, x, y, B, T, &wel));
    if (el != (double)wel)
        TEST_FAILF("%s rank %d: evaluation loss %.9g, whole model %.9g", what, rank, el,
                   (double)wel);
    free(first);
    dt_grad_sync_destroy(sync);
    dt_optimizer_destroy(opt);
    dt_runner_destroy(r);
    dt_gpt_destroy(part);
    dt_gpt_destroy(whole);
    dt_pp_report_free(&rep);
    dt_pp_schedule_destroy(s);
    if (rank == 0)
        printf("  %s: ok\n", what);
}

/* Rank 1 is given GPipe, the others 1F1B: every rank fails at start. */
static void mismatched(dt_group *g, int rank, int P) {
    dt_gpt_config cfg = {.layers = P, .dim = 32, .heads = 2, .max_seq = T, .vocab = 61};
    dt_pp_schedule *s;
    ASSERT_OK(dt_pp_schedule_create(&s, rank == 1 ? DT_PP_GPIPE : DT_PP_1F1B, P, 1, 4));
    dt_gpt_options o = {.slots = 4};
    ASSERT_OK(dt_pp_model_part(s, cfg.layers, rank, &o.part));
    dt_gpt *m;
    ASSERT_OK(dt_gpt_create_with(&m, &cfg, B, T, &o));
    dt_runner *r = NULL;
    ASSERT_STATUS(dt_pp_runner_create(&r, &(dt_pp_runner_config){m, s, g}), DT_ERR_MISMATCH);
    ASSERT_CONTAINS(dt_last_error(), "rank 1 (world rank 1) was given another schedule");
    /* A part that is not this rank's stage. */
    dt_gpt_options w = {.slots = 4};
    dt_gpt *whole;
    ASSERT_OK(dt_gpt_create_with(&whole, &cfg, B, T, &w));
    ASSERT_STATUS(dt_pp_runner_create(&r, &(dt_pp_runner_config){whole, s, g}), DT_ERR_INVALID);
    dt_gpt_destroy(whole);
    dt_gpt_destroy(m);
    dt_pp_schedule_destroy(s);
}

static void pp_case(int rank, int P) {
    dt_group *g = NULL;
    ASSERT_OK(dt_group_init_from_env(&g));
    run_schedule(g, rank, P, DT_PP_GPIPE, 1, 3);
    run_schedule(g, rank, P, DT_PP_1F1B, 1, 5);
    run_schedule(g, rank, P, DT_PP_1F1B, 1, 1);
    run_schedule(g, rank, P, DT_PP_INTERLEAVED, 2, 2 * P);
    run_schedule(g, rank, P, DT_PP_ZB, 1, 5);
    mismatched(g, rank, P);
    dt_group_destroy(g);
}

int main(int argc, char **argv) {
    dt_tensor_set_threads(1);
    static const hcase cases[] = {
        {"pp_2", 2, pp_case, {NULL}, -1, 240},
        {"pp_3", 3, pp_case, {NULL}, -1, 240},
        {"pp_4", 4, pp_case, {NULL}, -1, 300},
    };
    return harness_main(argc, argv, cases, (int)(sizeof cases / sizeof cases[0]));
}
