/*
 * test.h — a tiny assertion header for dtrain's tests.
 *
 * Each test file is its own program (ctest runs it as a separate process
 * with a timeout). A failed assertion prints both sides with file:line and
 * exits 1 immediately: a test that fails must not go on to pass.
 *
 *     static void test_sizes(void) {
 *         size_t v;
 *         ASSERT_OK(dt_config_parse_size("--x", "64K", 0, SIZE_MAX, &v));
 *         ASSERT_EQ(v, 65536);
 *     }
 *     int main(void) { RUN(test_sizes); return TEST_SUMMARY(); }
 */
#ifndef DTRAIN_TEST_H
#define DTRAIN_TEST_H

#include "dtrain/core.h"

#include <inttypes.h>
#include <math.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static int test__run_count;
static const char *test__current = "";

static inline _Noreturn void test__fail(const char *file, int line, const char *msg) {
    fprintf(stderr, "FAIL %s\n  %s:%d: %s\n", test__current, file, line, msg);
    const char *err = dt_last_error();
    if (err && *err)
        fprintf(stderr, "  dt_last_error: %s\n", err);
    fflush(stderr);
    exit(1);
}

/* A message longer than the buffer is cut; reading snprintf's result says
 * that is intended (-Wformat-truncation). */
#define TEST_FAILF(...)                                                                            \
    do {                                                                                           \
        char test__msg[1024];                                                                      \
        int test__len = snprintf(test__msg, sizeof test__msg, __VA_ARGS__);                        \
        (void)test__len;                                                                           \
        test__fail(__FILE__, __LINE__, test__msg);                                                 \
    } while (0)

#define ASSERT_TRUE(cond)                                                                          \
    do {                                                                                           \
        if (!(cond))                                                                               \
            TEST_FAILF("expected true: %s", #cond);                                                \
    } while (0)

/* Integer equality, printing both values (signed comparison via intmax_t,
 * unsigned values above INTMAX_MAX compare through uintmax_t). */
#define ASSERT_EQ(a, b)                                                                            \
    do {                                                                                           \
        intmax_t test__a = (intmax_t)(a), test__b = (intmax_t)(b);                                 \
        if (test__a != test__b)                                                                    \
            TEST_FAILF("%s == %s\n    left:  %jd (0x%jx)\n    right: %jd (0x%jx)", #a, #b,         \
                       test__a, (uintmax_t)test__a, test__b, (uintmax_t)test__b);                  \
    } while (0)

#define ASSERT_NE(a, b)                                                                            \
    do {                                                                                           \
        intmax_t test__a = (intmax_t)(a), test__b = (intmax_t)(b);                                 \
        if (test__a == test__b)                                                                    \
            TEST_FAILF("%s != %s\n    both: %jd", #a, #b, test__a);                                \
    } while (0)

#define ASSERT_STREQ(a, b)                                                                         \
    do {                                                                                           \
        const char *test__a = (a), *test__b = (b);                                                 \
        if (!test__a || !test__b || strcmp(test__a, test__b) != 0)                                 \
            TEST_FAILF("%s == %s\n    left:  \"%s\"\n    right: \"%s\"", #a, #b,                   \
                       test__a ? test__a : "(null)", test__b ? test__b : "(null)");                \
    } while (0)

#define ASSERT_CONTAINS(haystack, needle)                                                          \
    do {                                                                                           \
        const char *test__h = (haystack), *test__n = (needle);                                     \
        if (!test__h || !strstr(test__h, test__n))                                                 \
            TEST_FAILF("expected \"%s\" to contain \"%s\"", test__h ? test__h : "(null)",          \
                       test__n);                                                                   \
    } while (0)

/* |a - b| <= atol + rtol * |b| */
#define ASSERT_NEAR(a, b, rtol, atol)                                                              \
    do {                                                                                           \
        double test__a = (double)(a), test__b = (double)(b);                                       \
        double test__tol = (double)(atol) + (double)(rtol)*fabs(test__b);                          \
        if (!(fabs(test__a - test__b) <= test__tol))                                               \
            TEST_FAILF("%s ~= %s\n    left:  %.9g\n    right: %.9g\n    diff:  %.3g > tol %.3g",   \
                       #a, #b, test__a, test__b, fabs(test__a - test__b), test__tol);              \
    } while (0)

#define ASSERT_OK(call)                                                                            \
    do {                                                                                           \
        dt_status test__st = (call);                                                               \
        if (test__st != DT_OK)                                                                     \
            TEST_FAILF("%s returned %s (%s)", #call, dt_status_name(test__st),                     \
                       dt_strerror(test__st));                                                     \
    } while (0)

#define ASSERT_STATUS(call, expected)                                                              \
    do {                                                                                           \
        dt_status test__st = (call);                                                               \
        if (test__st != (expected))                                                                \
            TEST_FAILF("%s returned %s, expected %s", #call, dt_status_name(test__st),             \
                       dt_status_name(expected));                                                  \
    } while (0)

#define RUN(fn)                                                                                    \
    do {                                                                                           \
        test__current = #fn;                                                                       \
        dt_error_clear();                                                                          \
        fn();                                                                                      \
        test__run_count++;                                                                         \
        printf("ok %s\n", #fn);                                                                    \
        fflush(stdout);                                                                            \
    } while (0)

#define TEST_SUMMARY() (printf("%d passed, 0 failed\n", test__run_count), 0)

/* A program whose cases run one per process (`prog NAME`, one ctest each). */
typedef struct test_case {
    const char *name;
    void (*fn)(void);
} test_case;

/* The case argv[1] names, or NULL after printing the usage with every name. */
static inline const test_case *test_find_case(int argc, char **argv, const test_case *cases,
                                              size_t n) {
    for (size_t i = 0; argc == 2 && i < n; i++)
        if (strcmp(argv[1], cases[i].name) == 0)
            return &cases[i];
    fprintf(stderr, "usage: %s ", argc > 0 ? argv[0] : "test");
    for (size_t i = 0; i < n; i++)
        fprintf(stderr, "%s%s", i ? "|" : "", cases[i].name);
    fprintf(stderr, "\n");
    return NULL;
}

/* Run one case like RUN does. */
static inline void test_run_case(const test_case *c) {
    test__current = c->name;
    dt_error_clear();
    c->fn();
    test__run_count++;
    printf("ok %s\n", c->name);
    fflush(stdout);
}

/* A port P with P and P + 1 free (node 0 of a multi-node launch uses both),
 * taken outside the kernel's ephemeral range (32768-60999 by default) so that
 * other programs' bind(0) and connect() calls do not race for it. Tests that
 * use it hold the ctest resource lock "launch_ports", so they do not race each
 * other either. */
static inline int test_free_port_pair(void) {
    unsigned seed = (unsigned)getpid() ^ (unsigned)dt_now_ns();
    for (int attempt = 0; attempt < 1000; attempt++) {
        seed = seed * 1103515245u + 12345u;
        int port = 20000 + (int)((seed >> 8) % 12000);
        int ok = 0;
        for (int k = 0; k < 2; k++) {
            int fd = socket(AF_INET, SOCK_STREAM, 0);
            struct sockaddr_in sa = {.sin_family = AF_INET,
                                     .sin_port = htons((uint16_t)(port + k))};
            sa.sin_addr.s_addr = htonl(INADDR_ANY);
            ok += fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0;
            if (fd >= 0)
                close(fd);
        }
        if (ok == 2)
            return port;
    }
    TEST_FAILF("no free pair of TCP ports in [20000, 32000)");
}

#endif /* DTRAIN_TEST_H */
