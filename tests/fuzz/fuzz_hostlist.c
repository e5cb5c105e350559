/*
 * fuzz_hostlist.c — Slurm's compact notations from the environment (src/util/hostlist.c):
 * SLURM_JOB_NODELIST host lists ("node[01-03,07],gpu-a[1-2]-x") and SLURM_TASKS_PER_NODE counts
 * ("2(x3),1"), which world.c parses to find rank 0's host and this node's ranks.
 *
 * Input: a byte for the node asked about, then the text (cut at a NUL: the environment holds C
 * strings), read both as a host list and as a tasks-per-node string. A list that expands must
 * give 1 … DDP_HOSTLIST_MAX non-empty names; a tasks count must be ≥ 0.
 */
#include "fuzz.h"

#include <string.h>

#include "util/hostlist.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || size > 4096)
        return 0;
    int node = data[0];
    char *s = strndup((const char *)data + 1, size - 1);
    if (!s)
        abort();
    char **hosts = NULL;
    int n = 0;
    ddp_error err = {0};
    ddp_status st = ddp__hostlist_expand(s, &hosts, &n, &err);
    if (st != DDP_OK && !*err.msg)
        abort();
    if (st == DDP_OK) {
        if (n < 0 || n > DDP_HOSTLIST_MAX || (n > 0 && !hosts))
            abort();
        for (int i = 0; i < n; i++)
            if (!hosts[i] || !*hosts[i])
                abort();
        ddp__hostlist_free(hosts, n);
    }
    int tasks = -1;
    st = ddp__slurm_tasks_on_node(s, node, &tasks, &err);
    if (st != DDP_OK && !*err.msg)
        abort();
    if (st == DDP_OK && tasks < 0)
        abort();
    free(s);
    return 0;
}
