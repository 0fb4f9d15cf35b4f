/*
 * test_metrics.c — metrics.jsonl lines (jansson), config.json,
 * the sparkline, both progress modes, and the loss-scaler fields.
 */
#include "dtrain/train.h"
#include "test.h"

#include <sys/stat.h>

#include <unistd.h>

static char dir[64];

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    ASSERT_TRUE(f != NULL);
    static char buf[65536];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

static int count_char(const char *s, char c) {
    int n = 0;
    for (; *s; s++)
        n += *s == c;
    return n;
}

static dt_step_metrics sample(int64_t step) {
    return (dt_step_metrics){.step = step,
                             .total_steps = 10,
                             .loss = 4.5 - 0.25 * (double)step,
                             .val_loss = step % 5 == 0 ? 3.0 : NAN,
                             .lr = 0.001,
                             .grad_norm = 1.5,
                             .tokens_per_s = 12000,
                             .step_ms = 50,
                             .compute_ms = 40,
                             .comm_ms = 20,
                             .exposed_comm_ms = 10,
                             .tp_comm_ms = step == 2 ? 2.5 : NAN,
                             .cp_attention_ms = step == 2 ? 7.5 : NAN,
                             .pp_bubble = step == 2 ? 0.25 : NAN,
                             .pp_peak_live = step == 2 ? 3 : 0,
                             .mfu = NAN,
                             .bytes_sent = 1u << 20,
                             .tokens = step * 600,
                             .loss_scale = NAN};
}

static void test_metrics_file(void) {
    char run[128], path[160];
    snprintf(run, sizeof run, "%s/run/a", dir);
    dt_metrics *m;
    ASSERT_OK(dt_metrics_create(&m, run, 0));
    for (int64_t s = 1; s <= 5; s++) {
        dt_step_metrics x = sample(s);
        ASSERT_OK(dt_metrics_log(m, &x));
    }
    dt_metrics_destroy(m);
    dt_metrics_destroy(NULL);
    snprintf(path, sizeof path, "%s/metrics.jsonl", run);
    char *text = slurp(path);
    ASSERT_EQ(count_char(text, '\n'), 5);
    ASSERT_CONTAINS(text, "{\"step\":1,\"loss\":4.25,\"val_loss\":null,\"lr\":0.001,"
                          "\"grad_norm\":1.5,\"tokens_per_s\":12000.0,\"step_ms\":50.0,"
                          "\"compute_ms\":40.0,\"comm_ms\":20.0,\"exposed_comm_ms\":10.0,"
                          "\"tp_comm_ms\":null,\"cp_attention_ms\":null,\"pp_bubble\":null,\"pp_"
                          "peak_live\":0,\"mfu\":null,"
                          "\"bytes_sent\":1048576,\"tokens\":600,\"loss_scale\":null,"
                          "\"skipped_steps\":0}\n");
    ASSERT_CONTAINS(text, "{\"step\":5,\"loss\":3.25,\"val_loss\":3.0,");
    ASSERT_CONTAINS(text, "\"exposed_comm_ms\":10.0,\"tp_comm_ms\":2.5,\"cp_attention_ms\":7.5,"
                          "\"pp_bubble\":0.25,\"pp_"
                          "peak_live\":3,\"mfu\"");

    /* A run resumed from step 3 keeps steps 1..3 and appends; a fresh one
     * starts over. */
    ASSERT_OK(dt_metrics_create(&m, run, 3));
    dt_step_metrics x = sample(4);
    ASSERT_OK(dt_metrics_log(m, &x));
    dt_metrics_destroy(m);
    text = slurp(path);
    ASSERT_EQ(count_char(text, '\n'), 4);
    ASSERT_CONTAINS(text, "{\"step\":3,");
    ASSERT_CONTAINS(text, "{\"step\":4,");
    ASSERT_TRUE(strstr(text, "{\"step\":5,") == NULL);
    ASSERT_OK(dt_metrics_create(&m, run, 9)); /* beyond the file: keeps all */
    dt_metrics_destroy(m);
    ASSERT_EQ(count_char(slurp(path), '\n'), 4);
    ASSERT_OK(dt_metrics_create(&m, run, 0));
    dt_metrics_destroy(m);
    ASSERT_EQ(count_char(slurp(path), '\n'), 0);

    ASSERT_STATUS(dt_metrics_create(&m, "/proc/nope/run", 0), DT_ERR_IO);
    ASSERT_CONTAINS(dt_last_error(), "/proc/nope");
}

static void test_config(void) {
    const char *t = "{\n  \"lr\": 0.05\n}\n";
    char run[128], path[160];
    snprintf(run, sizeof run, "%s/run/b", dir);
    ASSERT_OK(dt_metrics_write_config(run, t));
    snprintf(path, sizeof path, "%s/config.json", run);
    ASSERT_STREQ(slurp(path), t);
}

static void test_sparkline(void) {
    double up[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    char b[64];
    ASSERT_STREQ(dt_sparkline(b, sizeof b, up, 8), "▁▂▃▄▅▆▇█");
    double flat[3] = {2, 2, 2};
    ASSERT_STREQ(dt_sparkline(b, sizeof b, flat, 3), "▁▁▁");
    double two[2] = {9, 1};
    ASSERT_STREQ(dt_sparkline(b, sizeof b, two, 2), "█▁");
    ASSERT_STREQ(dt_sparkline(b, 7, up, 8), "▁▂"); /* stops before overflowing */
}

static void test_progress_plain(void) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    dt_progress *p;
    ASSERT_OK(dt_progress_create(&p, f, false, 10, 4));
    for (int64_t s = 1; s <= 10; s++) {
        dt_step_metrics x = sample(s);
        dt_progress_update(p, &x);
    }
    dt_progress_finish(p);
    dt_progress_destroy(p);
    fclose(f);
    /* Steps 1 (first), 4, 8 and 10 (last). */
    ASSERT_EQ(count_char(text, '\n'), 4);
    ASSERT_CONTAINS(text, "step      1/10  loss 4.2500");
    ASSERT_CONTAINS(text, "step      8/10  loss 2.5000  val 3.0000");
    ASSERT_CONTAINS(text, "12.0k tok/s");
    ASSERT_CONTAINS(text, "(compute 40.0, comm 20.0, exposed 10.0)");
    ASSERT_TRUE(strchr(text, '\r') == NULL);
    free(text);
}

static void test_progress_tty(void) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    dt_progress *p;
    ASSERT_OK(dt_progress_create(&p, f, true, 10, 0));
    for (int64_t s = 1; s <= 10; s++) {
        dt_step_metrics x = sample(s);
        x.mfu = 0.25;
        dt_progress_update(p, &x);
    }
    dt_progress_finish(p);
    dt_progress_destroy(p);
    fclose(f);
    ASSERT_EQ(count_char(text, '\r'), 10);
    ASSERT_EQ(count_char(text, '\n'), 1); /* only after the last step */
    ASSERT_CONTAINS(text, "\r\033[Kstep 10/10 | loss 2.0000 ");
    ASSERT_CONTAINS(text, "█▇▆"); /* falling loss */
    ASSERT_CONTAINS(text, "MFU 25.0%");
    ASSERT_CONTAINS(text, "compute 40 + exposed comm 10");
    ASSERT_CONTAINS(text, "ETA 0s");
    free(text);
}

/* Loss scaling on: the scale and the skipped steps in the metrics line and
 * on both kinds of progress line (absent above, where it is off). */
static void test_scaler_fields(void) {
    dt_step_metrics x = sample(2);
    x.loss_scale = 32768;
    x.skipped_steps = 3;
    x.skipped = true;
    char line[512];
    ASSERT_TRUE(dt_metrics_format(line, sizeof line, &x) > 0);
    ASSERT_CONTAINS(line, ",\"tokens\":1200,\"loss_scale\":32768.0,\"skipped_steps\":3}\n");
    for (int tty = 0; tty <= 1; tty++) {
        char *text = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&text, &len);
        dt_progress *p;
        ASSERT_OK(dt_progress_create(&p, f, tty, 10, 1));
        dt_progress_update(p, &x);
        x.step = 3;
        x.loss_scale = 1e30;
        x.grad_norm = NAN; /* as on a skipped step */
        dt_progress_update(p, &x);
        x.step = 2;
        x.loss_scale = 32768;
        x.grad_norm = 1.5;
        dt_progress_finish(p);
        dt_progress_destroy(p);
        fclose(f);
        ASSERT_CONTAINS(text, tty ? "lr 1.00e-03 | scale 2^15 skipped 3 |"
                                  : "gnorm 1.500  scale 2^15 skipped 3  12.0k tok/s");
        ASSERT_CONTAINS(text, tty ? "scale 1e+30 skipped 3" : "gnorm skip  scale 1e+30 skipped 3");
        free(text);
    }
}

/* A metrics file that is not one: a FIFO where metrics.jsonl should be is
 * refused (not waited on), and a line too long to be a metrics line makes
 * the resume's rewrite fail instead of reading it into memory. */
static void test_metrics_bad_file(void) {
    char run[128], path[160];
    snprintf(run, sizeof run, "%s/run/fifo", dir);
    ASSERT_OK(dt_mkdir_p(run));
    snprintf(path, sizeof path, "%s/metrics.jsonl", run);
    ASSERT_EQ(mkfifo(path, 0600), 0);
    dt_metrics *m = NULL;
    ASSERT_STATUS(dt_metrics_create(&m, run, 3), DT_ERR_INVALID);
    ASSERT_STATUS(dt_metrics_create(&m, run, 0), DT_ERR_INVALID);
    snprintf(run, sizeof run, "%s/run/long", dir);
    ASSERT_OK(dt_mkdir_p(run));
    snprintf(path, sizeof path, "%s/metrics.jsonl", run);
    FILE *f = fopen(path, "w");
    ASSERT_TRUE(f != NULL);
    fputs("{\"step\":1,\"loss\":", f);
    for (int i = 0; i < 100000; i++)
        fputc('9', f);
    fputs("}\n", f);
    fclose(f);
    ASSERT_STATUS(dt_metrics_create(&m, run, 3), DT_ERR_CORRUPT);
    ASSERT_CONTAINS(dt_last_error(), "longer than 65535 bytes");
}

int main(void) {
    snprintf(dir, sizeof dir, "/tmp/dt_metrics_XXXXXX");
    ASSERT_TRUE(mkdtemp(dir) != NULL);
    RUN(test_metrics_file);
    RUN(test_config);
    RUN(test_metrics_bad_file);
    RUN(test_sparkline);
    RUN(test_progress_plain);
    RUN(test_progress_tty);
    RUN(test_scaler_fields);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    ASSERT_EQ(system(cmd), 0);
    return TEST_SUMMARY();
}
