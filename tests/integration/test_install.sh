#!/usr/bin/env bash
# The library as a C programmer uses it: `cmake --install` into a prefix, then examples built
# against that prefix alone, with pkg-config (ddp.pc) and with CMake (find_package(ddp), target
# ddp::ddp), and run. libddp is static, so this fails when either file forgets a library that
# libddp needs (MPI, OpenBLAS, libyaml, jansson, zlib, libdl).
# Also: each installed header compiles alone in strict C11, and every example README names builds.
# Usage: test_install.sh BINDIR SRCDIR
. "$(dirname "$0")/lib.sh"
SRC=${2:?usage: $0 BINDIR SRCDIR}
if [ -n "$SANITIZE" ]; then # its libddp.a needs the sanitizer's runtime in every program
    echo "skip: a $SANITIZE-sanitized build is not one to install"
    exit 77
fi
P=$T/prefix
cmake --install "$BIN/.." --prefix "$P" >"$T/install.log" 2>&1 ||
    { cat "$T/install.log" >&2; fail "cmake --install failed"; }
for f in include/ddp/ddp.h lib/libddp.a bin/ddprun; do [ -e "$P/$f" ] || fail "$f not installed"; done
pc=$(find "$P" -name ddp.pc | head -1)
[ -n "$pc" ] || fail "no ddp.pc installed"
cfg=$(find "$P" -name ddpConfig.cmake | head -1)
[ -n "$cfg" ] || fail "no ddpConfig.cmake installed"
ok "installed: headers, libddp.a, ddprun, ddp.pc, ddpConfig.cmake"

# Each installed header on its own, twice (include guards), in strict C11.
n=0
for h in "$P"/include/ddp/*.h; do
    printf '#include "ddp/%s"\n#include "ddp/%s"\nint main(void) { return 0; }\n' \
        "${h##*/}" "${h##*/}" >"$T/hdr.c"
    cc -std=c11 -Wall -Wextra -pedantic -Werror -I"$P/include" -c "$T/hdr.c" -o "$T/hdr.o" \
        2>"$T/cc.err" || { cat "$T/cc.err" >&2; fail "installed ${h##*/} does not compile alone"; }
    n=$((n + 1))
done
[ "$n" -gt 10 ] || fail "only $n headers installed"
ok "each of the $n installed headers compiles alone (-std=c11 -Wall -Wextra -pedantic -Werror)"

# pkg-config, relocated: the prefix is found from the .pc file's own place.
mv "$P" "$T/moved"
P=$T/moved
export PKG_CONFIG_PATH=$P/${pc#"$T/prefix/"}
PKG_CONFIG_PATH=$(dirname "$PKG_CONFIG_PATH")
flags=$(pkg-config --cflags --libs ddp) || fail "pkg-config --cflags --libs ddp failed"
for ex in hello_world spawn_allreduce train_mlp ddp_mlp; do # every example README names
    # shellcheck disable=SC2086
    cc -std=c11 -O1 "$SRC/examples/$ex.c" $flags -o "$T/pc_$ex" 2>"$T/cc.err" ||
        { cat "$T/cc.err" >&2; fail "$ex does not build with pkg-config's flags: $flags"; }
done
"$T/pc_spawn_allreduce" >"$T/out" 2>&1 || { cat "$T/out" >&2; fail "spawn_allreduce (pkg-config) failed"; }
assert_contains "$T/out" "as expected"
"$P/bin/ddprun" --standalone --nproc_per_node 2 "$T/pc_hello_world" >"$T/out" 2>&1 ||
    { cat "$T/out" >&2; fail "hello_world (pkg-config) under the installed ddprun failed"; }
ok "examples build with \$(pkg-config --cflags --libs ddp) from a moved prefix, and run"

# The README's snippets in "The library", as a reader copies them: each C block marked
# "<!-- a program's body: integration.install -->" ("{ … }" standing for error handling) compiles
# against the prefix and runs under ddprun over shm and tcp. The collectives' snippet wrote into
# ddp_group_alloc()'s memory, which is NULL over tcp: it crashed there.
awk '/^## / {on = /^## The library/} /^<!-- a program.s body: integration.install -->$/ {want = 1}
     on && want && /^```c$/ {n++; f = sprintf("%s/readme_%d.c", dir, n); want = 0; next}
     /^```$/ {f = ""; next}
     f != "" {print > f}' dir="$T" "$SRC/README.md"
n=0
for f in "$T"/readme_*.c; do
    {
        # the calls whose status a snippet leaves unread must succeed all the same
        cat <<'C'
#include <stdio.h>
#include <stdlib.h>
#include "ddp/ddp.h"
static ddp_status ok_(ddp_status st, const char *call)
{
    if (st != DDP_OK) {
        fprintf(stderr, "%s: %s\n", call, ddp_status_str(st));
        exit(1);
    }
    return st;
}
#define ddp_allreduce(...) ok_(ddp_allreduce(__VA_ARGS__), "ddp_allreduce")
#define ddp_allreduce_async(...) ok_(ddp_allreduce_async(__VA_ARGS__), "ddp_allreduce_async")
#define ddp_work_wait(...) ok_(ddp_work_wait(__VA_ARGS__), "ddp_work_wait")
#define ddp_store_barrier(...) ok_(ddp_store_barrier(__VA_ARGS__), "ddp_store_barrier")
C
        printf 'int main(void)\n{\n    size_t n = 100000;\n'
        grep -q 'ddp_error err' "$f" || printf '    ddp_error err = {0};\n' # from an earlier one
        grep -v '^#include' "$f" | sed 's/{ … }/{ fprintf(stderr, "%s\\n", err.msg); return 1; }/'
        printf '    return 0;\n}\n'
    } >"$f.main.c"
    exe=${f%.c}
    # shellcheck disable=SC2086
    cc -std=c11 -Wall -Wno-unused-variable "$f.main.c" $flags -o "$exe" 2>"$T/cc.err" ||
        { cat "$f.main.c" "$T/cc.err" >&2; fail "README snippet ${f##*/} does not compile"; }
    for be in shm tcp; do
        DDP_BACKEND=$be "$P/bin/ddprun" --standalone --nproc_per_node 2 "$exe" >"$T/out" 2>&1 ||
            { cat "$f.main.c" "$T/out" >&2; fail "README snippet ${f##*/} failed over $be"; }
    done
    n=$((n + 1))
done
[ "$n" -ge 2 ] || fail "only $n README snippets were whole programs"
ok "the README's $n library snippets compile as written and run at 2 ranks over shm and tcp"

# Every docs/ page a header points to exists (ddp.h named a docs/api.md that never did).
for h in "$SRC"/include/ddp/*.h; do
    while read -r d; do
        [ -e "$SRC/$d" ] || fail "${h##*/} points to $d, which does not exist"
    done < <(grep -o 'docs/[A-Za-z0-9_.-]*\.md' "$h" | sort -u)
done
ok "every docs/ page the headers name exists"

# CMake: find_package(ddp) from the prefix.
mkdir -p "$T/cm"
cat >"$T/cm/CMakeLists.txt" <<CM
cmake_minimum_required(VERSION 3.25)
project(use_ddp C)
find_package(ddp 0.1 REQUIRED)
add_executable(spawn_allreduce "$SRC/examples/spawn_allreduce.c")
target_link_libraries(spawn_allreduce PRIVATE ddp::ddp)
add_executable(train_mlp "$SRC/examples/train_mlp.c")
target_link_libraries(train_mlp PRIVATE ddp::ddp)
add_executable(ddp_mlp "$SRC/examples/ddp_mlp.c") # <cblas.h> through ddp::ddp
target_link_libraries(ddp_mlp PRIVATE ddp::ddp)
CM
cmake -S "$T/cm" -B "$T/cm/b" -DCMAKE_PREFIX_PATH="$P" >"$T/cm.log" 2>&1 ||
    { cat "$T/cm.log" >&2; fail "find_package(ddp) failed"; }
cmake --build "$T/cm/b" >"$T/cm.log" 2>&1 || { cat "$T/cm.log" >&2; fail "ddp::ddp does not link"; }
"$T/cm/b/spawn_allreduce" >"$T/out" 2>&1 || { cat "$T/out" >&2; fail "spawn_allreduce (CMake) failed"; }
assert_contains "$T/out" "as expected"
ok "find_package(ddp) + ddp::ddp builds the examples, and they run"
