/*
 * hostlist.h — Slurm's compact notations, parsed without running Slurm: host lists
 * (SLURM_JOB_NODELIST, "node[01-03,07],gpu-a[1-2]-x plain") and task counts per node
 * (SLURM_TASKS_PER_NODE, "2(x3),1"). Used by world.c to find rank 0's host and this node's
 * number of ranks; internal (ddp__), tested by tests/unit/test_world.c.
 */
#ifndef DDP_HOSTLIST_H
#define DDP_HOSTLIST_H

#include <stddef.h>

#include "ddp/status.h"

/* Most hosts one list may expand to (a guard against "n[0-999999999]"). */
#define DDP_HOSTLIST_MAX 1000000

/* Expands a Slurm host list into *hosts_out, an array of *n_out NUL-terminated names in Slurm's
 * order: items separated by commas or white space (commas inside brackets belong to the
 * bracket), each item a name with zero or more bracket groups `[a,b-c,…]`; several groups expand
 * as nested loops, the first outermost. A range keeps the width of its first number
 * ("[08-10]" gives 08 09 10; "[8-10]" gives 8 9 10); empty items are skipped, as Slurm does.
 * Text after a bracket ("gpu[1-2]-x") is accepted although Slurm 22.05's scontrol refuses it. Bad
 * syntax (an unclosed or nested bracket, an empty group or element, a range without an end, a range
 * whose end is below its start, a non-digit in a group, more than DDP_HOSTLIST_MAX hosts) fails
 * with DDP_ERR_INVALID and a message quoting the list and the place. The caller frees with
 * ddp__hostlist_free(). Outputs written only on DDP_OK. */
ddp_status ddp__hostlist_expand(const char *list, char ***hosts_out, int *n_out, ddp_error *err);
void ddp__hostlist_free(char **hosts, int n);

/* The number of tasks on node `node` (0-based) from a Slurm tasks-per-node string: a comma list
 * of counts, each optionally repeated as "C(xR)" ("2(x3),1" is 2,2,2,1). DDP_ERR_INVALID on bad
 * syntax or when node is past the end; *out written only on DDP_OK. */
ddp_status ddp__slurm_tasks_on_node(const char *spec, int node, int *out, ddp_error *err);

#endif /* DDP_HOSTLIST_H */
