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
#include "dtrain/plan.h"
#include "dtrain/train.h"

#include <jansson.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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
    c.save_default = true; /* as `dtrain train`: the end assembles a split model */
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

/* ------------------------------------------------------------------------ */
/* dtrain plan --model ... --devices N --cluster FILE: the search           */
/* ------------------------------------------------------------------------ */

static const char *const plan_precisions[] = {"fp32", "bf16", "fp16", "any", NULL};

/* clang-format off */
static const cli_opt plan_opts[] = {
    {"model", 'm', CLI_STRING, "PRESET", "gpt2-124m", "DT_MODEL", "model preset", NULL, 0, 0},
    {"layers", 0, CLI_INT, "L", "0", "DT_LAYERS", "transformer blocks (0: the preset's)", NULL, 0, 1024},
    {"dim", 0, CLI_INT, "C", "0", "DT_DIM", "channels (0: the preset's)", NULL, 0, 1 << 20},
    {"hidden", 0, CLI_INT, "H", "0", NULL, "the same as --dim", NULL, 0, 1 << 20},
    {"heads", 0, CLI_INT, "NH", "0", "DT_HEADS", "attention heads (0: the preset's)", NULL, 0, 4096},
    {"seq", 's', CLI_INT, "T", "0", "DT_SEQ", "sequence length (0: the preset's)", NULL, 0, 1 << 22},
    {"vocab", 0, CLI_INT, "V", "0", "DT_VOCAB", "vocabulary (0: the preset's)", NULL, 0, 1 << 24},
    {"global-batch", 0, CLI_INT, "B", "0", "DT_GLOBAL_BATCH", "sequences per optimizer step (0: 8 per device)", NULL, 0, 1 << 24},
    {"devices", 0, CLI_INT, "N", "1", "DT_NPROC", "ranks (devices) of the job", NULL, 1, 1 << 20},
    {"cluster", 0, CLI_STRING, "FILE", "this", "DT_CLUSTER", "cluster file, or 'this' (measure this machine)", NULL, 0, 0},
    {"precision", 0, CLI_ENUM, "TYPE", "bf16", "DT_PRECISION", "compute type, or any (search them)", plan_precisions, 0, 0},
    {"dp", 0, CLI_INT, "N", "0", "DT_DP", "fix the data-parallel degree (0: search)", NULL, 0, 1 << 20},
    {"tp", 0, CLI_INT, "N", "0", "DT_TP", "fix the tensor-parallel degree (0: search)", NULL, 0, 4096},
    {"pp", 0, CLI_INT, "N", "0", "DT_PP", "fix the pipeline stages (0: search)", NULL, 0, 4096},
    {"cp", 0, CLI_INT, "N", "0", "DT_CP", "fix the context-parallel degree (0: search; long sequences only)", NULL, 0, 4096},
    {"pp-schedule", 0, CLI_STRING, "KIND", "search", "DT_PP_SCHEDULE", "fix the schedule: gpipe, 1f1b, interleaved:V, zb (search: 1f1b, interleaved:2/4, zb)", NULL, 0, 0},
    {"micro-batch", 0, CLI_INT, "B", "0", "DT_BATCH", "fix the sequences per micro-batch (0: search powers of 2)", NULL, 0, 1 << 20},
    {"zero", 0, CLI_INT, "S", "-1", "DT_ZERO", "fix the ZeRO stage (-1: search 0-3)", NULL, -1, 3},
    {"recompute", 0, CLI_STRING, "MODE", "search", "DT_RECOMPUTE", "fix recomputation: none, blocks, every:K (search: none and blocks)", NULL, 0, 0},
    {"top", 0, CLI_INT, "K", "5", NULL, "candidates shown", NULL, 1, 1 << 20},
    {"keep", 0, CLI_INT, "K", "64", NULL, "layouts evaluated exactly (memory plan, simulated schedule), fastest estimates first; 0: all", NULL, 0, 1 << 20},
    {"json", 0, CLI_FLAG, NULL, NULL, NULL, "print the ranked candidates and the pruning reasons as JSON", NULL, 0, 0},
    {"timeline", 0, CLI_FLAG, NULL, NULL, NULL, "print the best layout's predicted step breakdown and pipeline timeline", NULL, 0, 0},
    {"timeline-json", 0, CLI_STRING, "FILE", NULL, "DT_PLAN_TIMELINE_JSON", "simulate the best layout's step (links shared by overlapping collectives) and write its timeline as a Chrome trace (dtrain report --predicted)", NULL, 0, 0},
    {"save-cluster", 0, CLI_STRING, "FILE", NULL, NULL, "write the cluster description used (with --cluster this: the measurement)", NULL, 0, 0},
    {0},
};
/* clang-format on */

static json_t *layout_json(const dt_plan_layout *l) {
    char rec[24], args[320];
    dt_train_config c;
    dt_train_config_init(&c);
    dt_plan_layout_to_config(l, &c);
    return json_pack("{s:i, s:i, s:i, s:i, s:i, s:s, s:i, s:i, s:i, s:s, s:s, s:b, s:s?, s:s}",
                     "dp", l->dp, "tp", l->tp, "pp", l->pp, "cp", l->cp, "virtual_stages",
                     l->chunks, "pp_schedule", l->pp > 1 ? c.pp_schedule : "none", "micro_batch",
                     l->micro_batch, "micro_batches", l->micro, "zero", l->zero, "recompute",
                     dt_recompute_format(l->recompute_every, rec, sizeof rec), "precision",
                     dt_precision_name(l->precision), "sp", l->sp, "cp_mode", c.cp_mode,
                     "train_args", dt_plan_layout_args(l, args, sizeof args));
}

static int print_json(const dt_plan_request *rq, const dt_cluster *cl, const dt_plan_result *r,
                      int top) {
    json_t *cands = json_array(), *pruned = json_array();
    for (size_t i = 0; i < r->n && (int)i < top; i++) {
        const dt_plan_candidate *c = &r->ranked[i];
        json_t *o = json_pack(
            "{s:i, s:o, s:f, s:f, s:f, s:f, s:f, s:I, s:I, s:{s:f, s:f, s:f, s:f, s:f, s:f}}",
            "rank", (int)i + 1, "layout", layout_json(&c->layout), "step_s", c->step_s,
            "tokens_per_s", c->tokens_per_s, "tflops_per_device", c->tflops_device,
            "hw_tflops_per_device", c->hw_tflops_device, "mfu", c->mfu, "memory_per_device",
            (json_int_t)c->memory, "assembly_rank0", (json_int_t)c->assembly, "breakdown",
            "passes_s", c->passes_s, "compute_s", c->compute_s, "bubble", c->bubble, "model_comm_s",
            c->model_comm_s, "sync_s", c->sync_s, "optimizer_s", c->optimizer_s);
        json_array_append_new(cands, o);
    }
    for (size_t i = 0; i < r->npruned; i++)
        json_array_append_new(pruned, json_pack("{s:s, s:I, s:o}", "reason", r->pruned[i].reason,
                                                "count", (json_int_t)r->pruned[i].count, "example",
                                                layout_json(&r->pruned[i].example)));
    json_t *root = json_pack(
        "{s:{s:i, s:i, s:i, s:i, s:i}, s:i, s:i, s:s, s:I, s:I, s:f, s:o, s:o}", "model", "layers",
        rq->model.layers, "dim", rq->model.dim, "heads", rq->model.heads, "seq", rq->model.max_seq,
        "vocab", rq->model.vocab, "global_batch", rq->global_batch, "devices", rq->devices,
        "cluster", cl->name, "considered", (json_int_t)r->considered, "fit", (json_int_t)r->n,
        "seconds", r->seconds, "candidates", cands, "pruned", pruned);
    char *text = root ? json_dumps(root, JSON_INDENT(2)) : NULL;
    json_decref(root);
    if (!text)
        return cli_fail(DT_ERR_NOMEM);
    puts(text);
    free(text);
    return 0;
}

/* The simulated step of l, its timeline written to path (through a
 * temporary file and a rename). */
static dt_status write_timeline(const dt_plan_request *rq, const dt_cluster *cl,
                                const dt_plan_layout *l, const char *path, FILE *say) {
    DT_CHECK(dt_file_check_replaceable(path));
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    FILE *f = fopen(tmp, "w");
    if (!f)
        return dt_error_set_errno(DT_ERR_IO, "--timeline-json: cannot write %s", tmp);
    dt_plan_sim sim;
    dt_status st = dt_plan_simulate(rq, cl, l, &sim, f);
    if (fclose(f) != 0 && st == DT_OK)
        st = dt_error_set_errno(DT_ERR_IO, "--timeline-json: cannot write %s", tmp);
    if (st == DT_OK && rename(tmp, path) != 0)
        st = dt_error_set_errno(DT_ERR_IO, "--timeline-json: cannot rename %s to %s", tmp, path);
    if (st != DT_OK) {
        unlink(tmp);
        return st;
    }
    fprintf(say,
            "simulated: %.4g s/step (analytic %.4g s, %+.1f%%; without link contention %.4g s); "
            "timeline %s\n",
            sim.step_s, sim.analytic_s, 100 * (sim.step_s / sim.analytic_s - 1), sim.alone_s, path);
    return DT_OK;
}

static int run_search(cli_args *a) {
    if (a->argc > 0)
        cli_usage_error(a->cmd, "unknown plan '%s' (expected: pipeline, memory, or options)",
                        a->argv[0]);
    dt_plan_request rq = dt_plan_request_default();
    if (dt_gpt_preset(cli_str(a, "model"), &rq.model) != DT_OK)
        cli_usage_error(a->cmd, "%s", dt_last_error());
    static const char *const dims[] = {"layers", "dim", "hidden", "heads", "seq", "vocab"};
    int *fields[] = {&rq.model.layers, &rq.model.dim,     &rq.model.dim,
                     &rq.model.heads,  &rq.model.max_seq, &rq.model.vocab};
    for (int i = 0; i < 6; i++)
        if (cli_int(a, dims[i]) > 0)
            *fields[i] = (int)cli_int(a, dims[i]);
    if (dt_gpt_config_validate(&rq.model) != DT_OK)
        cli_usage_error(a->cmd, "%s", dt_last_error());
    rq.devices = (int)cli_int(a, "devices");
    rq.global_batch = cli_int(a, "global-batch") ? (int)cli_int(a, "global-batch") : 8 * rq.devices;
    int prec = cli_enum(a, "precision");
    rq.any_precision = prec == DT_PRECISION_COUNT;
    rq.precision = rq.any_precision ? DT_PRECISION_BF16 : (dt_precision)prec;
    rq.dp = (int)cli_int(a, "dp");
    rq.tp = (int)cli_int(a, "tp");
    rq.pp = (int)cli_int(a, "pp");
    rq.cp = (int)cli_int(a, "cp");
    rq.micro_batch = (int)cli_int(a, "micro-batch");
    rq.zero = (int)cli_int(a, "zero");
    rq.keep = (int)cli_int(a, "keep");
    if (rq.keep && rq.keep < cli_int(a, "top"))
        rq.keep = (int)cli_int(a, "top");
    const char *sched = cli_str(a, "pp-schedule"), *rec = cli_str(a, "recompute");
    if (strcmp(sched, "search") != 0) {
        dt_pp_kind kind;
        if (dt_pp_kind_parse("--pp-schedule", sched, &kind, &rq.chunks) != DT_OK)
            cli_usage_error(a->cmd, "%s (or search)", dt_last_error());
        rq.pp_kind = (int)kind;
    }
    if (strcmp(rec, "search") != 0 &&
        dt_recompute_parse("--recompute", rec, &rq.recompute) != DT_OK)
        cli_usage_error(a->cmd, "%s (or search)", dt_last_error());

    dt_cluster cl;
    const char *file = cli_str(a, "cluster");
    dt_status st = !strcmp(file, "this") ? dt_cluster_measure(&cl) : dt_cluster_load(file, &cl);
    if (st != DT_OK)
        cli_usage_error(a->cmd, "--cluster %s: %s", file, dt_last_error());
    const char *save = cli_str(a, "save-cluster");
    if (save) {
        FILE *f = fopen(save, "w");
        if (!f || dt_cluster_write(&cl, f) != DT_OK || fclose(f) != 0)
            cli_usage_error(a->cmd, "--save-cluster %s: cannot write it", save);
    }
    if (dt_plan_request_validate(&rq, &cl) != DT_OK)
        cli_usage_error(a->cmd, "%s", dt_last_error());
    dt_plan_result r;
    st = dt_plan_search(&rq, &cl, &r);
    if (st != DT_OK)
        return cli_fail(st);
    int top = (int)cli_int(a, "top");
    const char *tlj = cli_str(a, "timeline-json");
    if (cli_bool(a, "json")) {
        if (r.n && tlj && *tlj &&
            (st = write_timeline(&rq, &cl, &r.ranked[0].layout, tlj, stderr)) != DT_OK) {
            dt_plan_result_free(&r);
            return cli_fail(st);
        }
        int rc = print_json(&rq, &cl, &r, top);
        dt_plan_result_free(&r);
        return rc;
    }
    printf("plan: %s (L%d C%d NH%d T%d V%d), global batch %d, %d device(s) on %s\n",
           cli_str(a, "model"), rq.model.layers, rq.model.dim, rq.model.heads, rq.model.max_seq,
           rq.model.vocab, rq.global_batch, rq.devices, cl.name);
    if (cl.source[0])
        printf("cluster:  %s\n", cl.source);
    printf("searched: %zu layouts in %.3f s: %zu fit, %zu pruned\n", r.considered, r.seconds, r.n,
           r.considered - r.n);
    if (r.n)
        printf("%-4s %-78s %10s %12s %9s %6s %10s\n", "#", "layout", "step", "tokens/s", "TFLOP/s",
               "MFU", "mem/dev");
    for (size_t i = 0; i < r.n && (int)i < top; i++) {
        const dt_plan_candidate *c = &r.ranked[i];
        char lb[200], mb[32];
        printf("%-4zu %-78s %8.4g s %12.4g %9.3g %5.1f%% %10s\n", i + 1,
               dt_plan_layout_format(&c->layout, lb, sizeof lb), c->step_s, c->tokens_per_s,
               c->tflops_device, 100 * c->mfu, dt_format_bytes(c->memory, mb, sizeof mb));
    }
    if (r.n) {
        char args[320];
        printf("run #1:   dtrain train %s\n",
               dt_plan_layout_args(&r.ranked[0].layout, args, sizeof args));
    }
    if (r.npruned)
        printf("pruned (count, reason, first example):\n");
    for (size_t i = 0; i < r.npruned; i++) {
        char lb[200];
        printf("  %-6zu %s (%s)\n", r.pruned[i].count, r.pruned[i].reason,
               dt_plan_layout_format(&r.pruned[i].example, lb, sizeof lb));
    }
    if (!r.n)
        printf("no layout fits: see the reasons above\n");
    st = DT_OK;
    if (r.n && cli_bool(a, "timeline")) {
        const dt_plan_candidate *c = &r.ranked[0];
        printf("best: memory per device: ");
        dt_rank_memory_print(&c->mem, stdout);
        printf("\n");
        st = dt_plan_timeline(&rq, &cl, &c->layout, stdout);
    }
    if (st == DT_OK && r.n && tlj && *tlj)
        st = write_timeline(&rq, &cl, &r.ranked[0].layout, tlj, stdout);
    int rc = r.n ? 0 : 1;
    dt_plan_result_free(&r);
    return st != DT_OK ? cli_fail(st) : rc;
}

static const cli_cmd *const plan_subs[] = {&plan_pipeline, &plan_memory};

static int run_plan(cli_args *a) {
    if (a->argc > 0 && (!strcmp(a->argv[0], "pipeline") || !strcmp(a->argv[0], "memory")))
        return cli_run_sub(a, plan_subs, 2, "plan", "(expected: pipeline or memory)");
    return run_search(a);
}

const cli_cmd cli_cmd_plan = {
    .name = "plan",
    .summary = "choose and predict a layout: dtrain plan --devices N --cluster FILE, or "
               "plan pipeline|memory",
    .usage = "dtrain plan --model M|--layers L --hidden H --heads A --seq T --vocab V "
             "--global-batch B --devices N --cluster FILE|this [--top K] [--json]\n"
             "       dtrain plan pipeline|memory [OPTIONS]",
    .description =
        "Searches every layout of N devices (dp x tp x pp x cp, virtual stages, micro-batch,\n"
        "ZeRO stage, recomputation, precision) that fits memory, ranked by predicted step\n"
        "time, with the reason each pruned layout failed (docs/planner.md).\n"
        "plans:\n  pipeline   schedule table, check, memory per stage, bubble, timeline\n"
        "  memory     every rank's memory for a layout (ZeRO, tp, pp, precision)\n"
        "Example:\n"
        "  dtrain plan --model gpt2-350m --global-batch 512 --devices 64 "
        "--cluster examples/clusters/dgx-a100.json",
    .opts = plan_opts,
    .run = run_plan,
    .stop_at_positional = true,
    .subs = plan_subs,
    .nsubs = 2,
};
