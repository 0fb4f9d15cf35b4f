/*
 * clip.c — global-norm gradient clipping: sum of squares, scaling, and the
 * clip factor.
 *
 * The sum of squares is accumulated in double over fixed blocks of
 * DT__SUMSQ_BLOCK elements counted from the start of the range; within a
 * block, element i goes to accumulator lane i % 64, and the 64 lanes and
 * then the block sums are added in a fixed order. The result therefore
 * depends only on the data and the range start, never on the thread count,
 * and the AVX-512 and scalar forms agree bit for bit.
 */
#include "optim_internal.h"

#include <math.h>

#ifdef __AVX512F__
#include <immintrin.h>
#endif

/* Accumulator lanes: element i of a block goes to lane i % LANES. Four
 * independent pairs of 8-double vectors hide the latency of the adds. */
#define LANES 64

static double sum_lanes(const double lane[LANES]) {
    double s = 0.0;
    for (int j = 0; j < LANES; j++)
        s += lane[j];
    return s;
}

double dt__sumsq_block_scalar(const float *g, size_t n) {
    double lane[LANES] = {0};
    for (size_t i = 0; i < n; i++) {
        double x = (double)g[i];
        lane[i % LANES] += x * x;
    }
    return sum_lanes(lane);
}

#ifdef __AVX512F__
/* acc[0] += squares of x's low 8 lanes (as doubles), acc[1] of its high 8. */
static inline void sq_acc16(__m512d acc[2], __m512 x) {
    __m512d xl = _mm512_cvtps_pd(_mm512_castps512_ps256(x));
    __m512d xh = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)));
    acc[0] = _mm512_add_pd(acc[0], _mm512_mul_pd(xl, xl));
    acc[1] = _mm512_add_pd(acc[1], _mm512_mul_pd(xh, xh));
}

double dt__sumsq_block_vec(const float *g, size_t n) {
    __m512d acc[LANES / 8]; /* acc[j] holds lanes 8j .. 8j+7 */
    for (int j = 0; j < LANES / 8; j++)
        acc[j] = _mm512_setzero_pd();
    size_t i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int q = 0; q < LANES / 16; q++)
            sq_acc16(acc + 2 * q, _mm512_loadu_ps(g + i + 16 * (size_t)q));
    /* The tail: whole or masked 16-float groups into the matching lanes. */
    for (int q = 0; i < n; q++, i += 16) {
        size_t left = n - i;
        __mmask16 mask = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1u);
        sq_acc16(acc + 2 * q, _mm512_maskz_loadu_ps(mask, g + i));
    }
    double lane[LANES];
    for (int j = 0; j < LANES / 8; j++)
        _mm512_storeu_pd(lane + 8 * j, acc[j]);
    return sum_lanes(lane);
}
#else
double dt__sumsq_block_vec(const float *g, size_t n) { return dt__sumsq_block_scalar(g, n); }
#endif

double dt_grad_sumsq(const float *g, size_t n) {
    /* Blocks are processed in groups so their partial sums fit on the stack. */
    enum { GROUP = 256 };
    double partial[GROUP];
    double total = 0.0;
    bool vec = dt__optim_vec();
    size_t nblocks = (n + DT__SUMSQ_BLOCK - 1) / DT__SUMSQ_BLOCK;
    for (size_t b0 = 0; b0 < nblocks; b0 += GROUP) {
        size_t nb = nblocks - b0 < GROUP ? nblocks - b0 : GROUP;
#pragma omp parallel for schedule(static) if (n >= DT__OPTIM_PAR_MIN && nb > 1)
        for (size_t b = 0; b < nb; b++) {
            size_t off = (b0 + b) * DT__SUMSQ_BLOCK;
            size_t len = n - off < DT__SUMSQ_BLOCK ? n - off : DT__SUMSQ_BLOCK;
            partial[b] =
                vec ? dt__sumsq_block_vec(g + off, len) : dt__sumsq_block_scalar(g + off, len);
        }
        for (size_t b = 0; b < nb; b++)
            total += partial[b];
    }
    return total;
}

void dt_scale(float *g, size_t n, float s) {
    if (n < DT__OPTIM_PAR_MIN) {
        for (size_t i = 0; i < n; i++)
            g[i] *= s;
        return;
    }
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++)
        g[i] *= s;
}

float dt_clip_scale(double sumsq, float max_norm) {
    /* Non-finite gradients are the caller's to detect (isfinite(sumsq));
     * scaling them by 0 or NaN would only hide where they came from. */
    if (!(max_norm > 0.0f) || !isfinite(sumsq))
        return 1.0f;
    /* In float, as torch.nn.utils.clip_grad_norm_ computes it on a float tensor. */
    float norm = (float)sqrt(sumsq);
    float coef = max_norm / (norm + 1e-6f);
    return coef < 1.0f ? coef : 1.0f;
}
