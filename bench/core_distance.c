/* core_distance: the cache-line round trip between two cores, in ns (the fastest of 8 batches of
 * 2000 round trips), a longer version of the shm backend's distance probe (4 batches of 8). A VM's
 * host may move its vCPUs: on this project's 2-vCPU machine it reads about 55 ns (one last-level
 * cache) or about 350 ns (two chiplets), changing from second to second.
 *
 * Usage: core_distance [CPU_A CPU_B]   (default 0 1) */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

enum { TRIPS = 2000, BATCHES = 8 };
static _Alignas(64) atomic_uint ping;
static _Alignas(64) atomic_uint pong;
static int cpu_b;

static double now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

static int pin(int cpu)
{
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(cpu, &s);
    return pthread_setaffinity_np(pthread_self(), sizeof s, &s);
}

static void *answer(void *arg)
{
    (void)arg;
    if (pin(cpu_b))
        fprintf(stderr, "core_distance: cannot run on CPU %d; measuring unpinned\n", cpu_b);
    for (unsigned t = 1; t <= TRIPS * BATCHES; t++) {
        while (atomic_load_explicit(&ping, memory_order_acquire) != t)
            ;
        atomic_store_explicit(&pong, t, memory_order_release);
    }
    return NULL;
}

int main(int argc, char **argv)
{
    int a = argc > 2 ? atoi(argv[1]) : 0;
    cpu_b = argc > 2 ? atoi(argv[2]) : 1;
    if (pin(a)) {
        fprintf(stderr, "core_distance: cannot run on CPU %d\n", a);
        return 1;
    }
    pthread_t th;
    if (pthread_create(&th, NULL, answer, NULL))
        return 1;
    double best = 1e30;
    unsigned t = 0;
    for (int b = 0; b < BATCHES; b++) {
        double t0 = now_ns();
        for (int i = 0; i < TRIPS; i++) {
            atomic_store_explicit(&ping, ++t, memory_order_release);
            while (atomic_load_explicit(&pong, memory_order_acquire) != t)
                ;
        }
        double dt = (now_ns() - t0) / TRIPS;
        if (dt < best)
            best = dt;
    }
    pthread_join(th, NULL);
    printf("%.0f\n", best);
    return 0;
}
