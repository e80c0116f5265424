"""Machine set-up and numba support: the process restart that settles malloc, OpenMP and
portable arithmetic, the device choice, the compiled-kernel cache and the kernels' helpers."""
