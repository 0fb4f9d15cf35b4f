/*
 * dtrain/report.h — what a finished run's directory says about where its
 * time went: the step breakdown, the roofline of its kernels, its
 * collectives against their alpha-beta model, bottleneck advice with the
 * expected gain, and `dtrain report`'s self-contained HTML page
 * (docs/observability.md).
 *
 * Overview
 * --------
 * A run directory (dtrain/train.h) holds config.json, metrics.jsonl,
 * summary.json and, for a run with --trace, trace/trace.json (every rank's
 * events, clocks aligned) and trace/machine.json (this machine's measured
 * peaks, memory bandwidth and link models). dt_run_load reads them into a
 * dt_run: the metrics per step, the breakdown per rank, the kernels
 * aggregated by name (time, FLOPs, bytes), the collectives aggregated by
 * operation, transport and size, and the events of the last few traced
 * steps for the timeline. The trace is read one line (one event) at a
 * time, so its size does not bound what can be read.
 *
 * dt_run_advise applies the rules of docs/observability.md ("Advice") to
 * a loaded run: each names what to change and what it is expected to gain
 * (ms per step and the fraction of the step), computed from the run's own
 * figures. dt_report_write renders one run, or two overlaid (--compare),
 * as one HTML file: inline SVG drawn by an inline script from the data
 * embedded in the page; no network access is needed to view it.
 *
 * Ownership rules
 * ---------------
 *   1. dt_run_load returns a dt_run the caller destroys with
 *      dt_run_destroy (NULL-safe); it keeps no pointer to the path.
 *   2. dt_run_advise and dt_report_write only read the runs.
 *   3. Missing optional files (summary.json, the trace, machine.json) are
 *      not errors: what they would feed is reported as absent. A file that
 *      is there but malformed is DT_ERR_CORRUPT naming the file and line.
 *
 * Example
 * -------
 *     dt_run *run;
 *     DT_CHECK(dt_run_load("runs/tiny-20261128-101500", &run));
 *     dt_advice adv[16];
 *     size_t n = dt_run_advise(run, adv, 16);
 *     for (size_t i = 0; i < n && i < 16; i++)
 *         printf("%s: %s\n", adv[i].title, adv[i].text);
 *     FILE *f = fopen("report.html", "w");
 *     const dt_run *runs[1] = {run};
 *     DT_CHECK(dt_report_write(runs, 1, f));
 *     fclose(f);
 *     dt_run_destroy(run);
 */
#ifndef DTRAIN_REPORT_H
#define DTRAIN_REPORT_H

#include "dtrain/core.h"

#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dt_run dt_run;

/* Read RUN_DIR (rule 3). DT_ERR_NOT_FOUND when it holds no metrics.jsonl. */
dt_status dt_run_load(const char *run_dir, dt_run **out);
void dt_run_destroy(dt_run *r);
/* The directory it was read from. */
const char *dt_run_dir(const dt_run *r);

/* Overlay a predicted step (the Chrome trace `dtrain plan --timeline-json`
 * writes) on r's timeline. dt_run_load reads RUN_DIR/trace/predicted.json
 * by itself when it is there; this reads another file. DT_ERR_NOT_FOUND
 * when path does not exist, DT_ERR_INVALID (naming the file and what is
 * wrong) when it is not a predicted timeline. */
dt_status dt_run_load_predicted(dt_run *r, const char *path);

/* One piece of advice. */
typedef struct dt_advice {
    char rule[32];   /* "straggler", "exposed-comm", ... (docs/observability.md) */
    char title[160]; /* one line */
    char text[1024]; /* what was seen and what to change */
    double gain_ms;  /* expected saving per step, ms (0: none estimated) */
    double gain;     /* the same as a fraction of the step */
} dt_advice;

/* The advice for a run, largest expected gain first: up to max into out,
 * returns how many rules fired. */
size_t dt_run_advise(const dt_run *r, dt_advice *out, size_t max);

/* The HTML page of runs[0] (n 1), or of runs[0] and runs[1] overlaid
 * (n 2), into f. */
dt_status dt_report_write(const dt_run *const *runs, size_t n, FILE *f);

/* One line per fact of the run for a terminal: steps, throughput, MFU,
 * the mean breakdown of the slowest rank. */
void dt_run_print_summary(const dt_run *r, FILE *f);

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_REPORT_H */
