/*
 * cmd_report.c — `dtrain report`: a run directory's page (an HTML file
 * that needs nothing else to be viewed) and its bottleneck advice on the
 * terminal; with --compare, two runs on one page. The work is the report
 * layer's (dtrain/report.h); this file only handles the arguments.
 */
#include "cli.h"
#include "dtrain/report.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static const cli_opt report_opts[] = {
    {"output", 'o', CLI_STRING, "FILE", NULL, "DT_REPORT_OUTPUT",
     "the page to write (default: RUN_DIR/report.html; with --compare RUN_A/compare.html)", NULL, 0,
     0},
    {"compare", 0, CLI_FLAG, NULL, NULL, "DT_REPORT_COMPARE",
     "two run directories on one page, their curves overlaid", NULL, 0, 0},
    {"predicted", 0, CLI_STRING, "FILE", NULL, "DT_REPORT_PREDICTED",
     "overlay this predicted step (dtrain plan --timeline-json) on the timeline (default: "
     "RUN_DIR/trace/predicted.json when it exists)",
     NULL, 0, 0},
    {"quiet", 'q', CLI_FLAG, NULL, NULL, "DT_REPORT_QUIET", "print only the page's path", NULL, 0,
     0},
    {0},
};

static int run_report(cli_args *a) {
    bool compare = cli_bool(a, "compare");
    int want = compare ? 2 : 1;
    if (a->argc != want)
        cli_usage_error(a->cmd, "expected %s, got %d argument(s)",
                        compare ? "two run directories after --compare" : "one run directory",
                        a->argc);
    dt_run *runs[2] = {NULL, NULL};
    for (int i = 0; i < want; i++) {
        dt_status st = dt_run_load(a->argv[i], &runs[i]);
        if (st != DT_OK) {
            dt_run_destroy(runs[0]);
            return cli_fail(st);
        }
    }
    const char *pred = cli_str(a, "predicted");
    if (pred && *pred) {
        dt_status st = dt_run_load_predicted(runs[0], pred);
        if (st != DT_OK) {
            for (int i = 0; i < want; i++)
                dt_run_destroy(runs[i]);
            return cli_fail(st);
        }
    }
    char out[4400];
    const char *o = cli_str(a, "output");
    if (o && *o)
        snprintf(out, sizeof out, "%s", o);
    else
        snprintf(out, sizeof out, "%s/%s", dt_run_dir(runs[0]),
                 compare ? "compare.html" : "report.html");
    dt_status st = dt_file_check_replaceable(out);
    char tmp[4500];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", out, (int)getpid());
    FILE *f = st == DT_OK ? fopen(tmp, "w") : NULL;
    if (st == DT_OK && !f)
        st = dt_error_set_errno(DT_ERR_IO, "cannot write %s", tmp);
    if (f) {
        st = dt_report_write((const dt_run *const *)runs, (size_t)want, f);
        if (fclose(f) != 0 && st == DT_OK)
            st = dt_error_set_errno(DT_ERR_IO, "cannot write %s", tmp);
        if (st == DT_OK && rename(tmp, out) != 0)
            st = dt_error_set_errno(DT_ERR_IO, "cannot rename %s to %s", tmp, out);
        if (st != DT_OK)
            unlink(tmp);
    }
    if (st == DT_OK && !cli_bool(a, "quiet")) {
        for (int i = 0; i < want; i++) {
            dt_run_print_summary(runs[i], stdout);
            dt_advice adv[16];
            size_t n = dt_run_advise(runs[i], adv, 16);
            for (size_t k = 0; k < n && k < 16; k++) {
                printf("advice:     %s", adv[k].title);
                if (adv[k].gain_ms > 0)
                    printf(" (expected gain %.1f ms/step, %.0f%%)", adv[k].gain_ms,
                           100 * adv[k].gain);
                printf("\n            %s\n", adv[k].text);
            }
            if (n == 0)
                printf("advice:     no rule fired (docs/observability.md lists them)\n");
        }
    }
    if (st == DT_OK)
        printf("report:     %s\n", out);
    for (int i = 0; i < want; i++)
        dt_run_destroy(runs[i]);
    return st == DT_OK ? 0 : cli_fail(st);
}

const cli_cmd cli_cmd_report = {
    .name = "report",
    .summary = "a run's page: loss, throughput, step breakdown, timeline, roofline, advice",
    .usage = "dtrain report RUN_DIR [-o FILE] [--predicted FILE] | dtrain report --compare RUN_A "
             "RUN_B [-o FILE]",
    .description =
        "Reads a run directory of `dtrain train` (metrics.jsonl, summary.json, config.json and,\n"
        "with --trace, trace/) and writes one self-contained HTML page: loss and validation\n"
        "curves, throughput and MFU, the step breakdown per rank and per step, the timeline of\n"
        "the last traced steps, the roofline of the kernels, the collectives against their\n"
        "alpha-beta model, memory, the configuration and the bottleneck advice, which is also\n"
        "printed here. Open the page in any browser; it needs no network (docs/observability.md).\n"
        "Example:\n"
        "  dtrain train --data input.txt --nproc 2 --steps 50 --trace --run-dir run\n"
        "  dtrain report run            # run/report.html\n"
        "  dtrain plan --cluster this --devices 2 --dp 2 ... --timeline-json pred.json\n"
        "  dtrain report run --predicted pred.json   # the predicted step over the measured one\n"
        "  dtrain report --compare run run-int8 -o compare.html",
    .opts = report_opts,
    .run = run_report,
};
