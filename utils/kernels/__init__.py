"""Triton kernels of the labs, with their launchers: the reference implementations the benchmarks reuse."""
