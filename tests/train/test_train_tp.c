/*
 * test_train_tp.c — tensor (and sequence) parallel training as real
 * processes, against one rank.
 *
 *   equiv_tp2, equiv_tp4, equiv_dp2tp2
 *                tp = 2, tp = 4 and dp 2 x tp 2, each with and without --sp,
 *                in fp32 and bf16: the loss and the global gradient norm of
 *                each of 20 steps, and the final parameters (read back from
 *                the layout-independent checkpoint as global tensors), equal
 *                the 1-rank run's within a tolerance for the reduction order
 *                (see `tol`).
 *   reshard      a run saved at tp = 2 resumes at dp = 2 (and one saved at
 *                dp = 2 resumes at tp = 2, and at tp 2 x dp 2 with --sp): the
 *                same losses as the uninterrupted run within float
 *                tolerance; a run stopped and resumed in its own layout is
 *                bit-identical to the uninterrupted one.
 *   format1      a checkpoint in the format before sharding (one flat
 *                "params" section, no tensor table) still resumes.
 *   layouts      bad layouts exit 2 naming the axis and the numbers.
 *   info         `dtrain ckpt info` shows the layout a checkpoint was written
 *                from, its shard files and each tensor's boxes by writer.
 * Run one case per process: test_train_tp CASE.
 */
#include "train_util.h"

#include "dtrain/nn.h"

#include <math.h>

#define DTRAIN DT_CLI_PATH
/* eps 1e-4, as in test_train_ddp: gradients that are zero in exact
 * arithmetic (the attention key bias) are rounding noise whose value
 * depends on the summation order, and Adam with eps 1e-8 would amplify
 * that noise by lr/eps. */
#define TINY                                                                                       \
    "--model tiny --layers 2 --dim 32 --heads 4 --seq 32 --threads 1 --peak-flops 1e9 "            \
    "--sample-tokens 0 --progress plain --val-split 0 --lr 1e-3 --warmup 1 --schedule linear "     \
    "--min-lr 1e-4 --eps 1e-4 --global-batch 4"
#define STEPS 20

static char corpus[128];

/* tu_train with this test's flags. */
static float *train(const char *name, const char *extra, int steps, size_t *n, double *loss,
                    double *norm) {
    return tu_train(TINY, corpus, name, extra, steps, n, loss, norm);
}

/* One layout against one rank, with and without --sp, fp32 and bf16. The
 * tolerance: fp32 partial sums of the row-parallel layers are added in
 * another order (relative 1e-7 per product), compounded over 20 Adam
 * steps; bf16 additionally rounds activations to 8 bits of mantissa, so a
 * sum in another order can land on the neighbouring bf16 value. */
static void run_equiv(const char *layout) {
    static const char *const precisions[] = {"fp32", "bf16"};
    for (int p = 0; p < 2; p++) {
        double rel = p == 0 ? 2e-5 : 5e-3;
        double l1[64], n1[64], l2[64], n2[64];
        size_t na, nb;
        char name[64], extra[256];
        snprintf(name, sizeof name, "one_%s", precisions[p]);
        snprintf(extra, sizeof extra, "--precision %s", precisions[p]);
        float *pa = train(name, extra, STEPS, &na, l1, n1);
        for (int sp = 0; sp < 2; sp++) {
            snprintf(name, sizeof name, "split_%s_%d", precisions[p], sp);
            snprintf(extra, sizeof extra, "--precision %s %s %s", precisions[p], layout,
                     sp ? "--sp" : "");
            float *pb = train(name, extra, STEPS, &nb, l2, n2);
            ASSERT_EQ(na, nb);
            char what[160];
            snprintf(what, sizeof what, "%s %s%s", precisions[p], layout, sp ? " --sp" : "");
            tu_expect_close(what, STEPS, l1, l2, n1, n2, pa, pb, na, rel);
            free(pb);
        }
        free(pa);
    }
}

static void test_equiv_tp2(void) { run_equiv("--nproc 2 --tp 2"); }
static void test_equiv_tp4(void) { run_equiv("--nproc 4 --tp 4"); }
static void test_equiv_dp2tp2(void) { run_equiv("--nproc 4 --tp 2"); }

/* tu_reshard with this test's flags, stopping after STEPS / 2. */
static void reshard(const char *name, const char *a, const char *b, bool bitwise) {
    tu_reshard(TINY, corpus, name, a, b, bitwise ? 0 : 2e-5, STEPS);
}

static void test_reshard(void) {
    reshard("same_tp2", "--nproc 2 --tp 2 --sp", "--nproc 2 --tp 2 --sp", true);
    reshard("tp2_to_dp2", "--nproc 2 --tp 2", "--nproc 2", false);
    reshard("dp2_to_tp2", "--nproc 2", "--nproc 2 --tp 2", false);
    reshard("tp2_to_dp2tp2", "--nproc 2 --tp 2", "--nproc 4 --tp 2 --sp", false);
    reshard("tp4_to_one", "--nproc 4 --tp 4", "", false);
}

/* The checkpoint format before sharding: rewrite a run's checkpoint as the
 * old trainer wrote it (train_state_version 1, one flat "params" and AdamW
 * state, no tensor table, maps or layout) and resume from it. */
static void test_format1(void) {
    double l2[64], n2[64];
    size_t np2;
    EXPECT_RC(tu_run("%s train --data %s " TINY " --steps %d --ckpt-dir %s/v2/ck --stop-after 10",
                     DTRAIN, corpus, STEPS, tu_dir),
              0);
    char path[256];
    snprintf(path, sizeof path, "%s/v2/ck", tu_dir);
    dt_ckpt *ck;
    ASSERT_OK(dt_ckpt_open_latest(&ck, path));
    dt_ckpt_section s[64];
    size_t k = 0;
    int64_t one = 1;
    for (size_t i = 0; i < dt_ckpt_num_sections(ck); i++) {
        dt_ckpt_info info;
        dt_ckpt_section_at(ck, i, &info);
        if (strstr(info.name, ".map") || !strcmp(info.name, "tensors") ||
            !strcmp(info.name, "layout"))
            continue;
        s[k++] = (dt_ckpt_section){
            strcmp(info.name, "train_state_version") ? info.name : "train_state_version", info.type,
            !strcmp(info.name, "train_state_version") ? &one : info.data, info.count};
    }
    char v1dir[256];
    snprintf(v1dir, sizeof v1dir, "%s/v1/ck", tu_dir);
    ASSERT_OK(dt_ckpt_save(v1dir, 10, s, k, 3, NULL, 0));
    dt_ckpt_close(ck);
    /* The uninterrupted run to 20 steps, and the v1 checkpoint resumed. */
    free(train("v2_whole", "", STEPS, &np2, l2, n2));
    EXPECT_RC(tu_run("%s train --data %s " TINY
                     " --steps %d --ckpt-dir %s --run-dir %s/v1 --resume",
                     DTRAIN, corpus, STEPS, v1dir, tu_dir),
              0);
    EXPECT_OUT("resumed from");
    double lv[64];
    snprintf(path, sizeof path, "%s/v1/metrics.jsonl", tu_dir);
    tu_losses(path, lv, 63);
    for (int st = 11; st <= STEPS; st++)
        if (lv[st] != l2[st])
            TEST_FAILF("step %d: loss %.9g after resuming the format-1 checkpoint, %.9g "
                       "uninterrupted",
                       st, lv[st], l2[st]);
}

static void test_layouts(void) {
    EXPECT_RC(tu_run("%s train --data %s " TINY " --steps 1 --nproc 2 --tp 3", DTRAIN, corpus), 2);
    EXPECT_OUT("not a multiple of --tp 3");
    EXPECT_RC(tu_run("%s train --data %s " TINY " --steps 1 --nproc 3 --tp 3", DTRAIN, corpus), 2);
    EXPECT_OUT("--tp 3 does not divide the model's 4 attention heads");
    EXPECT_RC(
        tu_run("%s train --data %s " TINY " --steps 1 --nproc 4 --tp 2 --dp 3", DTRAIN, corpus), 2);
    EXPECT_OUT("--dp 3 x --tp 2 x --pp 1 x --cp 1 = 6 ranks, but the job has 4");
    EXPECT_RC(tu_run("%s train --data %s " TINY " --steps 1 --sp", DTRAIN, corpus), 2);
    EXPECT_OUT("--sp (sequence parallelism) needs --tp 2 or more");
    EXPECT_RC(tu_run("%s train --data %s " TINY " --steps 1 --nproc 2 --tp 2 --sp --seq 31", DTRAIN,
                     corpus),
              2);
    EXPECT_OUT("sequence length 31 is not a multiple of --tp 2");
    EXPECT_RC(tu_run("%s train --data %s " TINY " --steps 1 --mesh-order tp-dp", DTRAIN, corpus),
              2);
    EXPECT_OUT("--mesh-order \"tp-dp\"");
    EXPECT_RC(tu_run("%s train --data %s " TINY " --steps 1 --cp 2 --nproc 2 --cp-mode rings",
                     DTRAIN, corpus),
              2);
    EXPECT_OUT("--cp-mode \"rings\": expected ulysses or ring");
}

static void test_info(void) {
    EXPECT_RC(tu_run("%s train --data %s " TINY " --steps 2 --nproc 4 --tp 2 --sp --ckpt-dir %s/ck",
                     DTRAIN, corpus, tu_dir),
              0);
    EXPECT_RC(tu_run("%s ckpt info %s/ck", DTRAIN, tu_dir), 0);
    EXPECT_OUT("layout:    written by 4 rank(s) as dp 2 x tp 2");
    EXPECT_OUT("the manifest and 1 shard file(s), checksums ok");
    EXPECT_OUT("ckpt-000002.r00001.dtck");
    EXPECT_OUT("h.1.attn.c_attn.weight       3x32x32        r0[0:3,0:16,0:32] r1[0:3,16:32,0:32]");
    EXPECT_OUT("ln_f.bias                    32             r0[0:32]\n");
    /* A damaged shard file: info says so and exits 1. */
    char p[256];
    snprintf(p, sizeof p, "%s/ck/ckpt-000002.r00001.dtck", tu_dir);
    FILE *f = fopen(p, "r+b");
    ASSERT_TRUE(f != NULL);
    fseek(f, 4096, SEEK_SET);
    fputc(0x5a, f);
    fclose(f);
    EXPECT_RC(tu_run("%s ckpt info %s/ck/ckpt-000002.dtck", DTRAIN, tu_dir), 1);
    EXPECT_OUT("shards:    UNUSABLE");
    EXPECT_OUT("checksum mismatch");
    /* And resume refuses it: no older checkpoint validates. */
    EXPECT_RC(tu_run("%s train --data %s " TINY " --steps 3 --nproc 4 --tp 2 --ckpt-dir %s/ck "
                     "--resume",
                     DTRAIN, corpus, tu_dir),
              1);
    EXPECT_OUT("none of the 1 checkpoints");
}

int main(int argc, char **argv) {
    static const test_case cases[] = {
        {"equiv_tp2", test_equiv_tp2},
        {"equiv_tp4", test_equiv_tp4},
        {"equiv_dp2tp2", test_equiv_dp2tp2},
        {"reshard", test_reshard},
        {"format1", test_format1},
        {"layouts", test_layouts},
        {"info", test_info},
    };
    return tu_main(argc, argv, cases, sizeof cases / sizeof cases[0], corpus, sizeof corpus);
}
