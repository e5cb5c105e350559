/* fake_gpu_dep.c — the library a fake GPU module needs (fake_gpu_module.c, FAKE_NEEDS_DEP). */
int fake_gpu_dep_value(void);
int fake_gpu_dep_value(void)
{
    return 0;
}
