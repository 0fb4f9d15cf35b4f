/*
 * test_amp_convert.c — CPU-feature levels, DT_ISA, and the 16-bit
 * conversions: every level available on this CPU against the scalar
 * reference, bit for bit (all 65536 patterns for 16 -> 32, special and
 * random values for 32 -> 16), and the reference against independent facts
 * (exactly representable values, round-to-even ties, overflow, subnormals).
 */
#include "dtrain/amp.h"
#include "test.h"

#include <float.h>
#include <sys/wait.h>
#include <unistd.h>

static uint32_t bits(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}

static float fl(uint32_t u) {
    float x;
    memcpy(&x, &u, 4);
    return x;
}

static void test_isa_names(void) {
    const dt_cpu_features *f = dt_cpu_features_get();
    printf(
        "  cpu max level %s, current %s (avx2 %d f16c %d avx512f %d bf16 %d fp16 %d amx %d%s%s)\n",
        dt_isa_name(f->max_level), dt_isa_name(dt_isa()), f->avx2, f->f16c, f->avx512f,
        f->avx512_bf16, f->avx512_fp16, f->amx_os, f->amx_note[0] ? ": " : "", f->amx_note);
    for (int l = 0; l < DT_ISA_COUNT; l++) {
        dt_isa_level back;
        ASSERT_OK(dt_isa_parse("DT_ISA", dt_isa_name((dt_isa_level)l), &back));
        ASSERT_EQ(back, l);
    }
    dt_isa_level x;
    ASSERT_STATUS(dt_isa_parse("DT_ISA", "avx9", &x), DT_ERR_INVALID);
    ASSERT_CONTAINS(dt_last_error(), "avx9");
    ASSERT_STREQ(dt_isa_name(DT_ISA_COUNT), "?");
    ASSERT_STATUS(dt_isa_set(DT_ISA_COUNT), DT_ERR_INVALID);
    /* Levels are cumulative: a level implies its features. */
    if (f->max_level >= DT_ISA_AVX2)
        ASSERT_TRUE(f->avx2 && f->fma && f->f16c);
    if (f->max_level >= DT_ISA_AVX512BF16)
        ASSERT_TRUE(f->avx512f && f->avx512bw && f->avx512_bf16);
    if (f->max_level >= DT_ISA_AMX)
        ASSERT_TRUE(f->amx_tile && f->amx_bf16 && f->amx_os);
    /* A level above the CPU's is refused and leaves the level unchanged. */
    if (f->max_level + 1 < DT_ISA_COUNT) {
        dt_isa_level before = dt_isa();
        ASSERT_STATUS(dt_isa_set((dt_isa_level)(f->max_level + 1)), DT_ERR_UNSUPPORTED);
        ASSERT_CONTAINS(dt_last_error(), "supports only up to");
        ASSERT_EQ(dt_isa(), before);
    }
}

/* DT_ISA is read once per process, so each value is tried in a child. */
static int child_isa(const char *value, dt_status *st_out, dt_isa_level *lvl_out) {
    int fds[2];
    ASSERT_EQ(pipe(fds), 0);
    pid_t pid = fork();
    ASSERT_TRUE(pid >= 0);
    if (pid == 0) {
        setenv("DT_ISA", value, 1);
        int msg[2];
        msg[0] = (int)dt_isa_init();
        msg[1] = (int)dt_isa();
        if (write(fds[1], msg, sizeof msg) != (ssize_t)sizeof msg)
            _exit(3);
        _exit(0);
    }
    close(fds[1]);
    int msg[2] = {-1, -1};
    ssize_t got = read(fds[0], msg, sizeof msg);
    close(fds[0]);
    int status;
    waitpid(pid, &status, 0);
    ASSERT_EQ(got, (ssize_t)sizeof msg);
    *st_out = (dt_status)msg[0];
    *lvl_out = (dt_isa_level)msg[1];
    return WEXITSTATUS(status);
}

static void test_isa_env(void) {
    dt_isa_level max = dt_cpu_features_get()->max_level;
    for (int l = 0; l < DT_ISA_COUNT; l++) {
        dt_status st;
        dt_isa_level got;
        ASSERT_EQ(child_isa(dt_isa_name((dt_isa_level)l), &st, &got), 0);
        if (l <= (int)max) {
            ASSERT_EQ(st, DT_OK);
            ASSERT_EQ(got, l);
        } else {
            ASSERT_EQ(st, DT_ERR_UNSUPPORTED);
            ASSERT_EQ(got, max); /* falls back to what the CPU has */
        }
    }
    dt_status st;
    dt_isa_level got;
    ASSERT_EQ(child_isa("sse9", &st, &got), 0);
    ASSERT_EQ(st, DT_ERR_INVALID);
    ASSERT_EQ(got, max);
}

/* Facts about the reference that do not depend on its code. */
static void test_reference_values(void) {
    /* Exactly representable values convert exactly. */
    for (int i = -2048; i <= 2048; i++) {
        if (i >= -256 && i <= 256) /* bf16 has 8 significant bits */
            ASSERT_EQ(dt_f32_from_bf16(dt_bf16_from_f32((float)i)), (float)i);
        ASSERT_EQ(dt_f32_from_f16(dt_f16_from_f32((float)i)), (float)i); /* fp16: 11 */
    }
    ASSERT_EQ(dt_bf16_from_f32(1.0f), 0x3f80);
    ASSERT_EQ(dt_bf16_from_f32(-2.0f), 0xc000);
    /* Ties go to even: 1 + 2^-8 is half-way between 1 and 1 + 2^-7. */
    ASSERT_EQ(dt_bf16_from_f32(fl(0x3f808000)), 0x3f80);
    ASSERT_EQ(dt_bf16_from_f32(fl(0x3f818000)), 0x3f82);
    ASSERT_EQ(dt_bf16_from_f32(fl(0x3f808001)), 0x3f81);
    /* Overflow to infinity, NaNs stay NaN (even with payload only in the
     * low 16 bits), subnormals are rounded, not flushed. */
    ASSERT_EQ(dt_bf16_from_f32(FLT_MAX), 0x7f80);
    ASSERT_EQ(dt_bf16_from_f32(fl(0x7f800001)), 0x7fc0);
    ASSERT_EQ(dt_bf16_from_f32(fl(0xff800001)), 0xffc0);
    ASSERT_EQ(dt_bf16_from_f32(fl(0x007fffff)), 0x0080);
    ASSERT_EQ(dt_bf16_from_f32(fl(0x00008000)), 0x0000);
    ASSERT_EQ(dt_bf16_from_f32(fl(0x00018000)), 0x0002);
    ASSERT_EQ(bits(dt_f32_from_bf16(0x7fc1)), 0x7fc10000u);
    /* fp16: largest finite, overflow threshold, smallest subnormal. */
    ASSERT_EQ(dt_f16_from_f32(65504.0f), 0x7bff);
    ASSERT_EQ(dt_f16_from_f32(65519.99f), 0x7bff);
    ASSERT_EQ(dt_f16_from_f32(65520.0f), 0x7c00);
    ASSERT_EQ(dt_f16_from_f32(-INFINITY), 0xfc00);
    ASSERT_EQ(dt_f16_from_f32(ldexpf(1.0f, -24)), 0x0001);
    ASSERT_EQ(dt_f16_from_f32(ldexpf(1.0f, -25)), 0x0000); /* tie -> even 0 */
    ASSERT_EQ(dt_f16_from_f32(ldexpf(1.5f, -25)), 0x0001);
    ASSERT_EQ(dt_f16_from_f32(ldexpf(3.0f, -25)), 0x0002);        /* tie -> even 2 */
    ASSERT_EQ(dt_f16_from_f32(ldexpf(1.0f, -14)), 0x0400);        /* smallest normal */
    ASSERT_EQ(dt_f16_from_f32(ldexpf(1023.5f, -24)), 0x0400);     /* rounds up into normal */
    ASSERT_EQ(dt_f16_from_f32(1.0f + ldexpf(1.0f, -11)), 0x3c00); /* tie -> even */
    ASSERT_EQ(dt_f16_from_f32(1.0f + 3 * ldexpf(1.0f, -11)), 0x3c02);
    ASSERT_TRUE(isnan(dt_f32_from_f16(dt_f16_from_f32(NAN))));
    /* 16 -> 32 -> 16 is the identity on every non-NaN pattern. */
    for (uint32_t h = 0; h < 65536; h++) {
        bool hnan = (h & 0x7c00) == 0x7c00 && (h & 0x3ff);
        if (!hnan) {
            ASSERT_EQ(dt_f16_from_f32(dt_f32_from_f16((dt_f16)h)), h);
            ASSERT_EQ(dt_bf16_from_f32(dt_f32_from_bf16((dt_bf16)h)), h);
        } else {
            ASSERT_TRUE(isnan(dt_f32_from_f16((dt_f16)h)));
        }
    }
    /* fp16 -> fp32 against the value computed from the fields. */
    for (uint32_t h = 0; h < 0x7c00; h++) {
        int e = (int)(h >> 10), m = (int)(h & 0x3ff);
        double v = e ? ldexp(1024 + m, e - 25) : ldexp(m, -24);
        ASSERT_EQ(bits(dt_f32_from_f16((dt_f16)h)), bits((float)v));
    }
}

/* Random values over the whole fp32 range plus the interesting patterns. */
static size_t special_inputs(float *x, size_t cap) {
    static const uint32_t pats[] = {
        0x00000000, 0x80000000, 0x00000001, 0x80000001, 0x007fffff, 0x00400000, 0x00008000,
        0x00018000, 0x00800000, 0x3f800000, 0x3f808000, 0x3f818000, 0x3f808001, 0x7f7fffff,
        0xff7fffff, 0x7f7f8000, 0x7f800000, 0xff800000, 0x7f800001, 0xff800001, 0x7fc00000,
        0x7fffffff, 0xffffffff, 0x7f80ffff, 0x7fbfffff, 0x477fe000, 0x477ff000, 0x477fefff,
        0x38800000, 0x387fc000, 0x33000000, 0x33000001, 0x33800000, 0x337fffff, 0x38000000,
        0x47800000, 0xc77ff000, 0x3c7fe000, 0x3c7ff000};
    size_t n = 0;
    for (size_t i = 0; i < sizeof pats / sizeof pats[0] && n < cap; i++)
        x[n++] = fl(pats[i]);
    /* Near every half-way point of both formats. */
    for (uint32_t e = 0; e < 256 && n + 6 <= cap; e += 3) {
        uint32_t base = e << 23;
        x[n++] = fl(base | 0x8000);
        x[n++] = fl(base | 0x18000);
        x[n++] = fl(base | 0x7fff);
        x[n++] = fl(base | 0x1000);
        x[n++] = fl(base | 0x3000);
        x[n++] = fl(base | 0x0fff | 0x80000000u);
    }
    dt_rng r;
    dt_rng_init(&r, 7, dt_rng_stream_id(0, 0, DT_RNG_TEST));
    while (n < cap)
        x[n++] = fl(dt_rng_u32(&r));
    return n;
}

static void test_paths_bit_exact(void) {
    enum { N = 1 << 16 };
    dt_isa_level max = dt_cpu_features_get()->max_level;
    float *x = malloc(N * sizeof *x), *y = malloc(N * sizeof *y), *ref32 = malloc(N * 4);
    uint16_t *h = malloc(N * 2), *ref16 = malloc(N * 2), *all = malloc(N * 2);
    ASSERT_TRUE(x && y && ref32 && h && ref16 && all);
    size_t n = special_inputs(x, N);
    for (uint32_t i = 0; i < N; i++)
        all[i] = (uint16_t)i;
    for (int l = 0; l <= (int)max; l++) {
        ASSERT_OK(dt_isa_set((dt_isa_level)l));
        /* Every length 0..40 (all tails) at odd offsets, then the bulk. */
        for (size_t len = 0; len <= 40; len++) {
            memset(h, 0xab, 64 * 2);
            dt_f32_to_bf16(h + 1, x + 3, len);
            for (size_t i = 0; i < len; i++)
                if (h[1 + i] != dt_bf16_from_f32(x[3 + i]))
                    TEST_FAILF("%s bf16 len %zu [%zu]: 0x%08x -> 0x%04x, want 0x%04x",
                               dt_isa_name(dt_isa()), len, i, bits(x[3 + i]), h[1 + i],
                               dt_bf16_from_f32(x[3 + i]));
            ASSERT_EQ(h[1 + len], 0xabab); /* nothing written past the end */
            dt_f32_to_f16(h + 1, x + 3, len);
            for (size_t i = 0; i < len; i++)
                ASSERT_EQ(h[1 + i], dt_f16_from_f32(x[3 + i]));
            ASSERT_EQ(h[1 + len], 0xabab);
        }
        dt_f32_to_bf16(h, x, n);
        for (size_t i = 0; i < n; i++)
            if (h[i] != dt_bf16_from_f32(x[i]))
                TEST_FAILF("%s bf16 [%zu]: 0x%08x -> 0x%04x, want 0x%04x", dt_isa_name(dt_isa()), i,
                           bits(x[i]), h[i], dt_bf16_from_f32(x[i]));
        dt_f32_to_f16(h, x, n);
        for (size_t i = 0; i < n; i++)
            if (h[i] != dt_f16_from_f32(x[i]))
                TEST_FAILF("%s f16 [%zu]: 0x%08x -> 0x%04x, want 0x%04x", dt_isa_name(dt_isa()), i,
                           bits(x[i]), h[i], dt_f16_from_f32(x[i]));
        /* All 65536 patterns, 16 -> 32, offset by one element. */
        dt_bf16_to_f32(y + 1, all, N - 1);
        for (uint32_t i = 0; i < N - 1; i++)
            ASSERT_EQ(bits(y[1 + i]), bits(dt_f32_from_bf16(all[i])));
        dt_bf16_to_f32(y, all + N - 1, 1);
        ASSERT_EQ(bits(y[0]), 0xffff0000u);
        dt_f16_to_f32(y, all, N);
        for (uint32_t i = 0; i < N; i++)
            if (bits(y[i]) != bits(dt_f32_from_f16(all[i])))
                TEST_FAILF("%s f16 0x%04x -> 0x%08x, want 0x%08x", dt_isa_name(dt_isa()), i,
                           bits(y[i]), bits(dt_f32_from_f16(all[i])));
        printf("  %s: bit-exact\n", dt_isa_name(dt_isa()));
    }
    free(x), free(y), free(ref32), free(h), free(ref16), free(all);
    ASSERT_OK(dt_isa_set(max));
}

/* PyTorch's conversions (tests/data/gen_amp_convert.py) as an independent
 * reference: every non-NaN value must give the same bits on every level;
 * NaNs must stay NaN (PyTorch canonicalises their payload, we keep it). */
static void test_against_pytorch(void) {
    FILE *f = fopen(DT_TEST_DATA_DIR "/data/amp_convert.bin", "rb");
    ASSERT_TRUE(f != NULL);
    char magic[8];
    uint32_t hdr[2];
    ASSERT_EQ(fread(magic, 1, 8, f), 8);
    ASSERT_TRUE(memcmp(magic, "DTAMPCNV", 8) == 0);
    ASSERT_EQ(fread(hdr, 4, 2, f), 2);
    ASSERT_EQ(hdr[0], 1);
    uint32_t n = hdr[1];
    ASSERT_TRUE(n > 1000 && n < 1000000);
    uint32_t *xb = malloc(n * 4);
    uint16_t *tb = malloc(n * 2), *th = malloc(n * 2), *ob = malloc(n * 2), *oh = malloc(n * 2);
    ASSERT_TRUE(xb && tb && th && ob && oh);
    ASSERT_EQ(fread(xb, 4, n, f), n);
    ASSERT_EQ(fread(tb, 2, n, f), n);
    ASSERT_EQ(fread(th, 2, n, f), n);
    ASSERT_EQ(fgetc(f), EOF);
    fclose(f);
    dt_isa_level max = dt_cpu_features_get()->max_level;
    for (int l = 0; l <= (int)max; l++) {
        ASSERT_OK(dt_isa_set((dt_isa_level)l));
        dt_f32_to_bf16(ob, (const float *)xb, n);
        dt_f32_to_f16(oh, (const float *)xb, n);
        for (uint32_t i = 0; i < n; i++) {
            if ((xb[i] & 0x7fffffffu) > 0x7f800000u) {
                ASSERT_TRUE((ob[i] & 0x7fff) > 0x7f80 && (oh[i] & 0x7fff) > 0x7c00);
                continue;
            }
            if (ob[i] != tb[i] || oh[i] != th[i])
                TEST_FAILF("%s: 0x%08x -> bf16 0x%04x (torch 0x%04x), f16 0x%04x (torch 0x%04x)",
                           dt_isa_name(dt_isa()), xb[i], ob[i], tb[i], oh[i], th[i]);
        }
    }
    printf("  %u values match PyTorch on every level\n", n);
    ASSERT_OK(dt_isa_set(max));
    free(xb), free(tb), free(th), free(ob), free(oh);
}

/* Arrays of >= 2^20 elements are split over threads: same bits as the
 * reference, including at the chunk borders. */
static void test_large_arrays_threaded(void) {
    size_t n = (3u << 20) + 17;
    float *x = malloc(n * 4), *y = malloc(n * 4);
    uint16_t *h = malloc(n * 2);
    ASSERT_TRUE(x && y && h);
    dt_rng r;
    dt_rng_init(&r, 11, dt_rng_stream_id(0, 1, DT_RNG_TEST));
    for (size_t i = 0; i < n; i++)
        x[i] = fl(dt_rng_u32(&r));
    dt_f32_to_bf16(h, x, n);
    for (size_t i = 0; i < n; i++)
        if (h[i] != dt_bf16_from_f32(x[i]))
            TEST_FAILF("bf16 [%zu] 0x%08x -> 0x%04x", i, bits(x[i]), h[i]);
    dt_bf16_to_f32(y, h, n);
    for (size_t i = 0; i < n; i++)
        ASSERT_EQ(bits(y[i]), bits(dt_f32_from_bf16(h[i])));
    dt_f32_to_f16(h, x, n);
    for (size_t i = 0; i < n; i++)
        if (h[i] != dt_f16_from_f32(x[i]))
            TEST_FAILF("f16 [%zu] 0x%08x -> 0x%04x", i, bits(x[i]), h[i]);
    dt_f16_to_f32(y, h, n);
    for (size_t i = 0; i < n; i++)
        ASSERT_EQ(bits(y[i]), bits(dt_f32_from_f16(h[i])));
    free(x), free(y), free(h);
}

int main(void) {
    RUN(test_isa_env); /* first: children must inherit an unread DT_ISA */
    RUN(test_isa_names);
    RUN(test_reference_values);
    RUN(test_paths_bit_exact);
    RUN(test_against_pytorch);
    RUN(test_large_arrays_threaded);
    return TEST_SUMMARY();
}
