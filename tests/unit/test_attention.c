/*
 * test_attention.c — the two causal-attention implementations
 * (attention_internal.h) against the naive reference and each other:
 *   - avx512 and tiles vs naive, forward (out 1e-5) and backward (dqkv
 *     1e-4), over head sizes 16..64 and lengths around the 16-lane, 6-row
 *     and 64-block edges;
 *   - avx512 bit-identical with 1 and 2 threads, and on a compact one-head
 *     copy (B = 1, C = HS, NH = 1: what attention16 runs) as on the full
 *     tensor;
 *   - the dispatch: which head sizes the kernels take, and the public
 *     functions equal to tiles bit for bit when dt_isa() is below AVX-512;
 *   - the cross blocks of ring attention: a causal sequence [prefix; x]
 *     computed as x's own causal attention merged with x against the
 *     prefix (forward), and its gradients as the sum of both blocks'
 *     shares, against naive attention of the whole sequence.
 * Skips the avx512 parts (saying so) where the CPU lacks AVX-512.
 */
#include "tensor/attention_internal.h"
#include "tensor_check.h"

static bool have_avx512(void) { return dt__attention_avx512_ok(64, 1); }

/* Both implementations against naive at one shape. */
static void check_shape(int B, int T, int C, int NH) {
    size_t BTC = (size_t)B * T * C, nl = (size_t)B * NH * T;
    float *qkv = randv(3 * BTC, 1.5f), *dout = randv(BTC, 1.0f);
    float *on = zerov(BTC), *att = zerov((size_t)B * NH * T * T), *dn = zerov(3 * BTC);
    float *o = zerov(BTC), *lse = zerov(nl), *d = zerov(3 * BTC), *lt = zerov(nl);
    dt_attention_naive_forward(on, att, qkv, B, T, C, NH);
    dt_attention_naive_backward(dn, dout, qkv, att, B, T, C, NH);
    char what[96];
    for (int m = 0; m < 2; m++) {
        const char *name = m ? "avx512" : "tiles";
        memset(d, 0x7f, 3 * BTC * sizeof(float)); /* backward must overwrite */
        if (m == 0) {
            dt__attention_forward_tiles(o, lse, qkv, B, T, C, NH);
            memcpy(lt, lse, nl * sizeof(float));
            dt__attention_backward_tiles(d, dout, qkv, o, lse, B, T, C, NH);
        } else {
            if (!dt__attention_avx512_ok(C, NH))
                break;
            ASSERT_TRUE(dt__attention_forward_avx512(o, lse, qkv, B, T, C, NH));
            check_close("avx512 vs tiles lse", lse, lt, nl, 1e-6);
            ASSERT_TRUE(dt__attention_backward_avx512(d, dout, qkv, o, lse, B, T, C, NH));
        }
        snprintf(what, sizeof what, "%s vs naive out (T=%d, HS=%d)", name, T, C / NH);
        check_close(what, o, on, BTC, 1e-5);
        snprintf(what, sizeof what, "%s vs naive dqkv (T=%d, HS=%d)", name, T, C / NH);
        check_close(what, d, dn, 3 * BTC, 1e-4);
    }
    free(qkv), free(dout), free(on), free(att), free(dn), free(o), free(lse), free(d), free(lt);
}

static void test_vs_naive(void) {
    static const int Ts[] = {1, 5, 6, 16, 17, 63, 64, 65, 100, 130, 257};
    static const int HSs[] = {16, 32, 48, 64};
    for (size_t h = 0; h < sizeof HSs / sizeof HSs[0]; h++)
        for (size_t k = 0; k < sizeof Ts / sizeof Ts[0]; k++)
            check_shape(2, Ts[k], 2 * HSs[h], 2);
    check_shape(1, 70, 24, 2); /* head size 12: tiles only */
}

/* 1 and 2 threads, and the full tensor vs a compact copy of one head. */
static void test_invariance(void) {
    if (!have_avx512()) {
        printf("# no AVX-512: invariance of the avx512 kernels not tested\n");
        return;
    }
    int B = 3, T = 150, C = 192, NH = 3, HS = C / NH;
    size_t BTC = (size_t)B * T * C, nl = (size_t)B * NH * T;
    float *qkv = randv(3 * BTC, 1.0f), *dout = randv(BTC, 1.0f);
    float *o[2], *l[2], *d[2];
    for (int k = 0; k < 2; k++) {
        dt_tensor_set_threads(k + 1);
        o[k] = zerov(BTC), l[k] = zerov(nl), d[k] = zerov(3 * BTC);
        ASSERT_TRUE(dt__attention_forward_avx512(o[k], l[k], qkv, B, T, C, NH));
        ASSERT_TRUE(dt__attention_backward_avx512(d[k], dout, qkv, o[k], l[k], B, T, C, NH));
    }
    dt_tensor_set_threads(2);
    ASSERT_TRUE(memcmp(o[0], o[1], BTC * sizeof(float)) == 0);
    ASSERT_TRUE(memcmp(l[0], l[1], nl * sizeof(float)) == 0);
    ASSERT_TRUE(memcmp(d[0], d[1], 3 * BTC * sizeof(float)) == 0);
    /* head h = 1 of sequence b = 2 as a one-head problem */
    int b = 2, h = 1;
    float *q1 = zerov(3 * (size_t)T * HS), *do1 = zerov((size_t)T * HS);
    float *o1 = zerov((size_t)T * HS), *l1 = zerov(T), *d1 = zerov(3 * (size_t)T * HS);
    for (int t = 0; t < T; t++) {
        for (int part = 0; part < 3; part++)
            memcpy(q1 + (size_t)t * 3 * HS + part * HS,
                   qkv + ((size_t)b * T + t) * 3 * C + part * C + h * HS, HS * sizeof(float));
        memcpy(do1 + (size_t)t * HS, dout + ((size_t)b * T + t) * C + h * HS, HS * sizeof(float));
    }
    ASSERT_TRUE(dt__attention_forward_avx512(o1, l1, q1, 1, T, HS, 1));
    ASSERT_TRUE(dt__attention_backward_avx512(d1, do1, q1, o1, l1, 1, T, HS, 1));
    for (int t = 0; t < T; t++) {
        ASSERT_TRUE(memcmp(o1 + (size_t)t * HS, o[0] + ((size_t)b * T + t) * C + h * HS,
                           HS * sizeof(float)) == 0);
        ASSERT_TRUE(l1[t] == l[0][((size_t)b * NH + h) * T + t]);
        for (int part = 0; part < 3; part++)
            ASSERT_TRUE(memcmp(d1 + (size_t)t * 3 * HS + part * HS,
                               d[0] + ((size_t)b * T + t) * 3 * C + part * C + h * HS,
                               HS * sizeof(float)) == 0);
    }
    for (int k = 0; k < 2; k++)
        free(o[k]), free(l[k]), free(d[k]);
    free(qkv), free(dout), free(q1), free(do1), free(o1), free(l1), free(d1);
}

static void test_dispatch(void) {
    bool avx = dt_isa() >= DT_ISA_AVX512;
    ASSERT_EQ(dt__attention_avx512_ok(384, 6), avx);   /* 64 */
    ASSERT_EQ(dt__attention_avx512_ok(96, 2), avx);    /* 48 */
    ASSERT_EQ(dt__attention_avx512_ok(16, 1), avx);    /* 16 */
    ASSERT_EQ(dt__attention_avx512_ok(24, 2), false);  /* 12 */
    ASSERT_EQ(dt__attention_avx512_ok(160, 2), false); /* 80 */
    ASSERT_EQ(dt__attention_avx512_ok(128, 0), false);
    /* Below AVX-512 the public functions are the tiles, bit for bit. */
    dt_isa_level saved = dt_isa();
    ASSERT_OK(dt_isa_set(DT_ISA_AVX2 < saved ? DT_ISA_AVX2 : saved));
    ASSERT_EQ(dt__attention_avx512_ok(384, 6), false);
    int B = 2, T = 77, C = 128, NH = 2;
    size_t BTC = (size_t)B * T * C, nl = (size_t)B * NH * T;
    float *qkv = randv(3 * BTC, 1.0f), *dout = randv(BTC, 1.0f);
    float *o[2] = {zerov(BTC), zerov(BTC)}, *l[2] = {zerov(nl), zerov(nl)};
    float *d[2] = {zerov(3 * BTC), zerov(3 * BTC)};
    dt_attention_forward(o[0], l[0], qkv, B, T, C, NH);
    dt_attention_backward(d[0], dout, qkv, o[0], l[0], B, T, C, NH);
    dt__attention_forward_tiles(o[1], l[1], qkv, B, T, C, NH);
    dt__attention_backward_tiles(d[1], dout, qkv, o[1], l[1], B, T, C, NH);
    ASSERT_OK(dt_isa_set(saved));
    ASSERT_TRUE(memcmp(o[0], o[1], BTC * sizeof(float)) == 0);
    ASSERT_TRUE(memcmp(d[0], d[1], 3 * BTC * sizeof(float)) == 0);
    for (int k = 0; k < 2; k++)
        free(o[k]), free(l[k]), free(d[k]);
    free(qkv), free(dout);
}

/* Naive causal attention over T = Tk + Tq rows, against the ring's split:
 * the last Tq rows attend causally to themselves (dt_attention_forward)
 * and wholly to the first Tk (dt_attention_cross_forward), merged. dout is
 * zero on the first Tk rows, so their k/v gradients come from the last
 * rows only: what the cross block's backward must produce. */
static void check_cross(int Tq, int Tk, int C, int NH, bool packed_kv, bool avx512) {
    const int T = Tq + Tk, HS = C / NH;
    const size_t C3 = 3 * (size_t)C, TC = (size_t)T * C, QC = (size_t)Tq * C;
    float *qkv = randv(3 * TC, 1.5f), *dout = randv(TC, 1.0f);
    memset(dout, 0, (size_t)Tk * C * sizeof(float));
    float *on = zerov(TC), *att = zerov((size_t)NH * T * T), *dn = zerov(3 * TC);
    dt_attention_naive_forward(on, att, qkv, 1, T, C, NH);
    dt_attention_naive_backward(dn, dout, qkv, att, 1, T, C, NH);
    /* the prefix's k|v rows, as the ring passes them (packed) or in place */
    float *kvp = zerov((size_t)Tk * 2 * C);
    for (int t = 0; t < Tk; t++)
        memcpy(kvp + (size_t)t * 2 * C, qkv + (size_t)t * C3 + C, 2 * (size_t)C * sizeof(float));
    const float *kv = packed_kv ? kvp : qkv + C;
    const size_t ldkv = packed_kv ? 2 * (size_t)C : C3;
    const float *ql = qkv + (size_t)Tk * C3; /* the last Tq rows: a (Tq,3C) qkv */
    float *o = zerov(QC), *l = zerov((size_t)NH * Tq), *po = zerov(QC),
          *pl = zerov((size_t)NH * Tq);
    dt_attention_forward(o, l, ql, 1, Tq, C, NH);
    if (avx512)
        ASSERT_TRUE(dt__attention_cross_forward_avx512(po, pl, (size_t)Tq, ql, C3, kv, ldkv, Tq, Tk,
                                                       C, NH));
    else
        dt__attention_cross_forward_tiles(po, pl, (size_t)Tq, ql, C3, kv, ldkv, Tq, Tk, C, NH);
    dt_attention_merge(o, l, (size_t)Tq, po, pl, (size_t)Tq, Tq, C, NH);
    char what[96];
    const char *impl = avx512 ? "avx512" : "tiles";
    snprintf(what, sizeof what, "%s cross+merge out (Tq=%d Tk=%d HS=%d)", impl, Tq, Tk, HS);
    check_close(what, o, on + (size_t)Tk * C, QC, 1e-5);
    float *dq = zerov(3 * QC), *dkv = zerov((size_t)Tk * ldkv);
    dt_attention_backward(dq, dout + (size_t)Tk * C, ql, o, l, 1, Tq, C, NH);
    if (avx512)
        ASSERT_TRUE(dt__attention_cross_backward_avx512(dq, dkv, dout + (size_t)Tk * C, ql, C3, kv,
                                                        ldkv, o, l, (size_t)Tq, Tq, Tk, C, NH));
    else
        dt__attention_cross_backward_tiles(dq, dkv, dout + (size_t)Tk * C, ql, C3, kv, ldkv, o, l,
                                           (size_t)Tq, Tq, Tk, C, NH, 0, NH);
    snprintf(what, sizeof what, "%s cross dqkv of x (Tq=%d Tk=%d HS=%d)", impl, Tq, Tk, HS);
    check_close(what, dq, dn + (size_t)Tk * C3, 3 * QC, 1e-4);
    /* dk|dv of the prefix, compared row by row (the naive rows are 3C wide) */
    float *want = zerov((size_t)Tk * 2 * C), *got = zerov((size_t)Tk * 2 * C);
    for (int t = 0; t < Tk; t++) {
        memcpy(want + (size_t)t * 2 * C, dn + (size_t)t * C3 + C, 2 * (size_t)C * sizeof(float));
        memcpy(got + (size_t)t * 2 * C, dkv + (size_t)t * ldkv, 2 * (size_t)C * sizeof(float));
    }
    snprintf(what, sizeof what, "%s cross dkv of the prefix (Tq=%d Tk=%d HS=%d)", impl, Tq, Tk, HS);
    check_close(what, got, want, (size_t)Tk * 2 * C, 1e-4);
    free(qkv), free(dout), free(on), free(att), free(dn), free(kvp), free(o), free(l), free(po);
    free(pl), free(dq), free(dkv), free(want), free(got);
}

static void test_cross(void) {
    static const int Ts[][2] = {{1, 1},    {5, 17},   {17, 5},   {64, 64},
                                {65, 130}, {130, 65}, {300, 33}, {100, 200}};
    static const int HSs[] = {12, 16, 64};
    for (size_t h = 0; h < sizeof HSs / sizeof HSs[0]; h++)
        for (size_t k = 0; k < sizeof Ts / sizeof Ts[0]; k++) {
            check_cross(Ts[k][0], Ts[k][1], 2 * HSs[h], 2, k % 2 == 0, false);
            if (dt__attention_avx512_ok(2 * HSs[h], 2))
                check_cross(Ts[k][0], Ts[k][1], 2 * HSs[h], 2, k % 2 == 0, true);
        }
    if (!have_avx512())
        printf("# no AVX-512: the avx512 cross blocks not tested\n");
}

int main(void) {
    dt_rng_init(&g_rng, 7, dt_rng_stream_id(0, 0, DT_RNG_TEST));
    dt_tensor_set_threads(2);
    printf("# attention avx512 kernels: %s (isa %s)\n", have_avx512() ? "yes" : "no",
           dt_isa_name(dt_isa()));
    RUN(test_vs_naive);
    RUN(test_invariance);
    RUN(test_dispatch);
    RUN(test_cross);
    return TEST_SUMMARY();
}
