# mpi_lib.sh — what the MPI tests share (sourced after lib.sh): mpirun with the flags this machine
# needs, and a clean skip (exit 77) where there is no mpirun or the library was built without MPI.
command -v mpirun >/dev/null 2>&1 || { echo "skip: no mpirun (install openmpi-bin)"; exit 77; }
# As root (these machines, CI) mpirun refuses to start without these.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Open MPI's own chatter about help messages, and its attempts to find other networks, stay out.
export OMPI_MCA_orte_base_help_aggregate=0 OMPI_MCA_btl_base_warn_component_unused=0
# Under AddressSanitizer (the build made libkeep_loaded.so): Open MPI's own allocations kept
# until exit are not ddpc's leaks. The suppressions match only frames inside Open MPI's libraries;
# keep_loaded.c stops Open MPI unloading its components, so that their frames have names; the
# slow unwinder follows frames through Open MPI's code, built without frame pointers.
if [ -f "$BIN/libkeep_loaded.so" ]; then
    export LD_PRELOAD=$BIN/libkeep_loaded.so
    export ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0
    supp=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/openmpi.supp
    export LSAN_OPTIONS=${LSAN_OPTIONS:+$LSAN_OPTIONS:}suppressions=$supp:fast_unwind_on_malloc=0
fi
# One host: shared memory and loopback only, never another interface.
MPI_LOCAL=(--oversubscribe --mca btl self,vader,tcp --mca btl_tcp_if_include lo
    --mca oob_tcp_if_include lo)
mpi_run() { # mpi_run NP PROGRAM ARGS...: NP ranks on this host, each rank's OpenBLAS on 1 thread
    local np=$1
    shift
    mpirun "${MPI_LOCAL[@]}" -np "$np" "$@"
}
