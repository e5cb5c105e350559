/*
 * fuzz_config.c — the YAML configuration loader (ddp_config_load) on arbitrary files and
 * command lines.
 *
 * Input: YAML text up to the first NUL byte; after it, command-line arguments separated by NUL
 * bytes (at most 32). The schema has every key type, dotted keys and a choice, like ddptrain's.
 * Besides not crashing, a loaded configuration must survive its own YAML: what
 * ddp_config_to_yaml writes (into logs and checkpoints) must load again to the same values
 * (when its strings are UTF-8: YAML cannot hold other bytes).
 */
#include "fuzz.h"

#include <string.h>

#include "ddp/config.h"

static const ddp_cfg_key schema[] = {
    {"lr", DDP_CFG_FLOAT, "0.1", NULL, "learning rate"},
    {"epochs", DDP_CFG_INT, "1", NULL, "passes over the data"},
    {"shuffle", DDP_CFG_BOOL, "true", NULL, "shuffle every epoch"},
    {"out_dir", DDP_CFG_STRING, "runs/default", NULL, "where logs go"},
    {"schedule", DDP_CFG_CHOICE, "cosine", "cosine|linear|constant", "learning-rate schedule"},
    {"model.type", DDP_CFG_CHOICE, "mlp", "mlp|cnn|gpt", "model"},
    {"model.hidden", DDP_CFG_INT_LIST, "256,128", NULL, "hidden sizes"},
    {"model.dropout", DDP_CFG_FLOAT, "0", NULL, "dropout"},
    {"data.path", DDP_CFG_STRING, "", NULL, "data file"},
    {"data.threads", DDP_CFG_INT, "1", NULL, "loader threads"},
    {"checkpoint.every", DDP_CFG_INT, "0", NULL, "steps between checkpoints"},
    {"a.b.c.d", DDP_CFG_STRING, "deep", NULL, "a deeply nested key"},
};
#define NKEYS (sizeof schema / sizeof schema[0])

/* Whether s is UTF-8 (YAML text is Unicode: other bytes cannot round-trip). */
static bool is_utf8(const unsigned char *s)
{
    while (*s) {
        int k = *s < 0x80             ? 0
                : (*s & 0xe0) == 0xc0 ? 1
                : (*s & 0xf0) == 0xe0 ? 2
                : (*s & 0xf8) == 0xf0 ? 3
                                      : -1;
        if (k < 0)
            return false;
        uint32_t cp = k == 0 ? *s : *s & (0x3fu >> k);
        for (int j = 1; j <= k; j++) {
            if ((s[j] & 0xc0) != 0x80)
                return false;
            cp = cp << 6 | (s[j] & 0x3fu);
        }
        static const uint32_t min[4] = {0, 0x80, 0x800, 0x10000};
        if (cp < min[k] || (cp >= 0xd800 && cp <= 0xdfff) || cp > 0x10ffff)
            return false;
        s += k + 1;
    }
    return true;
}

/* Every getter on every key; returns a digest so nothing is optimised away. */
static uint64_t read_all(const ddp_config *c)
{
    uint64_t h = 0;
    for (size_t i = 0; i < NKEYS; i++) {
        const char *k = schema[i].name;
        size_t n = 0;
        const int64_t *l = ddp_config_ints(c, k, &n);
        for (size_t j = 0; j < n; j++)
            h = h * 31 + (uint64_t)l[j];
        h = h * 31 + (uint64_t)ddp_config_int(c, k) + ddp_config_bool(c, k);
        double d = ddp_config_float(c, k);
        uint64_t bits;
        memcpy(&bits, &d, sizeof bits);
        h = h * 31 + bits;
        h = h * 31 + strlen(ddp_config_str(c, k)) + strlen(ddp_config_origin(c, k));
    }
    return h;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *nul = memchr(data, 0, size);
    size_t ylen = nul ? (size_t)(nul - data) : size;
    char path[64];
    int fd = fuzz_mem_file(data, ylen, path, sizeof path);

    /* The arguments: copied out, NUL-terminated. */
    char *args = NULL, *argv[32];
    int argc = 0;
    if (nul) {
        size_t an = size - ylen - 1;
        args = malloc(an + 1);
        if (!args)
            abort();
        memcpy(args, nul + 1, an);
        args[an] = '\0';
        for (char *p = args; p < args + an && argc < 32; p += strlen(p) + 1)
            argv[argc++] = p;
    }

    ddp_config *c = NULL;
    ddp_error err = {0};
    if (ddp_config_load(schema, NKEYS, path, argc, argv, &c, &err) == DDP_OK) {
        volatile uint64_t h = read_all(c);
        (void)h;
        bool utf8 = true;
        for (size_t i = 0; i < NKEYS; i++)
            utf8 = utf8 && is_utf8((const unsigned char *)ddp_config_str(c, schema[i].name));
        char *yaml = ddp_config_to_yaml(c);
        if (!yaml)
            abort();
        if (!utf8)
            goto out_yaml;
        char p2[64];
        int fd2 = fuzz_mem_file(yaml, strlen(yaml), p2, sizeof p2);
        ddp_config *c2 = NULL;
        ddp_error err2 = {0};
        if (ddp_config_load(schema, NKEYS, p2, 0, NULL, &c2, &err2) != DDP_OK) {
            fprintf(stderr, "ddp_config_to_yaml wrote YAML that does not load again:\n%s\n%s\n",
                    yaml, err2.msg);
            abort();
        }
        char *yaml2 = ddp_config_to_yaml(c2);
        if (!yaml2 || strcmp(yaml, yaml2) != 0) {
            fprintf(stderr, "the configuration changed through its YAML:\n%s\n---\n%s\n", yaml,
                    yaml2 ? yaml2 : "(null)");
            abort();
        }
        free(yaml2);
        ddp_config_free(c2);
        close(fd2);
    out_yaml:
        free(yaml);
    }
    ddp_config_free(c);
    free(args);
    close(fd);
    return 0;
}
