/*
 * report.c — what rank 0 prints: the header before the first step, the
 * generated sample at the end, and the helpers they share (medians).
 */
#include "dtrain/tensor.h"
#include "train_internal.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The header's precision and memory lines: compute type, loss scaling,
 * recomputation, and the bytes each rank holds. */
static void print_precision(const trainer *t, FILE *f) {
    const dt_train_config *c = t->c;
    char rc[32], a[32], b[32], o[32], act[32];
    dt_recompute_format(c->recompute_every, rc, sizeof rc);
    fprintf(f, "  precision %s (master weights, gradients and optimizer fp32), loss scaling ",
            dt_precision_name(c->precision));
    if (t->scaling)
        fprintf(f, "on (from %g, x%g after %" PRId64 " clean steps, x%g on overflow)",
                t->scaler.cfg.init_scale, t->scaler.cfg.growth_factor,
                t->scaler.cfg.growth_interval, t->scaler.cfg.backoff_factor);
    else
        fprintf(f, "off");
    fprintf(f, ", recompute %s, kernels %s\n", rc, dt_isa_name(dt_isa()));
    dt_memory_report mr;
    dt_gpt_memory(t->m, &mr);
    size_t opt = dt_optimizer_state_bytes(t->opt);
    char w16[48] = "", w[32], sv[32], re[32];
    if (mr.weights16)
        snprintf(w16, sizeof w16, ", %s weights %s", dt_precision_name(c->precision),
                 dt_format_bytes((double)mr.weights16, w, sizeof w));
    fprintf(f,
            "  memory/rank: params %s, grads %s, optimizer %s%s, activations %s peak (%s; saved "
            "%s, recompute scratch %s)\n",
            dt_format_bytes((double)mr.params, a, sizeof a),
            dt_format_bytes((double)mr.grads, b, sizeof b),
            dt_format_bytes((double)opt, o, sizeof o), w16,
            dt_format_bytes((double)mr.activations, act, sizeof act),
            dt_precision_name(c->precision), dt_format_bytes((double)mr.saved, sv, sizeof sv),
            dt_format_bytes((double)mr.recompute, re, sizeof re));
    fprintf(f, "  memory plan/rank (dtrain plan memory; rank 0): ");
    dt_rank_memory_print(&t->plan, f);
    fprintf(f, "\n");
}

/* The lines printed before the first step: the model, the layout and the
 * batch, the gradient wire format, precision and memory, and the resume. */
void dt__train_print_header(const trainer *t, double peak, const char *peak_from, FILE *f) {
    const dt_train_config *c = t->c;
    dt_sync_cost cost;
    dt_grad_sync_cost(t->sync, &cost);
    int64_t tokens_per_step = (int64_t)t->dp * t->B * t->T * t->K;
    char pb[32], bb[32];
    char layout[160] = "", mesh[64];
    if (t->dp != t->size)
        snprintf(layout, sizeof layout, " as %s%s (%zu parameters per rank); %d replica(s)",
                 dt_mesh_format(dt_mesh_get_shape(t->mesh), mesh, sizeof mesh),
                 c->sp ? " with sequence parallelism" : "", t->n, t->dp);
    size_t total = dt_gpt_config_num_params(&t->mc);
    fprintf(f,
            "dtrain train: %s%s model, %zu parameters (%s), %d layers, dim %d, %d heads, "
            "seq %d, vocab %d\n"
            "  %d rank(s)%s x batch %d x accum %d = %" PRId64 " tokens/step, %d bucket(s) of "
            "<= %s, %d thread(s)/rank, transport %s\n"
            "  MFU relative to %.1f GFLOP/s per rank (%s peak: %s)\n",
            c->init_from ? "--init-from " : "", c->init_from ? c->init_from : c->model, total,
            dt_format_bytes((double)total * 4, pb, sizeof pb), t->mc.layers, t->mc.dim, t->mc.heads,
            t->T, t->mc.vocab, t->size, layout, t->B, t->K, tokens_per_step, cost.pieces,
            dt_format_bytes((double)c->bucket_bytes, bb, sizeof bb), t->threads,
            t->world ? dt_group_transport(t->world) : "self", peak, dt_precision_name(c->precision),
            peak_from);
    print_precision(t, f);
    if (c->dp_mode != DT_DP_MODE_DDP) /* the strategy's own description of its settings */
        fprintf(f, "  --dp-mode %s: %s (docs/async.md)\n", dt_dp_mode_names[c->dp_mode],
                dt_grad_sync_state_ident(t->sync));
    if (t->pipe) {
        const dt_gpt_part *pt = dt_gpt_get_part(t->m);
        const dt_pp_schedule *ps = t->pipe;
        fprintf(f,
                "  pipeline: %s over %d stages x %d chunk(s), %d micro-batches per step "
                "(theoretical bubble %.1f%%); stage 0 holds blocks",
                dt_runner_name(t->runner), ps->stages, ps->chunks, ps->micro,
                100 * dt_pp_theoretical_bubble(ps->kind, ps->stages, ps->chunks, ps->micro));
        for (int k = 0; k < pt->chunks; k++)
            fprintf(f, "%s%d-%d", k ? ", " : " ", pt->layers[k].begin, pt->layers[k].end - 1);
        fprintf(f, " and keeps up to %d micro-batch(es) per chunk\n",
                dt_gpt_get_options(t->m)->slots);
    }
    if (t->sync_size > 1 &&
        (c->compress.kind != DT_CODEC_NONE || c->compress_auto.n || c->grad_dtype != DT_F32)) {
        fprintf(f, "  gradients: %s", dt_grad_sync_state_ident(t->sync));
        if (c->compress.kind != DT_CODEC_NONE && c->compress_start > 0)
            fprintf(f, ", dense (fp32) for steps 1-%" PRId64, c->compress_start);
        if (c->compress_ramp > 0)
            fprintf(f, ", density %g%% -> %g%% over steps %" PRId64 "-%" PRId64,
                    100 * DT_TRAIN_RAMP_START, 100 * c->compress.fraction, c->compress_start + 1,
                    c->compress_start + c->compress_ramp);
        if (c->compress_dense_below > 0)
            fprintf(f, ", tensors < %" PRId64 " values exact", c->compress_dense_below);
        fprintf(f, "\n");
    }
    if (t->sync_size > 1 && c->comm_priority == DT_COMM_PRIORITY_CRITICAL) {
        char pb2[32];
        fprintf(
            f, "  gradient order: critical (the first layers first, pieces of %s)%s\n",
            dt_format_bytes((double)(c->comm_piece ? c->comm_piece : DT_DDP_DEFAULT_PIECE_BYTES),
                            pb2, sizeof pb2),
            dt_grad_sync_defers(t->sync, c->clip <= 0 && !t->scaling)
                ? "; the next forward overlaps the last pieces"
            : c->clip > 0 ? "; --clip waits for every gradient, so the next forward does "
                            "not overlap them (--clip 0 lets it)"
                          : "; this optimizer or loss scaling keeps the next forward "
                            "after them");
    }
    if (t->resumed[0]) {
        fprintf(f, "  resumed from %s at step %" PRId64, t->resumed, t->step);
        if (t->ckpt_precision != (int64_t)c->precision)
            fprintf(f, " (written in %s, continuing in %s)",
                    dt_precision_name((dt_precision)t->ckpt_precision),
                    dt_precision_name(c->precision));
        if (t->scaling)
            fprintf(f, ", loss scale %g", (double)dt__train_applied_scale(t));
        fprintf(f, "\n");
    }
}

/* Rank 0: sample `ntok` tokens after a newline (or token 0) at temperature
 * 0.8 from the stream (seed, DT_RNG_SAMPLE) and print them. */
dt_status dt__train_generate(trainer *t, dt_gpt *m, FILE *out) {
    int ntok = t->c->sample_tokens, V = t->mc.vocab, Vd = t->tok->vocab_size, T = t->T;
    int32_t *ids = dt_alloc((size_t)(ntok + 1) * sizeof *ids);
    float *probs = dt_alloc((size_t)V * sizeof *probs);
    dt_status st = DT_OK;
    if (!ids || !probs) {
        st = DT_ERR_NOMEM;
        goto done;
    }
    /* The first token: a newline's (its first token with bpe), else 0. */
    int32_t *nl = NULL;
    size_t nnl = 0;
    ids[0] = dt_tokenizer_encode_any(t->tok, "\n", 1, &nl, &nnl) == DT_OK && nnl > 0 ? nl[0] : 0;
    free(nl);
    dt_error_clear();
    dt_rng rng;
    dt_rng_init(&rng, t->c->seed, dt_rng_stream_id(0, 0, DT_RNG_SAMPLE));
    for (int i = 0; i < ntok; i++) {
        int len = i + 1, Tc = len < T ? len : T;
        DT_CHECK_GOTO(dt_gpt_forward(m, ids + len - Tc, NULL, 1, Tc, NULL), st, done);
        const float *logits = dt_gpt_last_logits(m, 0);
        float mx = -INFINITY;
        for (int v = 0; v < Vd; v++)
            mx = logits[v] > mx ? logits[v] : mx;
        double z = 0;
        for (int v = 0; v < Vd; v++) {
            probs[v] = expf((logits[v] - mx) / 0.8f);
            z += probs[v];
        }
        double u = dt_rng_uniform(&rng) * z, acc = 0;
        int pick = Vd - 1;
        for (int v = 0; v < Vd; v++) {
            acc += probs[v];
            if (u < acc) {
                pick = v;
                break;
            }
        }
        ids[len] = pick;
    }
    /* The tokens' bytes (one each, or a bpe token's several). */
    fprintf(out, "---- sample (%d tokens, temperature 0.8) ----\n", ntok);
    for (int i = 1; i <= ntok; i++) {
        size_t len;
        const uint8_t *b = dt_tokenizer_token(t->tok, ids[i], &len);
        if (!b) {
            fprintf(out, "(cannot decode: the bpe tokenizer's files are not loaded; give "
                         "--tokenizer)");
            break;
        }
        for (size_t k = 0; k < len; k++)
            fputc(b[k] == '\0' || (b[k] < 0x20 && b[k] != '\n' && b[k] != '\t') ? '?' : b[k], out);
    }
    fprintf(out, "\n----\n");
done:
    dt_free(ids);
    dt_free(probs);
    return st;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The whole model from the parts of the first replica (its tensor-,
 * context- and pipeline-parallel ranks): each sends its parameters and the
 * boxes it owns to rank 0, which copies them into an unsharded model one
 * part at a time, so that it holds the whole model and one part at most
 * (dt_train_plan_memory's "assembly"). */
dt_status dt__train_whole_model(trainer *t, dt_gpt **out) {
    *out = NULL;
    const dt_gpt_part *part = dt_gpt_get_part(t->m);
    if (part->tp_size == 1 && part->cp_size == 1 && !t->pipe) {
        *out = t->rank == 0 ? t->m : NULL;
        return DT_OK;
    }
    dt_group *mg = NULL; /* the first replica (dp and cp 0), ordered by world rank */
    DT_CHECK(dt_group_split(t->world, t->sync_rank == 0 ? 0 : DT_UNDEFINED, t->rank, &mg));
    if (!mg)
        return DT_OK;
    int nr = dt_group_size(mg), me = dt_group_rank(mg);
    shards sh;
    dt_status st = dt__shards_make(t, &sh);
    if (st != DT_OK) {
        dt_group_destroy(mg);
        return st;
    }
    /* Parts differ in size (pipeline stages): every rank sends its own
     * count, rank 0 receives into a buffer of the largest. */
    int64_t most[2] = {(int64_t)t->n, (int64_t)sh.nt};
    float *recv = NULL;
    dt_ckpt_box *boxes = NULL, *mine = NULL, *want = NULL;
    int64_t *counts = NULL;
    dt_gpt *whole = NULL;
    DT_CHECK_GOTO(dt_group_allreduce(mg, most, most, 2, DT_I64, DT_MAX), st, done);
    size_t np = (size_t)most[0], nb = (size_t)most[1];
    mine = dt_calloc(nb, sizeof *mine);
    boxes = dt_calloc((size_t)nr * nb, sizeof *boxes);
    counts = dt_calloc((size_t)nr, sizeof *counts);
    recv = me == 0 && nr > 1 ? dt_alloc(np * sizeof(float)) : NULL;
    if (!mine || !boxes || !counts || (me == 0 && nr > 1 && !recv)) {
        st = dt_error_set(DT_ERR_NOMEM, "assembling the whole model on rank 0");
        goto done;
    }
    /* A tensor part this rank does not own, and the padding, are empty boxes. */
    for (size_t i = 0; i < nb; i++) {
        mine[i].tensor = UINT32_MAX;
        if (i < sh.nt && sh.owned[i])
            mine[i] = sh.whole[i];
    }
    int64_t n_me = (int64_t)t->n;
    DT_CHECK_GOTO(dt_group_allgather(mg, mine, boxes, nb * sizeof *boxes, DT_U8), st, done);
    DT_CHECK_GOTO(dt_group_allgather(mg, &n_me, counts, 1, DT_I64), st, done);
    if (me != 0) {
        st = dt_group_send(mg, dt_gpt_params(t->m), t->n, DT_F32, 0, 0);
        goto done;
    }
    dt_gpt_options o = dt_gpt_options_default();
    DT_CHECK_GOTO(dt_gpt_create_with(&whole, &t->mc, 1, t->T, &o), st, done);
    size_t nt = dt_gpt_num_tensors(whole);
    if (!(want = dt_calloc(nt, sizeof *want))) {
        st = DT_ERR_NOMEM;
        goto done;
    }
    uint64_t need = 0, got = 0;
    for (size_t i = 0; i < nt; i++) {
        dt_param_info pi;
        dt_gpt_tensor_info(whole, i, &pi);
        want[i] = (dt_ckpt_box){.tensor = (uint32_t)pi.global,
                                .extent = {pi.extent[0], pi.extent[1], pi.extent[2]},
                                .offset = pi.offset};
        need += dt_ckpt_box_volume(&want[i]);
    }
    for (int r = 0; r < nr; r++) {
        const float *src = dt_gpt_params(t->m);
        if (r > 0) {
            DT_CHECK_GOTO(dt_group_recv(mg, recv, (size_t)counts[r], DT_F32, r, 0), st, done);
            src = recv;
        }
        got += dt_ckpt_copy_boxes(boxes + (size_t)r * nb, nb, src, want, nt, dt_gpt_params(whole));
    }
    DT_ASSERT(got == need); /* the parts tile the model: a bug otherwise */
    *out = whole;
    whole = NULL;
done:
    dt_gpt_destroy(whole);
    dt_free(want);
    dt_free(counts);
    dt_free(boxes);
    dt_free(recv);
    dt_free(mine);
    dt__shards_free(&sh);
    dt_group_destroy(mg);
    return st;
}

double dt__median(double *v, size_t n) {
    if (n == 0)
        return NAN;
    qsort(v, n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}
