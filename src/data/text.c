/*
 * text.c — text to byte-level token files (vocab 256): every byte is one uint16 token, written in
 * nanoGPT's headerless layout, so any text becomes a language-model dataset with no tokenizer.
 * Documents (whole files, or the entries of fortune's "%"-separated files) are dealt to the
 * training or validation file by their position, so validation text is spread over every input
 * rather than being its last 10%. Bytes are kept exactly, separator lines included: a model
 * learns where a document ends. It does not do BPE; GPT-2 BPE token files made elsewhere
 * (tiktoken, nanoGPT's prepare.py) are read as they are (docs/gpt.md).
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "data/data_int.h"
#include "ddp/data.h"
#include "util/util.h"

typedef struct file_list {
    char **paths;
    size_t n, cap;
} file_list;

static void list_free(file_list *l)
{
    for (size_t i = 0; i < l->n; i++)
        free(l->paths[i]);
    free(l->paths);
}

static ddp_status list_add(file_list *l, const char *path, ddp_error *err)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 16;
        char **p = realloc(l->paths, cap * sizeof *p);
        if (!p)
            return ddp__err(err, DDP_ERR_NOMEM, "out of memory listing text files");
        l->paths = p;
        l->cap = cap;
    }
    if (!(l->paths[l->n] = strdup(path)))
        return ddp__err(err, DDP_ERR_NOMEM, "out of memory listing text files");
    l->n++;
    return DDP_OK;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* A folder's text files: regular files (not links: fortune's *.u8 links repeat their target)
 * named without a '.' or ending in ".txt" (fortune's *.dat indexes are binary), by name. */
static bool is_text_name(const char *name)
{
    const char *dot = strrchr(name, '.');
    return name[0] != '.' && (!dot || strcmp(dot, ".txt") == 0);
}

static ddp_status expand(const char *input, file_list *l, ddp_error *err)
{
    struct stat st;
    if (stat(input, &st) != 0)
        return ddp__err(err, errno == ENOENT ? DDP_ERR_NOT_FOUND : DDP_ERR_SYSTEM,
                        "cannot read text input '%s': %s", input, strerror(errno));
    /* A pipe or a device cannot be prepared: the text is read once to check the splits, then
     * once per file written, and the cache key is its size and modification time (a FIFO
     * blocked the open until the job's timeout; /dev/zero would have been read until memory
     * ran out). */
    if (!S_ISDIR(st.st_mode) && !S_ISREG(st.st_mode))
        return ddp__err(err, DDP_ERR_INVALID,
                        "text input '%s' is %s, not a file or a folder: the text is read more "
                        "than once; save it to a file first",
                        input,
                        S_ISFIFO(st.st_mode)   ? "a FIFO (named pipe)"
                        : S_ISCHR(st.st_mode)  ? "a character device"
                        : S_ISBLK(st.st_mode)  ? "a block device"
                        : S_ISSOCK(st.st_mode) ? "a socket"
                                               : "a special file");
    if (!S_ISDIR(st.st_mode))
        return list_add(l, input, err);
    DIR *d = opendir(input);
    if (!d)
        return ddp__err(err, DDP_ERR_SYSTEM, "cannot list '%s': %s", input, strerror(errno));
    size_t first = l->n;
    ddp_status rc = DDP_OK;
    struct dirent *e;
    while (rc == DDP_OK && (e = readdir(d))) {
        if (!is_text_name(e->d_name))
            continue;
        char path[4200];
        ddp__fmt(path, sizeof path, "%s/%s", input, e->d_name);
        struct stat fs;
        if (lstat(path, &fs) == 0 && S_ISREG(fs.st_mode))
            rc = list_add(l, path, err);
    }
    closedir(d);
    if (rc == DDP_OK && l->n == first)
        rc = ddp__err(err, DDP_ERR_NOT_FOUND,
                      "the folder '%s' holds no text files (regular files named without a '.' "
                      "or ending in .txt)",
                      input);
    if (rc == DDP_OK)
        qsort(l->paths + first, l->n - first, sizeof *l->paths, cmp_str);
    return rc;
}

static ddp_status read_all(const char *path, char **out, size_t *len, ddp_error *err)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return ddp__err(err, DDP_ERR_SYSTEM, "cannot open '%s': %s", path, strerror(errno));
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    ddp_status rc = DDP_OK;
    while (buf) {
        if (n == cap) {
            char *b = realloc(buf, cap * 2);
            if (!b) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = b;
            cap *= 2;
        }
        size_t k = fread(buf + n, 1, cap - n, f);
        n += k;
        if (k == 0) {
            if (ferror(f))
                rc = ddp__err(err, DDP_ERR_SYSTEM, "reading '%s' failed", path);
            break;
        }
    }
    fclose(f);
    if (!buf)
        return ddp__err(err, DDP_ERR_NOMEM, "out of memory reading '%s'", path);
    if (rc != DDP_OK) {
        free(buf);
        return rc;
    }
    *out = buf;
    *len = n;
    return DDP_OK;
}

/* The job: the inputs and where each document goes. */
typedef struct text_job {
    file_list files;
    ddp_text_opts o;
    bool want_val; /* writing the validation file (else the training file) */
    ddp_text_stats stats;
} text_job;

static ddp_status put_tokens(FILE *f, const char *p, size_t n, const char *tmp, ddp_error *err)
{
    uint16_t buf[4096];
    while (n) {
        size_t k = n < 4096 ? n : 4096;
        for (size_t i = 0; i < k; i++)
            buf[i] = (unsigned char)p[i];
        if (fwrite(buf, 2, k, f) != k)
            return ddp__err(err, DDP_ERR_SYSTEM, "writing '%s' failed: %s", tmp, strerror(errno));
        p += k;
        n -= k;
    }
    return DDP_OK;
}

/* Length of the document starting at p (up to end): through its separator line (the separator
 * alone on its line, before '\n' or "\r\n"), or to end. */
static size_t doc_len(const char *p, const char *end, const char *sep)
{
    if (!sep)
        return (size_t)(end - p);
    size_t sl = strlen(sep);
    const char *line = p;
    while (line < end) {
        const char *nl = memchr(line, '\n', (size_t)(end - line));
        const char *le = nl ? nl : end;
        size_t ll = (size_t)(le - line);
        if (ll > sl && line[ll - 1] == '\r') /* a CRLF file's line */
            ll--;
        if (ll == sl && memcmp(line, sep, sl) == 0)
            return (size_t)((nl ? nl + 1 : end) - p);
        line = nl ? nl + 1 : end;
    }
    return (size_t)(end - p);
}

/* Deals the documents of every input to the training or validation file: f receives the split
 * j->want_val names; f NULL only counts (j->stats, both splits). */
static ddp_status deal(text_job *j, FILE *f, const char *tmp, ddp_error *err)
{
    uint64_t doc = 0, tokens[2] = {0, 0};
    unsigned every = j->o.val_every;
    for (size_t i = 0; i < j->files.n; i++) {
        char *text = NULL;
        size_t len = 0;
        ddp_status st = read_all(j->files.paths[i], &text, &len, err);
        if (st)
            return st;
        for (const char *p = text, *end = text + len; p < end; doc++) {
            size_t n = doc_len(p, end, j->o.doc_sep);
            bool val = every > 0 && doc % every == every - 1;
            if (f && val == j->want_val && (st = put_tokens(f, p, n, tmp, err))) {
                free(text);
                return st;
            }
            tokens[val] += n;
            p += n;
        }
        free(text);
    }
    j->stats.documents = doc;
    j->stats.train_tokens = tokens[0];
    j->stats.val_tokens = tokens[1];
    return DDP_OK;
}

static ddp_status write_split(void *ctx, FILE *f, const char *tmp, ddp_error *err)
{
    return deal(ctx, f, tmp, err);
}

/* Before anything is written: both splits must get tokens, so that a failure leaves no file
 * replaced (a new val.bin beside an old train.bin would be a pair from two texts). */
static ddp_status check_split(text_job *j, bool want_val, ddp_error *err)
{
    ddp_status st = deal(j, NULL, NULL, err);
    if (st)
        return st;
    const ddp_text_stats *s = &j->stats;
    unsigned every = j->o.val_every;
    unsigned long long docs = (unsigned long long)s->documents;
    if (docs == 0)
        return ddp__err(err, DDP_ERR_INVALID,
                        "the text inputs are empty (%zu file%s, 0 bytes); give files that hold "
                        "text",
                        j->files.n, j->files.n == 1 ? "" : "s");
    if (s->train_tokens == 0)
        return ddp__err(err, DDP_ERR_INVALID,
                        "the text inputs give no training tokens: %llu document%s, and with "
                        "val_every %u every one goes to validation; set val_every to 0 (no "
                        "validation file) or 2 and above",
                        docs, docs == 1 ? "" : "s", every);
    if (want_val && every > 0 && s->val_tokens == 0)
        return ddp__err(err, DDP_ERR_INVALID,
                        "the text inputs give no validation tokens: %llu document%s (%s), and "
                        "val_every %u sends every %u-th to validation; cut the text into "
                        "documents with doc_sep (a line that ends each one, e.g. %% in fortune "
                        "files), give more files, or lower val_every",
                        docs, docs == 1 ? "" : "s",
                        j->o.doc_sep ? "cut at doc_sep lines" : "each file is one document", every,
                        every);
    return DDP_OK;
}

static ddp_status job_init(text_job *j, const char *const *inputs, size_t n,
                           const ddp_text_opts *opts, ddp_error *err)
{
    memset(j, 0, sizeof *j);
    ddp_text_opts dflt = DDP_TEXT_OPTS_INIT;
    j->o = opts ? *opts : dflt;
    if (n == 0 || !inputs)
        return ddp__err(err, DDP_ERR_INVALID, "no text inputs given");
    if (j->o.doc_sep && strpbrk(j->o.doc_sep, "\r\n"))
        return ddp__err(err, DDP_ERR_INVALID,
                        "doc_sep holds a line break: it is one line (e.g. %%), matched against "
                        "each line of the text without its line break");
    if (j->o.doc_sep && !*j->o.doc_sep)
        j->o.doc_sep = NULL; /* "": none, as ddptrain's default data.doc_sep */
    for (size_t i = 0; i < n; i++) {
        ddp_status st = expand(inputs[i], &j->files, err);
        if (st)
            return st;
    }
    /* Each file opens, before the data cache is touched: an unreadable input failed inside
     * the cache's writer, whose message then blamed the cache ("DDP_DATA_CACHE names another
     * folder"). expand let through regular files only, so no open blocks. */
    for (size_t i = 0; i < j->files.n; i++) {
        FILE *f = fopen(j->files.paths[i], "rb");
        if (!f)
            return ddp__err(err, DDP_ERR_INVALID, "cannot read text input '%s': %s",
                            j->files.paths[i], strerror(errno));
        fclose(f);
    }
    return DDP_OK;
}

/* Writes both files: validation first, so a training file present means both are complete. */
static ddp_status write_both(text_job *j, const char *train_out, const char *val_out,
                             ddp_error *err)
{
    ddp_status st = check_split(j, val_out != NULL, err);
    if (st)
        return st;
    if (val_out && j->o.val_every > 0) {
        j->want_val = true;
        if ((st = ddp_file_write_atomic(val_out, write_split, j, err)))
            return st;
    }
    j->want_val = false;
    return ddp_file_write_atomic(train_out, write_split, j, err);
}

ddp_status ddp_tokens_from_text(const char *const *inputs, size_t n, const ddp_text_opts *opts,
                                const char *train_out, const char *val_out, ddp_text_stats *stats,
                                ddp_error *err)
{
    if (!train_out)
        return ddp__err(err, DDP_ERR_INVALID, "ddp_tokens_from_text: train_out is required");
    text_job j;
    ddp_status st = job_init(&j, inputs, n, opts, err);
    if (st == DDP_OK)
        st = write_both(&j, train_out, val_out, err);
    if (!val_out)
        j.stats.val_tokens = 0; /* dealt to validation, not written */
    if (st == DDP_OK && stats)
        *stats = j.stats;
    list_free(&j.files);
    return st;
}

/* FNV-1a over bytes: the cache key of a set of inputs. */
static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

typedef struct cached_job {
    text_job *j;
    const char *val_out;
} cached_job;

/* prepare_once's writer: the validation file (atomically, beside), then the training file. */
static ddp_status write_cached(void *ctx, FILE *f, const char *tmp, ddp_error *err)
{
    cached_job *c = ctx;
    ddp_status st = check_split(c->j, true, err);
    if (st)
        return st;
    if (c->j->o.val_every > 0) {
        c->j->want_val = true;
        if ((st = ddp_file_write_atomic(c->val_out, write_split, c->j, err)))
            return st;
    }
    c->j->want_val = false;
    return write_split(c->j, f, tmp, err);
}

ddp_status ddp_tokens_prepare_text(const char *const *inputs, size_t n, const ddp_text_opts *opts,
                                   const char *cache_dir, char *train_path, char *val_path,
                                   size_t cap, ddp_error *err)
{
    if (!train_path || !val_path || cap == 0)
        return ddp__err(err, DDP_ERR_INVALID, "ddp_tokens_prepare_text: output buffers required");
    text_job j;
    ddp_status st = job_init(&j, inputs, n, opts, err);
    if (st)
        goto out;
    /* the key: every file's path, size, modification time and inode, and the options */
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < j.files.n; i++) {
        struct stat fs;
        if (stat(j.files.paths[i], &fs) != 0) {
            st = ddp__err(err, DDP_ERR_SYSTEM, "cannot read '%s': %s", j.files.paths[i],
                          strerror(errno));
            goto out;
        }
        /* the modification time to the nanosecond: a text rewritten with the same size
         * within the same second (a script making its data) is a new entry too */
        int64_t v[4] = {(int64_t)fs.st_size, (int64_t)fs.st_mtim.tv_sec,
                        (int64_t)fs.st_mtim.tv_nsec, (int64_t)fs.st_ino};
        h = fnv(h, j.files.paths[i], strlen(j.files.paths[i]) + 1);
        h = fnv(h, v, sizeof v);
    }
    h = fnv(h, &j.o.val_every, sizeof j.o.val_every);
    if (j.o.doc_sep)
        h = fnv(h, j.o.doc_sep, strlen(j.o.doc_sep) + 1);
    const char *dir = cache_dir && *cache_dir ? cache_dir : "/tmp/ddp-data-cache";
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
        st = ddp__err(err, DDP_ERR_SYSTEM, "cannot create the data cache '%s': %s", dir,
                      strerror(errno));
        goto out;
    }
    ddp__fmt(train_path, cap, "%s/text-%016llx-train.bin", dir, (unsigned long long)h);
    ddp__fmt(val_path, cap, "%s/text-%016llx-val.bin", dir, (unsigned long long)h);
    if (strlen(val_path) + 1 >= cap) {
        st = ddp__err(err, DDP_ERR_INVALID, "the data cache path '%s' is too long", dir);
        goto out;
    }
    if (j.o.val_every == 0)
        val_path[0] = '\0';
    char what[256];
    ddp__fmt(what, sizeof what, "tokenize %zu text files", j.files.n);
    cached_job c = {&j, val_path};
    st = ddp__prepare_once(train_path, what, write_cached, &c, err);
out:
    list_free(&j.files);
    return st;
}
