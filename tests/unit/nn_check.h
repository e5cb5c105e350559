/*
 * nn_check.h — helpers shared by test_nn.c and test_transformer.c (nn_check.c): seeded uniform
 * fills, counted comparisons against a double reference, and the central finite-difference check
 * of an analytic gradient. Allocation failure fails the running cmocka test; the counting
 * functions print the first few mismatches with print_error() and return how many there were.
 * Include after <cmocka.h>.
 */
#ifndef NN_CHECK_H
#define NN_CHECK_H

#include <stddef.h>
#include <stdint.h>

/* The finite-difference step (moved in float) and the relative tolerance of check_fd():
 * |analytic − numeric| ≤ FD_RTOL · max(1, |analytic|). The test files explain the bound. */
#define H 1e-3f
#define FD_RTOL 1e-2

/* xorshift64: advances *s and returns it. */
uint64_t rng_next(uint64_t *s);

/* Fills v (n,) uniform in [lo, hi), the same numbers for the same seed. */
void fill(float *v, size_t n, float lo, float hi, uint64_t seed);

/* n zeroed floats (at least one); the caller frees. */
float *falloc(size_t n);

/* Σ y[i]·r[i] in double: the scalar loss whose dL/dy is r. */
double weighted_sum(const float *y, const float *r, size_t n);

/* Counts |got − want| > atol + rtol·|want| over n elements and prints the first few. */
int compare(const char *what, const float *got, const double *want, size_t n, double atol,
            double rtol);

typedef double (*loss_fn)(void *ctx);

/* Checks analytic (n,) = dL/dv against central differences of loss (±H), moving v in place and
 * putting it back; counts the elements off by more than FD_RTOL · max(1, |analytic|). */
int check_fd(const char *what, loss_fn loss, void *ctx, float *v, size_t n, const float *analytic);

/* Gradient accumulated on top of a seed value: returns grad − seed (n,) in a new buffer the
 * caller frees. */
float *minus(const float *grad, const float *seed, size_t n);

#endif
