/*
 * sim.c — the discrete-event simulator of dtrain/sim.h: lanes that run
 * their tasks in order, links whose bandwidth the transfers moving on them
 * share equally, and a Chrome-trace writer for the result.
 *
 * Invariants: a task depends only on tasks added before it and a lane runs
 * its tasks in the order they were added, so every task's predecessors were
 * added earlier and the run cannot deadlock; at most one task per lane runs
 * at a time, so each event looks at the lanes' heads only.
 */
#include "dtrain/sim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { WAITING, COMPUTING, LATENCY, MOVING, DONE };

typedef struct task {
    dt_sim_task t;
    char name[32], cat[12];
    int next; /* the next task of its lane, -1 */
    int state;
    double start, end, until, left; /* until: end of compute or latency; left: bytes */
} task;

typedef struct lane {
    int pid, tid;
    char name[32];
    int head, tail; /* the lane's first unfinished task and its last task, -1 */
} lane;

typedef struct link {
    char name[32];
    double bw;
    int moving; /* transfers on it now */
} link;

struct dt_sim {
    task *task;
    lane *lane;
    link *link;
    int ntask, nlane, nlink, captask, caplane, caplink;
    bool ran;
};

static bool grow(void **p, int *cap, int n, size_t size) {
    if (n < *cap)
        return true;
    int c = *cap ? 2 * *cap : 64;
    void *q = realloc(*p, (size_t)c * size);
    if (!q)
        return false;
    *p = q;
    *cap = c;
    return true;
}

dt_status dt_sim_create(dt_sim **out) {
    *out = calloc(1, sizeof **out);
    return *out ? DT_OK : dt_error_set(DT_ERR_NOMEM, "sim: out of memory");
}

void dt_sim_destroy(dt_sim *s) {
    if (!s)
        return;
    free(s->task);
    free(s->lane);
    free(s->link);
    free(s);
}

int dt_sim_lane(dt_sim *s, int pid, int tid, const char *name) {
    if (s->ran)
        return dt_error_set(DT_ERR_INVALID, "sim: lane added after the run"), -1;
    if (!grow((void **)&s->lane, &s->caplane, s->nlane, sizeof *s->lane))
        return dt_error_set(DT_ERR_NOMEM, "sim: out of memory"), -1;
    lane *l = &s->lane[s->nlane];
    l->pid = pid;
    l->tid = tid;
    snprintf(l->name, sizeof l->name, "%s", name ? name : "lane");
    l->head = l->tail = -1;
    return s->nlane++;
}

int dt_sim_link(dt_sim *s, const char *name, double bw) {
    if (s->ran)
        return dt_error_set(DT_ERR_INVALID, "sim: link added after the run"), -1;
    if (!(bw > 0) || !isfinite(bw))
        return dt_error_set(DT_ERR_INVALID, "sim: link %s: bandwidth %g bytes/s (must be > 0)",
                            name ? name : "?", bw),
               -1;
    if (!grow((void **)&s->link, &s->caplink, s->nlink, sizeof *s->link))
        return dt_error_set(DT_ERR_NOMEM, "sim: out of memory"), -1;
    link *k = &s->link[s->nlink];
    snprintf(k->name, sizeof k->name, "%s", name ? name : "link");
    k->bw = bw;
    k->moving = 0;
    return s->nlink++;
}

int dt_sim_add(dt_sim *s, const dt_sim_task *t) {
    const char *nm = t->name ? t->name : "?";
    if (s->ran)
        return dt_error_set(DT_ERR_INVALID, "sim: task %s added after the run", nm), -1;
    if (t->lane < 0 || t->lane >= s->nlane)
        return dt_error_set(DT_ERR_INVALID, "sim: task %s: lane %d (have %d)", nm, t->lane,
                            s->nlane),
               -1;
    if (t->link < -1 || t->link >= s->nlink)
        return dt_error_set(DT_ERR_INVALID, "sim: task %s: link %d (have %d)", nm, t->link,
                            s->nlink),
               -1;
    if (!(t->seconds >= 0) || !isfinite(t->seconds) || !(t->bytes >= 0) || !isfinite(t->bytes) ||
        (t->link < 0 && t->bytes > 0))
        return dt_error_set(DT_ERR_INVALID,
                            "sim: task %s: seconds %g, bytes %g (each >= 0; bytes need a link)", nm,
                            t->seconds, t->bytes),
               -1;
    if (t->ndeps < 0 || t->ndeps > DT_SIM_DEPS)
        return dt_error_set(DT_ERR_INVALID, "sim: task %s: %d dependencies (at most %d)", nm,
                            t->ndeps, DT_SIM_DEPS),
               -1;
    for (int i = 0; i < t->ndeps; i++)
        if (t->deps[i] < 0 || t->deps[i] >= s->ntask)
            return dt_error_set(DT_ERR_INVALID,
                                "sim: task %s: dependency %d is not an earlier task (0..%d)", nm,
                                t->deps[i], s->ntask - 1),
                   -1;
    if (!grow((void **)&s->task, &s->captask, s->ntask, sizeof *s->task))
        return dt_error_set(DT_ERR_NOMEM, "sim: out of memory"), -1;
    int id = s->ntask++;
    task *k = &s->task[id];
    memset(k, 0, sizeof *k);
    k->t = *t;
    snprintf(k->name, sizeof k->name, "%s", nm);
    snprintf(k->cat, sizeof k->cat, "%s", t->cat ? t->cat : "compute");
    k->t.name = k->t.cat = NULL; /* rule 2: only the copies */
    k->next = -1;
    k->state = WAITING;
    lane *l = &s->lane[t->lane];
    if (l->tail >= 0)
        s->task[l->tail].next = id;
    else
        l->head = id;
    l->tail = id;
    return id;
}

static void finish(dt_sim *s, int id, double now) {
    task *k = &s->task[id];
    if (k->state == MOVING)
        s->link[k->t.link].moving--;
    k->state = DONE;
    k->end = now;
    s->lane[k->t.lane].head = k->next;
}

/* Start every lane head whose dependencies are done; tasks of no duration
 * finish at once (and may let others start). Returns the tasks finished. */
static int start_ready(dt_sim *s, double now) {
    int finished = 0;
    for (bool again = true; again;) {
        again = false;
        for (int i = 0; i < s->nlane; i++) {
            int id = s->lane[i].head;
            if (id < 0 || s->task[id].state != WAITING)
                continue;
            task *k = &s->task[id];
            bool ready = true;
            for (int d = 0; d < k->t.ndeps && ready; d++)
                ready = s->task[k->t.deps[d]].state == DONE;
            if (!ready)
                continue;
            k->start = now;
            if (k->t.seconds > 0) {
                k->state = k->t.link < 0 ? COMPUTING : LATENCY;
                k->until = now + k->t.seconds;
            } else if (k->t.bytes > 0) {
                k->state = MOVING;
                k->left = k->t.bytes;
                s->link[k->t.link].moving++;
            } else {
                finish(s, id, now);
                finished++;
                again = true;
            }
        }
    }
    return finished;
}

dt_status dt_sim_run(dt_sim *s, double *makespan) {
    if (s->ran)
        return dt_error_set(DT_ERR_INVALID, "sim: already run");
    s->ran = true;
    double now = 0;
    int done = start_ready(s, now);
    while (done < s->ntask) {
        /* The next event: a compute or latency ends, or a transfer finishes
         * at its current share. */
        double next = INFINITY;
        for (int i = 0; i < s->nlane; i++) {
            int id = s->lane[i].head;
            if (id < 0)
                continue;
            const task *k = &s->task[id];
            if (k->state == COMPUTING || k->state == LATENCY)
                next = fmin(next, k->until);
            else if (k->state == MOVING) {
                const link *l = &s->link[k->t.link];
                next = fmin(next, now + k->left * l->moving / l->bw);
            }
        }
        if (!isfinite(next)) /* cannot happen by rule 3: a bug */
            return dt_error_set(DT_ERR_INTERNAL, "sim: %d of %d tasks cannot start at %g s",
                                s->ntask - done, s->ntask, now);
        double dt = next - now;
        /* Shares are those before the event: move everyone's bytes first. */
        for (int i = 0; i < s->nlane; i++) {
            int id = s->lane[i].head;
            if (id >= 0 && s->task[id].state == MOVING) {
                task *k = &s->task[id];
                const link *l = &s->link[k->t.link];
                k->left -= dt * l->bw / l->moving;
            }
        }
        now = next;
        for (int i = 0; i < s->nlane; i++) {
            int id = s->lane[i].head;
            if (id < 0)
                continue;
            task *k = &s->task[id];
            if (k->state == COMPUTING && k->until <= now) {
                finish(s, id, now);
                done++;
            } else if (k->state == LATENCY && k->until <= now) {
                if (k->t.bytes > 0) {
                    k->state = MOVING;
                    k->left = k->t.bytes;
                    s->link[k->t.link].moving++;
                } else {
                    finish(s, id, now);
                    done++;
                }
            } else if (k->state == MOVING && k->left <= 1e-9 * k->t.bytes + 1e-6) {
                finish(s, id, now);
                done++;
            }
        }
        done += start_ready(s, now);
    }
    double end = 0;
    for (int i = 0; i < s->ntask; i++)
        end = fmax(end, s->task[i].end);
    *makespan = end;
    return DT_OK;
}

void dt_sim_task_time(const dt_sim *s, int id, double *start, double *end) {
    *start = id >= 0 && id < s->ntask ? s->task[id].start : NAN;
    *end = id >= 0 && id < s->ntask ? s->task[id].end : NAN;
}

static void put_escaped(FILE *f, const char *s) {
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            fputc('\\', f);
        if ((unsigned char)*s >= 0x20)
            fputc(*s, f);
    }
}

dt_status dt_sim_write_trace(const dt_sim *s, FILE *f, const char *other_json) {
    fprintf(f, "{\"traceEvents\":[\n");
    /* Lanes without an event to draw are left out (a rank without a
     * pipeline has no transfers). */
    bool *used = calloc((size_t)s->nlane + 1, sizeof *used);
    if (!used)
        return dt_error_set(DT_ERR_NOMEM, "sim: out of memory");
    for (int i = 0; i < s->ntask; i++)
        if (s->ran && s->task[i].end > s->task[i].start)
            used[s->task[i].t.lane] = true;
    for (int i = 0; i < s->nlane; i++) {
        bool first = true;
        for (int j = 0; j < i && first; j++)
            first = s->lane[j].pid != s->lane[i].pid;
        int pid = s->lane[i].pid;
        if (first) {
            fprintf(f,
                    "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"args\":{"
                    "\"name\":\"predicted rank %d\"}},\n",
                    pid, pid);
            fprintf(f,
                    "{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"args\":{"
                    "\"sort_index\":%d}},\n",
                    pid, pid);
        }
        if (!used[i])
            continue;
        fprintf(f,
                "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"args\":{\"name\":"
                "\"",
                pid, s->lane[i].tid);
        put_escaped(f, s->lane[i].name);
        fprintf(f, "\"}},\n");
    }
    free(used);
    for (int i = 0; i < s->ntask; i++) {
        const task *k = &s->task[i];
        if (!s->ran || k->end <= k->start)
            continue; /* nothing to draw */
        const lane *l = &s->lane[k->t.lane];
        fprintf(f,
                "{\"name\":\"%s\",\"cat\":\"%s\",\"ph\":\"X\",\"ts\":%.3f,\"dur\":%.3f,\"pid\":%d,"
                "\"tid\":%d,\"args\":{",
                k->name, k->cat, k->start * 1e6, (k->end - k->start) * 1e6, l->pid, l->tid);
        const char *sep = "";
        if (k->t.link >= 0) {
            fprintf(f, "\"bytes\":%.0f,\"link\":\"%s\"", k->t.bytes, s->link[k->t.link].name);
            sep = ",";
        }
        if (k->t.idx >= 0)
            fprintf(f, "%s\"index\":%d", sep, k->t.idx);
        fprintf(f, "}},\n");
    }
    fprintf(f,
            "{\"name\":\"trace_end\",\"ph\":\"M\",\"pid\":0,\"tid\":0,\"args\":{}}\n],\n"
            "\"displayTimeUnit\":\"ms\",\n\"otherData\":%s}\n",
            other_json ? other_json : "{}");
    return ferror(f) ? dt_error_set(DT_ERR_IO, "sim: writing the trace failed") : DT_OK;
}
