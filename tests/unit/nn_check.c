/*
 * nn_check.c — the helpers of nn_check.h, linked into test_nn and test_transformer. Plain loops
 * in double where a reference is summed; nothing here knows a layer.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "nn_check.h"

uint64_t rng_next(uint64_t *s)
{
    *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
    return *s;
}

/* Uniform in [lo, hi). */
void fill(float *v, size_t n, float lo, float hi, uint64_t seed)
{
    uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
    for (size_t i = 0; i < n; i++)
        v[i] = lo + (hi - lo) * (float)((rng_next(&s) >> 40) * (1.0 / 16777216.0));
}

float *falloc(size_t n)
{
    float *p = calloc(n ? n : 1, sizeof(float));
    assert_non_null(p);
    return p;
}

double weighted_sum(const float *y, const float *r, size_t n)
{
    double s = 0.0;
    for (size_t i = 0; i < n; i++)
        s += (double)y[i] * r[i];
    return s;
}

/* Counts |got − want| > atol + rtol·|want| and prints the first few. */
int compare(const char *what, const float *got, const double *want, size_t n, double atol,
            double rtol)
{
    int bad = 0;
    for (size_t i = 0; i < n; i++)
        if (!(fabs(got[i] - want[i]) <= atol + rtol * fabs(want[i]))) {
            if (bad++ < 5)
                print_error("%s[%zu]: got %.8g, want %.8g\n", what, i, got[i], want[i]);
        }
    return bad;
}

/* Checks analytic (n,) = dL/dv against central differences of loss, moving v in place. */
int check_fd(const char *what, loss_fn loss, void *ctx, float *v, size_t n, const float *analytic)
{
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        float orig = v[i];
        v[i] = orig + H;
        double up = v[i], lp = loss(ctx);
        v[i] = orig - H;
        double dn = v[i], lm = loss(ctx);
        v[i] = orig;
        double num = (lp - lm) / (up - dn);
        if (!(fabs(num - analytic[i]) <= FD_RTOL * fmax(1.0, fabs(analytic[i])))) {
            if (bad++ < 5)
                print_error("%s[%zu]: analytic %.6g, finite difference %.6g\n", what, i,
                            analytic[i], num);
        }
    }
    return bad;
}

/* Gradient accumulated on top of a seed value: returns grad − seed in a new buffer. */
float *minus(const float *grad, const float *seed, size_t n)
{
    float *d = falloc(n);
    for (size_t i = 0; i < n; i++)
        d[i] = grad[i] - seed[i];
    return d;
}
