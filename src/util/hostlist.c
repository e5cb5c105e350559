/*
 * hostlist.c — Slurm's host-list and tasks-per-node notations (hostlist.h). A parser rather than
 * `scontrol show hostnames`, so the library runs no program and works where Slurm's tools are
 * not installed (inside a container started by srun); tests/unit/test_world.c compares the two
 * when scontrol is present. Only the syntax Slurm documents for node lists: no ranges with a
 * step, no hosts named by a numeric suffix without brackets.
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/hostlist.h"
#include "util/util.h"

#define HOST_MAX 255 /* bytes in one expanded name */

typedef struct range {
    long long lo, hi;
    int width; /* digits of the first number as written: zero padding kept */
} range;

/* One bracket group of an item: its ranges. */
typedef struct group {
    range *r;
    int n;
    long long count; /* names the group gives */
} group;

typedef struct out_list {
    char **v;
    int n, cap;
} out_list;

static ddp_status bad(ddp_error *err, const char *list, const char *why, size_t at)
{
    return ddp__err(err, DDP_ERR_INVALID,
                    "host list '%s' is malformed: %s at character %zu; write it as Slurm does, "
                    "e.g. 'node[01-03,07],gpu1'",
                    list, why, at + 1);
}

static ddp_status push(out_list *o, const char *name, ddp_error *err)
{
    if (o->n == o->cap) {
        int cap = o->cap ? o->cap * 2 : 16;
        char **v = realloc(o->v, sizeof *v * (size_t)cap);
        if (!v)
            return ddp__err(err, DDP_ERR_NOMEM, "out of memory expanding a host list");
        o->v = v;
        o->cap = cap;
    }
    if (!(o->v[o->n] = strdup(name)))
        return ddp__err(err, DDP_ERR_NOMEM, "out of memory expanding a host list");
    o->n++;
    return DDP_OK;
}

/* Parses the inside of one bracket, list[a..b), into g. */
static ddp_status parse_group(const char *list, size_t a, size_t b, group *g, ddp_error *err)
{
    g->n = 0;
    g->count = 0;
    g->r = NULL;
    int cap = 0;
    size_t i = a;
    for (;;) {
        size_t start = i;
        while (i < b && isdigit((unsigned char)list[i]))
            i++;
        if (i == start)
            return bad(err, list,
                       i < b && list[i] != ',' ? "a non-digit inside brackets"
                                               : "an empty element inside brackets",
                       i);
        if (i - start > 18)
            return bad(err, list, "a number too long", start);
        range r = {0, 0, (int)(i - start)};
        char num[20];
        memcpy(num, list + start, i - start);
        num[i - start] = '\0';
        r.lo = r.hi = strtoll(num, NULL, 10);
        if (i < b && list[i] == '-') {
            size_t s2 = ++i;
            while (i < b && isdigit((unsigned char)list[i]))
                i++;
            if (i == s2)
                return bad(err, list, "a range without an end", s2);
            if (i - s2 > 18)
                return bad(err, list, "a number too long", s2);
            memcpy(num, list + s2, i - s2);
            num[i - s2] = '\0';
            r.hi = strtoll(num, NULL, 10);
            if (r.hi < r.lo)
                return bad(err, list, "a range whose end is below its start", start);
        }
        if (i < b && list[i] != ',')
            return bad(err, list, "a non-digit inside brackets", i);
        if (r.hi - r.lo + 1 > DDP_HOSTLIST_MAX || g->count + (r.hi - r.lo + 1) > DDP_HOSTLIST_MAX)
            return bad(err, list, "more than 1000000 hosts", start);
        if (g->n == cap) {
            cap = cap ? cap * 2 : 4;
            range *nr = realloc(g->r, sizeof *nr * (size_t)cap);
            if (!nr)
                return ddp__err(err, DDP_ERR_NOMEM, "out of memory parsing a host list");
            g->r = nr;
        }
        g->r[g->n++] = r;
        g->count += r.hi - r.lo + 1;
        if (i >= b)
            return DDP_OK;
        i++; /* the comma */
    }
}

/* The k-th name of group g, 0 ≤ k < g->count, as text with the range's width. */
static void group_name(const group *g, long long k, char *buf, size_t cap)
{
    for (int j = 0; j < g->n; j++) {
        long long c = g->r[j].hi - g->r[j].lo + 1;
        if (k < c) {
            snprintf(buf, cap, "%0*lld", g->r[j].width, g->r[j].lo + k);
            return;
        }
        k -= c;
    }
}

/* Expands one item, list[a..b) (brackets balanced and unnested, checked by the caller). */
static ddp_status expand_item(const char *list, size_t a, size_t b, out_list *o, ddp_error *err)
{
    /* Split into literal pieces and groups: lit[0] grp[0] lit[1] grp[1] … lit[ng]. */
    int ng = 0;
    for (size_t i = a; i < b; i++)
        ng += list[i] == '[';
    group *g = calloc((size_t)ng + 1, sizeof *g);
    size_t *lit_a = calloc((size_t)ng + 1, sizeof *lit_a);
    size_t *lit_b = calloc((size_t)ng + 1, sizeof *lit_b);
    long long *idx = calloc((size_t)ng + 1, sizeof *idx);
    ddp_status st = DDP_OK;
    if (!g || !lit_a || !lit_b || !idx) {
        st = ddp__err(err, DDP_ERR_NOMEM, "out of memory parsing a host list");
        goto out_free;
    }
    size_t i = a;
    long long total = 1;
    for (int k = 0; k <= ng; k++) {
        lit_a[k] = i;
        while (i < b && list[i] != '[')
            i++;
        lit_b[k] = i;
        if (k == ng)
            break;
        size_t close = i + 1;
        while (list[close] != ']')
            close++;
        if ((st = parse_group(list, i + 1, close, &g[k], err)))
            goto out_free;
        total *= g[k].count;
        if (total > DDP_HOSTLIST_MAX) {
            st = bad(err, list, "more than 1000000 hosts", i);
            goto out_free;
        }
        i = close + 1;
    }
    if ((long long)o->n + total > DDP_HOSTLIST_MAX) {
        st = bad(err, list, "more than 1000000 hosts", a);
        goto out_free;
    }
    /* An odometer over the groups, the last fastest. */
    for (;;) {
        char name[HOST_MAX + 1];
        size_t len = 0;
        for (int k = 0; k <= ng; k++) {
            size_t ll = lit_b[k] - lit_a[k];
            char num[24] = "";
            if (k < ng)
                group_name(&g[k], idx[k], num, sizeof num);
            if (len + ll + strlen(num) > HOST_MAX) {
                st = bad(err, list, "a host name longer than 255 characters", a);
                goto out_free;
            }
            memcpy(name + len, list + lit_a[k], ll);
            len += ll;
            memcpy(name + len, num, strlen(num));
            len += strlen(num);
        }
        name[len] = '\0';
        if ((st = push(o, name, err)))
            goto out_free;
        int k = ng - 1;
        while (k >= 0 && ++idx[k] == g[k].count)
            idx[k--] = 0;
        if (k < 0)
            break;
    }
out_free:
    for (int k = 0; g && k < ng; k++)
        free(g[k].r);
    free(g);
    free(lit_a);
    free(lit_b);
    free(idx);
    return st;
}

static bool is_sep(char c)
{
    return c == ',' || isspace((unsigned char)c);
}

ddp_status ddp__hostlist_expand(const char *list, char ***hosts_out, int *n_out, ddp_error *err)
{
    if (!list || !hosts_out || !n_out)
        return ddp__err(err, DDP_ERR_INVALID, "ddp__hostlist_expand: an argument is NULL");
    out_list o = {0};
    ddp_status st = DDP_OK;
    size_t len = strlen(list), i = 0;
    while (i < len) {
        if (is_sep(list[i])) { /* empty items are skipped, as Slurm does ("a,,b", "a,") */
            i++;
            continue;
        }
        /* One item: up to a separator outside brackets. */
        size_t a = i;
        bool open = false;
        for (; i < len && (open || !is_sep(list[i])); i++) {
            if (list[i] == '[') {
                if (open) {
                    st = bad(err, list, "a '[' inside brackets", i);
                    goto out_fail;
                }
                open = true;
            } else if (list[i] == ']') {
                if (!open) {
                    st = bad(err, list, "a ']' without its '['", i);
                    goto out_fail;
                }
                open = false;
            }
        }
        if (open) {
            st = bad(err, list, "a '[' that is never closed", len);
            goto out_fail;
        }
        if ((st = expand_item(list, a, i, &o, err)))
            goto out_fail;
    }
    if (o.n == 0) {
        st = ddp__err(err, DDP_ERR_INVALID, "host list '%s' names no host; check %s", list,
                      "SLURM_JOB_NODELIST");
        goto out_fail;
    }
    *hosts_out = o.v;
    *n_out = o.n;
    return DDP_OK;
out_fail:
    ddp__hostlist_free(o.v, o.n);
    return st;
}

void ddp__hostlist_free(char **hosts, int n)
{
    for (int i = 0; hosts && i < n; i++)
        free(hosts[i]);
    free(hosts);
}

ddp_status ddp__slurm_tasks_on_node(const char *spec, int node, int *out, ddp_error *err)
{
    if (!spec || !out || node < 0)
        return ddp__err(err, DDP_ERR_INVALID, "ddp__slurm_tasks_on_node: bad argument");
    const char *p = spec;
    long long seen = 0;
    int found = -1; /* the whole string is checked, not only up to this node */
    for (;;) {
        char *end;
        if (!isdigit((unsigned char)*p))
            goto bad_syntax;
        long long c = strtoll(p, &end, 10), rep = 1;
        if (c < 0 || c > 1 << 24)
            goto bad_syntax;
        p = end;
        if (*p == '(') {
            if (p[1] != 'x' || !isdigit((unsigned char)p[2]))
                goto bad_syntax;
            rep = strtoll(p + 2, &end, 10);
            if (*end != ')' || rep < 1 || rep > 1 << 24)
                goto bad_syntax;
            p = end + 1;
        }
        if (found < 0 && node < seen + rep)
            found = (int)c;
        seen += rep;
        if (*p == '\0' && found >= 0) {
            *out = found;
            return DDP_OK;
        }
        if (*p == '\0')
            return ddp__err(err, DDP_ERR_INVALID,
                            "tasks per node '%s' lists %lld nodes, but this is node %d; check "
                            "SLURM_NODEID and SLURM_STEP_TASKS_PER_NODE",
                            spec, seen, node);
        if (*p != ',')
            goto bad_syntax;
        p++;
    }
bad_syntax:
    return ddp__err(err, DDP_ERR_INVALID,
                    "tasks per node '%s' is malformed at character %td; Slurm writes it as "
                    "counts with repeats, e.g. '2(x3),1'",
                    spec, p - spec + 1);
}
