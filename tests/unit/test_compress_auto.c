/*
 * test_compress_auto.c — the adaptive codec choice (--compress auto): the
 * candidate list (parsed, ordered most accurate first, bad lists refused
 * with the knob and the text) and the rule dt_codec_auto_choose against
 * hand-worked cases: a fast link compresses nothing, a slow one everything
 * that cannot hide, a window in between compresses only the late buckets
 * and exactly as much as needed, a link too slow for any plan takes the
 * fastest everywhere.
 */
#include "dtrain/compress.h"
#include "test.h"

#include <string.h>

static void test_parse(void) {
    dt_codec_auto a;
    char buf[256];
    ASSERT_OK(dt_codec_auto_parse("--compress", "auto", &a));
    ASSERT_EQ(a.n, 3);
    ASSERT_STREQ(dt_codec_auto_format(&a, buf, sizeof buf), "auto:none,fp16,int8");
    /* Sorted by bytes per value, the most accurate first. */
    ASSERT_OK(dt_codec_auto_parse("--compress", "auto:int8,topk:0.01,none,powersgd:4,fp16", &a));
    ASSERT_EQ(a.n, 5);
    ASSERT_STREQ(dt_codec_auto_format(&a, buf, sizeof buf),
                 "auto:none,fp16,int8,topk:0.01,powersgd:4");
    dt_codec_auto b;
    ASSERT_OK(dt_codec_auto_parse("--compress", buf, &b)); /* round trip */
    char buf2[256];
    ASSERT_STREQ(dt_codec_auto_format(&b, buf2, sizeof buf2), buf);
    const char *bad[] = {"autox",           "auto:",         "auto:int8",
                         "auto:int8,int8",  "auto:int8,foo", "auto:none,,int8",
                         "auto:none,int8,", "none",          NULL};
    for (int i = 0; bad[i]; i++) {
        ASSERT_STATUS(dt_codec_auto_parse("--compress", bad[i], &a), DT_ERR_INVALID);
        ASSERT_CONTAINS(dt_last_error(), "--compress");
    }
    ASSERT_STATUS(dt_codec_auto_parse("--compress", "auto:a,b,c,d,e,f,g,h,i", &a), DT_ERR_INVALID);
}

/* Ten buckets launched one second apart (backward ends at 10 s), each
 * costing `slow` s uncompressed (candidate 0) and `fast` s compressed
 * (candidate 1). */
static void ten(dt_auto_bucket *b, double slow, double fast) {
    for (int i = 0; i < 10; i++)
        b[i] = (dt_auto_bucket){.launch = i, .cost = {slow, fast}};
}

/* Where the plan's last bucket finishes. */
static double finish(const dt_auto_bucket *b, int nb, const int *c) {
    double f = 0;
    for (int i = 0; i < nb; i++)
        f = (b[i].launch > f ? b[i].launch : f) + b[i].cost[c[i]];
    return f;
}

static void test_choose(void) {
    dt_auto_bucket b[10];
    int c[10];
    /* Fast link: everything hides behind backward uncompressed. */
    ten(b, 0.5, 0.4);
    dt_codec_auto_choose(b, 10, 2, 10, 0, c);
    for (int i = 0; i < 10; i++)
        ASSERT_EQ(c[i], 0);
    /* Uncompressed faster than compressed (codec time > bytes saved):
     * never compressed, even with no window at all. */
    ten(b, 0.4, 0.5);
    dt_codec_auto_choose(b, 10, 2, 0, 0, c);
    for (int i = 0; i < 10; i++)
        ASSERT_EQ(c[i], 0);
    /* No window (end 0): the fastest everywhere. */
    ten(b, 2.0, 0.5);
    dt_codec_auto_choose(b, 10, 2, 0, 0, c);
    for (int i = 0; i < 10; i++)
        ASSERT_EQ(c[i], 1);
    /* In between: 1.5 s per bucket uncompressed cannot keep up with one a
     * second; the early ones go uncompressed while the later, compressed
     * at 0.5 s, can still finish by 10.5 s. */
    ten(b, 1.5, 0.5);
    dt_codec_auto_choose(b, 10, 2, 10, 0.05, c);
    int first = -1;
    for (int i = 0; i < 10; i++) {
        if (c[i] == 1 && first < 0)
            first = i;
        ASSERT_TRUE(first < 0 || c[i] == 1 || i < first); /* uncompressed, then compressed */
    }
    ASSERT_TRUE(first > 0); /* some uncompressed, some compressed */
    ASSERT_TRUE(finish(b, 10, c) <= 10 * 1.05 + 1e-9);
    /* As little compression as needed: one more uncompressed bucket breaks it. */
    int more[10];
    memcpy(more, c, sizeof more);
    more[first] = 0;
    ASSERT_TRUE(finish(b, 10, more) > 10 * 1.05);
    /* Too slow for any plan: the fastest everywhere (least exposed). */
    ten(b, 4.0, 2.0);
    dt_codec_auto_choose(b, 10, 2, 10, 0.05, c);
    for (int i = 0; i < 10; i++)
        ASSERT_EQ(c[i], 1);
    /* Three candidates: the middle one where it is enough. */
    for (int i = 0; i < 10; i++)
        b[i] = (dt_auto_bucket){.launch = i, .cost = {1.5, 0.9, 0.3}};
    dt_codec_auto_choose(b, 10, 3, 10, 0, c);
    ASSERT_TRUE(finish(b, 10, c) <= 10 + 1e-9);
    bool middle = false;
    for (int i = 0; i < 10; i++)
        middle |= c[i] == 1;
    ASSERT_TRUE(middle);
}

int main(void) {
    RUN(test_parse);
    RUN(test_choose);
    return TEST_SUMMARY();
}
