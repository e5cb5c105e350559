/*
 * straggler.c — the straggler rule of straggler.h. The median is taken over the other ranks
 * (not all of them) so that with two ranks the slow one is compared with the fast one rather
 * than with the mean of both.
 */
#include "straggler.h"

#include <stdlib.h>

void straggler_init(straggler *s, const straggler_opts *o)
{
    s->o = *o;
    if (s->o.after < 1)
        s->o.after = 1;
    s->rank = -1;
    s->count = s->intervals = 0;
    s->since_step = 0;
    s->since_t = 0;
    s->warned_rank = -1;
    s->warned_t = 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The median of v[0..n) without v[skip], n ≥ 2; NAN-free input assumed by the caller. */
static bool median_without(const double *v, int n, int skip, double *med)
{
    double *o = malloc(sizeof *o * (size_t)(n - 1));
    if (!o)
        return false;
    int k = 0;
    for (int i = 0; i < n; i++)
        if (i != skip)
            o[k++] = v[i];
    qsort(o, (size_t)k, sizeof *o, cmp_double);
    *med = k % 2 ? o[k / 2] : (o[k / 2 - 1] + o[k / 2]) / 2;
    free(o);
    return true;
}

bool straggler_update(straggler *s, const double *busy_ms, int W, uint64_t from_step, double t_from,
                      double now, straggler_report *out)
{
    if (W < 2 || !(s->o.ratio > 1))
        return false;
    int slow = 0;
    for (int r = 1; r < W; r++)
        if (busy_ms[r] > busy_ms[slow])
            slow = r;
    double med;
    if (!median_without(busy_ms, W, slow, &med))
        return false;
    bool is_slow = busy_ms[slow] > s->o.ratio * med && busy_ms[slow] - med >= s->o.min_ms;
    if (!is_slow) {
        if (s->count > 0 && --s->count == 0)
            s->rank = -1;
        return false;
    }
    if (slow != s->rank) { /* a new count */
        s->rank = slow;
        s->count = s->intervals = 0;
        s->since_step = from_step;
        s->since_t = t_from;
    }
    s->count++;
    s->intervals++;
    if (s->count < s->o.after || now - s->since_t < s->o.after_s ||
        (s->warned_rank == slow && now - s->warned_t < s->o.every_s))
        return false;
    s->warned_rank = slow;
    s->warned_t = now;
    *out =
        (straggler_report){slow, busy_ms[slow], med, now - s->since_t, s->since_step, s->intervals};
    return true;
}
