/*
 * config.c — schema-checked configuration: defaults, then a YAML file (libyaml's document API),
 * then command-line overrides. Values are kept as text with their origin and parsed by type on
 * every layer, so a bad value is caught where it came from. Not here: what the keys mean.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <yaml.h>

#include "ddp/config.h"
#include "util/util.h"

typedef struct value {
    char *text;
    char origin[300];
    /* parsed */
    int64_t i;
    double f;
    bool b;
    int64_t *list;
    size_t nlist;
} value;

struct ddp_config {
    const ddp_cfg_key *schema;
    size_t n;
    value *v;
};

static long find_key(const ddp_cfg_key *s, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(s[i].name, name) == 0)
            return (long)i;
    return -1;
}

/* Whether some key of s lies under name ("checkpoint" for "checkpoint.every"): a YAML map given
 * for name is then that section, even where name is a key of its own. */
static bool has_section(const ddp_cfg_key *s, size_t n, const char *name)
{
    size_t l = strlen(name);
    for (size_t i = 0; i < n; i++)
        if (strncmp(s[i].name, name, l) == 0 && s[i].name[l] == '.')
            return true;
    return false;
}

size_t ddp_config_edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    if (la > 63 || lb > 63)
        return 99;
    size_t d[64][64];
    for (size_t i = 0; i <= la; i++)
        d[i][0] = i;
    for (size_t j = 0; j <= lb; j++)
        d[0][j] = j;
    for (size_t i = 1; i <= la; i++)
        for (size_t j = 1; j <= lb; j++) {
            size_t sub = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
            size_t del = d[i - 1][j] + 1, ins = d[i][j - 1] + 1;
            d[i][j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
        }
    return d[la][lb];
}

static ddp_status unknown_key(const ddp_cfg_key *s, size_t n, const char *name, const char *where,
                              ddp_error *err)
{
    size_t best = 99;
    const char *sugg = NULL;
    for (size_t i = 0; i < n; i++) {
        size_t d = ddp_config_edit_distance(name, s[i].name);
        const char *dot = strrchr(s[i].name, '.');
        if (dot && strcmp(dot + 1, name) == 0)
            d = 1; /* "hidden" for "model.hidden" */
        if (d < best) {
            best = d;
            sugg = s[i].name;
        }
    }
    /* Near only when most of the name survives: 'foo' is 3 edits from 'lr' too, as every
     * 3-letter name is, and suggesting 'lr' for it misleads. */
    if (sugg && best <= 3 && 2 * best <= strlen(name))
        return ddp__err(err, DDP_ERR_INVALID,
                        "unknown key '%s' (%s); did you mean '%s'? (--help "
                        "lists every key)",
                        name, where, sugg);
    return ddp__err(err, DDP_ERR_INVALID, "unknown key '%s' (%s); --help lists every key", name,
                    where);
}

static bool parse_bool(const char *t, bool *out)
{
    static const char *const yes[] = {"true", "yes", "on", "1"};
    static const char *const no[] = {"false", "no", "off", "0"};
    for (int i = 0; i < 4; i++) {
        if (!strcasecmp(t, yes[i])) {
            *out = true;
            return true;
        }
        if (!strcasecmp(t, no[i])) {
            *out = false;
            return true;
        }
    }
    return false;
}

/* Parses text for key k into v (replacing what was there). */
static ddp_status set_value(const ddp_cfg_key *k, value *v, const char *text, const char *origin,
                            ddp_error *err)
{
    value nv = {0};
    char *end;
    switch (k->type) {
    case DDP_CFG_INT: {
        errno = 0;
        long long x = strtoll(text, &end, 10);
        if (!*text || *end || errno)
            return ddp__err(err, DDP_ERR_INVALID, "key '%s': '%s' is not an integer (%s)", k->name,
                            text, origin);
        nv.i = x;
        break;
    }
    case DDP_CFG_FLOAT: {
        errno = 0;
        double x = strtod(text, &end);
        if (!*text || *end || isnan(x))
            return ddp__err(err, DDP_ERR_INVALID, "key '%s': '%s' is not a number (%s)", k->name,
                            text, origin);
        /* ERANGE with a result of 0 or a subnormal is underflow: a number too small to hold
         * exactly, still a number (1e-320 is one); only an overflow (±HUGE_VAL), or "inf"
         * written out, is refused. */
        if (!isfinite(x) || (errno == ERANGE && fabs(x) >= DBL_MIN))
            return ddp__err(err, DDP_ERR_INVALID,
                            "key '%s': '%s' is out of range (%s); write a finite number of at "
                            "most %.1e in size",
                            k->name, text, origin, DBL_MAX);
        nv.f = x;
        break;
    }
    case DDP_CFG_BOOL:
        if (!parse_bool(text, &nv.b))
            return ddp__err(err, DDP_ERR_INVALID, "key '%s': '%s' is not true or false (%s)",
                            k->name, text, origin);
        break;
    case DDP_CFG_CHOICE: {
        bool ok = false;
        const char *c = k->choices ? k->choices : "";
        size_t tl = strlen(text);
        for (const char *p = c; *p && !ok;) {
            const char *bar = strchr(p, '|');
            size_t l = bar ? (size_t)(bar - p) : strlen(p);
            ok = l == tl && strncmp(p, text, l) == 0;
            p = bar ? bar + 1 : p + l;
        }
        if (!ok)
            return ddp__err(err, DDP_ERR_INVALID, "key '%s': '%s' is not one of %s (%s)", k->name,
                            text, c, origin);
        break;
    }
    case DDP_CFG_INT_LIST: {
        size_t cap = 8;
        nv.list = malloc(sizeof(int64_t) * cap);
        if (!nv.list)
            return ddp__err(err, DDP_ERR_NOMEM, "out of memory reading key '%s'", k->name);
        /* 256,128 or [256, 128]: a bracket closes what one opened, commas between numbers,
         * blanks anywhere between; nothing after the list */
        const char *p = text;
        while (*p == ' ')
            p++;
        bool open = *p == '[', closed = false, bad = false;
        p += open;
        while (*p == ' ')
            p++;
        while (*p && !bad && !closed) {
            if (open && *p == ']' && nv.nlist == 0) { /* [] */
                closed = true;
                p++;
                break;
            }
            errno = 0;
            long long x = strtoll(p, &end, 10);
            if (end == p || errno) {
                bad = true;
                break;
            }
            if (nv.nlist == cap) {
                int64_t *q = realloc(nv.list, sizeof(int64_t) * (cap *= 2));
                if (!q) {
                    free(nv.list);
                    return ddp__err(err, DDP_ERR_NOMEM, "out of memory reading '%s'", k->name);
                }
                nv.list = q;
            }
            nv.list[nv.nlist++] = x;
            for (p = end; *p == ' '; p++)
                ;
            if (*p == ',') {
                for (p++; *p == ' '; p++)
                    ;
                bad = !*p || *p == ']' || *p == ','; /* a number must follow a comma */
            } else if (open && *p == ']') {
                closed = true;
                p++;
            } else
                bad = *p != '\0';
        }
        while (*p == ' ')
            p++;
        if (bad || *p || open != closed) {
            free(nv.list);
            return ddp__err(err, DDP_ERR_INVALID,
                            "key '%s': '%s' is not a list of integers like 256,128 or [256, 128] "
                            "(%s)",
                            k->name, text, origin);
        }
        break;
    }
    case DDP_CFG_STRING: break;
    }
    nv.text = strdup(text);
    if (!nv.text) {
        free(nv.list);
        return ddp__err(err, DDP_ERR_NOMEM, "out of memory reading key '%s'", k->name);
    }
    ddp__fmt(nv.origin, sizeof nv.origin, "%s", origin);
    free(v->text);
    free(v->list);
    *v = nv;
    return DDP_OK;
}

/* A growable string (values read from YAML, ddp_config_to_yaml); `failed` once an allocation
 * failed. */
typedef struct sbuf {
    char *p;
    size_t len, cap;
    bool failed;
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t n)
{
    if (b->failed)
        return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (b->len + n + 1 > cap)
            cap *= 2;
        char *q = realloc(b->p, cap);
        if (!q) {
            b->failed = true;
            return;
        }
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static void sb_fmt(sbuf *b, const char *fmt, ...) DDP_PRINTF(2, 3);
static void sb_fmt(sbuf *b, const char *fmt, ...)
{
    char tmp[64];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n > 0)
        sb_put(b, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

/* Nested maps deeper than this are refused. Each level of walk() takes about 5 KB of stack, so
 * a few thousand levels (a 10 KB file of "{a:{a:…") overflowed it; no schema nests so deep. */
#define MAX_DEPTH 64

/* Key-value pairs walked in one file, at most. YAML aliases let a map be reused by reference, so
 * ten maps of ten aliases each (700 bytes) would otherwise be walked 10^10 times. */
#define MAX_PAIRS 100000

/* Bytes in one value read from YAML, at most (a list of aliases to a long string could
 * otherwise ask for the file's size squared). */
#define MAX_VALUE (1 << 20)

/* Walks a YAML mapping, flattening keys with '.'; depth counts the maps above node, *pairs the
 * pairs walked so far. */
static ddp_status walk(ddp_config *c, yaml_document_t *doc, yaml_node_t *node, const char *prefix,
                       const char *path, int depth, size_t *pairs, ddp_error *err)
{
    if (depth >= MAX_DEPTH)
        return ddp__err(err, DDP_ERR_INVALID,
                        "'%s' line %zu: maps nested more than %d deep (under '%.64s…'); no key "
                        "is that deep",
                        path, node->start_mark.line + 1, MAX_DEPTH, prefix);
    if (node->type != YAML_MAPPING_NODE)
        return ddp__err(err, DDP_ERR_INVALID, "'%s' line %zu: expected 'key: value' pairs%s%s",
                        path, node->start_mark.line + 1, *prefix ? " under " : "", prefix);
    for (yaml_node_pair_t *pr = node->data.mapping.pairs.start; pr < node->data.mapping.pairs.top;
         pr++) {
        if (++*pairs > MAX_PAIRS)
            return ddp__err(err, DDP_ERR_INVALID,
                            "'%s': more than %d keys, counting the maps that aliases (*name) "
                            "repeat; write the configuration without aliases",
                            path, MAX_PAIRS);
        yaml_node_t *k = yaml_document_get_node(doc, pr->key);
        yaml_node_t *v = yaml_document_get_node(doc, pr->value);
        if (!k || !v || k->type != YAML_SCALAR_NODE)
            return ddp__err(err, DDP_ERR_INVALID, "'%s': a key is not a plain name", path);
        char name[256];
        ddp__fmt(name, sizeof name, "%s%s%s", prefix, *prefix ? "." : "",
                 (const char *)k->data.scalar.value);
        char origin[300];
        ddp__fmt(origin, sizeof origin, "%s line %zu", path, k->start_mark.line + 1);
        long idx = find_key(c->schema, c->n, name);
        /* A map is a section of dotted keys: "checkpoint: {every: 5}" sets checkpoint.every,
         * though "checkpoint" is a key too (before 2026-11-25 that map was refused as "expected a
         * single value"). */
        if (v->type == YAML_MAPPING_NODE && (idx < 0 || has_section(c->schema, c->n, name))) {
            ddp_status st = walk(c, doc, v, name, path, depth + 1, pairs, err);
            if (st)
                return st;
            continue;
        }
        if (idx < 0)
            return unknown_key(c->schema, c->n, name, origin, err);
        /* A key given twice in one file: YAML parsers differ on which wins, so say so rather
         * than take the last one silently. */
        size_t pl = strlen(path);
        if (strncmp(c->v[idx].origin, path, pl) == 0 &&
            strncmp(c->v[idx].origin + pl, " line ", 6) == 0)
            return ddp__err(err, DDP_ERR_INVALID,
                            "key '%s' is set twice in '%s' (%s and line %zu); keep one of them",
                            name, path, c->v[idx].origin + pl + 1, k->start_mark.line + 1);
        /* The value as text: a scalar, or a list's items joined by commas (a list key, or a
         * text key read as comma-separated values, such as betas: [0.9, 0.95]). No fixed buffer:
         * one of 4 KB cut longer values short without a word. */
        sbuf text = {0};
        sb_put(&text, "", 0);
        if (v->type == YAML_SCALAR_NODE) {
            sb_put(&text, (const char *)v->data.scalar.value, v->data.scalar.length);
        } else if (v->type == YAML_SEQUENCE_NODE && (c->schema[idx].type == DDP_CFG_INT_LIST ||
                                                     c->schema[idx].type == DDP_CFG_STRING)) {
            for (yaml_node_item_t *it = v->data.sequence.items.start;
                 it < v->data.sequence.items.top && text.len <= MAX_VALUE; it++) {
                yaml_node_t *e = yaml_document_get_node(doc, *it);
                if (!e || e->type != YAML_SCALAR_NODE) {
                    free(text.p);
                    return ddp__err(err, DDP_ERR_INVALID,
                                    "key '%s': a list of plain values is expected (%s)", name,
                                    origin);
                }
                if (it != v->data.sequence.items.start)
                    sb_put(&text, ",", 1);
                sb_put(&text, (const char *)e->data.scalar.value, e->data.scalar.length);
            }
        } else {
            free(text.p);
            return ddp__err(err, DDP_ERR_INVALID, "key '%s': expected a single value (%s)", name,
                            origin);
        }
        ddp_status st = DDP_OK;
        if (text.failed)
            st = ddp__err(err, DDP_ERR_NOMEM, "out of memory reading key '%s' (%s)", name, origin);
        else if (text.len > MAX_VALUE)
            st = ddp__err(err, DDP_ERR_INVALID, "key '%s': a value longer than %d bytes (%s)", name,
                          MAX_VALUE, origin);
        else if (strlen(text.p) != text.len)
            st = ddp__err(err, DDP_ERR_INVALID, "key '%s': the value holds a NUL character (%s)",
                          name, origin);
        else
            st = set_value(&c->schema[idx], &c->v[idx], text.p, origin, err);
        free(text.p);
        if (st)
            return st;
    }
    return DDP_OK;
}

static ddp_status load_yaml(ddp_config *c, const char *path, ddp_error *err)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return ddp__err(err, errno == ENOENT ? DDP_ERR_NOT_FOUND : DDP_ERR_SYSTEM,
                        "cannot open config file '%s': %s", path, strerror(errno));
    yaml_parser_t p;
    yaml_document_t doc;
    ddp_status st = DDP_OK;
    if (!yaml_parser_initialize(&p)) {
        fclose(f);
        return ddp__err(err, DDP_ERR_NOMEM, "cannot start the YAML parser");
    }
    yaml_parser_set_input_file(&p, f);
    if (!yaml_parser_load(&p, &doc)) {
        /* A plain value cannot start with YAML's reserved indicators: `doc_sep: %` (a fortune
         * file's separator) reads as "cannot start any token"; say what to write instead. */
        char hint[96] = "";
        if (p.problem && strstr(p.problem, "cannot start any token") &&
            fseek(f, (long)p.problem_mark.index, SEEK_SET) == 0) {
            int ch = fgetc(f);
            if (ch == '%' || ch == '@' || ch == '`')
                ddp__fmt(hint, sizeof hint,
                         " (a value that starts with '%c' must be quoted: \"%c…\")", ch, ch);
        }
        st = ddp__err(err, DDP_ERR_INVALID, "'%s' line %zu column %zu: %s%s%s%s; fix the YAML",
                      path, p.problem_mark.line + 1, p.problem_mark.column + 1,
                      p.problem ? p.problem : "syntax error", p.context ? " " : "",
                      p.context ? p.context : "", hint);
        yaml_parser_delete(&p);
        fclose(f);
        return st;
    }
    yaml_node_t *root = yaml_document_get_root_node(&doc);
    size_t pairs = 0;
    if (root && !(root->type == YAML_SCALAR_NODE && root->data.scalar.length == 0))
        st = walk(c, &doc, root, "", path, 0, &pairs, err);
    yaml_document_delete(&doc);
    yaml_parser_delete(&p);
    fclose(f);
    return st;
}

ddp_status ddp_config_load(const ddp_cfg_key *schema, size_t nkeys, const char *yaml_path, int argc,
                           char **argv, ddp_config **out, ddp_error *err)
{
    if (!schema || !out)
        return ddp__err(err, DDP_ERR_INVALID, "ddp_config_load: schema and out are required");
    ddp_config *c = calloc(1, sizeof *c);
    if (!c)
        return ddp__err(err, DDP_ERR_NOMEM, "out of memory reading the configuration");
    c->schema = schema;
    c->n = nkeys;
    c->v = calloc(nkeys ? nkeys : 1, sizeof *c->v);
    ddp_status st = DDP_OK;
    if (!c->v) {
        st = ddp__err(err, DDP_ERR_NOMEM, "out of memory reading the configuration");
        goto out_fail;
    }
    for (size_t i = 0; i < nkeys && !st; i++)
        st = set_value(&schema[i], &c->v[i], schema[i].def ? schema[i].def : "", "default", err);
    if (st)
        goto out_fail;
    if (yaml_path && (st = load_yaml(c, yaml_path, err)))
        goto out_fail;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (strncmp(a, "--", 2) != 0 || !a[2]) {
            st = ddp__err(err, DDP_ERR_INVALID,
                          "unexpected argument '%s'; options look like "
                          "--key value",
                          a);
            goto out_fail;
        }
        char name[256];
        const char *eq = strchr(a, '=');
        size_t l = eq ? (size_t)(eq - a - 2) : strlen(a + 2);
        ddp__fmt(name, sizeof name, "%.*s", (int)l, a + 2);
        for (char *p = name; *p; p++)
            if (*p == '-')
                *p = '_';
        long idx = find_key(schema, nkeys, name);
        if (idx < 0) {
            st = unknown_key(schema, nkeys, name, "on the command line", err);
            goto out_fail;
        }
        const char *val;
        if (eq)
            val = eq + 1;
        else if (schema[idx].type == DDP_CFG_BOOL &&
                 (i + 1 >= argc || strncmp(argv[i + 1], "--", 2) == 0))
            val = "true"; /* a bare --flag */
        else if (i + 1 < argc)
            val = argv[++i];
        else {
            st = ddp__err(err, DDP_ERR_INVALID, "option '--%s' needs a value", name);
            goto out_fail;
        }
        if ((st = set_value(&schema[idx], &c->v[idx], val, "the command line", err)))
            goto out_fail;
    }
    *out = c;
    return DDP_OK;
out_fail:
    ddp_config_free(c);
    return st;
}

void ddp_config_free(ddp_config *c)
{
    if (!c)
        return;
    for (size_t i = 0; c->v && i < c->n; i++) {
        free(c->v[i].text);
        free(c->v[i].list);
    }
    free(c->v);
    free(c);
}

static const value *get(const ddp_config *c, const char *key)
{
    if (!c || !key)
        return NULL;
    long i = find_key(c->schema, c->n, key);
    return i < 0 ? NULL : &c->v[i];
}

int64_t ddp_config_int(const ddp_config *c, const char *key)
{
    const value *v = get(c, key);
    return v ? v->i : 0;
}

double ddp_config_float(const ddp_config *c, const char *key)
{
    const value *v = get(c, key);
    return v ? v->f : 0.0;
}

bool ddp_config_bool(const ddp_config *c, const char *key)
{
    const value *v = get(c, key);
    return v ? v->b : false;
}

const char *ddp_config_str(const ddp_config *c, const char *key)
{
    const value *v = get(c, key);
    return v && v->text ? v->text : "";
}

const int64_t *ddp_config_ints(const ddp_config *c, const char *key, size_t *n)
{
    const value *v = get(c, key);
    if (n)
        *n = v ? v->nlist : 0;
    return v ? v->list : NULL;
}

const char *ddp_config_origin(const ddp_config *c, const char *key)
{
    const value *v = get(c, key);
    return v ? v->origin : "";
}

/* The length of the UTF-8 sequence at s (of n bytes) and its code point; 0 if not UTF-8. */
static size_t utf8_char(const unsigned char *s, size_t n, uint32_t *cp)
{
    static const uint32_t min[4] = {0, 0x80, 0x800, 0x10000};
    size_t k = s[0] < 0x80             ? 0
               : (s[0] & 0xe0) == 0xc0 ? 1
               : (s[0] & 0xf0) == 0xe0 ? 2
               : (s[0] & 0xf8) == 0xf0 ? 3
                                       : 4;
    if (k == 4 || k >= n)
        return 0;
    uint32_t c = k == 0 ? s[0] : s[0] & (0x3f >> k);
    for (size_t j = 1; j <= k; j++) {
        if ((s[j] & 0xc0) != 0x80)
            return 0;
        c = c << 6 | (s[j] & 0x3f);
    }
    if (c < min[k] || (c >= 0xd800 && c <= 0xdfff) || c > 0x10ffff)
        return 0;
    *cp = c;
    return k + 1;
}

/* Writes t as a YAML double-quoted scalar that reads back as exactly t: quotes, backslashes,
 * line breaks (YAML folds raw ones, also U+0085, U+2028, U+2029) and characters YAML does not
 * allow raw are escaped. A byte that is not UTF-8 cannot be written as itself (YAML text is
 * Unicode): it becomes the character of that number. */
static void sb_quoted(sbuf *b, const char *t)
{
    const unsigned char *s = (const unsigned char *)t;
    size_t n = strlen(t);
    sb_put(b, "\"", 1);
    for (size_t i = 0; i < n;) {
        uint32_t cp = 0;
        size_t k = utf8_char(s + i, n - i, &cp);
        bool raw = k > 0 && cp != '"' && cp != '\\' &&
                   ((cp >= 0x20 && cp <= 0x7e) ||
                    (cp >= 0xa0 && cp <= 0xd7ff && cp != 0x2028 && cp != 0x2029) ||
                    (cp >= 0xe000 && cp <= 0xfffd && cp != 0xfeff) || cp >= 0x10000);
        if (raw)
            sb_put(b, t + i, k);
        else if (k == 0)
            sb_fmt(b, "\\x%02x", s[i]);
        else if (cp == '"' || cp == '\\')
            sb_fmt(b, "\\%c", (char)cp);
        else if (cp == '\n')
            sb_put(b, "\\n", 2);
        else if (cp == '\t')
            sb_put(b, "\\t", 2);
        else if (cp < 0x100)
            sb_fmt(b, "\\x%02x", (unsigned)cp);
        else
            sb_fmt(b, "\\u%04x", (unsigned)cp);
        i += k ? k : 1;
    }
    sb_put(b, "\"", 1);
}

/* The shortest decimal form of x that reads back as x. */
static void sb_double(sbuf *b, double x)
{
    char tmp[40];
    for (int prec = 15; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*g", prec, x);
        if (strtod(tmp, NULL) == x)
            break;
    }
    sb_put(b, tmp, strlen(tmp));
}

char *ddp_config_to_yaml(const ddp_config *c)
{
    if (!c)
        return NULL;
    /* Values are written from their parsed form, so the text always reads back as the same
     * value, whatever spelling it came in ("yes", " 5", "[1, 2]"). */
    sbuf b = {0};
    sb_put(&b, "", 0);
    for (size_t i = 0; i < c->n; i++) {
        const ddp_cfg_key *k = &c->schema[i];
        const value *v = &c->v[i];
        sb_put(&b, k->name, strlen(k->name));
        sb_put(&b, ": ", 2);
        switch (k->type) {
        case DDP_CFG_INT: sb_fmt(&b, "%lld", (long long)v->i); break;
        case DDP_CFG_FLOAT: sb_double(&b, v->f); break;
        case DDP_CFG_BOOL: sb_put(&b, v->b ? "true" : "false", v->b ? 4 : 5); break;
        case DDP_CFG_INT_LIST:
            sb_put(&b, "[", 1);
            for (size_t j = 0; j < v->nlist; j++)
                sb_fmt(&b, "%s%lld", j ? "," : "", (long long)v->list[j]);
            sb_put(&b, "]", 1);
            break;
        case DDP_CFG_STRING:
        case DDP_CFG_CHOICE: sb_quoted(&b, v->text ? v->text : ""); break;
        }
        sb_put(&b, "\n", 1);
    }
    if (b.failed) {
        free(b.p);
        return NULL;
    }
    return b.p;
}

/* The section of a key: the part before its first dot ("" for a top-level key). */
static size_t section_len(const char *name)
{
    const char *dot = strchr(name, '.');
    return dot ? (size_t)(dot - name) : 0;
}

static bool same_section(const char *a, const char *b)
{
    size_t la = section_len(a);
    return la == section_len(b) && strncmp(a, b, la) == 0;
}

void ddp_config_print_help(const ddp_cfg_key *schema, size_t n, FILE *out)
{
    static const char *const tn[] = {"int", "float", "bool", "string", "choice", "int list"};
    /* Each section once, in the order of its first key; its keys in schema order (a schema that
     * comes back to top-level keys between sections would otherwise print "general" again). */
    for (size_t i = 0; i < n; i++) {
        bool seen = false;
        for (size_t j = 0; j < i && !seen; j++)
            seen = same_section(schema[j].name, schema[i].name);
        if (seen)
            continue;
        size_t l = section_len(schema[i].name);
        fprintf(out, "\n%.*s\n", (int)(l ? l : 7), l ? schema[i].name : "general");
        for (size_t k = i; k < n; k++) {
            if (!same_section(schema[k].name, schema[i].name))
                continue;
            const char *type =
                schema[k].type == DDP_CFG_CHOICE ? schema[k].choices : tn[schema[k].type];
            fprintf(out, "  --%-28s %s (default: %s)\n      %s\n", schema[k].name, type,
                    schema[k].def && *schema[k].def ? schema[k].def : "\"\"", schema[k].help);
        }
    }
}
