/*
 * gpt_cp.c — attention of a context-parallel model part (nn.h, "Context
 * parallelism"): each rank holds Tl = T/cp tokens of every sequence and
 * runs every other layer on them alone; here attention meets the other
 * ranks' tokens, forward beside backward, through the dt_cp_regions table
 * the parallel layer implements over the cp group.
 *
 * Ulysses (any precision). Shapes per rank, N = B Tl, Hc = Ct/cp channels
 * of the NHt/cp heads this rank attends for everyone:
 *
 *   forward    c_attn out (N,3Ct) --pack by head group--> a2a --unpack by
 *              token position--> a->qkv (B,T,3Hc); attention -> (B,T,Hc)
 *              --pack by token--> a2a --unpack by heads--> a->atty (N,Ct)
 *   backward   dout (N,Ct) and a->atty the same way to (B,T,Hc) each;
 *              attention backward -> (B,T,3Hc) --back--> dqkv (N,3Ct)
 *
 * a->qkv and a->att_lse are kept in the gathered layout (the same sizes as
 * the local ones), a->atty in the local one (c_proj reads it); backward
 * gathers the output again rather than keeping a second copy. The
 * gathered attention output (forward) and dqkv (backward) are computed in
 * the (N,3Ct) buffer that the local qkv was (forward: m->dqkv, free once
 * gathered) or that dqkv will be (backward), so the scratch is the one
 * all-to-all buffer and the gathered dout and out.
 *
 * Ring (fp32; bf16/fp16 on fp32 copies). Rank r holds chunks r and 2cp-1-r of Tc = Tl/2 tokens. Its
 * own keys first: causal attention over its 2Tc rows in local order is
 * right as it stands (chunk 2cp-1-r sees all of chunk r, each chunk itself
 * causally). Then at step s = 1..cp-1 the keys and values of rank
 * o = r - s arrive; as chunks precede each other:
 *   o < r: both query chunks see o's first chunk wholly (2Tc x Tc keys);
 *   o > r: only the second query chunk sees keys, both of o's (Tc x 2Tc);
 * the same work on every rank at every step. Each partial result merges by
 * its log-sum-exp. Step s + 1's block is in flight while step s computes.
 * Backward: the local causal block writes dqkv; the blocks come round again
 * and each step's dk|dv share is added to a travelling accumulator for
 * that block's owner, which moves one hop after each step and arrives home
 * after the last.
 */
#include "gpt_internal.h"

#include <string.h>

int dt_gpt_cp_position(const dt_gpt_part *part, int T, int i) {
    if (part->cp_size <= 1)
        return i;
    gpt_dims d = {.cp = part->cp_size, .cr = part->cp_rank, .cpm = part->cp_mode};
    return cp_position(&d, T / part->cp_size, i);
}

const char *dt_cp_mode_name(dt_cp_mode mode) { return mode == DT_CP_RING ? "ring" : "ulysses"; }

dt_status dt_cp_mode_parse(const char *knob, const char *text, dt_cp_mode *out) {
    if (strcmp(text, "ulysses") == 0)
        *out = DT_CP_ULYSSES;
    else if (strcmp(text, "ring") == 0)
        *out = DT_CP_RING;
    else
        return dt_error_set(DT_ERR_INVALID, "%s \"%s\": expected ulysses or ring", knob, text);
    return DT_OK;
}

/* ------------------------------------------------------------------------ */
/* Ulysses                                                                  */
/* ------------------------------------------------------------------------ */

/* A tensor of P parts of Ct channels per token row, in the local layout X
 * (B, Tl, P Ct) and the gathered layout G (B, T, P Hc): rank j's heads are
 * channels [j Hc, (j+1) Hc) of each part. The a2a buffer holds cp blocks
 * (B, Tl, P, Hc): by destination head group when sending local tokens, by
 * source rank when receiving them (and the reverse going back). */
typedef struct reshape {
    size_t B, Tl, P, Hc, es; /* es: bytes per element */
    int cp;
    const gpt_dims *d;
} reshape;

/* Which layout a tensor is in: this rank's tokens of all heads (X), or
 * every token of this rank's heads (G). */
typedef enum { LOCAL, GATHERED } layout;

/* The byte offset, in a tensor of layout `l`, of the Hc channels that block
 * j of the a2a buffer holds for (b, t, part p): in X, rank j's heads of
 * local token t; in G, rank j's token t (its sequence position). */
static size_t tensor_at(const reshape *z, layout l, int j, size_t b, size_t t, size_t p) {
    if (l == LOCAL)
        return (((b * z->Tl + t) * z->P + p) * (size_t)z->cp + (size_t)j) * z->Hc * z->es;
    gpt_dims dj = *z->d;
    dj.cr = j;
    size_t T = z->Tl * (size_t)z->cp, pos = (size_t)cp_position(&dj, (int)z->Tl, (int)t);
    return ((b * T + pos) * z->P + p) * z->Hc * z->es;
}
static size_t buf_at(const reshape *z, int j, size_t b, size_t t, size_t p) {
    return ((((size_t)j * z->B + b) * z->Tl + t) * z->P + p) * z->Hc * z->es;
}

/* Copy between the a2a buffer's cp blocks and a tensor of layout l, into
 * the buffer (to_buf) or out of it. */
static void copy_blocks(const reshape *z, layout l, char *buf, char *tensor, bool to_buf) {
    const long rows = (long)(z->B * z->Tl);
#pragma omp parallel for schedule(static) if (rows > 256)
    for (long r = 0; r < rows; r++) {
        size_t b = (size_t)r / z->Tl, t = (size_t)r % z->Tl;
        for (int j = 0; j < z->cp; j++)
            for (size_t p = 0; p < z->P; p++) {
                char *x = tensor + tensor_at(z, l, j, b, t, p), *y = buf + buf_at(z, j, b, t, p);
                memcpy(to_buf ? y : x, to_buf ? x : y, z->Hc * z->es);
            }
    }
}

static reshape reshape_of(const dt_gpt *m, size_t parts, size_t es) {
    const gpt_dims *d = &m->d;
    return (reshape){.B = (size_t)m->s->B,
                     .Tl = (size_t)m->s->T,
                     .P = parts,
                     .Hc = (size_t)(d->Ct / d->cp),
                     .es = es,
                     .cp = d->cp,
                     .d = d};
}

/* src (in layout `from`) -> dst (in the other layout) through the
 * all-to-all. dst may be src (the buffer stands between them). */
static dt_status reshuffle(dt_gpt *m, const reshape *z, layout from, void *dst, const void *src) {
    const dt_cp_regions *g = m->opt.part.cp_regions;
    size_t block = z->B * z->Tl * z->P * z->Hc * z->es;
    copy_blocks(z, from, m->cp.a2a, (char *)src, true); /* read only */
    REGION(m, g->all_to_all(g->ctx, m->cp.a2a, block));
    copy_blocks(z, from == LOCAL ? GATHERED : LOCAL, m->cp.a2a, dst, false);
    return DT_OK;
}
static dt_status gather_heads(dt_gpt *m, const reshape *z, void *G, const void *X) {
    return reshuffle(m, z, LOCAL, G, X);
}
static dt_status scatter_heads(dt_gpt *m, const reshape *z, void *X, const void *G) {
    return reshuffle(m, z, GATHERED, X, G);
}

static dt_status ulysses_forward(dt_gpt *m, const block_acts *a, const void *qkv_local) {
    const gpt_dims *d = &m->d;
    const dt_precision pr = m->opt.precision;
    const size_t A = dt__act_size(pr);
    const int B = m->s->B, T = m->s->T * d->cp, Hc = d->Ct / d->cp, NHc = d->NHt / d->cp;
    reshape z3 = reshape_of(m, 3, A), z1 = reshape_of(m, 1, A);
    DT_CHECK(gather_heads(m, &z3, a->qkv, qkv_local));
    if (pr == DT_PRECISION_FP32)
        dt_attention_forward(m->dqkv, a->att_lse, a->qkv, B, T, Hc, NHc);
    else
        dt_attention16_forward(pr, m->dqkv, a->att_lse, a->qkv, B, T, Hc, NHc, m->attn_work);
    return scatter_heads(m, &z1, a->atty, m->dqkv);
}

static dt_status ulysses_backward(dt_gpt *m, const block_acts *a, const float *dout, void *dqkv) {
    const gpt_dims *d = &m->d;
    const dt_precision pr = m->opt.precision;
    const size_t A = dt__act_size(pr);
    const int B = m->s->B, T = m->s->T * d->cp, Hc = d->Ct / d->cp, NHc = d->NHt / d->cp;
    reshape zd = reshape_of(m, 1, 4), z1 = reshape_of(m, 1, A), z3 = reshape_of(m, 3, A);
    DT_CHECK(gather_heads(m, &zd, m->cp.g_dout, dout));
    DT_CHECK(gather_heads(m, &z1, m->cp.g_out, a->atty));
    if (pr == DT_PRECISION_FP32)
        dt_attention_backward(dqkv, m->cp.g_dout, a->qkv, m->cp.g_out, a->att_lse, B, T, Hc, NHc);
    else
        dt_attention16_backward(pr, dqkv, m->cp.g_dout, a->qkv, m->cp.g_out, a->att_lse, B, T, Hc,
                                NHc, m->attn_work);
    return scatter_heads(m, &z3, dqkv, dqkv); /* through the a2a buffer */
}

/* ------------------------------------------------------------------------ */
/* Ring                                                                     */
/* ------------------------------------------------------------------------ */

/* The k|v rows (N,2Ct) of qkv (N,3Ct): what travels. */
static void pack_kv(float *kv, const float *qkv, size_t N, size_t Ct) {
    for (size_t i = 0; i < N; i++)
        memcpy(kv + i * 2 * Ct, qkv + i * 3 * Ct + Ct, 2 * Ct * sizeof(float));
}

/* Which rows meet at ring step s: queries [q0, q0+nq) of each sequence
 * against the arriving block's keys [0, nk). */
typedef struct ring_step {
    int q0, nq, nk;
} ring_step;

static ring_step step_of(const gpt_dims *d, int Tl, int s) {
    int owner = ((d->cr - s) % d->cp + d->cp) % d->cp, Tc = Tl / 2;
    return owner < d->cr ? (ring_step){0, Tl, Tc} : (ring_step){Tc, Tc, Tl};
}

/* Forward over fp32 qkv (N,3Ct) into out (N,Ct) and lse (B,NHt,Tl). */
static dt_status ring_forward(dt_gpt *m, const float *qkv, float *out, float *lse) {
    const gpt_dims *d = &m->d;
    const dt_cp_regions *g = m->opt.part.cp_regions;
    const int B = m->s->B, Tl = m->s->T, Ct = d->Ct, NHt = d->NHt, cp = d->cp;
    const size_t N = (size_t)B * Tl, C3 = 3 * (size_t)Ct, C2 = 2 * (size_t)Ct;
    const size_t bytes = N * C2 * sizeof(float);
    float **kv = m->cp.kv;
    pack_kv(kv[0], qkv, N, (size_t)Ct);
    REGION(m, g->shift_start(g->ctx, 0, kv[0], kv[1], bytes));
    dt_attention_forward(out, lse, qkv, B, Tl, Ct, NHt);
    for (int s = 1; s < cp; s++) {
        const float *cur = kv[s & 1];
        REGION(m, g->shift_wait(g->ctx, 0));
        if (s + 1 < cp)
            REGION(m, g->shift_start(g->ctx, 0, cur, kv[(s + 1) & 1], bytes));
        ring_step st = step_of(d, Tl, s);
        for (int b = 0; b < B; b++) {
            size_t row = (size_t)b * Tl + (size_t)st.q0, lrow = (size_t)b * NHt * Tl + st.q0;
            dt_attention_cross_forward(m->cp.pout + row * Ct, m->cp.plse + lrow, (size_t)Tl,
                                       qkv + row * C3, C3, cur + (size_t)b * Tl * C2, C2, st.nq,
                                       st.nk, Ct, NHt);
            dt_attention_merge(out + row * Ct, lse + lrow, (size_t)Tl, m->cp.pout + row * Ct,
                               m->cp.plse + lrow, (size_t)Tl, st.nq, Ct, NHt);
        }
    }
    return DT_OK;
}

/* Backward over fp32 qkv, out (final), lse and dout into dqkv (written). */
static dt_status ring_backward(dt_gpt *m, const float *qkv, const float *out, const float *lse,
                               const float *dout, float *dqkv) {
    const gpt_dims *d = &m->d;
    const dt_cp_regions *g = m->opt.part.cp_regions;
    const int B = m->s->B, Tl = m->s->T, Ct = d->Ct, NHt = d->NHt, cp = d->cp;
    const size_t N = (size_t)B * Tl, C3 = 3 * (size_t)Ct, C2 = 2 * (size_t)Ct;
    const size_t bytes = N * C2 * sizeof(float);
    float **kv = m->cp.kv, **acc = m->cp.acc;
    pack_kv(kv[0], qkv, N, (size_t)Ct);
    REGION(m, g->shift_start(g->ctx, 0, kv[0], kv[1], bytes));
    dt_attention_backward(dqkv, dout, qkv, out, lse, B, Tl, Ct, NHt);
    for (int s = 1; s < cp; s++) {
        const float *cur = kv[s & 1];
        float *dkv = acc[s & 1];
        REGION(m, g->shift_wait(g->ctx, 0));
        if (s + 1 < cp)
            REGION(m, g->shift_start(g->ctx, 0, cur, kv[(s + 1) & 1], bytes));
        if (s == 1)
            memset(dkv, 0, bytes); /* the first rank this block visits */
        else
            REGION(m, g->shift_wait(g->ctx, 1));
        ring_step st = step_of(d, Tl, s);
        for (int b = 0; b < B; b++) {
            size_t row = (size_t)b * Tl + (size_t)st.q0, lrow = (size_t)b * NHt * Tl + st.q0;
            dt_attention_cross_backward(dqkv + row * C3, dkv + (size_t)b * Tl * C2, dout + row * Ct,
                                        qkv + row * C3, C3, cur + (size_t)b * Tl * C2, C2,
                                        out + row * Ct, lse + lrow, (size_t)Tl, st.nq, st.nk, Ct,
                                        NHt);
        }
        REGION(m, g->shift_start(g->ctx, 1, dkv, acc[(s + 1) & 1], bytes));
    }
    /* This rank's own block, back from its last visit: add its dk|dv. */
    REGION(m, g->shift_wait(g->ctx, 1));
    const float *mine = acc[cp & 1];
    for (size_t i = 0; i < N; i++) {
        float *dst = dqkv + i * C3 + Ct;
        const float *src = mine + i * C2;
        for (size_t j = 0; j < C2; j++)
            dst[j] += src[j];
    }
    return DT_OK;
}

/* ------------------------------------------------------------------------ */
/* The model's entry points                                                 */
/* ------------------------------------------------------------------------ */

void *dt__gpt_cp_qkv_target(dt_gpt *m, const block_acts *a) {
    return m->d.cpm == DT_CP_ULYSSES ? m->dqkv : a->qkv;
}

/* bf16/fp16: the ring runs in fp32 on widened copies (what attention16
 * does per head), its output and gradient rounded back. The blocks travel
 * as fp32. */
static dt_status attention_forward(dt_gpt *m, const block_acts *a, const void *qkv_local) {
    if (m->d.cpm == DT_CP_ULYSSES)
        return ulysses_forward(m, a, qkv_local);
    const dt_precision pr = m->opt.precision;
    if (pr == DT_PRECISION_FP32)
        return ring_forward(m, a->qkv, a->atty, a->att_lse);
    const size_t N = (size_t)m->s->B * m->s->T, Ct = (size_t)m->d.Ct;
    dt_act16_to_f32(pr, m->cp.w_qkv, a->qkv, N * 3 * Ct);
    DT_CHECK(ring_forward(m, m->cp.w_qkv, m->cp.w_out, a->att_lse));
    dt_act16_from_f32(pr, a->atty, m->cp.w_out, N * Ct);
    return DT_OK;
}

static dt_status attention_backward(dt_gpt *m, const block_acts *a, const float *dout, void *dqkv) {
    if (m->d.cpm == DT_CP_ULYSSES)
        return ulysses_backward(m, a, dout, dqkv);
    const dt_precision pr = m->opt.precision;
    if (pr == DT_PRECISION_FP32)
        return ring_backward(m, a->qkv, a->atty, a->att_lse, dout, dqkv);
    const size_t N = (size_t)m->s->B * m->s->T, Ct = (size_t)m->d.Ct;
    dt_act16_to_f32(pr, m->cp.w_qkv, a->qkv, N * 3 * Ct);
    dt_act16_to_f32(pr, m->cp.w_out, a->atty, N * Ct);
    DT_CHECK(ring_backward(m, m->cp.w_qkv, m->cp.w_out, a->att_lse, dout, m->cp.w_dqkv));
    dt_act16_from_f32(pr, dqkv, m->cp.w_dqkv, N * 3 * Ct);
    return DT_OK;
}

dt_status dt__gpt_cp_attention_forward(dt_gpt *m, const block_acts *a, const void *qkv_local) {
    double t0 = dt_now();
    dt_status st = attention_forward(m, a, qkv_local);
    m->cp_attn_ms += (dt_now() - t0) * 1e3;
    return st;
}

dt_status dt__gpt_cp_attention_backward(dt_gpt *m, const block_acts *a, const float *dout,
                                        void *dqkv) {
    double t0 = dt_now();
    dt_status st = attention_backward(m, a, dout, dqkv);
    m->cp_attn_ms += (dt_now() - t0) * 1e3;
    return st;
}
