/*
 * keep_loaded.c — a preload for the MPI tests under AddressSanitizer (tests/integration/
 * mpi_lib.sh): dlclose() that unloads nothing. Open MPI unloads its components in MPI_Finalize;
 * what they keep until exit then shows in LeakSanitizer's report with no module name, and the
 * suppressions (openmpi.supp), which match Open MPI's libraries by name, cannot tell it from a
 * leak in ddpc. Kept loaded, every frame has its name. Built only in the address-sanitizer build.
 */
int dlclose(void *handle);

int dlclose(void *handle)
{
    (void)handle;
    return 0;
}
