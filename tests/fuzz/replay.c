/*
 * replay.c — a main() for the fuzz harnesses outside libFuzzer: runs every file named on the
 * command line, and every regular file in every folder named (in name order), through
 * LLVMFuzzerTestOneInput once. With gcc and no sanitizer it shows that the seed corpus and
 * the crash regressions in it still pass; under make asan it checks them with ASan+UBSan.
 * Exit status 0, or 1 when an argument cannot be read (a crash is a crash).
 */
#include "fuzz.h" /* first: it defines _GNU_SOURCE */

#include <dirent.h>
#include <errno.h>
#include <string.h>
#include <sys/stat.h>

static int run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "replay: cannot open '%s': %s\n", path, strerror(errno));
        return 1;
    }
    size_t cap = 4096, n = 0;
    unsigned char *buf = malloc(cap);
    for (;;) {
        if (!buf) {
            fprintf(stderr, "replay: out of memory reading '%s'\n", path);
            fclose(f);
            return 1;
        }
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap)
            break;
        unsigned char *p = realloc(buf, cap *= 2);
        if (!p)
            free(buf);
        buf = p;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        fprintf(stderr, "replay: cannot read '%s'\n", path);
        free(buf);
        return 1;
    }
    LLVMFuzzerTestOneInput(buf, n);
    free(buf);
    return 0;
}

static int by_name(const struct dirent **a, const struct dirent **b)
{
    return strcmp((*a)->d_name, (*b)->d_name);
}

int main(int argc, char **argv)
{
    int rc = 0;
    size_t ran = 0;
    for (int i = 1; i < argc; i++) {
        struct stat sb;
        if (stat(argv[i], &sb) != 0) {
            fprintf(stderr, "replay: '%s': %s\n", argv[i], strerror(errno));
            rc = 1;
            continue;
        }
        if (!S_ISDIR(sb.st_mode)) {
            rc |= run_file(argv[i]);
            ran++;
            continue;
        }
        struct dirent **ents;
        int n = scandir(argv[i], &ents, NULL, by_name);
        if (n < 0) {
            fprintf(stderr, "replay: cannot list '%s': %s\n", argv[i], strerror(errno));
            rc = 1;
            continue;
        }
        for (int k = 0; k < n; k++) {
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", argv[i], ents[k]->d_name);
            if (stat(path, &sb) == 0 && S_ISREG(sb.st_mode)) {
                rc |= run_file(path);
                ran++;
            }
            free(ents[k]);
        }
        free(ents);
    }
    printf("replay: %zu inputs%s\n", ran, rc ? ", some unreadable" : "");
    return rc;
}
