#!/usr/bin/env bash
# The shm allreduce's choice of variant as a user meets it (docs/group.md): the cache file for
# this machine (written here by hand under the key the library computes: model name and cache
# sizes from /proc and sysfs, ranks on the host) is what `auto` uses; `rules` ignores it; a
# damaged file is a miss, never an error; DDP_SHM_ALGO forces a variant; a bad value is a clear
# error. ddpbench's algo column shows the variant per size, and every run checks its results.
. "$(dirname "$0")/lib.sh"
PY=/usr/bin/python3
BENCH=$BIN/ddpbench
export DDP_CACHE_DIR=$T/cache
mkdir -p "$DDP_CACHE_DIR"

algo() { # algo SIZE [ENV…]: the variant ddpbench reports for an allreduce of SIZE bytes
    local size=$1
    shift
    env "$@" "$DDPRUN" --standalone --nproc_per_node=2 --no_prefix "$BENCH" --op allreduce \
        --sizes "$size" --iters 5 --csv 2>"$T/err" | awk -F, '$1=="allreduce" && $7==0 {print $9}'
}

# The file the library would read: shm-<FNV-1a of the key>.txt, key "model|l1d|l2|l3|members".
cache_file() {
    "$PY" - "$DDP_CACHE_DIR" <<'EOP'
import glob, os, re, sys
model = ""
for line in open("/proc/cpuinfo"):
    if line.startswith("model name"):
        model = line.split(":", 1)[1].strip().replace("|", "/")
        break
size = {1: 0, 2: 0, 3: 0}
for d in sorted(glob.glob("/sys/devices/system/cpu/cpu0/cache/index*")):
    if open(d + "/type").read().strip() == "Instruction":
        continue
    lvl = int(open(d + "/level").read())
    m = re.match(r"(\d+)([KMG]?)", open(d + "/size").read().strip())
    size[lvl] = int(m.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30}[m.group(2)]
key = f"{model}|{size[1]}|{size[2]}|{size[3]}|2"
h = 0xcbf29ce484222325
for b in key.encode():
    h = ((h ^ b) * 0x100000001b3) & 0xffffffffffffffff
print(os.path.join(sys.argv[1], f"shm-{h:016x}.txt"))
print(key)
EOP
}
{ read -r FILE; read -r KEY; } < <(cache_file)
# Bands 64K 256K 1M 4M 16M 64M 256M: something no rule table gives, so only the file explains it.
printf 'ddpc shm allreduce choice v1\n%s\nlibc,libc,cached,stream,pipelined,libc,libc;block=131072\n' \
    "$KEY" >"$FILE"
[ "$(algo 1M)" = cached ] || fail "auto did not take the cached choice at 1 MiB: '$(algo 1M)' ($(cat "$T/err"))"
[ "$(algo 4M)" = stream ] || fail "auto did not take the cached choice at 4 MiB"
[ "$(algo 16M)" = pipelined ] || fail "auto did not take the cached choice at 16 MiB"
ok "auto uses this machine's cached choice ($FILE)"

rules=$(algo 1M DDP_SHM_ALGO=rules)
[ -n "$rules" ] && [ "$rules" != cached ] || fail "rules gave '$rules' at 1 MiB: it read the cache file"
ok "rules ignores the cache file (1 MiB: $rules)"

for v in libc cached stream pipelined; do
    [ "$(algo 4M DDP_SHM_ALGO=$v)" = $v ] || fail "DDP_SHM_ALGO=$v did not force $v"
done
ok "DDP_SHM_ALGO forces each variant, and each one's results check out"

printf 'ddpc shm allreduce choice v1\n%s\nlibc,lib' "$KEY" >"$FILE"
[ -n "$(algo 1M DDP_SHM_ALGO=auto)" ] || fail "a damaged cache file broke the group: $(cat "$T/err")"
ok "a damaged cache file is a miss"

DDP_SHM_ALGO=fast "$DDPRUN" --standalone --nproc_per_node=2 --no_prefix "$BENCH" --sizes 4K \
    >"$T/bad" 2>&1 && fail "DDP_SHM_ALGO=fast was accepted"
grep -q "DDP_SHM_ALGO must be auto, probe, rules, libc, cached, stream or pipelined, not 'fast'" \
    "$T/bad" || fail "no clear error for DDP_SHM_ALGO=fast: $(cat "$T/bad")"
ok "a bad DDP_SHM_ALGO is a clear error"
