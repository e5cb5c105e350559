/*
 * fuzz_text.c — text files made into byte-level token files (ddp_tokens_from_text): documents
 * cut at a separator line (fortune's "%"), CRLF lines, the deal into training and validation
 * files, and the files written (atomically, into a scratch folder in /dev/shm, removed after
 * each input).
 *
 * Input: a byte for val_every (byte % 5), then the separator line up to the first '\n' (empty:
 * each file is one document), then up to three text files separated by the 4 bytes "\n--\n".
 * On DDP_OK the files written must hold every byte of the text once, as uint16 tokens below
 * 256, as many in each file as the returned statistics say.
 */
#include "fuzz.h"

#include <string.h>
#include <sys/stat.h>

#include "ddp/data.h"

static const char sep[] = "\n--\n";

/* The bytes of a written token file as a count of tokens; -1 when absent; aborts on a token
 * that is not a byte. */
static long long tokens_in(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return -1;
    long long n = 0;
    uint16_t t;
    while (fread(&t, 2, 1, f) == 1) {
        if (t > 255)
            abort();
        n++;
    }
    fclose(f);
    return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    ddp_text_opts o = DDP_TEXT_OPTS_INIT;
    o.val_every = data[0] % 5;
    data++;
    size--;
    const uint8_t *nl = memchr(data, '\n', size);
    size_t sl = nl ? (size_t)(nl - data) : 0;
    char docsep[256];
    if (sl >= sizeof docsep)
        return 0;
    memcpy(docsep, data, sl);
    docsep[sl] = '\0';
    if (strlen(docsep) != sl) /* a NUL in it: not a line anyone can give */
        return 0;
    o.doc_sep = docsep;
    if (nl) {
        data += sl + 1;
        size -= sl + 1;
    }

    int fds[3];
    char paths[3][64];
    const char *inputs[3];
    size_t n = 0, total = 0;
    const uint8_t *p = data, *end = data + size;
    while (n < 3) {
        const uint8_t *q = (n < 2 && end - p >= (ptrdiff_t)sizeof sep - 1)
                               ? memmem(p, (size_t)(end - p), sep, sizeof sep - 1)
                               : NULL;
        size_t len = (size_t)((q ? q : end) - p);
        fds[n] = fuzz_mem_file(p, len, paths[n], sizeof paths[n]);
        inputs[n] = paths[n];
        total += len;
        n++;
        if (!q)
            break;
        p = q + sizeof sep - 1;
    }

    char dir[] = "/dev/shm/ddp-fuzz-text-XXXXXX", train[64], val[64];
    if (!mkdtemp(dir))
        abort();
    snprintf(train, sizeof train, "%s/train.bin", dir);
    snprintf(val, sizeof val, "%s/val.bin", dir);
    ddp_text_stats stats;
    ddp_error err = {0};
    ddp_status st = ddp_tokens_from_text(inputs, n, &o, train, val, &stats, &err);
    if (st != DDP_OK && !*err.msg)
        abort();
    if (st == DDP_OK) {
        long long tt = tokens_in(train), vt = tokens_in(val);
        if (tt < 0 || (unsigned long long)tt != stats.train_tokens ||
            (o.val_every > 0 && (vt < 0 || (unsigned long long)vt != stats.val_tokens)) ||
            (o.val_every == 0 && vt >= 0) || stats.train_tokens + stats.val_tokens != total ||
            stats.train_tokens == 0) {
            fprintf(stderr,
                    "fuzz_text: written files (%lld, %lld tokens) unlike the stats "
                    "(%llu, %llu) or the text (%zu bytes)\n",
                    tt, vt, (unsigned long long)stats.train_tokens,
                    (unsigned long long)stats.val_tokens, total);
            abort();
        }
    }
    unlink(train);
    unlink(val);
    if (rmdir(dir) != 0) {
        fprintf(stderr, "fuzz_text: '%s' is not empty after the call: a temporary file left\n",
                dir);
        abort();
    }
    for (size_t i = 0; i < n; i++)
        close(fds[i]);
    return 0;
}
