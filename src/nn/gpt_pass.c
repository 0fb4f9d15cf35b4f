/*
 * gpt_pass.c — forward and backward of a GPT model part: the embeddings,
 * the blocks, the LM head with its cross-entropy, and the points where a
 * tensor-parallel part communicates.
 *
 * Tensor parallelism (Megatron-LM). A column-parallel linear (c_attn by
 * heads, c_fc by rows, the LM head by vocabulary) takes the whole input
 * and gives this rank's columns; a row-parallel linear (both c_proj)
 * takes this rank's columns and gives a partial sum of the whole output.
 * The communication sits in four functions below, each forward beside its
 * backward, which call the dt_tp_regions table that the parallel layer
 * implements (nn includes no comm header):
 *
 *                      forward                    backward
 *   region_in  (f)     identity                   allreduce dx
 *      with SP         all-gather rows            reduce-scatter rows
 *   region_out (g)     allreduce y                identity
 *      with SP         reduce-scatter rows        all-gather rows
 *
 * so a block costs one allreduce in forward and one in backward per
 * linear pair (two of each per block), or with sequence parallelism
 * (SP) a reduce-scatter + all-gather pair instead: LayerNorms, residual
 * adds and the residual stream then hold only this rank's Ns = N/tp token
 * rows. Under SP a LayerNorm's output is kept as the local rows and
 * gathered again in backward for its linear's weight gradient (as
 * Megatron does), and the replicated LayerNorm and wpe parameters receive
 * partial gradients from each rank's rows: they are summed over the group
 * per micro-batch before being added to the gradient buffer, so the
 * backward hook still reports final gradients.
 *
 * Without tensor parallelism (tp = 1) every region is the identity and the
 * calls below are exactly the unsharded model's (the same bits as before
 * the seam existed).
 *
 * Context parallelism (cp > 1) changes only which tokens a part holds
 * (take_tokens, the position embedding by cp_position) and attention,
 * which gpt_cp.c runs with the other ranks' tokens.
 */
#include "../tensor/simd.h"
#include "dtrain/trace.h"
#include "gpt_internal.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

/* ------------------------------------------------------------------------ */
/* Tensor-parallel regions (forward beside backward)                        */
/* ------------------------------------------------------------------------ */

static size_t rows_here(const dt_gpt *m) {
    size_t N = (size_t)m->s->B * m->s->T;
    return m->d.sp ? N / (size_t)m->d.tp : N;
}

/* f: the input of a column-parallel linear. Forward: the identity, or with
 * SP the all-gather of the local rows (elements of `esize` bytes) into
 * m->gathered. *full is the (N,C) input. */
static dt_status region_in_forward(dt_gpt *m, const void *local, const void **full, size_t esize) {
    *full = local;
    if (m->d.tp == 1 || !m->d.sp)
        return DT_OK;
    const dt_tp_regions *g = m->opt.part.regions;
    REGION(m, g->gather_from_sp_forward(g->ctx, local, m->gathered, rows_here(m) * (size_t)m->d.C,
                                        esize));
    *full = m->gathered;
    return DT_OK;
}

/* f backward: dfull (N,C) holds this rank's part of the input gradient;
 * sum it over the group (allreduce), or with SP reduce-scatter it in place.
 * *dlocal is the (Ns,C) gradient of this rank's rows. */
static dt_status region_in_backward(dt_gpt *m, float *dfull, float **dlocal) {
    *dlocal = dfull;
    if (m->d.tp == 1)
        return DT_OK;
    const dt_tp_regions *g = m->opt.part.regions;
    size_t ns = rows_here(m) * (size_t)m->d.C;
    if (!m->d.sp) {
        REGION(m, g->copy_to_backward(g->ctx, dfull, ns));
        return DT_OK;
    }
    REGION(m, g->gather_from_sp_backward(g->ctx, dfull, ns));
    *dlocal = dfull + (size_t)m->d.r * ns;
    return DT_OK;
}

/* g: the output of a row-parallel linear. partial (N,C) holds this rank's
 * partial sum; forward sums it (allreduce), or with SP reduce-scatters it
 * in place. *local is the (Ns,C) sum for this rank's rows. */
static dt_status region_out_forward(dt_gpt *m, float *partial, float **local) {
    *local = partial;
    if (m->d.tp == 1)
        return DT_OK;
    const dt_tp_regions *g = m->opt.part.regions;
    size_t ns = rows_here(m) * (size_t)m->d.C;
    if (!m->d.sp) {
        REGION(m, g->reduce_from_forward(g->ctx, partial, ns));
        return DT_OK;
    }
    REGION(m, g->scatter_to_sp_forward(g->ctx, partial, ns));
    *local = partial + (size_t)m->d.r * ns;
    return DT_OK;
}

/* g backward: the identity, or with SP the all-gather of the output
 * gradient's local rows into `full` (N,C), which already holds this rank's
 * rows at its block (in place: rows r Ns .. (r+1) Ns). */
static dt_status region_out_backward(dt_gpt *m, void *full, size_t esize) {
    if (m->d.tp == 1 || !m->d.sp)
        return DT_OK;
    const dt_tp_regions *g = m->opt.part.regions;
    size_t ns = rows_here(m) * (size_t)m->d.C;
    REGION(m, g->scatter_to_sp_backward(g->ctx, (char *)full + (size_t)m->d.r * ns * esize, full,
                                        ns, esize));
    return DT_OK;
}

/* A replicated parameter's gradient computed from this rank's rows only
 * (SP): `part` (n) is summed over the group, then written into `grad` per
 * mode. Without SP the gradient is already whole and the kernels write it
 * directly. */
static dt_status sum_partial(dt_gpt *m, float *grad, float *part, size_t n, dt_grad_mode mode) {
    const dt_tp_regions *g = m->opt.part.regions;
    REGION(m, g->sum_partial_grads(g->ctx, part, n));
    if (mode == DT_GRAD_OVERWRITE) {
        memcpy(grad, part, n * sizeof(float));
    } else {
        for (size_t i = 0; i < n; i++)
            grad[i] += part[i];
    }
    return DT_OK;
}

/* ------------------------------------------------------------------------ */
/* Parameters kept elsewhere (dt_param_hooks): the ranges a pass reads       */
/* ------------------------------------------------------------------------ */

typedef enum { U_WTE, U_WPE, U_LNF } unit_kind;

/* A range of the flat parameter buffer. */
typedef struct span {
    size_t begin, end;
} span;

/* The parameters of block l, and of wte, wpe or ln_f. */
static span block_unit(const dt_gpt *m, int l) {
    size_t b = block_offset(m, l);
    const dt_param_info *lastt =
        &m->info[m->blocks + (size_t)m->lidx[l] * P_BLOCK_COUNT + P_BLOCK_COUNT - 1];
    return (span){b, lastt->offset + lastt->rows * lastt->cols};
}
static span other_unit(const dt_gpt *m, unit_kind k) {
    size_t i = k == U_WTE ? m->wte : k == U_WPE ? m->wpe : m->lnf;
    const dt_param_info *p = &m->info[i];
    size_t n = p->rows * p->cols * (k == U_LNF ? 2 : 1); /* ln_f: weight and bias */
    return (span){p->offset, p->offset + n};
}
/* With the hooks, bf16/fp16 round a unit's weights into w16 as it is
 * fetched (the whole buffer is not there to cast at the forward's start)
 * and give w16's pages back as it is released: only the units in use hold
 * 16-bit copies, as only they hold fp32 parameters. With fetch16 the hooks
 * deliver the 16-bit copy themselves (and take its pages back). */
static dt_status fetch(dt_gpt *m, span r) {
    if (!m->hooks.fetch)
        return DT_OK;
    DT_CHECK(m->hooks.fetch(m->hooks.user, r.begin, r.end));
    if (m->w16 && !m->hooks.fetch16)
        PROF(m, PROF_CASTS,
             dt_act16_from_f32(m->opt.precision, m->w16 + r.begin, m->params + r.begin,
                               r.end - r.begin));
    return DT_OK;
}
static void prefetch(dt_gpt *m, span r) {
    if (m->hooks.prefetch)
        m->hooks.prefetch(m->hooks.user, r.begin, r.end);
}
static void release(dt_gpt *m, span r) {
    if (!m->hooks.release)
        return;
    m->hooks.release(m->hooks.user, r.begin, r.end);
    if (m->w16 && !m->hooks.fetch16)
        dt_mem_discard(m->w16 + r.begin, (r.end - r.begin) * sizeof *m->w16);
}
/* The same for a range read through the 16-bit copy in bf16/fp16 (the
 * blocks, the head's rows): fetch16 when the hooks gather 16 bits. */
static dt_status fetch_w(dt_gpt *m, span r) {
    if (m->w16 && m->hooks.fetch16)
        return m->hooks.fetch16(m->hooks.user, r.begin, r.end, m->w16);
    return fetch(m, r);
}
static void prefetch_w(dt_gpt *m, span r) {
    if (m->w16 && m->hooks.prefetch16)
        m->hooks.prefetch16(m->hooks.user, r.begin, r.end, m->w16);
    else
        prefetch(m, r);
}
static void release_w(dt_gpt *m, span r) {
    if (m->w16 && m->hooks.release16)
        m->hooks.release16(m->hooks.user, r.begin, r.end);
    else
        release(m, r);
}

/* Rows [v0, v0 + w) of this rank's tied embedding (the head's vocabulary
 * chunk, or a piece of the lookup's). */
static span wte_rows(const dt_gpt *m, int v0, int w) {
    size_t o = m->info[m->wte].offset, C = (size_t)m->d.C;
    return (span){o + (size_t)v0 * C, o + (size_t)(v0 + w) * C};
}

/* ------------------------------------------------------------------------ */
/* Forward                                                                  */
/* ------------------------------------------------------------------------ */

/* bf16/fp16: round all parameters into w16 at a forward, unless the copy's
 * owner says it is current (dt_gpt_set_weights16). Chunks in parallel; each chunk's rounding
 * is exact per element, so the thread count cannot change the result. */
static void cast_weights(dt_gpt *m) {
    const size_t chunk = (size_t)1 << 16, n = m->nparams;
    const long nchunks = (long)((n + chunk - 1) / chunk);
#pragma omp parallel for schedule(static)
    for (long i = 0; i < nchunks; i++) {
        size_t o = (size_t)i * chunk, k = n - o < chunk ? n - o : chunk;
        dt_act16_from_f32(m->opt.precision, m->w16 + o, m->params + o, k);
    }
}

/* out (rows,C) = a + (b + bias): a residual add whose row-parallel linear
 * left its bias to be added after the reduction (the operation order of
 * dt_residual_layernorm_forward's sum). */
static void residual_bias(float *out, const float *a, const float *b, const float *bias,
                          size_t rows, size_t C) {
    for (size_t i = 0; i < rows; i++)
        for (size_t j = 0; j < C; j++)
            out[i * C + j] = a[i * C + j] + (b[i * C + j] + bias[j]);
}

/* The embeddings of the tokens into m->s->encoded (Ns,C). Vocabulary-parallel:
 * each rank looks up the tokens of its wte rows (zeros elsewhere), the
 * partial sums are reduced (g), then wpe is added for this rank's rows. */
static dt_status embed_forward(dt_gpt *m) {
    const int B = m->s->B, T = m->s->T, C = m->d.C;
    const float *wte = m->params + m->info[m->wte].offset,
                *wpe = m->params + m->info[m->wpe].offset;
    if (m->d.tp == 1 && m->d.cp == 1) {
        PROF(m, PROF_ELEMENTWISE,
             dt_embedding_forward(m->s->encoded, m->s->tokens, wte, wpe, B, T, C));
        return DT_OK;
    }
    const size_t N = (size_t)B * T, v0 = (size_t)m->d.r * (size_t)m->d.Vl;
    for (size_t i = 0; i < N; i++) {
        size_t v = (size_t)m->s->tokens[i] - v0; /* wraps for tokens below v0 */
        if (v < (size_t)m->d.Vl)
            memcpy(m->dbuf + i * C, wte + v * C, sizeof(float) * C);
        else
            memset(m->dbuf + i * C, 0, sizeof(float) * C);
    }
    float *e;
    DT_CHECK(region_out_forward(m, m->dbuf, &e));
    size_t ns = rows_here(m), row0 = m->d.sp ? (size_t)m->d.r * ns : 0;
    for (size_t i = 0; i < ns; i++) {
        const float *p = wpe + (size_t)cp_position(&m->d, T, (int)((row0 + i) % (size_t)T)) * C;
        for (int j = 0; j < C; j++)
            m->s->encoded[i * C + j] = e[i * C + j] + p[j];
    }
    return DT_OK;
}

/* With parameter hooks (ZeRO 3) and neither tensor nor context
 * parallelism, the lookup reads wte in the head's pieces of the vocabulary
 * (each fetched, the next prefetched, its tokens' rows copied, released),
 * so the tied embedding is never whole; then the position embedding is
 * added: the one add per value of dt_embedding_forward, the same bits.
 * Defined after the hooks' helpers below. */
static dt_status embed_forward_pieces(dt_gpt *m);

/* Block l's forward from its input x (Ns,C) into its activations. With
 * `full` false it stops once everything backward reads is there: a
 * recomputation skips the MLP's c_proj and res3 (already kept). The calls
 * and their arguments are the same in both cases, so a recomputed
 * activation is bit-identical to the one forward produced.
 * fp32: each residual add also runs the LayerNorm that reads its sum next
 * (dt_residual_layernorm_forward): res2 with ln_2, and res3 with the next
 * block's ln_1 (or ln_f after the model's last block), so a full forward
 * of block l + 1 finds its ln_1 done (ln1_done). A recomputation computes
 * ln_1 from the kept input with dt_layernorm_forward: the same bits. */
dt_status dt__gpt_block_forward(dt_gpt *m, int l, const float *x, bool full, bool ln1_done) {
    const gpt_dims *d = &m->d;
    const int B = m->s->B, T = m->s->T, C = d->C, N = B * T, Ns = (int)rows_here(m);
    const int Ct = d->Ct, NHt = d->NHt, Ft = d->Ft;
    const dt_precision pr = m->opt.precision;
    const bool sharded = d->tp > 1;
    float *p = m->params, *y;
    const void *in;
    const block_acts *a = acts_of(m, l);
    if (pr == DT_PRECISION_FP32) {
        if (!ln1_done)
            PROF(m, PROF_ELEMENTWISE,
                 dt_layernorm_forward(a->ln1, a->ln1_mean, a->ln1_rstd, x, bt(m, p, l, P_LN1W),
                                      bt(m, p, l, P_LN1B), Ns, C));
        DT_CHECK(region_in_forward(m, a->ln1, &in, 4));
        if (d->cp == 1) {
            PROF(m, PROF_PRODUCTS,
                 dt_matmul_forward(a->qkv, in, bt(m, p, l, P_QKVW), bt(m, p, l, P_QKVB), N, C,
                                   3 * Ct));
            PROF(m, PROF_ATTENTION,
                 dt_attention_forward(a->atty, a->att_lse, a->qkv, B, T, Ct, NHt));
        } else {
            float *qkv = dt__gpt_cp_qkv_target(m, a);
            PROF(
                m, PROF_PRODUCTS,
                dt_matmul_forward(qkv, in, bt(m, p, l, P_QKVW), bt(m, p, l, P_QKVB), N, C, 3 * Ct));
            PROF(m, PROF_ATTENTION, DT_CHECK(dt__gpt_cp_attention_forward(m, a, qkv)));
        }
        /* The biases of c_proj and c_fc are added by the pass that reads
         * the product next (residual add, GELU), not seeded into the
         * product's output: one write and one read of that output fewer
         * (and a row-parallel bias is added once, after the reduction). */
        PROF(m, PROF_PRODUCTS,
             dt_matmul_forward(m->dbuf, a->atty, bt(m, p, l, P_ATTPROJW), NULL, N, Ct, C));
        DT_CHECK(region_out_forward(m, m->dbuf, &y));
        PROF(m, PROF_ELEMENTWISE,
             dt_residual_layernorm_forward(a->res2, a->ln2, a->ln2_mean, a->ln2_rstd, x, y,
                                           bt(m, p, l, P_ATTPROJB), bt(m, p, l, P_LN2W),
                                           bt(m, p, l, P_LN2B), Ns, C));
        DT_CHECK(region_in_forward(m, a->ln2, &in, 4));
        PROF(m, PROF_PRODUCTS, dt_matmul_forward(a->fch, in, bt(m, p, l, P_FCW), NULL, N, C, Ft));
        PROF(m, PROF_ELEMENTWISE,
             dt_gelu_bias_forward(a->fch_gelu, a->fch, bt(m, p, l, P_FCB), N, Ft));
        if (!full)
            return DT_OK;
        PROF(m, PROF_PRODUCTS,
             dt_matmul_forward(m->dbuf, a->fch_gelu, bt(m, p, l, P_FCPROJW), NULL, N, Ft, C));
        DT_CHECK(region_out_forward(m, m->dbuf, &y));
        if (l + 1 < m->s->L1) {
            const block_acts *nx = acts_of(m, l + 1);
            PROF(m, PROF_ELEMENTWISE,
                 dt_residual_layernorm_forward(a->res3, nx->ln1, nx->ln1_mean, nx->ln1_rstd,
                                               a->res2, y, bt(m, p, l, P_FCPROJB),
                                               bt(m, p, l + 1, P_LN1W), bt(m, p, l + 1, P_LN1B), Ns,
                                               C));
        } else if (m->s->head) {
            const size_t lnw = m->info[m->lnf].offset, lnb = m->info[m->lnf + 1].offset;
            PROF(m, PROF_ELEMENTWISE,
                 dt_residual_layernorm_forward(a->res3, m->s->lnf_out, m->s->lnf_mean,
                                               m->s->lnf_rstd, a->res2, y, bt(m, p, l, P_FCPROJB),
                                               p + lnw, p + lnb, Ns, C));
        } else { /* a pipeline stage's output: the next stage normalises it */
            PROF(m, PROF_ELEMENTWISE,
                 residual_bias(a->res3, a->res2, y, bt(m, p, l, P_FCPROJB), (size_t)Ns, (size_t)C));
        }
        return DT_OK;
    }
    /* bf16/fp16: a16 activations, fp32 residual stream and statistics; the
     * c_proj outputs are fp32 so the residual adds are exact fp32 adds. */
    PROF(m, PROF_ELEMENTWISE,
         dt_layernorm16_forward(pr, a->ln1, a->ln1_mean, a->ln1_rstd, x, bt(m, p, l, P_LN1W),
                                bt(m, p, l, P_LN1B), Ns, C));
    DT_CHECK(region_in_forward(m, a->ln1, &in, 2));
    void *qkv = d->cp == 1 ? a->qkv : dt__gpt_cp_qkv_target(m, a);
    PROF(m, PROF_PRODUCTS,
         DT_CHECK(dt_linear16_forward(pr, qkv, false, in, wt(m, l, P_QKVW), bt(m, p, l, P_QKVB), N,
                                      C, 3 * Ct)));
    if (d->cp == 1)
        PROF(m, PROF_ATTENTION,
             dt_attention16_forward(pr, a->atty, a->att_lse, a->qkv, B, T, Ct, NHt, m->attn_work));
    else
        PROF(m, PROF_ATTENTION, DT_CHECK(dt__gpt_cp_attention_forward(m, a, qkv)));
    PROF(m, PROF_PRODUCTS,
         DT_CHECK(dt_linear16_forward(pr, m->dbuf, true, a->atty, wt(m, l, P_ATTPROJW),
                                      sharded ? NULL : bt(m, p, l, P_ATTPROJB), N, Ct, C)));
    DT_CHECK(region_out_forward(m, m->dbuf, &y));
    if (sharded)
        PROF(m, PROF_ELEMENTWISE,
             residual_bias(a->res2, x, y, bt(m, p, l, P_ATTPROJB), (size_t)Ns, (size_t)C));
    else
        PROF(m, PROF_ELEMENTWISE, dt_residual_forward(a->res2, x, y, (size_t)N * C));
    PROF(m, PROF_ELEMENTWISE,
         dt_layernorm16_forward(pr, a->ln2, a->ln2_mean, a->ln2_rstd, a->res2, bt(m, p, l, P_LN2W),
                                bt(m, p, l, P_LN2B), Ns, C));
    DT_CHECK(region_in_forward(m, a->ln2, &in, 2));
    PROF(m, PROF_PRODUCTS,
         DT_CHECK(dt_linear16_forward(pr, a->fch, false, in, wt(m, l, P_FCW), bt(m, p, l, P_FCB), N,
                                      C, Ft)));
    PROF(m, PROF_ELEMENTWISE, dt_gelu16_forward(pr, a->fch_gelu, a->fch, (size_t)N * Ft));
    if (!full)
        return DT_OK;
    PROF(m, PROF_PRODUCTS,
         DT_CHECK(dt_linear16_forward(pr, m->dbuf, true, a->fch_gelu, wt(m, l, P_FCPROJW),
                                      sharded ? NULL : bt(m, p, l, P_FCPROJB), N, Ft, C)));
    DT_CHECK(region_out_forward(m, m->dbuf, &y));
    if (sharded)
        PROF(m, PROF_ELEMENTWISE,
             residual_bias(a->res3, a->res2, y, bt(m, p, l, P_FCPROJB), (size_t)Ns, (size_t)C));
    else
        PROF(m, PROF_ELEMENTWISE, dt_residual_forward(a->res3, a->res2, y, (size_t)N * C));
    return DT_OK;
}

/* ------------------------------------------------------------------------ */
/* LM head in vocabulary chunks                                             */
/* ------------------------------------------------------------------------ */
/*
 * The tied head, logits (N,Vl) = lnf (N,C) wte^T, runs over column chunks
 * [v0, v0 + w) of this rank's vocabulary (w = head_cols; the last chunk may
 * be narrower) in EVERY mode, so that recomputation is bit-identical to
 * none by construction:
 *  - each chunk is the same GEMM call on the same inputs, whether forward
 *    writes it (and, without recomputation, copies it into the full logits)
 *    or backward recomputes it;
 *  - the loss's log-sum-exp of a row merges the chunks' in chunk order;
 *  - backward turns a chunk into dlogits in place and does its two GEMMs:
 *    dwte rows [v0, v0+w) += dchunk^T lnf (a whole K = N reduction: each
 *    dwte row is written by one GEMM, as without chunks), and dlnf +=
 *    dchunk wte[v0:v0+w) (a split of the V reduction, summed in chunk order
 *    into an (N,C) buffer: cheap, N·C per chunk).
 * Chunking rows instead would split dwte's K = N reduction and read and
 * write the whole (V,C) dwte once per chunk (~300 MB for gpt2-124m).
 * With one chunk (V <= head_cols: tiny, shakespeare-char) every call is
 * the unchunked one: the same kernels, the same bits as before chunking.
 * The per-chunk loops between the GEMMs (copies, log-sum-exp, dlogits) are
 * serial on purpose: an OpenMP region there leaves its threads spinning
 * while OpenBLAS's own threads run the next chunk's GEMM; with 50 chunks
 * that made the gpt2-124m fp32 head forward 4.6x slower. Serial, they
 * cost ~N·V exponentials per pass, small next to the GEMMs' 2·N·V·C FLOPs.
 *
 * Vocabulary-parallel (tp > 1, Megatron's parallel cross-entropy): each
 * rank holds Vl = Vp/tp rows of wte (V padded to a multiple of tp; the
 * padding rows are zero and their logits masked out). A row's log-sum-exp
 * over this rank's columns and its target's logit (on the rank that holds
 * the target) are gathered from every rank and merged in rank order, so
 * every rank computes the same loss; dlogits then need no communication,
 * and dlnf's partial sums are reduced by f's backward.
 */

/* Columns of local chunk [v0, v0+w) that are real tokens (< V), not padding. */
static int valid_cols(const dt_gpt *m, int v0, int w) {
    long long g = (long long)m->d.r * m->d.Vl + v0, left = (long long)m->d.V - g;
    return left <= 0 ? 0 : left < w ? (int)left : w;
}

/* log(e^a + e^b) for log-sum-exps that may be -inf (no columns). */
static float lse_merge(float a, float b) {
    if (a == -INFINITY)
        return b;
    if (b == -INFINITY)
        return a;
    float hi = a > b ? a : b;
    return hi + log1pf(expf(-fabsf(a - b)));
}

/* The chunk [v0, v0+w) of the logits of the N rows `in` (the gathered ln_f
 * output, or the last positions' rows), into out (N,w). */
static dt_status head_gemm(dt_gpt *m, float *out, const void *in, int N, int v0, int w) {
    const int C = m->d.C;
    size_t off = m->info[m->wte].offset + (size_t)v0 * C;
    if (m->opt.precision == DT_PRECISION_FP32) {
        PROF(m, PROF_PRODUCTS, dt_matmul_forward(out, in, m->params + off, NULL, N, C, w));
        return DT_OK;
    }
    PROF(m, PROF_PRODUCTS,
         DT_CHECK(
             dt_linear16_forward(m->opt.precision, out, true, in, m->w16 + off, NULL, N, C, w)));
    return DT_OK;
}

/* Tensor parallelism: every rank's (lse, target logit) per row merged into
 * the loss rows. A row's target lives on rank target / Vl. */
static dt_status merge_ce(dt_gpt *m, int N) {
    const dt_tp_regions *g = m->opt.part.regions;
    const int tp = m->d.tp, Vl = m->d.Vl;
    for (int i = 0; i < N; i++) {
        m->ce_stats[2 * i] = m->s->ce_lse[i];
        m->ce_stats[2 * i + 1] = m->s->losses[i];
    }
    REGION(m, g->gather_stats(g->ctx, m->ce_stats, m->ce_all, 2 * (size_t)N));
    for (int i = 0; i < N; i++) {
        float lse = -INFINITY;
        for (int r = 0; r < tp; r++)
            lse = lse_merge(lse, m->ce_all[((size_t)r * N + i) * 2]);
        int owner = m->s->targets[i] / Vl;
        m->s->ce_lse[i] = lse;
        m->s->losses[i] = m->ce_all[((size_t)owner * N + i) * 2 + 1];
    }
    return DT_OK;
}

/* Tensor parallelism: the last positions' logits of every rank's shard
 * into last_all (B,Vp), padding masked: what a sampler reads. */
static dt_status gather_last(dt_gpt *m) {
    const dt_tp_regions *g = m->opt.part.regions;
    const size_t B = (size_t)m->s->B, Vl = (size_t)m->d.Vl, Vp = (size_t)m->d.Vp;
    REGION(m, g->gather_stats(g->ctx, m->last, m->ce_all, B * Vl));
    for (size_t r = 0; r < (size_t)m->d.tp; r++)
        for (size_t b = 0; b < B; b++)
            memcpy(m->last_all + b * Vp + r * Vl, m->ce_all + (r * B + b) * Vl, Vl * sizeof(float));
    for (size_t b = 0; b < B; b++)
        for (size_t v = (size_t)m->d.V; v < Vp; v++)
            m->last_all[b * Vp + v] = -INFINITY;
    return DT_OK;
}

/* Forward of the head on x (N,C), the gathered ln_f output: logits chunk
 * by chunk; with targets the loss rows (ce_lse, losses) and their mean.
 * Without recomputation the full logits are kept; with it (and with
 * tensor parallelism), the last positions' logits. */
static dt_status head_forward(dt_gpt *m, const void *x, bool targets, float *mean_loss) {
    const int B = m->s->B, T = m->s->T, N = B * T, Vl = m->d.Vl, hc = m->head_cols;
    const bool tp1 = m->d.tp == 1;
    *mean_loss = 0.0f;
    if (tp1 && hc >= Vl) { /* one chunk: the unchunked computation */
        DT_CHECK(fetch_w(m, wte_rows(m, 0, Vl)));
        dt_status st = head_gemm(m, m->s->chunk, x, N, 0, Vl);
        release_w(m, wte_rows(m, 0, Vl));
        DT_CHECK(st);
        if (targets)
            *mean_loss = dt_crossentropy_forward(m->s->losses, m->s->ce_lse, m->s->chunk,
                                                 m->s->targets, N, Vl);
        for (int b = 0; m->last && b < B; b++)
            memcpy(m->last + (size_t)b * Vl, m->s->chunk + ((size_t)b * T + T - 1) * Vl,
                   sizeof(float) * Vl);
        return DT_OK;
    }
    const int vbase = m->d.r * Vl;
    for (int i = 0; targets && i < N; i++) {
        m->s->ce_lse[i] = -INFINITY;
        m->s->losses[i] = 0.0f; /* the target's logit, if this rank holds it */
    }
    /* With parameter hooks each chunk's rows of wte are fetched, the
     * next chunk's prefetched, and released after its product. */
    DT_CHECK(fetch_w(m, wte_rows(m, 0, Vl < hc ? Vl : hc)));
    for (int v0 = 0; v0 < Vl; v0 += hc) {
        const int w = Vl - v0 < hc ? Vl - v0 : hc, wv = valid_cols(m, v0, w);
        const int v1 = v0 + w, wn = Vl - v1 < hc ? Vl - v1 : hc;
        float *c = m->s->chunk;
        if (v1 < Vl)
            prefetch_w(m, wte_rows(m, v1, wn));
        DT_CHECK(head_gemm(m, c, x, N, v0, w));
        if (v1 < Vl)
            DT_CHECK(fetch_w(m, wte_rows(m, v1, wn)));
        release_w(m, wte_rows(m, v0, w));
        for (int i = 0; wv < w && i < N; i++) /* mask the padding */
            for (int j = wv; j < w; j++)
                c[(size_t)i * w + j] = -INFINITY;
        if (m->s->logits)
            for (int i = 0; i < N; i++)
                memcpy(m->s->logits + (size_t)i * Vl + v0, c + (size_t)i * w, sizeof(float) * w);
        for (int b = 0; m->last && b < B; b++)
            memcpy(m->last + (size_t)b * Vl + v0, c + ((size_t)b * T + T - 1) * w,
                   sizeof(float) * w);
        if (!targets || wv == 0)
            continue;
        /* ce_lse: the running log-sum-exp; losses: the target's logit. */
        for (int i = 0; i < N; i++) {
            float l = dt__lse(c + (size_t)i * w, (size_t)wv);
            m->s->ce_lse[i] = v0 == 0 ? l : lse_merge(m->s->ce_lse[i], l);
            int t = m->s->targets[i] - vbase - v0;
            if (t >= 0 && t < wv)
                m->s->losses[i] = c[(size_t)i * w + t];
        }
    }
    if (!targets)
        return DT_OK;
    if (!tp1)
        DT_CHECK(merge_ce(m, N));
    double total = 0.0;
    for (int i = 0; i < N; i++) {
        m->s->losses[i] = m->s->ce_lse[i] - m->s->losses[i];
        total += m->s->losses[i];
    }
    *mean_loss = (float)(total / N);
    return DT_OK;
}

dt_status dt_gpt_forward(dt_gpt *m, const int32_t *inputs, const int32_t *targets, int B, int T,
                         float *mean_loss) {
    return dt_gpt_forward_stage(m, 0, 0, inputs, NULL, targets, B, T, mean_loss);
}

static dt_status embed_forward_pieces(dt_gpt *m) {
    const int B = m->s->B, T = m->s->T, C = m->d.C, N = B * T, V = m->d.Vl, hc = m->head_cols;
    const float *wte = m->params + m->info[m->wte].offset,
                *wpe = m->params + m->info[m->wpe].offset;
    float *out = m->s->encoded;
    DT_CHECK(fetch(m, wte_rows(m, 0, V < hc ? V : hc)));
    for (int v0 = 0; v0 < V; v0 += hc) {
        const int w = V - v0 < hc ? V - v0 : hc, v1 = v0 + w, wn = V - v1 < hc ? V - v1 : hc;
        if (v1 < V)
            prefetch(m, wte_rows(m, v1, wn));
        for (int i = 0; i < N; i++) {
            const int t = m->s->tokens[i];
            if (t >= v0 && t < v1)
                memcpy(out + (size_t)i * C, wte + (size_t)t * C, sizeof(float) * C);
        }
        if (v1 < V)
            DT_CHECK(fetch(m, wte_rows(m, v1, wn)));
        release(m, wte_rows(m, v0, w));
    }
    for (int i = 0; i < N; i++) {
        const float *pe = wpe + (size_t)(i % T) * C; // (C)
        float *o = out + (size_t)i * C;
        for (int c = 0; c < C; c++)
            o[c] += pe[c];
    }
    return DT_OK;
}

/* Forward of the current slot's blocks from x, with the parameter hooks:
 * block l reads its own parameters and (fp32: the next block's ln_1, or
 * ln_f after the chunk's last block, fused into its residual add) those of
 * the next unit, so each unit is fetched once, one block ahead, and the one
 * after that prefetched; ln_f stays fetched for the head. */
static dt_status blocks_forward(dt_gpt *m, const float *x, bool fused) {
    gpt_slot *s = m->s;
    DT_CHECK(fetch_w(m, block_unit(m, s->L0)));
    for (int l = s->L0; l < s->L1; l++) {
        if (l + 1 < s->L1)
            DT_CHECK(fetch_w(m, block_unit(m, l + 1)));
        else if (s->head)
            DT_CHECK(fetch(m, other_unit(m, U_LNF)));
        if (l + 2 < s->L1)
            prefetch_w(m, block_unit(m, l + 2));
        /* fp32: block l - 1 wrote block l's ln_1 (and the last block ln_f). */
        uint64_t tb = dt_trace_begin();
        DT_CHECK(dt__gpt_block_forward(m, l, x, true, fused && l > s->L0));
        dt_trace_end(tb, DT_TRACE_COMPUTE, "block_fwd", l, 0, 0);
        release_w(m, block_unit(m, l));
        x = acts_of(m, l)->res3;
    }
    return DT_OK;
}

/* Make chunk's `slot` the current one. */
static dt_status use_slot(dt_gpt *m, int chunk, int slot) {
    if (chunk < 0 || chunk >= m->d.nch)
        return dt_error_set(DT_ERR_INVALID, "chunk %d: the model part has %d chunk(s)", chunk,
                            m->d.nch);
    if (slot < 0 || slot >= m->nslots)
        return dt_error_set(DT_ERR_INVALID, "slot %d: the model was created with %d slot(s)", slot,
                            m->nslots);
    m->s = &m->slots[(size_t)chunk * m->nslots + slot];
    return DT_OK;
}

/* dst (B,Tl) = this rank's tokens of src (B,T): all of them without
 * context parallelism. */
static void take_tokens(const dt_gpt *m, int32_t *dst, const int32_t *src, int B, int T) {
    const int Tl = T / m->d.cp;
    for (int b = 0; b < B; b++)
        for (int i = 0; i < Tl; i++)
            dst[(size_t)b * Tl + i] = src[(size_t)b * T + cp_position(&m->d, Tl, i)];
}

/* Tokens must be in [0, V). */
static dt_status check_tokens(const int32_t *tok, int N, int V, const char *what) {
    for (int i = 0; tok && i < N; i++)
        if (tok[i] < 0 || tok[i] >= V)
            return dt_error_set(DT_ERR_INVALID, "%s token %d at position %d is outside [0, %d)",
                                what, tok[i], i, V);
    return DT_OK;
}

/* The head of a forward: ln_f (16-bit: here; fp32: fused into the last
 * block), the logits and, with targets, the loss. */
static dt_status head_pass(dt_gpt *m, const float *x, const int32_t *targets, int B, int T,
                           float *mean_loss) {
    const gpt_dims *d = &m->d;
    const int C = d->C;
    const dt_precision pr = m->opt.precision;
    const size_t ns = rows_here(m);
    const float *p = m->params;
    const size_t lnw = m->info[m->lnf].offset, lnb = m->info[m->lnf + 1].offset;
    if (pr != DT_PRECISION_FP32)
        PROF(m, PROF_ELEMENTWISE,
             dt_layernorm16_forward(pr, m->s->lnf_out, m->s->lnf_mean, m->s->lnf_rstd, x, p + lnw,
                                    p + lnb, (int)ns, C));
    const void *xf;
    DT_CHECK(region_in_forward(m, m->s->lnf_out, &xf, dt__act_size(pr)));
    if (!targets && !m->s->logits) {
        /* Recomputation, no loss: only the last positions' logits. */
        size_t row = (size_t)C * dt__act_size(pr);
        for (int b = 0; b < B; b++)
            memcpy((char *)m->lnf_last + (size_t)b * row,
                   (const char *)xf + ((size_t)b * T + (size_t)T - 1) * row, row);
        DT_CHECK(fetch_w(m, wte_rows(m, 0, d->Vl)));
        dt_status st = head_gemm(m, m->last, m->lnf_last, B, 0, d->Vl);
        release_w(m, wte_rows(m, 0, d->Vl));
        DT_CHECK(st);
        return d->tp > 1 ? gather_last(m) : DT_OK;
    }
    if (targets)
        take_tokens(m, m->s->targets, targets, B, T * d->cp);
    float loss;
    DT_CHECK(head_forward(m, xf, targets != NULL, &loss));
    if (!targets)
        return d->tp > 1 ? gather_last(m) : DT_OK;
    if (d->cp > 1) { /* the mean over every rank's tokens (equal counts) */
        const dt_cp_regions *g = m->opt.part.cp_regions;
        REGION(m, g->sum(g->ctx, &loss, 1));
        loss /= (float)d->cp;
    }
    if (mean_loss)
        *mean_loss = loss;
    m->s->have_targets = true;
    return DT_OK;
}

dt_status dt_gpt_forward_stage(dt_gpt *m, int chunk, int slot, const int32_t *inputs,
                               const float *x_in, const int32_t *targets, int B, int T,
                               float *mean_loss) {
    const gpt_dims *d = &m->d;
    DT_CHECK(use_slot(m, chunk, slot));
    gpt_slot *s = m->s;
    if (s->pending_w)
        return dt_error_set(DT_ERR_INVALID,
                            "forward into chunk %d's slot %d, whose weight gradients are pending "
                            "(dt_gpt_weight_stage)",
                            chunk, slot);
    const int C = d->C, V = d->V;
    const dt_precision pr = m->opt.precision;
    if (B < 1 || B > m->max_B || T < 1 || T > m->max_T)
        return dt_error_set(
            DT_ERR_INVALID,
            "forward with B=%d T=%d, but the model was created for B <= %d, T <= %d", B, T,
            m->max_B, m->max_T);
    const int split = d->cp > 1 && d->cpm == DT_CP_RING ? 2 * d->cp : d->cp;
    if (T % split != 0)
        return dt_error_set(DT_ERR_INVALID,
                            "forward with T=%d: context parallelism (%s, cp %d) needs a multiple "
                            "of %d",
                            T, dt_cp_mode_name(d->cpm), d->cp, split);
    if (d->cp > 1 && !targets && s->head)
        return dt_error_set(DT_ERR_UNSUPPORTED,
                            "forward without targets (sampling) of a context-parallel model part: "
                            "the last positions are on one rank; sample from the saved model");
    if (d->sp && (T / d->cp) % d->tp != 0)
        return dt_error_set(DT_ERR_INVALID,
                            "forward with T=%d: sequence parallelism needs a multiple of tp %d%s",
                            T, d->tp, d->cp > 1 ? " tokens per context-parallel rank" : "");
    if (s->embeds ? !inputs : !x_in)
        return dt_error_set(DT_ERR_INVALID, "forward of a model part: %s",
                            s->embeds ? "the first stage embeds tokens (inputs is NULL)"
                                      : "a later stage takes the residual stream (x_in is NULL)");
    DT_CHECK(check_tokens(s->embeds ? inputs : NULL, B * T, V, "input"));
    DT_CHECK(check_tokens(s->head ? targets : NULL, B * T, V, "target"));
    s->B = B;
    s->T = T / d->cp; /* this rank's tokens of each sequence */
    s->have_targets = false;
    const size_t ns = rows_here(m);
    if (pr != DT_PRECISION_FP32 && !m->hooks.fetch && /* with hooks: per unit, in fetch() */
        m->w16_state != DT_GPT_W16_CURRENT) {
        uint64_t tc = dt_trace_begin();
        PROF(m, PROF_CASTS, cast_weights(m));
        dt_trace_end(tc, DT_TRACE_CAST, "cast_weights", -1, m->nparams, 6 * m->nparams);
        if (m->w16_state == DT_GPT_W16_STALE)
            m->w16_state = DT_GPT_W16_CURRENT;
    }
    prefetch_w(m, block_unit(m, s->L0));
    if (s->embeds && m->hooks.fetch && d->tp == 1 && d->cp == 1) {
        take_tokens(m, s->tokens, inputs, B, T);
        DT_CHECK(fetch(m, other_unit(m, U_WPE)));
        DT_CHECK(embed_forward_pieces(m));
        release(m, other_unit(m, U_WPE));
    } else if (s->embeds) {
        take_tokens(m, s->tokens, inputs, B, T);
        DT_CHECK(fetch(m, other_unit(m, U_WTE)));
        DT_CHECK(fetch(m, other_unit(m, U_WPE)));
        uint64_t te = dt_trace_begin();
        DT_CHECK(embed_forward(m));
        dt_trace_end(te, DT_TRACE_COMPUTE, "embed_fwd", -1, 0, 0);
        release(m, other_unit(m, U_WTE));
        release(m, other_unit(m, U_WPE));
    } else if (x_in != s->encoded) {
        memcpy(s->encoded, x_in, sizeof(float) * ns * C);
    }
    DT_CHECK(blocks_forward(m, s->encoded, pr == DT_PRECISION_FP32));
    const float *x = acts_of(m, s->L1 - 1)->res3; /* the chunk's output */
    if (!s->head) {
        s->have_targets = true; /* a stage without the head differentiates its output */
        return DT_OK;
    }
    /* The tied head fetches its rows of wte chunk by chunk; ln_f was fetched. */
    uint64_t th = dt_trace_begin();
    dt_status hst = head_pass(m, x, targets, B, s->T, mean_loss);
    dt_trace_end(th, DT_TRACE_COMPUTE, "head_fwd", -1, 0, 0);
    release(m, other_unit(m, U_LNF));
    return hst;
}

/* ------------------------------------------------------------------------ */
/* Backward                                                                 */
/* ------------------------------------------------------------------------ */

/* bf16/fp16: round a dlogits chunk (N,V), fp32, to a16 packed at
 * the front of the same memory, without a second (N,V) buffer. Row 0's
 * destination overlaps its source, so it goes through row16. After that,
 * rows [r, 2r) are written to bytes [2rV, 4rV) and read from [4rV, 8rV):
 * destination and source of a call never overlap, and what a call
 * overwrites are the sources of rows < r, already converted. */
static const uint16_t *head_dout16(dt_gpt *m, float *buf, size_t N, size_t V) {
    const dt_precision pr = m->opt.precision;
    const float *in = buf;
    uint16_t *out = (uint16_t *)(void *)buf;
    PROF(m, PROF_CASTS, dt_act16_from_f32(pr, m->row16, in, V));
    memcpy(out, m->row16, V * sizeof(uint16_t));
    for (size_t r = 1; r < N; r *= 2) {
        size_t e = 2 * r < N ? 2 * r : N;
        PROF(m, PROF_CASTS, dt_act16_from_f32(pr, out + r * V, in + r * V, (e - r) * V));
    }
    return out;
}

/* dlogits of chunk x (N,w) = local columns [v0, v0+w), in place: scale *
 * (softmax - onehot), with dt_crossentropy_backward's row kernel; padding
 * columns get 0. */
static void chunk_dlogits(dt_gpt *m, float *x, int N, int v0, int w, float scale) {
    const int wv = valid_cols(m, v0, w), vbase = m->d.r * m->d.Vl;
    for (int i = 0; i < N; i++) {
        float *d = x + (size_t)i * w;
        dt__exp_shift_scale(d, d, m->s->ce_lse[i], scale, (size_t)wv);
        memset(d + wv, 0, sizeof(float) * (size_t)(w - wv));
        int t = m->s->targets[i] - vbase - v0;
        if (t >= 0 && t < wv)
            d[t] -= scale;
    }
}

/* Backward of the head, chunk by chunk, on its input x (N,C): m->dbuf
 * receives this rank's dlnf (N,C) and dwte is written per mode. A chunk's
 * logits come from the full logits (no recomputation) or are recomputed
 * by the forward's GEMM call. dfch, idle until the blocks' backward, holds
 * one chunk's part of dlnf. */
static dt_status head_backward(dt_gpt *m, const void *x, float scale, dt_grad_mode mode) {
    const int N = m->s->B * m->s->T, Vl = m->d.Vl, C = m->d.C, hc = m->head_cols;
    const dt_precision pr = m->opt.precision;
    const size_t wte = m->info[m->wte].offset;
    DT_CHECK(fetch_w(m, wte_rows(m, 0, Vl < hc ? Vl : hc))); /* the chunks' rows, as forward */
    for (int v0 = 0; v0 < Vl; v0 += hc) {
        const int w = Vl - v0 < hc ? Vl - v0 : hc;
        const int v1 = v0 + w, wn = Vl - v1 < hc ? Vl - v1 : hc;
        float *c = m->s->chunk, *dst = v0 == 0 ? m->dbuf : m->dfch;
        if (v1 < Vl)
            prefetch_w(m, wte_rows(m, v1, wn));
        if (!m->s->logits)
            DT_CHECK(head_gemm(m, c, x, N, v0, w));
        else if (c != m->s->logits)
            for (int i = 0; i < N; i++)
                memcpy(c + (size_t)i * w, m->s->logits + (size_t)i * Vl + v0, sizeof(float) * w);
        if (w == Vl && m->d.tp == 1)
            PROF(m, PROF_ELEMENTWISE,
                 dt_crossentropy_backward(c, c, m->s->ce_lse, m->s->targets, scale, N, Vl));
        else
            chunk_dlogits(m, c, N, v0, w, scale);
        /* dlnf (N,C) (+)= dchunk @ wte[v0:v0+w); dwte[v0:v0+w) += dchunk^T @ lnf. */
        if (pr == DT_PRECISION_FP32)
            PROF(m, PROF_PRODUCTS,
                 dt_matmul_backward_mode(dst, m->grads + wte + (size_t)v0 * C, NULL, c, x,
                                         m->params + wte + (size_t)v0 * C, N, C, w, mode));
        else
            PROF(m, PROF_PRODUCTS,
                 DT_CHECK(dt_linear16_backward_mode(pr, dst, m->grads + wte + (size_t)v0 * C, NULL,
                                                    head_dout16(m, c, (size_t)N, (size_t)w), x,
                                                    m->w16 + wte + (size_t)v0 * C, N, C, w, mode)));
        if (v1 < Vl)
            DT_CHECK(fetch_w(m, wte_rows(m, v1, wn)));
        release_w(m, wte_rows(m, v0, w));
        if (v0 > 0)
            for (size_t k = 0; k < (size_t)N * C; k++)
                m->dbuf[k] += dst[k];
    }
    return DT_OK;
}

/* A LayerNorm's backward: dinp (+=; NULL: skip) and, with `weights`, its
 * weight and bias gradients into gw, gb per mode (under sequence
 * parallelism into `stage` (2C, OVERWRITE) instead, to be summed over the
 * group by the caller). */
static void ln_backward(dt_gpt *m, float *dinp, bool weights, float *gw, float *gb, float *stage,
                        const float *dout, const float *inp, const float *w, const float *mean,
                        const float *rstd, dt_grad_mode mode) {
    const int C = m->d.C, Ns = (int)rows_here(m);
    if (!weights)
        PROF(m, PROF_ELEMENTWISE,
             dt_layernorm_backward_mode(dinp, NULL, NULL, dout, inp, w, mean, rstd, Ns, C, mode));
    else if (m->d.sp)
        PROF(m, PROF_ELEMENTWISE,
             dt_layernorm_backward_mode(dinp, stage, stage + C, dout, inp, w, mean, rstd, Ns, C,
                                        DT_GRAD_OVERWRITE));
    else
        PROF(m, PROF_ELEMENTWISE,
             dt_layernorm_backward_mode(dinp, gw, gb, dout, inp, w, mean, rstd, Ns, C, mode));
}

/* The gradient of this block's output, as the row-parallel c_proj layers
 * read it: dres itself, or under SP all N rows gathered (fp32 into
 * m->gathered; 16-bit rounded into dres16 and gathered there). */
static dt_status dout_rows(dt_gpt *m, const void **dout) {
    const dt_precision pr = m->opt.precision;
    const size_t ns = rows_here(m) * (size_t)m->d.C, off = m->d.sp ? (size_t)m->d.r * ns : 0;
    if (pr == DT_PRECISION_FP32) {
        *dout = m->dres;
        if (!m->d.sp)
            return DT_OK;
        memcpy((float *)m->gathered + off, m->dres, ns * sizeof(float));
        *dout = m->gathered;
        return region_out_backward(m, m->gathered, 4);
    }
    PROF(m, PROF_CASTS, dt_act16_from_f32(pr, m->dres16 + off, m->dres, ns));
    *dout = m->dres16;
    return region_out_backward(m, m->dres16, 2);
}

/* The linear layer k of block l reports its input and output gradient
 * (dt_gpt_set_linear_stats; fp32 only, so both are floats). */
static void linear_stats(dt_gpt *m, bool weights, int l, int k, const void *x, const void *dy,
                         int N, int in, int out) {
    if (m->lstats && weights)
        m->lstats(m->lstats_user, (size_t)(bt(m, m->params, l, k) - m->params), x, dy, N, in, out,
                  m->lstats_scale);
}

/* Block l's backward: m->dres holds d(res3) on entry and d(x) on return.
 * With `weights` the parameter gradients are written into m->grads per
 * mode as they go; without (a zero-bubble B) the gradients they are made
 * of are kept in the slot's block_wgrad for block_weights instead. */
static dt_status block_backward(dt_gpt *m, int l, const float *x, dt_grad_mode mode, bool weights) {
    const gpt_dims *d = &m->d;
    const int B = m->s->B, T = m->s->T, C = d->C, N = B * T, Ns = (int)rows_here(m);
    const int Ct = d->Ct, NHt = d->NHt, Ft = d->Ft;
    const dt_precision pr = m->opt.precision;
    const size_t A = dt__act_size(pr);
    float *p = m->params, *g = m->grads, *dln, *stage = m->gscratch;
    const void *dout, *in = NULL;
    const block_acts *a = acts_of(m, l);
    const block_wgrad *w = weights ? NULL : &m->s->wg[l - m->s->L0];
#define G(k) (weights ? bt(m, g, l, (k)) : NULL)
    /* MLP: res3 = res2 + c_proj(gelu(c_fc(ln_2(res2)))). */
    DT_CHECK(dout_rows(m, &dout));
    if (w)
        memcpy(w->d_fcproj, dout, (size_t)N * C * A);
    if (pr == DT_PRECISION_FP32) {
        float *dfc = w ? (float *)w->d_fc : m->dfch;
        PROF(m, PROF_PRODUCTS,
             dt_matmul_backward_mode(m->dfch, G(P_FCPROJW), G(P_FCPROJB), dout, a->fch_gelu,
                                     bt(m, p, l, P_FCPROJW), N, Ft, C, mode));
        linear_stats(m, weights, l, P_FCPROJW, a->fch_gelu, dout, N, Ft, C);
        PROF(m, PROF_ELEMENTWISE,
             dt_gelu_bias_backward(dfc, a->fch, bt(m, p, l, P_FCB), m->dfch, N, Ft));
        if (weights)
            DT_CHECK(region_in_forward(m, a->ln2, &in, 4)); /* SP: gathered again */
        PROF(m, PROF_PRODUCTS,
             dt_matmul_backward_mode(m->dbuf, G(P_FCW), G(P_FCB), dfc, in, bt(m, p, l, P_FCW), N, C,
                                     Ft, mode));
        linear_stats(m, weights, l, P_FCW, in, dfc, N, C, Ft);
    } else {
        PROF(m, PROF_PRODUCTS,
             DT_CHECK(dt_linear16_backward_mode(pr, m->dfch, G(P_FCPROJW), G(P_FCPROJB), dout,
                                                a->fch_gelu, wt(m, l, P_FCPROJW), N, Ft, C, mode)));
        /* The GELU output was only needed for c_proj's weight gradient: its
         * memory now takes the rounded gradient of the c_fc output (split:
         * the slot keeps it, the weight gradient still needs the output). */
        uint16_t *dfch16 = w ? w->d_fc : a->fch_gelu;
        PROF(m, PROF_ELEMENTWISE, dt_gelu16_backward(pr, dfch16, a->fch, m->dfch, (size_t)N * Ft));
        if (weights)
            DT_CHECK(region_in_forward(m, a->ln2, &in, 2));
        PROF(m, PROF_PRODUCTS,
             DT_CHECK(dt_linear16_backward_mode(pr, m->dbuf, G(P_FCW), G(P_FCB), dfch16, in,
                                                wt(m, l, P_FCW), N, C, Ft, mode)));
    }
    DT_CHECK(region_in_backward(m, m->dbuf, &dln));
    if (w)
        memcpy(w->d_ln2, dln, (size_t)Ns * C * sizeof(float));
    ln_backward(m, m->dres, weights, G(P_LN2W), G(P_LN2B), stage + 2 * C, dln, a->res2,
                bt(m, p, l, P_LN2W), a->ln2_mean, a->ln2_rstd, mode);
    /* m->dres now holds d(res2). Attention: res2 = x + c_proj(attn(c_attn(ln_1(x)))). */
    DT_CHECK(dout_rows(m, &dout));
    if (w)
        memcpy(w->d_attproj, dout, (size_t)N * C * A);
    if (pr == DT_PRECISION_FP32) {
        float *dqkv = w ? (float *)w->d_qkv : m->dqkv;
        PROF(m, PROF_PRODUCTS,
             dt_matmul_backward_mode(m->dbuf, G(P_ATTPROJW), G(P_ATTPROJB), dout, a->atty,
                                     bt(m, p, l, P_ATTPROJW), N, Ct, C, mode));
        linear_stats(m, weights, l, P_ATTPROJW, a->atty, dout, N, Ct, C);
        if (d->cp == 1)
            PROF(m, PROF_ATTENTION,
                 dt_attention_backward(dqkv, m->dbuf, a->qkv, a->atty, a->att_lse, B, T, Ct, NHt));
        else
            PROF(m, PROF_ATTENTION, DT_CHECK(dt__gpt_cp_attention_backward(m, a, m->dbuf, dqkv)));
        if (weights)
            DT_CHECK(region_in_forward(m, a->ln1, &in, 4));
        PROF(m, PROF_PRODUCTS,
             dt_matmul_backward_mode(m->dbuf, G(P_QKVW), G(P_QKVB), dqkv, in, bt(m, p, l, P_QKVW),
                                     N, C, 3 * Ct, mode));
        linear_stats(m, weights, l, P_QKVW, in, dqkv, N, C, 3 * Ct);
    } else {
        uint16_t *dqkv = w ? w->d_qkv : m->dqkv;
        PROF(m, PROF_PRODUCTS,
             DT_CHECK(dt_linear16_backward_mode(pr, m->dbuf, G(P_ATTPROJW), G(P_ATTPROJB), dout,
                                                a->atty, wt(m, l, P_ATTPROJW), N, Ct, C, mode)));
        if (d->cp == 1)
            PROF(m, PROF_ATTENTION,
                 dt_attention16_backward(pr, dqkv, m->dbuf, a->qkv, a->atty, a->att_lse, B, T, Ct,
                                         NHt, m->attn_work));
        else
            PROF(m, PROF_ATTENTION, DT_CHECK(dt__gpt_cp_attention_backward(m, a, m->dbuf, dqkv)));
        if (weights)
            DT_CHECK(region_in_forward(m, a->ln1, &in, 2));
        PROF(m, PROF_PRODUCTS,
             DT_CHECK(dt_linear16_backward_mode(pr, m->dbuf, G(P_QKVW), G(P_QKVB), dqkv, in,
                                                wt(m, l, P_QKVW), N, C, 3 * Ct, mode)));
    }
    DT_CHECK(region_in_backward(m, m->dbuf, &dln));
    if (w)
        memcpy(w->d_ln1, dln, (size_t)Ns * C * sizeof(float));
    ln_backward(m, m->dres, weights, G(P_LN1W), G(P_LN1B), stage, dln, x, bt(m, p, l, P_LN1W),
                a->ln1_mean, a->ln1_rstd, mode);
    if (weights && d->sp) { /* ln_1 and ln_2 (adjacent in the buffer) summed over the group */
        DT_CHECK(sum_partial(m, bt(m, g, l, P_LN1W), stage, 2 * (size_t)C, mode));
        DT_CHECK(sum_partial(m, bt(m, g, l, P_LN2W), stage + 2 * C, 2 * (size_t)C, mode));
    }
#undef G
    return DT_OK;
}

/* Block l's weight gradients from what its split backward kept: the calls
 * block_backward makes with `weights`, in its order, without the input
 * gradients (the kernels compute the two parts independently, so these
 * are the bits of one backward). */
static dt_status block_weights(dt_gpt *m, int l, const float *x, dt_grad_mode mode) {
    const gpt_dims *d = &m->d;
    const int N = m->s->B * m->s->T, C = d->C, Ct = d->Ct, Ft = d->Ft;
    const dt_precision pr = m->opt.precision;
    float *p = m->params, *g = m->grads, *stage = m->gscratch;
    const void *in;
    const block_acts *a = acts_of(m, l);
    const block_wgrad *w = &m->s->wg[l - m->s->L0];
    const size_t A = dt__act_size(pr);
    if (pr == DT_PRECISION_FP32) {
        PROF(m, PROF_PRODUCTS,
             dt_matmul_backward_mode(NULL, bt(m, g, l, P_FCPROJW), bt(m, g, l, P_FCPROJB),
                                     w->d_fcproj, a->fch_gelu, NULL, N, Ft, C, mode));
        DT_CHECK(region_in_forward(m, a->ln2, &in, 4));
        PROF(m, PROF_PRODUCTS,
             dt_matmul_backward_mode(NULL, bt(m, g, l, P_FCW), bt(m, g, l, P_FCB), w->d_fc, in,
                                     NULL, N, C, Ft, mode));
    } else {
        PROF(m, PROF_PRODUCTS,
             DT_CHECK(dt_linear16_backward_mode(pr, NULL, bt(m, g, l, P_FCPROJW),
                                                bt(m, g, l, P_FCPROJB), w->d_fcproj, a->fch_gelu,
                                                NULL, N, Ft, C, mode)));
        DT_CHECK(region_in_forward(m, a->ln2, &in, A));
        PROF(m, PROF_PRODUCTS,
             DT_CHECK(dt_linear16_backward_mode(pr, NULL, bt(m, g, l, P_FCW), bt(m, g, l, P_FCB),
                                                w->d_fc, in, NULL, N, C, Ft, mode)));
    }
    ln_backward(m, NULL, true, bt(m, g, l, P_LN2W), bt(m, g, l, P_LN2B), stage + 2 * C, w->d_ln2,
                a->res2, bt(m, p, l, P_LN2W), a->ln2_mean, a->ln2_rstd, mode);
    if (pr == DT_PRECISION_FP32) {
        PROF(m, PROF_PRODUCTS,
             dt_matmul_backward_mode(NULL, bt(m, g, l, P_ATTPROJW), bt(m, g, l, P_ATTPROJB),
                                     w->d_attproj, a->atty, NULL, N, Ct, C, mode));
        DT_CHECK(region_in_forward(m, a->ln1, &in, 4));
        PROF(m, PROF_PRODUCTS,
             dt_matmul_backward_mode(NULL, bt(m, g, l, P_QKVW), bt(m, g, l, P_QKVB), w->d_qkv, in,
                                     NULL, N, C, 3 * Ct, mode));
    } else {
        PROF(m, PROF_PRODUCTS,
             DT_CHECK(dt_linear16_backward_mode(pr, NULL, bt(m, g, l, P_ATTPROJW),
                                                bt(m, g, l, P_ATTPROJB), w->d_attproj, a->atty,
                                                NULL, N, Ct, C, mode)));
        DT_CHECK(region_in_forward(m, a->ln1, &in, A));
        PROF(m, PROF_PRODUCTS,
             DT_CHECK(dt_linear16_backward_mode(pr, NULL, bt(m, g, l, P_QKVW), bt(m, g, l, P_QKVB),
                                                w->d_qkv, in, NULL, N, C, 3 * Ct, mode)));
    }
    ln_backward(m, NULL, true, bt(m, g, l, P_LN1W), bt(m, g, l, P_LN1B), stage, w->d_ln1, x,
                bt(m, p, l, P_LN1W), a->ln1_mean, a->ln1_rstd, mode);
    if (d->sp) {
        DT_CHECK(sum_partial(m, bt(m, g, l, P_LN1W), stage, 2 * (size_t)C, mode));
        DT_CHECK(sum_partial(m, bt(m, g, l, P_LN2W), stage + 2 * C, 2 * (size_t)C, mode));
    }
    return DT_OK;
}

/* The embeddings' backward from m->dres (Ns,C), the gradient of the first
 * block's input. wte: the head (when this part has it) wrote its gradient
 * per mode and the lookup adds to it; alone (a first pipeline stage) the
 * lookup writes it per mode. wpe: rows [0,T) per mode, rows past T zero
 * when overwriting (no kernel writes them). */
static dt_status embed_backward(dt_gpt *m, dt_grad_mode mode) {
    const int B = m->s->B, T = m->s->T, C = m->d.C;
    float *dwte = m->grads + m->info[m->wte].offset, *dwpe = m->grads + m->info[m->wpe].offset;
    /* wpe rows of every rank's positions (Tg: the whole sequence) */
    const size_t Tg = (size_t)T * m->d.cp;
    const size_t rows = (size_t)m->d.Vl, tail = (size_t)m->cfg.max_seq - Tg;
    if (!m->d.last && mode == DT_GRAD_OVERWRITE)
        memset(dwte, 0, rows * C * sizeof(float));
    if (m->d.tp == 1 && m->d.cp == 1) {
        PROF(m, PROF_ELEMENTWISE,
             dt_embedding_backward_mode(dwte, dwpe, m->dres, m->s->tokens, B, T, C, mode));
    } else {
        /* wte: every token row of this rank's vocabulary, from all N rows
         * of the gradient (gathered under SP: g's backward). */
        const size_t N = (size_t)B * T, ns = rows_here(m), v0 = (size_t)m->d.r * rows;
        const float *dfull = m->dres;
        if (m->d.sp) {
            memcpy(m->dbuf + (size_t)m->d.r * ns * C, m->dres, ns * C * sizeof(float));
            DT_CHECK(region_out_backward(m, m->dbuf, 4));
            dfull = m->dbuf;
        }
        for (size_t i = 0; i < N; i++) {
            size_t v = (size_t)m->s->tokens[i] - v0;
            if (v < rows)
                for (int j = 0; j < C; j++)
                    dwte[v * C + j] += dfull[i * C + j];
        }
        /* wpe: this rank's rows (all of them without SP). */
        float *dst = m->d.sp ? m->gscratch : dwpe;
        size_t row0 = m->d.sp ? (size_t)m->d.r * ns : 0;
        if (m->d.sp || mode == DT_GRAD_OVERWRITE)
            memset(dst, 0, Tg * C * sizeof(float));
        for (size_t i = 0; i < ns; i++) {
            int pos = cp_position(&m->d, T, (int)((row0 + i) % (size_t)T));
            float *w = dst + (size_t)pos * C;
            for (int j = 0; j < C; j++)
                w[j] += m->dres[i * C + j];
        }
        if (m->d.sp)
            DT_CHECK(sum_partial(m, dwpe, m->gscratch, Tg * C, mode));
    }
    if (mode == DT_GRAD_OVERWRITE)
        memset(dwpe + Tg * C, 0, sizeof(float) * tail * C);
    return DT_OK;
}

dt_status dt_gpt_backward(dt_gpt *m, float grad_scale, dt_grad_ready_fn hook, void *user) {
    return dt_gpt_backward_stage(m, 0, 0, NULL, grad_scale, DT_GRAD_ACCUMULATE, hook, user);
}

dt_status dt_gpt_backward_mode(dt_gpt *m, float grad_scale, dt_grad_mode mode,
                               dt_grad_ready_fn hook, void *user) {
    return dt_gpt_backward_stage(m, 0, 0, NULL, grad_scale, mode, hook, user);
}

/* The input of block l of the current slot: the previous block's output,
 * or the chunk's input. */
static const float *block_input(const dt_gpt *m, int l) {
    return l > m->s->L0 ? acts_of(m, l - 1)->res3 : m->s->encoded;
}

dt_status dt_gpt_backward_stage(dt_gpt *m, int chunk, int slot, const float *dx_out,
                                float grad_scale, dt_grad_mode mode, dt_grad_ready_fn hook,
                                void *user) {
    const gpt_dims *d = &m->d;
    DT_CHECK(use_slot(m, chunk, slot));
    gpt_slot *s = m->s;
    if ((unsigned)mode > DT_GRAD_OVERWRITE)
        return dt_error_set(DT_ERR_INVALID, "backward: grad mode %d is not a dt_grad_mode",
                            (int)mode);
    if (!s->have_targets)
        return dt_error_set(DT_ERR_INVALID,
                            "backward needs a preceding forward with targets (and only one "
                            "backward per forward)");
    if (!s->head && !dx_out)
        return dt_error_set(DT_ERR_INVALID,
                            "backward of a model part without the head needs the gradient of "
                            "its output (dx_out)");
    s->have_targets = false; /* the logits are about to become dlogits */
    m->lstats_scale = grad_scale / (float)(s->B * s->T);
    const bool split = m->opt.split_weight_grads;
    const int C = d->C, Ns = (int)rows_here(m);
    float *p = m->params, *g = m->grads;
    const float *xL = acts_of(m, s->L1 - 1)->res3;
    prefetch_w(m, block_unit(m, s->L1 - 1));
    if (s->head) {
        const dt_param_info *lnw = &m->info[m->lnf], *lnb = &m->info[m->lnf + 1];
        const void *x;
        float *dlnf;
        uint64_t th = dt_trace_begin();
        DT_CHECK(fetch(m, other_unit(m, U_LNF)));
        DT_CHECK(region_in_forward(m, s->lnf_out, &x, dt__act_size(m->opt.precision)));
        DT_CHECK(head_backward(m, x, grad_scale / (float)(s->B * s->T), mode));
        DT_CHECK(region_in_backward(m, m->dbuf, &dlnf));
        memset(m->dres, 0, sizeof(float) * (size_t)Ns * C);
        ln_backward(m, m->dres, true, g + lnw->offset, g + lnb->offset, m->gscratch, dlnf, xL,
                    p + lnw->offset, s->lnf_mean, s->lnf_rstd, mode);
        release(m, other_unit(m, U_LNF));
        if (d->sp)
            DT_CHECK(sum_partial(m, g + lnw->offset, m->gscratch, 2 * (size_t)C, mode));
        dt_trace_end(th, DT_TRACE_COMPUTE, "head_bwd", -1, 0, 0);
    } else {
        memcpy(m->dres, dx_out, sizeof(float) * (size_t)Ns * C);
    }
    for (int l = s->L1 - 1; l >= s->L0; l--) {
        const float *x = block_input(m, l);
        DT_CHECK(fetch_w(m, block_unit(m, l)));
        if (l > s->L0)
            prefetch_w(m, block_unit(m, l - 1));
        /* A recomputed block refills the shared set from its kept input. */
        uint64_t tb = dt_trace_begin();
        if (dt__gpt_recomputed(m->opt.recompute_every, l))
            DT_CHECK(dt__gpt_block_forward(m, l, x, false, false));
        DT_CHECK(block_backward(m, l, x, mode, !split));
        dt_trace_end(tb, DT_TRACE_COMPUTE, "block_bwd", l, 0, 0);
        release_w(m, block_unit(m, l));
        /* m->dres holds d(x); every gradient from block l onwards is final. */
        if (hook && !split)
            hook(user, block_offset(m, l));
    }
    if (s->embeds) {
        uint64_t te = dt_trace_begin();
        DT_CHECK(embed_backward(m, mode));
        dt_trace_end(te, DT_TRACE_COMPUTE, "embed_bwd", -1, 0, 0);
    }
    s->pending_w = split;
    if (hook && !split && chunk == 0)
        hook(user, 0);
    return DT_OK;
}

dt_status dt_gpt_weight_stage(dt_gpt *m, int chunk, int slot, dt_grad_mode mode,
                              dt_grad_ready_fn hook, void *user) {
    DT_CHECK(use_slot(m, chunk, slot));
    gpt_slot *s = m->s;
    if (!s->pending_w)
        return dt_error_set(
            DT_ERR_INVALID, "weight gradients of chunk %d's slot %d: %s", chunk, slot,
            m->opt.split_weight_grads ? "no backward is pending there"
                                      : "the model was created without split_weight_grads");
    if ((unsigned)mode > DT_GRAD_OVERWRITE)
        return dt_error_set(DT_ERR_INVALID, "weight gradients: grad mode %d is not a dt_grad_mode",
                            (int)mode);
    /* A recomputation reads the 16-bit weights the last forward cast (the
     * parameters do not change within a step). */
    for (int l = s->L1 - 1; l >= s->L0; l--) {
        const float *x = block_input(m, l);
        DT_CHECK(fetch_w(m, block_unit(m, l)));
        uint64_t tb = dt_trace_begin();
        if (dt__gpt_recomputed(m->opt.recompute_every, l))
            DT_CHECK(dt__gpt_block_forward(m, l, x, false, false));
        DT_CHECK(block_weights(m, l, x, mode));
        dt_trace_end(tb, DT_TRACE_COMPUTE, "block_wgrad", l, 0, 0);
        release_w(m, block_unit(m, l));
        if (hook)
            hook(user, block_offset(m, l));
    }
    s->pending_w = false;
    if (hook && chunk == 0)
        hook(user, 0);
    return DT_OK;
}

const float *dt_gpt_stage_output(const dt_gpt *m, int chunk, int slot) {
    DT_ASSERT(chunk >= 0 && chunk < m->d.nch && slot >= 0 && slot < m->nslots);
    const gpt_slot *s = &m->slots[(size_t)chunk * m->nslots + slot];
    return s->acts[s->L1 - 1 - s->L0].res3;
}
const float *dt_gpt_stage_input_grad(const dt_gpt *m) { return m->dres; }
