/*
 * train_layout.c — `dtrain train --layout auto`: the planner's fastest
 * layout (src/plan, what `dtrain plan` prints first) for this run's model,
 * data, rank count and samples per step, chosen before any rank starts.
 *
 * What stays the user's: the model (resolved from the data exactly as the
 * run resolves it), the precision, the samples per optimizer step (batch x
 * data-parallel ranks x accum, or --global-batch x accum, as the flags
 * given would make them), and every layout flag given by hand (--dp, --tp,
 * --pp, --cp, --zero, --recompute, --pp-schedule), which the search keeps
 * fixed; the memory counts the run's optimizer. What is chosen: the rest
 * of dp x tp x pp x cp, the micro-batch
 * size and count, the ZeRO stage, recomputation and the pipeline schedule.
 *
 * A launcher process (--nproc N) plans once and hands its ranks the choice
 * as ordinary flags (dt_plan_layout_args), so every rank runs the same
 * layout and config.json records it; ranks of an external launcher
 * (mpirun, dtrain launch) each plan alike, which needs a cluster file:
 * measuring "this" machine from every rank at once would measure contention.
 */
#include "cli.h"
#include "dtrain/comm.h"
#include "dtrain/plan.h"

#include <stdio.h>
#include <string.h>

/* The samples per optimizer step that the flags given would train. */
static int samples_per_step(const dt_train_config *c, int world) {
    if (c->global_batch)
        return c->global_batch * c->accum;
    int model = c->tp * c->pp * c->cp;
    int dp = c->dp ? c->dp : (model > 0 ? world / model : 0);
    return c->batch * (dp > 0 ? dp : 1) * c->accum;
}

static bool given(const cli_args *a, const char *name) {
    return cli_is_set(a, name) && strcmp(cli_get(a, name)->from, "default") != 0;
}

int cli_train_plan_layout(const cli_args *a, const dt_train_config *c, int world, bool quiet,
                          dt_plan_layout *out) {
    const char *file = cli_str(a, "cluster");
    bool this_machine = strcmp(file, "this") == 0;
    if (cli_bool(a, "sp") && !given(a, "tp"))
        cli_usage_error(a->cmd, "--sp with --layout auto needs --tp (the search does not choose "
                                "sequence parallelism)");
    dt_plan_request rq = dt_plan_request_default();
    dt_status st = dt_train_model_config(c, &rq.model);
    if (st != DT_OK)
        return cli_fail(st);
    rq.devices = world;
    rq.global_batch = samples_per_step(c, world);
    rq.precision = c->precision;
    rq.optimizer = c->optimizer;
    if (given(a, "dp"))
        rq.dp = c->dp;
    if (given(a, "tp"))
        rq.tp = c->tp;
    if (given(a, "pp"))
        rq.pp = c->pp;
    if (given(a, "cp"))
        rq.cp = c->cp;
    if (given(a, "zero"))
        rq.zero = c->zero;
    if (given(a, "recompute"))
        rq.recompute = c->recompute_every;
    if (given(a, "pp-schedule")) {
        dt_pp_kind kind;
        if (dt_pp_kind_parse("--pp-schedule", c->pp_schedule, &kind, &rq.chunks) != DT_OK)
            cli_usage_error(a->cmd, "%s", dt_last_error());
        rq.pp_kind = (int)kind;
    }

    dt_cluster cl;
    st = this_machine ? dt_cluster_measure(&cl) : dt_cluster_load(file, &cl);
    if (st != DT_OK)
        cli_usage_error(a->cmd, "--cluster %s: %s", file, dt_last_error());
    if (dt_plan_request_validate(&rq, &cl) != DT_OK)
        cli_usage_error(a->cmd, "--layout auto: %s", dt_last_error());
    dt_plan_result r;
    if ((st = dt_plan_search(&rq, &cl, &r)) != DT_OK)
        return cli_fail(st);
    if (r.n == 0) {
        fprintf(stderr,
                "dtrain train: error: --layout auto: no layout of %d rank(s) fits %d samples "
                "per step of this model on %s:\n",
                world, rq.global_batch, cl.name);
        for (size_t i = 0; i < r.npruned; i++)
            fprintf(stderr, "  %zu x %s\n", r.pruned[i].count, r.pruned[i].reason);
        dt_plan_result_free(&r);
        return 2;
    }
    const dt_plan_candidate *best = &r.ranked[0];
    *out = best->layout;
    if (cli_bool(a, "sp"))
        out->sp = true;
    if (!quiet) {
        char lb[200], mb[32], args[320];
        fprintf(stderr,
                "layout auto: %s; predicted %.4g s/step, %.4g tokens/s, %s per rank (dtrain "
                "plan on %s: %zu layouts, %zu fit)\n  flags: %s\n",
                dt_plan_layout_format(out, lb, sizeof lb), best->step_s, best->tokens_per_s,
                dt_format_bytes(best->memory, mb, sizeof mb), cl.name, r.considered, r.n,
                dt_plan_layout_args(out, args, sizeof args));
    }
    dt_plan_result_free(&r);
    return 0;
}

int cli_train_job_world(const cli_args *a, int *world, int *rank) {
    dt_job_info ji;
    dt_status st = dt_job_info_read(&ji);
    if (st != DT_OK)
        return cli_fail(st);
    if (ji.size > 1 && strcmp(cli_str(a, "cluster"), "this") == 0)
        cli_usage_error(a->cmd,
                        "--layout auto under an external launcher needs --cluster FILE: every "
                        "rank plans, and they must plan alike (write one with `dtrain plan "
                        "--cluster this --save-cluster FILE`)");
    *world = ji.size;
    *rank = ji.rank;
    return 0;
}
