/*
 * ddp/config.h — configuration from a YAML file and the command line, checked against a schema.
 *
 * The program declares every key it understands (name, type, default, help). Values come from,
 * in rising precedence: the defaults, the YAML file, then `--key value` / `--key=value` on the
 * command line (dashes or underscores; nested YAML maps flatten to dotted keys:
 * `model: {hidden: 256}` is `model.hidden`, overridden by `--model.hidden 512`). Everything is
 * checked before any work starts: an unknown key is an error that suggests the closest known
 * one, a bad value names the key, the expected type and where the value came from (file and
 * line, or the command line).
 */
#ifndef DDP_CONFIG_H
#define DDP_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "ddp/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum ddp_cfg_type {
    DDP_CFG_INT,
    DDP_CFG_FLOAT,
    DDP_CFG_BOOL, /* true/false, yes/no, on/off, 1/0 */
    DDP_CFG_STRING,
    DDP_CFG_CHOICE,   /* one of `choices` ("none|linear|sqrt") */
    DDP_CFG_INT_LIST, /* YAML sequence [256, 128] or "256,128" on the command line */
} ddp_cfg_type;

/* One key of the schema: plain data, usually a static table. */
typedef struct ddp_cfg_key {
    const char *name; /* "lr", "model.hidden" */
    ddp_cfg_type type;
    const char *def;     /* default, as text ("" for an empty string or list) */
    const char *choices; /* for DDP_CFG_CHOICE: "a|b|c"; else NULL */
    const char *help;    /* one line */
} ddp_cfg_key;

typedef struct ddp_config ddp_config;

/* Resolves the configuration. yaml_path may be NULL (defaults and command line only). argv
 * holds only options (argv[0] is an option too, not a program name); the caller removes the
 * ones it handles itself (--config, --task, --help). *out written only on DDP_OK; err may be
 * NULL. The schema is borrowed for the config's life. */
ddp_status ddp_config_load(const ddp_cfg_key *schema, size_t nkeys, const char *yaml_path, int argc,
                           char **argv, ddp_config **out, ddp_error *err);
void ddp_config_free(ddp_config *c); /* NULL is a no-op */

/* Typed getters; the key must be in the schema with that type (else 0 / false / ""). */
int64_t ddp_config_int(const ddp_config *c, const char *key);
double ddp_config_float(const ddp_config *c, const char *key);
bool ddp_config_bool(const ddp_config *c, const char *key);
const char *ddp_config_str(const ddp_config *c, const char *key); /* also CHOICE; owned by c */
/* An INT_LIST: *n elements in *out, owned by c. */
const int64_t *ddp_config_ints(const ddp_config *c, const char *key, size_t *n);
/* Where a key's value came from: "default", "the command line", or "FILE line N". */
const char *ddp_config_origin(const ddp_config *c, const char *key);

/* The resolved configuration as YAML text ("key: value" lines, dotted keys), for logs and
 * checkpoints. Caller frees with free(). NULL on no memory. */
char *ddp_config_to_yaml(const ddp_config *c);

/* The Levenshtein distance between two names (insertions, deletions, substitutions), for a
 * "did you mean" of one's own, as ddprun's for its flags; names over 63 characters are 99 apart
 * from everything. */
size_t ddp_config_edit_distance(const char *a, const char *b);

/* Prints every key with its type, default and help, grouped by its first dotted part. */
void ddp_config_print_help(const ddp_cfg_key *schema, size_t nkeys, FILE *out);

#ifdef __cplusplus
}
#endif
#endif /* DDP_CONFIG_H */
