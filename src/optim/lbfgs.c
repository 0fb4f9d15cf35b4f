/*
 * lbfgs.c — L-BFGS with a strong-Wolfe line search, torch.optim.LBFGS's
 * algorithm (two-loop recursion over a history of m (s, y) pairs, Nocedal &
 * Wright algorithms 7.4 and 3.5/3.6, minFunc's cubic interpolation) turned
 * inside out: instead of calling a closure, dt_lbfgs_next returns to the
 * caller whenever it needs the loss and gradient at a new point (see
 * optim.h), so that the training loop evaluates with its own model, batch
 * and gradient averaging.
 *
 * State. Kept across steps, as PyTorch keeps it: the history (y_i, s_i, ro_i
 * in ring buffers, oldest first), the last direction D and step t, the
 * gradient P of the last accepted point, H_diag, the iteration count. Per
 * step: the gradient F at the current point, the line search's start X and
 * two gradient buffers for its bracket. Scalars are doubles (PyTorch mixes
 * float32 0-d tensors and Python floats), dot products are summed in
 * double over lanes; results therefore agree with PyTorch to float
 * rounding, not bit for bit (tests/unit/test_optim2.c compares).
 *
 * Memory: (2 m + 6) floats per parameter; for small models and fine-tuning
 * with full or large fixed batches, where that is affordable.
 */
#include "optim_internal.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define C1     1e-4 /* sufficient decrease (Armijo) */
#define C2     0.9  /* curvature */
#define MAX_LS 25   /* evaluations of one line search */

enum { PH_START, PH_LS, PH_NOLS };
enum { ST_BRACKET, ST_ZOOM };
/* Gradient buffers a bracket end may name. */
enum { B_F, B_LX, B_LY, B_GRADS };

struct dt__lbfgs {
    dt_lbfgs_config c;
    size_t n;
    float **y, **s; /* (m) ring buffers: logical i is physical (head + i) % m */
    int head, npairs;
    double *ro, *al; /* (m) by logical index */
    float *F, *P, *D, *X, *L[2];
    double t, h_diag;
    int64_t n_iter;     /* iterations over all steps (PyTorch's state['n_iter']) */
    int64_t func_evals; /* evaluations over all steps */
    /* This step. */
    int phase, iters, evals;
    float lr;
    double loss, prev_loss, gtd;
    /* The line search. */
    int stage, ls_iter, ls_evals;
    bool first, done, insuf;
    double f0, gtd0, d_norm;
    double t_prev, f_prev, gtd_prev;
    int g_prev;
    double br[2], bf[2], bgtd[2];
    int bg[2];
    int nbr, low, high;
};

static double dot(const float *a, const float *b, size_t n) {
    /* In chunks of 16 values, lane by lane, as the other statistics. */
    dt__lanes l = {{0}};
    for (size_t i = 0; i < n; i++)
        l.l[i % DT__LANES] += (double)a[i] * (double)b[i];
    return dt__lanes_total(&l);
}

static float max_abs(const float *a, size_t n) {
    float m = 0.0f;
    for (size_t i = 0; i < n; i++)
        m = fmaxf(m, fabsf(a[i]));
    return m;
}

dt_status dt__lbfgs_create(dt__lbfgs **out, const dt_lbfgs_config *c, size_t n) {
    dt__lbfgs *L = dt_calloc(1, sizeof *L);
    if (!L)
        return DT_ERR_NOMEM;
    *out = L;
    L->c = *c;
    L->n = n;
    int m = c->history;
    L->y = dt_calloc((size_t)m, sizeof *L->y);
    L->s = dt_calloc((size_t)m, sizeof *L->s);
    L->ro = dt_calloc((size_t)m, sizeof *L->ro);
    L->al = dt_calloc((size_t)m, sizeof *L->al);
    if (!L->y || !L->s || !L->ro || !L->al)
        return DT_ERR_NOMEM;
    for (size_t i = 0; i < dt__lbfgs_num_vectors(L); i++) {
        float **v = dt__lbfgs_slot(L, i);
        if (!(*v = dt_alloc((n ? n : 1) * sizeof(float))))
            return DT_ERR_NOMEM;
        memset(*v, 0, n * sizeof(float));
    }
    L->t = 0;
    L->h_diag = 1;
    return DT_OK;
}

void dt__lbfgs_destroy(dt__lbfgs *L) {
    if (!L)
        return;
    if (L->y && L->s)
        for (size_t i = 0; i < dt__lbfgs_num_vectors(L); i++)
            dt_free(*dt__lbfgs_slot(L, i));
    dt_free(L->y);
    dt_free(L->s);
    dt_free(L->ro);
    dt_free(L->al);
    dt_free(L);
}

size_t dt__lbfgs_num_vectors(const dt__lbfgs *L) { return 2 * (size_t)L->c.history + 6; }

/* Vector i's slot: y_0..y_{m-1}, s_0..s_{m-1} (physical), P, D, F, X, Lx, Ly. */
float **dt__lbfgs_slot(dt__lbfgs *L, size_t i) {
    size_t m = (size_t)L->c.history;
    if (i < m)
        return &L->y[i];
    if (i < 2 * m)
        return &L->s[i - m];
    float **rest[] = {&L->P, &L->D, &L->F, &L->X, &L->L[0], &L->L[1]};
    return rest[i - 2 * m];
}

/* The checkpointed vectors, in logical order: y_0.. (oldest first), s_0..,
 * P, D. The per-step buffers are not state. */
size_t dt__lbfgs_num_states(const dt__lbfgs *L) { return 2 * (size_t)L->c.history + 2; }

static float *logical(dt__lbfgs *L, size_t i) {
    size_t m = (size_t)L->c.history;
    if (i < m)
        return L->y[(L->head + i) % m];
    if (i < 2 * m)
        return L->s[(L->head + i - m) % m];
    return i == 2 * m ? L->P : L->D;
}

void dt__lbfgs_state_name(const dt__lbfgs *L, size_t i, char *buf, size_t len) {
    size_t m = (size_t)L->c.history;
    if (i < 2 * m)
        snprintf(buf, len, "lbfgs.%c%zu", i < m ? 'y' : 's', i % m);
    else
        snprintf(buf, len, "lbfgs.%s", i == 2 * m ? "prev_grad" : "dir");
}

void dt__lbfgs_state_get(dt__lbfgs *L, size_t i, float *dst) {
    memcpy(dst, logical(L, i), L->n * sizeof(float));
}

void dt__lbfgs_state_set(dt__lbfgs *L, size_t i, const float *src) {
    memcpy(logical(L, i), src, L->n * sizeof(float));
}

size_t dt__lbfgs_num_scalars(const dt__lbfgs *L) { return 5 + (size_t)L->c.history; }

void dt__lbfgs_scalars_get(const dt__lbfgs *L, double *v) {
    v[0] = (double)L->n_iter;
    v[1] = (double)L->func_evals;
    v[2] = L->npairs;
    v[3] = L->t;
    v[4] = L->h_diag;
    for (int i = 0; i < L->c.history; i++)
        v[5 + i] = L->ro[i];
}

dt_status dt__lbfgs_scalars_set(dt__lbfgs *L, const double *v) {
    if (!(v[0] >= 0) || !(v[2] >= 0 && v[2] <= L->c.history))
        return dt_error_set(DT_ERR_CORRUPT,
                            "lbfgs: iteration count %g or history length %g out "
                            "of range",
                            v[0], v[2]);
    L->n_iter = (int64_t)v[0];
    L->func_evals = (int64_t)v[1];
    L->npairs = (int)v[2];
    L->head = 0; /* the vectors were set in logical order */
    L->t = v[3];
    L->h_diag = v[4];
    for (int i = 0; i < L->c.history; i++)
        L->ro[i] = v[5 + i];
    return DT_OK;
}

size_t dt__lbfgs_scalar_bytes(const dt__lbfgs *L) {
    return 2 * (size_t)L->c.history * sizeof(double) + 4 * sizeof(float) * L->n;
}

void dt__lbfgs_begin(dt__lbfgs *L, float lr) {
    L->phase = PH_START;
    L->lr = lr;
}

int dt__lbfgs_evals(const dt__lbfgs *L) { return L->evals; }

/* minFunc's cubic interpolation of two points with values and slopes,
 * clamped to the bounds (torch.optim.lbfgs._cubic_interpolate). */
static double cubic(double x1, double f1, double g1, double x2, double f2, double g2, double lo,
                    double hi) {
    double d1 = g1 + g2 - 3 * (f1 - f2) / (x1 - x2);
    double d2sq = d1 * d1 - g1 * g2;
    if (d2sq >= 0) {
        double d2 = sqrt(d2sq), pos;
        if (x1 <= x2)
            pos = x2 - (x2 - x1) * ((g2 + d2 - d1) / (g2 - g1 + 2 * d2));
        else
            pos = x1 - (x1 - x2) * ((g1 + d2 - d1) / (g1 - g2 + 2 * d2));
        return fmin(fmax(pos, lo), hi);
    }
    return (lo + hi) / 2;
}

static float *gbuf(dt__lbfgs *L, int id, const float *grads) {
    switch (id) {
    case B_F: return L->F;
    case B_LX: return L->L[0];
    case B_LY: return L->L[1];
    default: return (float *)grads;
    }
}

/* params = X + t D, the point the line search evaluates (and ends at). */
static void move_to(dt__lbfgs *L, float *params, double t) {
    float tf = (float)t;
    for (size_t i = 0; i < L->n; i++)
        params[i] = L->X[i] + tf * L->D[i];
}

/* The zoom loop's next trial (or the end of the search: false). */
static bool zoom_next(dt__lbfgs *L) {
    if (L->done || L->ls_iter >= MAX_LS)
        return false;
    double lo = fmin(L->br[0], L->br[1]), hi = fmax(L->br[0], L->br[1]);
    if ((hi - lo) * L->d_norm < L->c.tolerance_change)
        return false;
    double t = cubic(L->br[0], L->bf[0], L->bgtd[0], L->br[1], L->bf[1], L->bgtd[1], lo, hi);
    /* Too close to an end: move a tenth of the bracket in, unless the last
     * trial made progress and this one is strictly inside. */
    double eps = 0.1 * (hi - lo);
    if (fmin(hi - t, t - lo) < eps) {
        if (L->insuf || t >= hi || t <= lo) {
            t = fabs(t - hi) < fabs(t - lo) ? hi - eps : lo + eps;
            L->insuf = false;
        } else {
            L->insuf = true;
        }
    } else {
        L->insuf = false;
    }
    L->t = t;
    return true;
}

static void bracket(dt__lbfgs *L, double f_new, double gtd_new, const float *grads) {
    L->br[0] = L->t_prev;
    L->br[1] = L->t;
    L->bf[0] = L->f_prev;
    L->bf[1] = f_new;
    L->bgtd[0] = L->gtd_prev;
    L->bgtd[1] = gtd_new;
    L->bg[0] = L->g_prev;
    L->bg[1] = B_LY;
    memcpy(L->L[1], grads, L->n * sizeof(float));
    L->nbr = 2;
}

/* The line search after an evaluation at L->t: true when it wants another
 * (L->t set), false when it is over (L->br[low] etc. hold the result). */
static bool line_search(dt__lbfgs *L, double f_new, const float *grads) {
    double gtd_new = dot(grads, L->D, L->n);
    L->ls_evals++;
    if (L->stage == ST_BRACKET) {
        if (!L->first)
            L->ls_iter++;
        L->first = false;
        if (L->ls_iter >= MAX_LS) {
            /* Out of evaluations while bracketing: [0, t]. */
            L->br[0] = 0;
            L->br[1] = L->t;
            L->bf[0] = L->f0;
            L->bf[1] = f_new;
            L->bg[0] = B_F;
            L->bg[1] = B_GRADS;
            L->nbr = 2;
            L->low = L->bf[0] <= L->bf[1] ? 0 : 1;
            return false;
        }
        if (f_new > L->f0 + C1 * L->t * L->gtd0 || (L->ls_iter > 1 && f_new >= L->f_prev)) {
            bracket(L, f_new, gtd_new, grads);
        } else if (fabs(gtd_new) <= -C2 * L->gtd0) {
            L->br[0] = L->t;
            L->bf[0] = f_new;
            L->bg[0] = B_GRADS;
            L->nbr = 1;
            L->done = true;
        } else if (gtd_new >= 0) {
            bracket(L, f_new, gtd_new, grads);
        } else {
            /* Extrapolate, then evaluate there. */
            double tmp = L->t;
            L->t = cubic(L->t_prev, L->f_prev, L->gtd_prev, L->t, f_new, gtd_new,
                         L->t + 0.01 * (L->t - L->t_prev), L->t * 10);
            L->t_prev = tmp;
            L->f_prev = f_new;
            L->g_prev = B_LX;
            memcpy(L->L[0], grads, L->n * sizeof(float));
            L->gtd_prev = gtd_new;
            return true;
        }
        L->stage = ST_ZOOM;
        L->low = L->nbr == 1 || L->bf[0] <= L->bf[1] ? 0 : 1;
        L->high = 1 - L->low;
        return zoom_next(L);
    }
    /* Zoom: the trial replaces an end of the bracket. */
    L->ls_iter++;
    int lo = L->low, hi = L->high;
    if (f_new > L->f0 + C1 * L->t * L->gtd0 || f_new >= L->bf[lo]) {
        L->br[hi] = L->t;
        L->bf[hi] = f_new;
        memcpy(gbuf(L, L->bg[hi], grads), grads, L->n * sizeof(float));
        L->bgtd[hi] = gtd_new;
        L->low = L->bf[0] <= L->bf[1] ? 0 : 1;
        L->high = 1 - L->low;
    } else {
        if (fabs(gtd_new) <= -C2 * L->gtd0) {
            L->done = true;
        } else if (gtd_new * (L->br[hi] - L->br[lo]) >= 0) {
            /* The old high becomes the new low. */
            L->br[hi] = L->br[lo];
            L->bf[hi] = L->bf[lo];
            int b = L->bg[hi];
            L->bg[hi] = L->bg[lo];
            L->bg[lo] = b;
            L->bgtd[hi] = L->bgtd[lo];
        }
        L->br[lo] = L->t;
        L->bf[lo] = f_new;
        memcpy(gbuf(L, L->bg[lo], grads), grads, L->n * sizeof(float));
        L->bgtd[lo] = gtd_new;
    }
    return zoom_next(L);
}

/* A new direction from F (the two-loop recursion), after adding the pair of
 * the last step to the history. */
static void direction(dt__lbfgs *L) {
    size_t n = L->n;
    int m = L->c.history;
    if (L->n_iter == 1) {
        for (size_t i = 0; i < n; i++)
            L->D[i] = -L->F[i];
        L->npairs = 0;
        L->head = 0;
        L->h_diag = 1;
        return;
    }
    float *y = L->L[0], *s = L->L[1], tf = (float)L->t;
    for (size_t i = 0; i < n; i++) {
        y[i] = L->F[i] - L->P[i];
        s[i] = L->D[i] * tf;
    }
    double ys = dot(y, s, n);
    if (ys > 1e-10) {
        /* The new pair takes the oldest one's slot when the history is full. */
        int slot;
        if (L->npairs == m) {
            slot = L->head;
            for (int i = 0; i + 1 < m; i++)
                L->ro[i] = L->ro[i + 1];
            L->head = (L->head + 1) % m;
        } else {
            slot = (L->head + L->npairs) % m;
            L->npairs++;
        }
        float *oy = L->y[slot], *os = L->s[slot];
        L->y[slot] = y;
        L->s[slot] = s;
        L->L[0] = oy;
        L->L[1] = os;
        L->ro[L->npairs - 1] = 1.0 / ys;
        L->h_diag = ys / dot(L->y[slot], L->y[slot], n);
    }
    float *q = L->D;
    for (size_t i = 0; i < n; i++)
        q[i] = -L->F[i];
    for (int i = L->npairs - 1; i >= 0; i--) {
        int ph = (L->head + i) % m;
        L->al[i] = dot(L->s[ph], q, n) * L->ro[i];
        float a = (float)-L->al[i];
        for (size_t j = 0; j < n; j++)
            q[j] = q[j] + a * L->y[ph][j];
    }
    float h = (float)L->h_diag;
    for (size_t j = 0; j < n; j++)
        q[j] = q[j] * h;
    for (int i = 0; i < L->npairs; i++) {
        int ph = (L->head + i) % m;
        double be = dot(L->y[ph], q, n) * L->ro[i];
        float a = (float)(L->al[i] - be);
        for (size_t j = 0; j < n; j++)
            q[j] = q[j] + a * L->s[ph][j];
    }
}

/* Start the next iteration from F; false when the step is over. */
static bool iterate(dt__lbfgs *L, float *params) {
    if (L->iters >= L->c.max_iter)
        return false;
    L->iters++;
    L->n_iter++;
    direction(L);
    memcpy(L->P, L->F, L->n * sizeof(float));
    L->prev_loss = L->loss;
    if (L->n_iter == 1) {
        dt__lanes l = {{0}};
        for (size_t i = 0; i < L->n; i++)
            l.l[i % DT__LANES] += fabs((double)L->F[i]);
        L->t = fmin(1.0, 1.0 / dt__lanes_total(&l)) * L->lr;
    } else {
        L->t = L->lr;
    }
    L->gtd = dot(L->F, L->D, L->n);
    if (L->gtd > -L->c.tolerance_change)
        return false;
    if (L->c.line_search) {
        memcpy(L->X, params, L->n * sizeof(float));
        L->stage = ST_BRACKET;
        L->first = true;
        L->done = L->insuf = false;
        L->ls_iter = L->ls_evals = 0;
        L->f0 = L->loss;
        L->gtd0 = L->gtd;
        L->d_norm = max_abs(L->D, L->n);
        L->t_prev = 0;
        L->f_prev = L->loss;
        L->g_prev = B_F;
        L->gtd_prev = L->gtd;
        move_to(L, params, L->t);
        L->phase = PH_LS;
        return true;
    }
    float tf = (float)L->t;
    for (size_t i = 0; i < L->n; i++)
        params[i] = params[i] + tf * L->D[i];
    if (L->iters != L->c.max_iter) {
        L->phase = PH_NOLS;
        return true;
    }
    return false; /* the last iteration is not evaluated */
}

/* The end-of-iteration tests; true: go on. */
static bool keep_going(const dt__lbfgs *L, bool opt_cond) {
    if (L->iters == L->c.max_iter || L->evals >= L->c.max_eval || opt_cond)
        return false;
    if (max_abs(L->D, L->n) * fabs(L->t) <= L->c.tolerance_change)
        return false;
    return fabs(L->loss - L->prev_loss) >= L->c.tolerance_change;
}

dt_status dt__lbfgs_next(dt__lbfgs *L, float *params, const float *grads, double loss, bool *more) {
    *more = false;
    if (!isfinite(loss))
        return dt_error_set(DT_ERR_NUMERIC, "lbfgs: the loss is %g at iteration %lld", loss,
                            (long long)L->n_iter);
    L->func_evals++;
    bool opt_cond;
    switch (L->phase) {
    case PH_START:
        L->evals = 1;
        L->iters = 0;
        L->loss = loss;
        memcpy(L->F, grads, L->n * sizeof(float));
        if (max_abs(L->F, L->n) <= L->c.tolerance_grad)
            return DT_OK;
        *more = iterate(L, params);
        return DT_OK;
    case PH_LS:
        if (line_search(L, loss, grads)) {
            move_to(L, params, L->t);
            *more = true;
            return DT_OK;
        }
        L->t = L->br[L->low];
        L->loss = L->bf[L->low];
        if (L->bg[L->low] != B_F)
            memcpy(L->F, gbuf(L, L->bg[L->low], grads), L->n * sizeof(float));
        move_to(L, params, L->t);
        L->evals += L->ls_evals;
        break;
    default: /* PH_NOLS */
        L->loss = loss;
        memcpy(L->F, grads, L->n * sizeof(float));
        L->evals += 1;
        break;
    }
    opt_cond = max_abs(L->F, L->n) <= L->c.tolerance_grad;
    if (keep_going(L, opt_cond))
        *more = iterate(L, params);
    return DT_OK;
}
