/*
 * data.c — the data a task reads, opened and checked before any work: Fashion-MNIST / MNIST IDX
 * files for the mlp and cnn; token files for the GPT (nanoGPT's raw uint16 or llm.c's shards),
 * or text made into byte-level token files once per host (ddp_tokens_prepare_text, under the
 * same lock as the IDX decompression). A file the model cannot read — an id beyond the
 * vocabulary, fewer tokens than one window — is a one-line error here rather than a failure in
 * the middle of training. Batches themselves come from the loader (train.c, eval.c).
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ddptrain.h"

/* cache: where a gzip file is decompressed to (the data_cache setting, DDP_DATA_CACHE). */
static ddp_status open_split(const char *dir, const char *split, const char *cache,
                             ddp_dataset **out, ddp_error *err)
{
    char im[2048], lb[2048];
    snprintf(im, sizeof im, "%s/%s-images-idx3-ubyte.gz", dir, split);
    snprintf(lb, sizeof lb, "%s/%s-labels-idx1-ubyte.gz", dir, split);
    if (access(im, R_OK) != 0) {
        snprintf(im, sizeof im, "%s/%s-images-idx3-ubyte", dir, split);
        snprintf(lb, sizeof lb, "%s/%s-labels-idx1-ubyte", dir, split);
    }
    return ddp_dataset_open_idx(im, lb, cache, out, err);
}

static int open_images(trainer *t, bool train, ddp_dataset **tr, ddp_dataset **te)
{
    ddp_error err = {0};
    const char *dir = ddp_config_str(t->cfg, "data.dir");
    const char *cache = t->world.settings.data_cache;
    if ((train && open_split(dir, "train", cache, tr, &err)) ||
        open_split(dir, "t10k", cache, te, &err)) {
        /* A missing file: say what data.dir must hold, and where Fashion-MNIST comes from. */
        if (err.status == DDP_ERR_NOT_FOUND)
            fprintf(stderr,
                    "ddptrain: %s; data.dir '%s' must hold train- and t10k-images-idx3-ubyte and "
                    "-labels-idx1-ubyte (or .gz): Fashion-MNIST is Debian's dataset-fashion-mnist "
                    "(/usr/share/datasets/fashion-mnist)\n",
                    err.msg, dir);
        else
            fprintf(stderr, "ddptrain: %s\n", err.msg);
        return 2;
    }
    t->side = (int)lround(sqrt((double)ddp_dataset_x_elems(*te)));
    /* The classes: a checkpoint's (test, predict: a few images of one's own, whatever their
     * labels); training: what the labels of either split reach (a test set without the last
     * class still trains on it). */
    int seen = ddp_dataset_classes(*te);
    if (train && ddp_dataset_classes(*tr) > seen)
        seen = ddp_dataset_classes(*tr);
    t->classes = t->ckpt_classes > 0 ? t->ckpt_classes : seen > 0 ? seen : 10;
    if (seen > t->classes && !strcmp(ddp_config_str(t->cfg, "task"), "test")) {
        fprintf(stderr,
                "ddptrain: the labels in data.dir '%s' go up to %d, but the checkpoint's model has "
                "%d classes (0 … %d): its accuracy on them means nothing; test it on images of "
                "those classes (--task predict takes any labels)\n",
                dir, seen - 1, t->classes, t->classes - 1);
        return 2;
    }
    int64_t shift = ddp_config_int(t->cfg, "augment.shift");
    if (shift < 0 || shift >= t->side) {
        fprintf(stderr,
                "ddptrain: augment.shift %lld must be from 0 to %d (the images are %d × %d)\n",
                (long long)shift, t->side - 1, t->side, t->side);
        return 2;
    }
    return 0;
}

/* data.text, comma-separated, made into token files in the data cache: their paths. */
static int prepare_text(trainer *t, char *train, char *val, size_t cap)
{
    char *list = strdup(ddp_config_str(t->cfg, "data.text"));
    const char **inputs = calloc(strlen(list ? list : "") / 2 + 2, sizeof *inputs);
    size_t n = 0;
    int rc = 2;
    if (!list || !inputs) {
        fprintf(stderr, "ddptrain: out of memory\n");
        goto out_free;
    }
    char *save = NULL;
    for (char *p = strtok_r(list, ",", &save); p; p = strtok_r(NULL, ",", &save))
        inputs[n++] = p;
    ddp_text_opts o = DDP_TEXT_OPTS_INIT;
    o.doc_sep =
        *ddp_config_str(t->cfg, "data.doc_sep") ? ddp_config_str(t->cfg, "data.doc_sep") : NULL;
    int64_t every = ddp_config_int(t->cfg, "data.val_every");
    if (every < 2 || every > 1000000) {
        fprintf(stderr,
                "ddptrain: data.val_every %lld must be from 2 to 1000000 (every Nth document is "
                "validation text)\n",
                (long long)every);
        goto out_free;
    }
    o.val_every = (unsigned)every;
    ddp_error err = {0};
    if (ddp_tokens_prepare_text(inputs, n, &o, t->world.settings.data_cache, train, val, cap,
                                &err) != DDP_OK) {
        fprintf(stderr, "ddptrain: data.text: %s\n", err.msg);
        goto out_free;
    }
    rc = 0;
out_free:
    free(inputs);
    free(list);
    return rc;
}

/* Opens the token file at path (the value of key, or made from data.text: from_text) in windows
 * of T tokens and checks it against the model: at least one window, every id below the
 * vocabulary. */
static int open_tokens(trainer *t, const char *key, const char *path, bool from_text,
                       ddp_dataset **out)
{
    ddp_error err = {0};
    if (ddp_dataset_open_tokens(path, (size_t)t->T, out, &err) != DDP_OK) {
        /* Too short for a window of T (+ 1) tokens, or unreadable? One token a window tells. */
        ddp_dataset *one;
        if (ddp_dataset_open_tokens(path, 1, &one, NULL) == DDP_OK) {
            /* made from data.text: the file is the cache's, not one the user named */
            if (from_text)
                fprintf(stderr,
                        "ddptrain: model.block_size %d is larger than the %s tokens data.text "
                        "gives allow: %zu (in '%s'), and a window needs block_size + 1; lower "
                        "model.block_size or give more text%s\n",
                        t->T, strcmp(key, "data.val") ? "training" : "validation",
                        ddp_dataset_num_tokens(one), path,
                        strcmp(key, "data.val") ? "" : " (or a smaller data.val_every)");
            else
                fprintf(stderr,
                        "ddptrain: model.block_size %d is larger than %s '%s' allows: it has %zu "
                        "tokens and a window needs block_size + 1; lower model.block_size\n",
                        t->T, key, path, ddp_dataset_num_tokens(one));
            ddp_dataset_close(one);
        } else {
            fprintf(stderr, "ddptrain: %s: %s\n", from_text ? "data.text" : key, err.msg);
        }
        return 2;
    }
    if (ddp_dataset_classes(*out) > t->vocab && from_text) {
        /* the user gave text, not this file: name the text, and the file as the cache's */
        fprintf(stderr,
                "ddptrain: data.text '%s' holds byte %d in its %s text (tokens cached in '%s'), "
                "not below model.vocab_size %d; text is read as bytes: set model.vocab_size to "
                "256 (its default)\n",
                ddp_config_str(t->cfg, "data.text"), ddp_dataset_classes(*out) - 1,
                strcmp(key, "data.val") ? "training" : "validation", path, t->vocab);
        ddp_dataset_close(*out);
        *out = NULL;
        return 2;
    }
    if (ddp_dataset_classes(*out) > t->vocab) {
        fprintf(stderr,
                "ddptrain: %s '%s' holds token id %d, not below model.vocab_size %d; set "
                "model.vocab_size above the largest id (bytes: 256, GPT-2 BPE: 50304)\n",
                key, path, ddp_dataset_classes(*out) - 1, t->vocab);
        ddp_dataset_close(*out);
        *out = NULL;
        return 2;
    }
    return 0;
}

static int open_lm(trainer *t, bool train, bool test, ddp_dataset **tr, ddp_dataset **te)
{
    char tpath[4096], vpath[4096];
    bool text_train = false, text_val = false; /* made from data.text */
    snprintf(tpath, sizeof tpath, "%s", ddp_config_str(t->cfg, "data.train"));
    snprintf(vpath, sizeof vpath, "%s", ddp_config_str(t->cfg, "data.val"));
    if (!train && !test)
        return 0; /* generation reads no data */
    if (!*tpath) {
        if (!*ddp_config_str(t->cfg, "data.text")) {
            fprintf(stderr, "ddptrain: model.type gpt needs token files (data.train, data.val) "
                            "or text to make them from (data.text)\n");
            return 2;
        }
        char val[4096];
        int rc = prepare_text(t, tpath, val, sizeof tpath);
        if (rc)
            return rc;
        text_train = true;
        if (!*vpath) {
            snprintf(vpath, sizeof vpath, "%s", val);
            text_val = true;
        }
    }
    if (!*vpath) {
        fprintf(stderr, "ddptrain: data.val is empty: a language model is evaluated on a "
                        "validation token file; give data.val\n");
        return 2;
    }
    int rc;
    if ((train && (rc = open_tokens(t, "data.train", tpath, text_train, tr))) ||
        (rc = open_tokens(t, "data.val", vpath, text_val, te)))
        return rc;
    snprintf(t->train_path, sizeof t->train_path, "%s", train ? tpath : "");
    snprintf(t->val_path, sizeof t->val_path, "%s", vpath);
    return 0;
}

int trainer_open_data(trainer *t, ddp_dataset **tr, ddp_dataset **te)
{
    const char *task = ddp_config_str(t->cfg, "task");
    bool train = !strcmp(task, "train"), test = !strcmp(task, "test");
    t->B = (int)ddp_config_int(t->cfg, "batch_size");
    t->lm = !strcmp(ddp_config_str(t->cfg, "model.type"), "gpt");
    if (!t->lm)
        return open_images(t, train, tr, te);
    t->T = (int)ddp_config_int(t->cfg, "model.block_size");
    t->vocab = (int)ddp_config_int(t->cfg, "model.vocab_size");
    t->random = !strcmp(ddp_config_str(t->cfg, "data.sampling"), "random");
    return open_lm(t, train, test, tr, te);
}
