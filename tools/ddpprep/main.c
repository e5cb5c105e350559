/*
 * ddpprep — turns text into byte-level token files for ddptrain's GPT (vocabulary 256):
 *
 *   ddpprep --out_dir data/fortunes --doc_sep % /usr/share/games/fortunes
 *
 * writes data/fortunes/train.bin and val.bin (nanoGPT's headerless uint16 layout). A thin
 * front end over ddp_tokens_from_text (include/ddp/data.h); uses only the public API.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ddp/ddp.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: ddpprep --out_dir DIR [--doc_sep LINE] [--val_every N] INPUT...\n"
               "  Byte-level tokenisation (vocabulary 256) of text files or folders into\n"
               "  DIR/train.bin and DIR/val.bin (uint16, nanoGPT's layout).\n"
               "  --doc_sep LINE   a line that ends a document (fortune files: %%); default:\n"
               "                   each file is one document (so does an empty LINE)\n"
               "  --val_every N    every Nth document goes to val.bin (10); 0: no val.bin\n"
               "                   (an old DIR/val.bin is removed)\n"
               "  Folders contribute their regular files named without a '.' or ending in .txt.\n"
               "  GPT-2 BPE files made elsewhere (nanoGPT's prepare.py, llm.c's shards) need no\n"
               "  preparation: give them to ddptrain as data.train/data.val with\n"
               "  model.vocab_size 50304 (50257 padded to a multiple of 64).\n");
}

/* "--a_b" and "--a-b", "--k v" and "--k=v": the value of flag `name`, or NULL. */
static const char *flag_value(int argc, char **argv, int *i, const char *name)
{
    const char *a = argv[*i];
    if (strncmp(a, "--", 2) != 0)
        return NULL;
    a += 2;
    size_t n = strlen(name), k = 0;
    for (; k < n && a[k]; k++)
        if (!(a[k] == name[k] || (a[k] == '-' && name[k] == '_')))
            return NULL;
    if (k != n)
        return NULL;
    if (a[n] == '=')
        return a + n + 1;
    if (a[n] != '\0')
        return NULL;
    if (*i + 1 >= argc) {
        fprintf(stderr, "ddpprep: --%s needs a value\n", name);
        exit(2);
    }
    return argv[++*i];
}

/* Removes the folders mkdir -p made (deepest first); rmdir leaves any that are not empty. */
static void remove_made(char *dirs, const size_t *made, int nmade)
{
    for (int i = nmade - 1; i >= 0; i--) {
        dirs[made[i]] = '\0';
        rmdir(dirs);
    }
}

int main(int argc, char **argv)
{
    const char *out_dir = NULL;
    ddp_text_opts o = DDP_TEXT_OPTS_INIT;
    const char **inputs = calloc((size_t)argc, sizeof *inputs);
    size_t n = 0;
    if (!inputs)
        return 1;
    for (int i = 1; i < argc; i++) {
        const char *v;
        if (strcmp(argv[i], "--version") == 0) { /* as ddprun's */
            printf("ddpprep (ddpc) %s\n", DDP_VERSION_STRING);
            free(inputs);
            return 0;
        }
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout);
            free(inputs);
            return 0;
        } else if ((v = flag_value(argc, argv, &i, "out_dir"))) {
            out_dir = v;
        } else if ((v = flag_value(argc, argv, &i, "doc_sep"))) {
            o.doc_sep = v;
        } else if ((v = flag_value(argc, argv, &i, "val_every"))) {
            char *end;
            errno = 0;
            long e = strtol(v, &end, 10);
            if (errno || *end || e < 0 || e > 1000000) {
                fprintf(stderr, "ddpprep: --val_every '%s' is not a whole number in 0…1000000\n",
                        v);
                free(inputs);
                return 2;
            }
            o.val_every = (unsigned)e;
        } else if (strncmp(argv[i], "--", 2) == 0) {
            fprintf(stderr, "ddpprep: unknown flag '%s' (see --help)\n", argv[i]);
            free(inputs);
            return 2;
        } else {
            inputs[n++] = argv[i];
        }
    }
    /* With no arguments, the usage; with some, one line saying what is missing (the whole
     * usage said nothing of which). */
    if (argc == 1)
        usage(stderr);
    else if (!out_dir)
        fprintf(stderr, "ddpprep: --out_dir is missing: the folder that gets train.bin and val.bin "
                        "(ddpprep --out_dir DIR [--doc_sep LINE] INPUT...; --help says more)\n");
    else if (n == 0)
        fprintf(stderr,
                "ddpprep: no text to prepare: give files or folders after the flags, e.g. "
                "ddpprep --out_dir %s --doc_sep %% /usr/share/games/fortunes\n",
                out_dir);
    if (!out_dir || n == 0) {
        free(inputs);
        return 2;
    }
    /* mkdir -p, as ddptrain's out_dir; a file in the way is said to be one. The folders made
     * here are remembered (made[]: their lengths in dirs) and removed again if the preparation
     * fails, so a bad input leaves nothing behind. */
    char dirs[4096];
    size_t made[256];
    int nmade = 0;
    snprintf(dirs, sizeof dirs, "%s", out_dir);
    for (char *p = dirs + 1;; p++) {
        if (*p != '/' && *p != '\0')
            continue;
        char c = *p;
        *p = '\0';
        struct stat ds;
        if (mkdir(dirs, 0755) == 0) {
            if (nmade < (int)(sizeof made / sizeof made[0]))
                made[nmade++] = (size_t)(p - dirs);
        } else if (errno != EEXIST) {
            fprintf(stderr, "ddpprep: cannot create '%s': %s\n", dirs, strerror(errno));
            remove_made(dirs, made, nmade);
            free(inputs);
            return 1;
        }
        if (stat(dirs, &ds) == 0 && !S_ISDIR(ds.st_mode)) {
            fprintf(stderr,
                    "ddpprep: --out_dir '%s': '%s' is a file, not a folder; choose another "
                    "--out_dir\n",
                    out_dir, dirs);
            free(inputs);
            return 1;
        }
        *p = c;
        if (!c)
            break;
    }
    char tr[4200], va[4200];
    snprintf(tr, sizeof tr, "%s/train.bin", out_dir);
    snprintf(va, sizeof va, "%s/val.bin", out_dir);
    ddp_text_stats st;
    ddp_error err = {0};
    ddp_status rc = ddp_tokens_from_text(inputs, n, &o, tr, o.val_every ? va : NULL, &st, &err);
    free(inputs);
    if (rc != DDP_OK) {
        fprintf(stderr, "ddpprep: %s\n", err.msg);
        remove_made(dirs, made, nmade);
        return 1;
    }
    printf("ddpprep: %llu document%s: %llu training tokens in '%s'",
           (unsigned long long)st.documents, st.documents == 1 ? "" : "s",
           (unsigned long long)st.train_tokens, tr);
    if (o.val_every)
        printf(", %llu validation tokens in '%s'", (unsigned long long)st.val_tokens, va);
    printf(" (byte-level, vocab 256)\n");
    /* No validation file asked for: one left from an earlier preparation into this folder would
     * pair another text's validation tokens with this training file. */
    if (!o.val_every && unlink(va) == 0)
        printf("ddpprep: removed '%s', an earlier preparation's (--val_every 0 makes none)\n", va);
    return 0;
}
