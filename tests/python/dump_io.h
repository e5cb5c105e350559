/*
 * dump_io.h — the file side of the torch parity tools nn_dump and transformer_dump (dump_io.c):
 * input NAME is read from DIR/NAME.bin and output NAME written to DIR/out_NAME.bin, raw arrays
 * in the machine's (little-endian) order. Every buffer these functions hand out is tracked and
 * freed by dump_free_all(), so LeakSanitizer sees a clean exit. Test-tool conventions: any
 * error prints "PROG: WHAT 'NAME'" on stderr and exits 1; one directory per process, not
 * thread-safe.
 */
#ifndef DUMP_IO_H
#define DUMP_IO_H

#include <stddef.h>

/* Sets the program name for messages and the directory of the files (both borrowed for the
 * life of the process). Call first. */
void dump_init(const char *prog, const char *dir);

/* Prints "PROG: WHAT 'NAME'" and exits 1. */
_Noreturn void die(const char *what, const char *name);

/* Tracks p (from calloc or malloc) for dump_free_all() and returns it; dies if p is NULL or
 * too many are tracked. */
void *track(void *p);

/* Reads DIR/NAME.bin, which must hold exactly n elements of size sz, into a tracked buffer. */
void *rd(const char *name, size_t n, size_t sz);
float *rdf(const char *name, size_t n);

/* Writes n elements of size sz from p to DIR/out_NAME.bin. */
void wr(const char *name, const void *p, size_t n, size_t sz);
void wrf(const char *name, const float *p, size_t n);

/* n zeroed floats (at least one), tracked. */
float *zalloc(size_t n);

/* Frees everything tracked, newest first. */
void dump_free_all(void);

#endif
