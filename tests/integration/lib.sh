# lib.sh — shared helpers for the integration tests; sourced by each tests/integration/*.sh.
# Usage from CTest: test_x.sh BINDIR. Each test works in its own temporary directory, and on
# exit kills (by recorded pid only) anything it started that is still alive, then fails if it
# found such a survivor: a leftover is a bug, not something to tidy silently.
set -euo pipefail

BIN=${1:?usage: $0 BINDIR}
BIN=$(cd "$BIN" && pwd)
DDPRUN=$BIN/ddprun
WORKER=$BIN/testworker
HELLO=$BIN/hello_world
# The build's sanitizer ('', address or thread): sanitized builds, 3–15× slower, run shorter
# versions of the heaviest checks (the plain build runs them whole).
SANITIZE=$(sed -n 's/^DDP_SANITIZE:[A-Z]*=//p' "$BIN/../CMakeCache.txt" 2>/dev/null || true)
T=$(mktemp -d "${TMPDIR:-/tmp}/ddptest.XXXXXX")
BG_PIDS=()
CLEANUP_GLOBS=() # files outside $T a test creates (e.g. in /dev/shm), removed on any exit
UNMOUNT=()       # file systems a test mounted under $T, unmounted on any exit before $T goes
unset OMP_NUM_THREADS OPENBLAS_NUM_THREADS DDP_STORE_TOKEN RANK WORLD_SIZE LOCAL_RANK \
    LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT GROUP_RANK DDP_RUN_ID DDP_AGENT_STORE DDP_STORE_PORT \
    TORCHELASTIC_RUN_ID TORCHELASTIC_USE_AGENT_STORE TORCHELASTIC_ERROR_FILE TORCH_NCCL_ASYNC_ERROR_HANDLING PMIX_RANK PMI_RANK PMI_SIZE MPI_LOCALRANKID MPI_LOCALNRANKS
# Other launchers' variables (tests started by srun or mpirun must not see a world of several).
for v in $(compgen -v | grep -E '^(OMPI_COMM_WORLD_|SLURM_|PET_)' || true); do unset "$v"; done

fail() {
    echo "FAIL: $*" >&2
    exit 1
}

ok() {
    echo "ok: $*"
}

# alive PID: true if PID exists and is not a zombie
alive() {
    local st
    st=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) || return 1
    [ "$st" != "Z" ]
}

# recorded_pids DIR: every pid the test workers wrote into DIR
recorded_pids() {
    cat "$1"/pid.* "$1"/child.* 2>/dev/null || true
}

# wait_gone DIR SECONDS: every recorded pid is gone within SECONDS, else fail naming survivors
wait_gone() {
    local dir=$1 limit=$2 end survivors
    end=$(($(date +%s%N) + ${limit%.*} * 1000000000))
    while :; do
        survivors=""
        for p in $(recorded_pids "$dir"); do
            alive "$p" && survivors="$survivors $p"
        done
        [ -z "$survivors" ] && return 0
        [ "$(date +%s%N)" -gt "$end" ] && fail "processes still alive after ${limit}s:$survivors"
        sleep 0.05
    done
}

# wait_files DIR GLOB COUNT SECONDS: wait until COUNT files match
wait_files() {
    local dir=$1 glob=$2 count=$3 limit=$4 i
    for ((i = 0; i < limit * 20; i++)); do
        # shellcheck disable=SC2086
        [ "$(ls $dir/$glob 2>/dev/null | wc -l)" -ge "$count" ] && return 0
        sleep 0.05
    done
    fail "expected $count files $glob in $dir within ${limit}s"
}

assert_contains() {
    grep -qF -- "$2" "$1" || { echo "---- $1 ----" >&2; cat "$1" >&2; fail "'$1' lacks '$2'"; }
}

assert_not_contains() {
    if grep -qF -- "$2" "$1"; then
        echo "---- $1 ----" >&2
        cat "$1" >&2
        fail "'$1' contains '$2'"
    fi
}

# late_start DIR RANK SECONDS: writes DIR/late.sh, which runs its arguments, RANK's SECONDS late
# (a worker slow to start, as under TSan with four tests on two cores): a test's workers must
# order themselves by what has happened, not by sleeps that are long enough on an idle machine.
late_start() {
    printf '#!/bin/sh\n[ "$RANK" = %s ] && sleep %s\nexec "$@"\n' "$2" "$3" >"$1/late.sh"
    chmod +x "$1/late.sh"
}

# tagged_pids TAG: processes whose environment holds DDP_TEST_TAG=TAG (start a job with
# DDP_TEST_TAG=TAG in its environment, not exported to the test's shell): what this test started
# and left running. Not `pgrep -f PROGRAM`, which also finds the same program run by a test
# beside this one under ctest -j.
tagged_pids() {
    local e p
    for e in /proc/[0-9]*/environ; do
        p=${e#/proc/}; p=${p%/environ}
        tr '\0' '\n' 2>/dev/null <"$e" | grep -qx "DDP_TEST_TAG=$1" && alive "$p" && echo "$p"
    done
    return 0
}

# idx_files PREFIX LABEL…: PREFIX-images-idx3-ubyte (random 28×28 images, one a label) and
# PREFIX-labels-idx1-ubyte (the labels), Fashion-MNIST's formats
idx_files() {
    /usr/bin/python3 - "$@" <<'EOP'
import os, struct, sys
p, labels = sys.argv[1], [int(v) for v in sys.argv[2:]]
n = len(labels)
open(p + "-images-idx3-ubyte", "wb").write(struct.pack(">IIII", 0x803, n, 28, 28) + os.urandom(n * 784))
open(p + "-labels-idx1-ubyte", "wb").write(struct.pack(">II", 0x801, n) + bytes(labels))
EOP
}

# small_idx DIR NTRAIN NTEST: a small data set in DIR (train-… and t10k-…), labels 0-9 in turn
small_idx() {
    mkdir -p "$1"
    # shellcheck disable=SC2046 # one label an argument
    idx_files "$1/train" $(seq 0 $(($2 - 1)) | awk '{ print $1 % 10 }')
    idx_files "$1/t10k" $(seq 0 $(($3 - 1)) | awk '{ print $1 % 10 }')
}

# free_port: a loopback port that was free a moment ago
free_port() {
    "$WORKER" free-port
}

now_ms() {
    echo $(($(date +%s%N) / 1000000))
}

cleanup() {
    local rc=$? leftovers=""
    for p in "${BG_PIDS[@]}"; do
        alive "$p" && { leftovers="$leftovers $p"; kill -9 "$p" 2>/dev/null || true; }
    done
    for d in "$T"/*/; do
        [ -d "$d" ] || continue
        for p in $(recorded_pids "$d"); do
            alive "$p" && { leftovers="$leftovers $p"; kill -9 "$p" 2>/dev/null || true; }
        done
    done
    for m in "${UNMOUNT[@]}"; do
        umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
    done
    rm -rf "$T"
    for g in "${CLEANUP_GLOBS[@]}"; do
        # shellcheck disable=SC2086
        rm -f $g
    done
    if [ -n "$leftovers" ]; then
        echo "FAIL: processes left behind:$leftovers" >&2
        exit 1
    fi
    exit $rc
}
trap cleanup EXIT

# have_cpu_bf16: true where precision bf16 can run on this CPU — bf16 units (AVX512_BF16 or AMX)
# and oneDNN installed. (No `grep -q` after ldconfig: under pipefail its early exit would make
# ldconfig's SIGPIPE fail the test now and then.)
have_cpu_bf16() {
    grep -qwE 'avx512_bf16|amx_bf16' /proc/cpuinfo && [ -n "$(ldconfig -p | grep 'libdnnl\.so\.2 ')" ]
}

# story_text: ~150 KB of text on stdout, 1500 '%'-separated documents of 8–27 words from a
# 16-word vocabulary with sentence ends: varied enough to learn, the same every time.
story_text() {
    awk 'BEGIN { srand(7);
                 split("the a cat dog sat ran on under mat log and then it was red blue", w, " ");
                 for (d = 0; d < 1500; d++) { n = 8 + int(rand() * 20); s = "";
                     for (i = 0; i < n; i++) s = s w[1 + int(rand() * 16)] (i % 7 == 6 ? ".\n" : " ");
                     print s "\n%" } }'
}

# tiny_gpt: writes text.txt in the current directory (300 documents of 12 words from a 10-word
# vocabulary, '%' between them) and sets TINY_GPT: ddptrain's arguments for a 2-layer GPT on it
# (batch 4 × 16 tokens, AdamW, every step logged), what the device-resident GPU tests train.
tiny_gpt() {
    awk 'BEGIN { srand(3); split("the a cat dog sat ran on under mat log", w, " ");
                 for (d = 0; d < 300; d++) { s = ""; for (i = 0; i < 12; i++) s = s w[1 + int(rand() * 10)] " ";
                 print s "\n%" } }' >text.txt
    TINY_GPT=(--model.type gpt --data.text "$PWD/text.txt" --data.doc_sep % --model.n_layer 2
              --model.n_head 2 --model.n_embd 32 --model.block_size 16 --batch_size 4
              --optimizer adamw --lr 3e-3 --schedule constant --grad_clip 1.0 --eval_windows 8
              --max_new_tokens 0 --log_every 1 --seed 9)
}

weights_close() { # weights_close A B: two checkpoints' weights (not the optimizer state)
    # within 1e-5 of each other (relative to the largest value of each tensor)
    "$BIN/ckpt_tool" dump "$1" | grep '^T ' >a.txt
    "$BIN/ckpt_tool" dump "$2" | grep '^T ' >b.txt
    /usr/bin/python3 - a.txt b.txt <<'EOP'
import sys
def load(p):
    out = {}
    for line in open(p):
        f = line.split()
        name = bytes.fromhex(f[1]).decode()
        if not name.startswith("optim."):
            nd = int(f[3])
            out[name] = [float.fromhex(v) for v in f[4 + nd:]]
    return out
a, b = load(sys.argv[1]), load(sys.argv[2])
assert a.keys() == b.keys() and a, (sorted(a), sorted(b))
rel = max(max(abs(x - y) for x, y in zip(a[k], b[k])) / max(max(abs(y) for y in b[k]), 1e-30)
          for k in a)
print(f"relative difference {rel:.2e}")
sys.exit(0 if rel <= 1e-5 else 1)
EOP
}
