/*
 * dump_io.c — reading and writing the arrays of the torch parity tools (see dump_io.h). A test
 * tool's helpers: process-wide state, and every failure ends the process.
 */
#include "dump_io.h"

#include <stdio.h>
#include <stdlib.h>

static const char *prog = "dump";
static const char *dir = ".";
static void *allocs[32]; /* everything allocated, freed at the end (for LeakSanitizer) */
static int n_allocs;

void dump_init(const char *prog_name, const char *dir_name)
{
    prog = prog_name;
    dir = dir_name;
}

void die(const char *what, const char *name)
{
    fprintf(stderr, "%s: %s '%s'\n", prog, what, name);
    exit(1);
}

void *track(void *p)
{
    if (!p || n_allocs == 32)
        die("out of memory", "");
    return allocs[n_allocs++] = p;
}

void *rd(const char *name, size_t n, size_t sz)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s.bin", dir, name);
    FILE *f = fopen(path, "rb");
    if (!f)
        die("cannot open", path);
    void *p = track(calloc(n ? n : 1, sz));
    size_t got = fread(p, sz, n, f);
    int extra = fgetc(f);
    fclose(f);
    if (got != n || extra != EOF)
        die("wrong size of", path);
    return p;
}

float *rdf(const char *name, size_t n)
{
    return rd(name, n, sizeof(float));
}

void wr(const char *name, const void *p, size_t n, size_t sz)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/out_%s.bin", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(p, sz, n, f) != n || fclose(f) != 0)
        die("cannot write", path);
}

void wrf(const char *name, const float *p, size_t n)
{
    wr(name, p, n, sizeof(float));
}

float *zalloc(size_t n)
{
    return track(calloc(n ? n : 1, sizeof(float)));
}

void dump_free_all(void)
{
    while (n_allocs > 0)
        free(allocs[--n_allocs]);
}
