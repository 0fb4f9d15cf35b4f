/*
 * cmd_plan.c — `dtrain plan`: what a layout will do, computed before
 * anything runs. `dtrain plan pipeline` generates a pipeline schedule,
 * checks it (parallel.h), and prints the per-rank table, the verdict, each
 * rank's peak live micro-batches and memory for the given model (from the
 * same memory plan that lays out the model's buffers), the bubble and a
 * timeline; --svg draws the timeline.
 */
#include "cli.h"
#include "dtrain/nn.h"
#include "dtrain/parallel.h"
#include "dtrain/train.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const precisions[] = {"fp32", "bf16", "fp16", NULL};
static const char *const optimizers[] = {"adamw", "sgd", NULL};

/* clang-format off */
static const cli_opt pipeline_opts[] = {
    {"stages", 'P', CLI_INT, "P", "2", "DT_PP", "pipeline stages (ranks)", NULL, 1, 4096},
    {"micro-batches", 'M', CLI_INT, "M", "8", "DT_MICRO_BATCHES", "micro-batches per optimizer step", NULL, 1, 1 << 20},
    {"schedule", 0, CLI_STRING, "KIND", "1f1b", "DT_PP_SCHEDULE", "gpipe, 1f1b, interleaved:V or zb", NULL, 0, 0},
    {"model", 'm', CLI_STRING, "PRESET", "gpt2-124m", "DT_MODEL", "model preset for the memory figures", NULL, 0, 0},
    {"layers", 0, CLI_INT, "L", "0", "DT_LAYERS", "transformer blocks (0: the preset's)", NULL, 0, 1024},
    {"dim", 0, CLI_INT, "C", "0", "DT_DIM", "channels (0: the preset's)", NULL, 0, 65536},
    {"heads", 0, CLI_INT, "NH", "0", "DT_HEADS", "attention heads (0: the preset's)", NULL, 0, 4096},
    {"seq", 's', CLI_INT, "T", "0", "DT_SEQ", "sequence length (0: the preset's)", NULL, 0, 1 << 20},
    {"vocab", 0, CLI_INT, "V", "0", "DT_VOCAB", "vocabulary (0: the preset's)", NULL, 0, 1 << 24},
    {"batch", 'b', CLI_INT, "B", "4", "DT_BATCH", "sequences per micro-batch", NULL, 1, 1 << 20},
    {"precision", 0, CLI_ENUM, "TYPE", "fp32", "DT_PRECISION", "compute type", precisions, 0, 0},
    {"recompute", 0, CLI_STRING, "MODE", "none", "DT_RECOMPUTE", "none, blocks, every:K", NULL, 0, 0},
    {"costs", 0, CLI_STRING, "F,B,W,C", "1,1,1,0", NULL, "durations of a forward, an input-gradient backward, a weight-gradient pass and a batch of transfers, relative", NULL, 0, 0},
    {"table", 0, CLI_FLAG, NULL, NULL, NULL, "print every rank's list of actions", NULL, 0, 0},
    {"svg", 0, CLI_STRING, "FILE", NULL, NULL, "write the timeline as an SVG drawing", NULL, 0, 0},
    {0},
};
/* clang-format on */

/* "F3", "B3", "W3"; transfers as ">a3 r1" (send activation to rank 1),
 * "<a3 r0", ">g3 r0", "<g3 r1"; chunks as a letter with interleaving. */
static void print_action(const dt_pp_schedule *s, const dt_pp_action *a, FILE *f) {
    static const char *const sym[DT_PP_OP_COUNT] = {"F", "B", "W", ">a", "<a", ">g", "<g"};
    fprintf(f, "%s%u", sym[a->op], a->mb);
    if (s->chunks > 1)
        fputc('a' + a->chunk % 26, f);
    if (a->peer >= 0)
        fprintf(f, "@%d", a->peer);
    fputc(' ', f);
}

static int run_pipeline(cli_args *a) {
    if (a->argc > 0)
        cli_usage_error(a->cmd, "unexpected argument '%s'", a->argv[0]);
    int P = (int)cli_int(a, "stages"), M = (int)cli_int(a, "micro-batches"), V;
    dt_pp_kind kind;
    if (dt_pp_kind_parse("--schedule", cli_str(a, "schedule"), &kind, &V) != DT_OK)
        cli_usage_error(a->cmd, "%s", dt_last_error());
    dt_pp_costs costs = dt_pp_costs_default();
    if (sscanf(cli_str(a, "costs"), "%lf,%lf,%lf,%lf", &costs.f, &costs.b, &costs.w, &costs.comm) !=
            4 ||
        !(costs.f > 0 && costs.b > 0 && costs.w > 0 && costs.comm >= 0))
        cli_usage_error(a->cmd, "--costs \"%s\": expected four numbers F,B,W,C (F, B, W > 0)",
                        cli_str(a, "costs"));
    dt_gpt_config cfg;
    if (dt_gpt_preset(cli_str(a, "model"), &cfg) != DT_OK)
        cli_usage_error(a->cmd, "%s", dt_last_error());
    static const char *const dims[] = {"layers", "dim", "heads", "seq", "vocab"};
    int *fields[] = {&cfg.layers, &cfg.dim, &cfg.heads, &cfg.max_seq, &cfg.vocab};
    for (int i = 0; i < 5; i++)
        if (cli_int(a, dims[i]) > 0)
            *fields[i] = (int)cli_int(a, dims[i]);
    if (dt_gpt_config_validate(&cfg) != DT_OK)
        cli_usage_error(a->cmd, "%s", dt_last_error());
    int S = P * V;
    if (cfg.layers < S)
        cli_usage_error(a->cmd,
                        "--stages %d x %d chunk(s) = %d virtual stages, but the model has %d "
                        "layers (every stage needs one)",
                        P, V, S, cfg.layers);
    dt_gpt_options mo = dt_gpt_options_default();
    mo.precision = (dt_precision)cli_enum(a, "precision");
    if (dt_recompute_parse("--recompute", cli_str(a, "recompute"), &mo.recompute_every) != DT_OK)
        cli_usage_error(a->cmd, "%s", dt_last_error());
    int B = (int)cli_int(a, "batch");

    dt_pp_schedule *s;
    dt_status st = dt_pp_schedule_create(&s, kind, P, V, M);
    if (st != DT_OK)
        return cli_fail(st);
    dt_pp_report r;
    st = dt_pp_check(s, &costs, &r);
    printf("pipeline: %s, %d stage(s) x %d chunk(s), %d micro-batch(es) of %d x %d, %s\n",
           dt_pp_kind_names[kind], P, V, M, B, cfg.max_seq, cli_str(a, "model"));
    if (st != DT_OK) {
        printf("check:    REFUSED: %s\n", dt_last_error());
        dt_pp_schedule_destroy(s);
        return 1;
    }
    printf("check:    ok (every transfer matched, no deadlock)\n");
    printf("bubble:   %.1f%% simulated (F %g, B %g, W %g, transfers %g); theory %.1f%% for "
           "%s\n",
           100 * r.bubble, costs.f, costs.b, costs.w, costs.comm,
           100 * dt_pp_theoretical_bubble(kind, P, V, M),
           kind == DT_PP_ZB ? "1F1B" : dt_pp_kind_names[kind]);
    printf("memory per rank (%s, recompute %s; layers split evenly over the %d stages):\n",
           dt_precision_name(mo.precision), cli_str(a, "recompute"), S);
    for (int rank = 0; rank < P; rank++) {
        /* The model part and slots the run builds (dt_pp_model_part, dt_pp_slots). */
        dt_gpt_options o = mo;
        o.slots = dt_pp_slots(s, &r, rank);
        o.split_weight_grads = s->split_w;
        dt_memory_report mr;
        st = dt_pp_model_part(s, cfg.layers, rank, &o.part);
        if (st != DT_OK)
            break;
        dt_gpt_memory_plan_with(&cfg, B, cfg.max_seq, &o, &mr);
        char pb[32], gb[32], ob[32], ab[32], tb[32], wb[32];
        size_t total = 4 * mr.params + mr.weights16 + mr.activations; /* + grads, AdamW m, v */
        printf("  rank %-3d live micro-batches %-3d params %s, grads %s, AdamW %s, activations "
               "%s%s%s%s: %s\n",
               rank, r.peak_live[rank], dt_format_bytes((double)mr.params, pb, sizeof pb),
               dt_format_bytes((double)mr.grads, gb, sizeof gb),
               dt_format_bytes(2.0 * mr.params, ob, sizeof ob),
               dt_format_bytes((double)mr.activations, ab, sizeof ab),
               mr.wgrad ? " (of which kept for W " : "",
               mr.wgrad ? dt_format_bytes((double)mr.wgrad, wb, sizeof wb) : "",
               mr.wgrad ? ")" : "", dt_format_bytes((double)total, tb, sizeof tb));
    }
    if (st != DT_OK) {
        dt_pp_report_free(&r);
        dt_pp_schedule_destroy(s);
        return cli_fail(st);
    }
    if (cli_bool(a, "table")) {
        printf("table:\n");
        for (int rank = 0; rank < P; rank++) {
            printf("  rank %-3d ", rank);
            for (size_t i = s->start[rank]; i < s->start[rank + 1]; i++)
                print_action(s, &s->actions[i], stdout);
            printf("\n");
        }
    }
    printf("timeline (one column per %s):\n", V > 1 ? "half forward" : "forward");
    dt_pp_timeline_text(s, &r, costs.f / (V > 1 ? 2 : 1), stdout);
    const char *svg = cli_str(a, "svg");
    if (svg) {
        st = dt_pp_timeline_svg(s, &r, svg);
        if (st == DT_OK)
            printf("svg:      %s\n", svg);
    }
    dt_pp_report_free(&r);
    dt_pp_schedule_destroy(s);
    return st == DT_OK ? 0 : cli_fail(st);
}

static const cli_cmd plan_pipeline = {
    .name = "pipeline",
    .parent = "plan",
    .summary = "generate, check and draw a pipeline schedule",
    .usage = "dtrain plan pipeline --stages P --micro-batches M --schedule KIND [OPTIONS]",
    .description =
        "Generates the schedule (gpipe, 1f1b, interleaved:V, zb), checks it (every transfer\n"
        "matched, no deadlock under the executor's semantics), and prints each rank's peak\n"
        "live micro-batches and memory for the model, the bubble and a timeline.\n"
        "Example:\n"
        "  dtrain plan pipeline --stages 4 --micro-batches 8 --schedule interleaved:2 --svg "
        "pp.svg",
    .opts = pipeline_opts,
    .run = run_pipeline,
};

/* clang-format off */
static const cli_opt memory_opts[] = {
    {"model", 'm', CLI_STRING, "PRESET", "gpt2-124m", "DT_MODEL", "model preset", NULL, 0, 0},
    {"layers", 0, CLI_INT, "L", "0", "DT_LAYERS", "transformer blocks (0: the preset's)", NULL, 0, 1024},
    {"dim", 0, CLI_INT, "C", "0", "DT_DIM", "channels (0: the preset's)", NULL, 0, 65536},
    {"heads", 0, CLI_INT, "NH", "0", "DT_HEADS", "attention heads (0: the preset's)", NULL, 0, 4096},
    {"seq", 's', CLI_INT, "T", "0", "DT_SEQ", "sequence length (0: the preset's)", NULL, 0, 1 << 20},
    {"vocab", 0, CLI_INT, "V", "0", "DT_VOCAB", "vocabulary (0: the preset's)", NULL, 0, 1 << 24},
    {"nproc", 'n', CLI_INT, "N", "1", "DT_NPROC", "ranks of the job", NULL, 1, 1 << 20},
    {"dp", 0, CLI_INT, "N", "0", "DT_DP", "data-parallel degree (0: the ranks left over)", NULL, 0, 1 << 20},
    {"tp", 0, CLI_INT, "N", "1", "DT_TP", "tensor-parallel degree", NULL, 1, 4096},
    {"sp", 0, CLI_FLAG, NULL, NULL, "DT_SP", "sequence parallelism with --tp", NULL, 0, 0},
    {"pp", 0, CLI_INT, "N", "1", "DT_PP", "pipeline stages", NULL, 1, 4096},
    {"cp", 0, CLI_INT, "N", "1", "DT_CP", "context-parallel degree", NULL, 1, 4096},
    {"cp-mode", 0, CLI_STRING, "MODE", "auto", "DT_CP_MODE", "ulysses, ring or auto (as dtrain train)", NULL, 0, 0},
    {"pp-schedule", 0, CLI_STRING, "KIND", NULL, "DT_PP_SCHEDULE", "gpipe, 1f1b, interleaved:V or zb", NULL, 0, 0},
    {"micro-batches", 0, CLI_INT, "M", "1", "DT_MICRO_BATCHES", "micro-batches per step", NULL, 1, 1 << 20},
    {"zero", 0, CLI_INT, "S", "0", "DT_ZERO", "ZeRO stage (0, 1, 2, 3)", NULL, 0, 3},
    {"batch", 'b', CLI_INT, "B", "8", "DT_BATCH", "sequences per data-parallel rank per micro-batch", NULL, 1, 1 << 20},
    {"precision", 0, CLI_ENUM, "TYPE", "fp32", "DT_PRECISION", "compute type", precisions, 0, 0},
    {"recompute", 0, CLI_STRING, "MODE", "none", "DT_RECOMPUTE", "none, blocks, every:K", NULL, 0, 0},
    {"optimizer", 0, CLI_ENUM, "NAME", "adamw", "DT_OPTIMIZER", "optimizer", optimizers, 0, 0},
    {"bucket-size", 0, CLI_SIZE, "SIZE", "0", "DT_BUCKET_SIZE", "gradient bucket size (0: a quarter of the gradient bytes, 1M-25M, as train's)", NULL, 0, 1e12},
    {0},
};
/* clang-format on */

/* Every rank's memory: the trainer's own plan (dt_train_plan_memory). */
static int run_memory(cli_args *a) {
    dt_gpt_config cfg;
    if (dt_gpt_preset(cli_str(a, "model"), &cfg) != DT_OK)
        cli_usage_error(a->cmd, "%s", dt_last_error());
    static const char *const dims[] = {"layers", "dim", "heads", "seq", "vocab"};
    int *fields[] = {&cfg.layers, &cfg.dim, &cfg.heads, &cfg.max_seq, &cfg.vocab};
    for (int i = 0; i < 5; i++)
        if (cli_int(a, dims[i]) > 0)
            *fields[i] = (int)cli_int(a, dims[i]);
    dt_train_config c;
    dt_train_config_init(&c);
    c.model = cli_str(a, "model");
    c.dp = (int)cli_int(a, "dp");
    c.tp = (int)cli_int(a, "tp");
    c.sp = cli_bool(a, "sp");
    c.pp = (int)cli_int(a, "pp");
    c.cp = (int)cli_int(a, "cp");
    c.cp_mode = cli_str(a, "cp-mode");
    c.pp_schedule = cli_str(a, "pp-schedule");
    c.accum = (int)cli_int(a, "micro-batches");
    c.zero = (int)cli_int(a, "zero");
    c.batch = (int)cli_int(a, "batch");
    c.precision = (dt_precision)cli_enum(a, "precision");
    c.optimizer = (dt_optim_kind)cli_enum(a, "optimizer");
    c.bucket_bytes = cli_size(a, "bucket-size");
    if (dt_recompute_parse("--recompute", cli_str(a, "recompute"), &c.recompute_every) != DT_OK)
        cli_usage_error(a->cmd, "%s", dt_last_error());
    int world = (int)cli_int(a, "nproc");
    printf("memory per rank: %s (L%d C%d NH%d T%d V%d), %d rank(s), batch %d x %d, %d "
           "micro-batch(es), zero %d, %s, recompute %s\n",
           c.model, cfg.layers, cfg.dim, cfg.heads, cfg.max_seq, cfg.vocab, world, c.batch,
           cfg.max_seq, c.accum, c.zero, dt_precision_name(c.precision), cli_str(a, "recompute"));
    /* Ranks that plan alike (dp replicas, tp shards) print once. */
    char prev[512] = "";
    for (int r = 0; r < world; r++) {
        dt_rank_memory m;
        dt_status st = dt_train_plan_memory(&c, &cfg, world, r, &m);
        if (st != DT_OK)
            return cli_fail(st);
        char line[512];
        FILE *f = fmemopen(line, sizeof line, "w");
        if (!f)
            return cli_fail(DT_ERR_NOMEM);
        dt_rank_memory_print(&m, f);
        fclose(f);
        if (strcmp(line, prev) != 0)
            printf("  rank %-4d %s\n", r, line);
        snprintf(prev, sizeof prev, "%s", line);
    }
    return 0;
}

static const cli_cmd plan_memory = {
    .name = "memory",
    .parent = "plan",
    .summary = "the memory each rank of a layout will hold",
    .usage =
        "dtrain plan memory --model M [--nproc N --dp N --tp N --pp N --cp N] --zero S [OPTIONS]",
    .description =
        "Plans every rank of the job with the trainer's own code: parameters, gradients\n"
        "(ZeRO 2: the resident peak), optimizer state, 16-bit weights and activations.\n"
        "Ranks that plan the same are printed once.\n"
        "Example:\n"
        "  dtrain plan memory --model gpt2-124m --nproc 2 --zero 2 --batch 4 --seq 64",
    .opts = memory_opts,
    .run = run_memory,
};

static const cli_opt plan_opts[] = {{0}};

static const cli_cmd *const plan_subs[] = {&plan_pipeline, &plan_memory};

static int run_plan(cli_args *a) {
    return cli_run_sub(a, plan_subs, 2, "plan", "(expected: pipeline or memory)");
}

const cli_cmd cli_cmd_plan = {
    .name = "plan",
    .summary = "plan a layout before running it: dtrain plan pipeline|memory ...",
    .usage = "dtrain plan pipeline|memory [OPTIONS]",
    .description =
        "plans:\n  pipeline   schedule table, check, memory per stage, bubble, timeline\n"
        "  memory     every rank's memory for a layout (ZeRO, tp, pp, precision)",
    .opts = plan_opts,
    .run = run_plan,
    .stop_at_positional = true,
    .subs = plan_subs,
    .nsubs = 2,
};
